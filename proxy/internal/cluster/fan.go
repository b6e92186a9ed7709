package cluster

import (
	"bytes"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/tidwall/redcon"

	"github.com/lockproxy/lockproxy/proxy/internal/resp"
)

// The commands that concern a whole server, in front of a Redis Cluster.
// The proxy's address is one Redis to its clients, so what a client sets
// on "the server" is set on every master, and what it reads of "the
// server" is read from every master and merged into what one Redis holding
// all the keys would answer:
//
//   - applied to every master, with the reply one Redis sends when all of
//     them succeed and the first error otherwise: CONFIG SET, RESETSTAT and
//     REWRITE, ACL SETUSER, DELUSER, LOAD and SAVE, SLOWLOG RESET, LATENCY
//     RESET (the sum), CLIENT PAUSE and UNPAUSE, SAVE, BGSAVE and
//     BGREWRITEAOF, SCRIPT KILL and FUNCTION KILL (+OK from the master
//     running the script, else the first NOTBUSY) (and, in plan.go,
//     FLUSHALL, FLUSHDB, SCRIPT LOAD/FLUSH, FUNCTION LOAD/DELETE/FLUSH/RESTORE);
//   - merged: INFO (see mergeInfo), SLOWLOG GET (the masters' entries,
//     newest first) and LEN (their number), each fanned command's entry
//     counted once (slowlog.go), ACL LOG (acllog.go), PUBSUB
//     SHARDCHANNELS and SHARDNUMSUB (shardinfo.go), SCRIPT EXISTS (known on any master:
//     EVAL caches a script on the master of its keys only);
//   - answered as one Redis answers: READONLY and READWRITE, which only a
//     cluster node accepts, and HELLO, whose reply says mode standalone;
//   - COMMAND and its subcommands are answered from one node's table
//     (every node of a cluster runs the same commands), with the proxy's
//     own commands added (command.go, dialAny).
//
// The masters' replies are not one snapshot: a merged read is made of
// answers read one after the other on each master. The other reads of
// server state (CONFIG GET, ACL LIST/GETUSER, CLIENT LIST, ...) are the
// slot-0 master's, which is the whole answer as long as the masters are
// configured alike (which applying every CONFIG SET and ACL SETUSER to all
// of them keeps).

// replyClusterDisabled is standalone Redis's answer to READONLY and
// READWRITE.
var replyClusterDisabled = []byte("-ERR This instance has cluster support disabled\r\n")

// serverWide routes a keyless command that concerns the whole server; it
// reports false for the others. keyless calls it only for the commands
// the command table flags NoSlot: a case added here must be flagged there
// (internal/resp/table.go).
func ServerWide(r *Router, clients int64, m *SlotMap, name []byte, cmd redcon.Command) (Call, bool) {
	args := cmd.Args
	var sb [24]byte
	sub := ""
	if len(args) > 1 {
		sub = string(resp.Lower(&sb, args[1]))
	}
	all := func(op MergeOp) (Call, bool) { return Fan(m, cmd.Raw, op), true }
	switch string(name) {
	case "readonly", "readwrite":
		return LocalCall(replyClusterDisabled), true
	case "info":
		c := Fan(m, cmd.Raw, OpFirst)
		c.Fold = func(replies [][]byte) ([]byte, bool) {
			return allOK(replies, func() []byte { return mergeInfo(replies, clients) })
		}
		return c, true
	case "save", "bgsave", "bgrewriteaof":
		return all(OpFirst)
	case "config":
		switch sub {
		case "set":
			if nodeOwnConfig(args) {
				// The slot-0 master's, whose CONFIG GET answers.
				return Call{Kind: CallPlain, One: Part{Slot: m.First[0], Addr: m.Master(m.First[0]), Raw: cmd.Raw}}, true
			}
			c := Fan(m, cmd.Raw, OpFirst)
			c.Learn = func(failed bool) {
				r.intsetMax.Store(0) // read again (join.go)
				if !failed {
					r.LearnSlowlogMax(args) // slowlog.go
				}
			}
			return c, true
		case "resetstat", "rewrite":
			return all(OpFirst)
		}
	case "acl":
		switch sub {
		case "setuser", "deluser", "load", "save":
			return all(OpFirst)
		case "log":
			return aclLogCall(m, args, cmd.Raw), true // acllog.go
		}
	case "client":
		switch sub {
		case "pause", "unpause":
			c := Fan(m, cmd.Raw, OpFirst)
			c.Learn = func(failed bool) {
				if !failed {
					r.LearnPause(args) // pause.go
				}
			}
			return c, true
		}
	case "script", "function":
		if string(name) == "script" && sub == "exists" {
			// EVAL caches its script on the master of its keys only: a
			// script is known when any master knows it.
			c := Fan(m, cmd.Raw, OpFirst)
			c.Fold = func(replies [][]byte) ([]byte, bool) {
				return allOK(replies, func() []byte { return anyExists(replies) })
			}
			return c, true
		}
		if sub == "kill" {
			// The script runs on one master at most: its +OK, or else
			// the first master's NOTBUSY.
			c := Fan(m, cmd.Raw, OpFirst)
			c.Fold = anyOK
			return c, true
		}
	case "pubsub":
		return shardPubsub(m, sub, cmd.Raw) // shardinfo.go
	case "latency":
		switch sub {
		case "reset":
			return all(OpSum)
		case "histogram":
			c := Fan(m, cmd.Raw, OpFirst)
			c.Fold = mergeLatencyHistogram // latency.go
			return c, true
		case "latest":
			c := Fan(m, cmd.Raw, OpFirst)
			c.Fold = mergeLatencyLatest
			return c, true
		case "history":
			c := Fan(m, cmd.Raw, OpFirst)
			c.Fold = mergeLatencyHistory
			return c, true
		}
	case "slowlog":
		switch sub {
		case "reset":
			return all(OpFirst)
		case "len":
			// The masters' copies of a command the proxy sent to all of
			// them count once (slowlog.go).
			c := Fan(m, cmd.Raw, OpFirst)
			slowlogParts(&c)
			c.Fold = func(replies [][]byte) ([]byte, bool) {
				return allOK(replies, func() []byte { return slowlogLen(replies, r.SlowlogCap()) })
			}
			return c, true
		case "get":
			count := int64(10) // Redis's default
			if len(args) > 2 {
				// An invalid count is refused by every master.
				count, _ = strconv.ParseInt(string(args[2]), 10, 64)
			}
			c := Fan(m, cmd.Raw, OpFirst)
			slowlogParts(&c)
			c.Fold = func(replies [][]byte) ([]byte, bool) {
				if most := r.SlowlogCap(); most >= 0 && (count < 0 || count > most) {
					count = most // one Redis keeps that many at most
				}
				return allOK(replies, func() []byte { return mergeSlowlog(replies, count) })
			}
			return c, true
		}
	}
	return Call{}, false
}

var (
	helloCluster    = []byte("$4\r\nmode\r\n$7\r\ncluster\r\n")
	helloStandalone = []byte("$4\r\nmode\r\n$10\r\nstandalone\r\n")
)

// standaloneHello merges the replies of a HELLO sent on every connection
// of the client: the first error, or the first node's reply saying mode
// standalone, as INFO does.
func StandaloneHello(replies [][]byte) ([]byte, bool) {
	return allOK(replies, func() []byte { return bytes.Replace(replies[0], helloCluster, helloStandalone, 1) })
}

// anyExists merges the masters' SCRIPT EXISTS replies: 1 where any of
// them has 1.
func anyExists(replies [][]byte) []byte {
	var out []int64
	for _, r := range replies {
		vals, err := scalars(nil, r)
		if err != nil {
			return resp.ErrorReply(err)
		}
		if out == nil {
			out = make([]int64, len(vals))
		}
		for i, v := range vals {
			if i < len(out) && string(v) == "1" {
				out[i] = 1
			}
		}
	}
	b := redcon.AppendArray(nil, len(out))
	for _, v := range out {
		b = redcon.AppendInt(b, v)
	}
	return b
}

// anyOK returns the first +OK among replies, or else the first reply.
func anyOK(replies [][]byte) ([]byte, bool) {
	for _, r := range replies {
		if bytes.Equal(r, resp.ReplyOK) {
			return r, false
		}
	}
	return replies[0], IsError(replies[0])
}

// allOK returns the first error among replies, or else what merged makes.
func allOK(replies [][]byte, merged func() []byte) ([]byte, bool) {
	for _, r := range replies {
		if len(r) > 0 && (r[0] == '-' || r[0] == '!') {
			return r, true
		}
	}
	b := merged()
	return b, b[0] == '-'
}

// mergeSlowlog merges the masters' SLOWLOG GET replies (the first
// master's with the client's count, the others' whole): their entries
// without the other masters' copies of fanned commands and the proxy's
// own reads of their logs, newest first, count of them at most (all for
// a negative count).
//
// An entry's time is in whole seconds, and ids are each master's own, so
// two masters' entries of one second are ordered by the commands every
// master logged at the same point of the clients' commands: a fanned
// command (SLOWLOG RESET, CONFIG SET, ...), and a SLOWLOG GET or LEN
// through the proxy (the first master's, and the proxy's reads of the
// others, slowlogParts). Counted from the newest (a log that reached
// slowlog-max-len lost its oldest), an entry with k of them newer than it
// on its master is older than the k-th newest of any master, and newer
// than the k+1-th. Within that, a master's own entries keep their order.
func mergeSlowlog(replies [][]byte, count int64) []byte {
	type entry struct {
		id, at int64
		place  int64 // -2k for an entry with k marks newer than it; -(2k-1) for the k-th mark
		raw    []byte
	}
	var all []entry
	for i, r := range replies {
		raws, kinds, err := slowlogAll(r)
		if err != nil {
			return resp.ErrorReply(err)
		}
		var marks int64
		for j, raw := range raws { // newest first
			kind := kinds[j]
			mark := kind == entryFanned || (i == 0 && kind == entryLog) || (i > 0 && kind == entryRead)
			place := -2 * marks
			if mark {
				marks++
				place = -(2*marks - 1)
			}
			if i > 0 && (kind == entryFanned || kind == entryRead) {
				// The other masters' copies of what the proxy sent to all
				// of them, and its reads of their logs (slowlog.go).
				continue
			}
			e := entry{raw: raw, place: place}
			if _, fields, err := elements(e.raw); err == nil {
				e.id, fields = leadingInt(fields)
				e.at, _ = leadingInt(fields)
			}
			all = append(all, e)
		}
	}
	slices.SortStableFunc(all, func(a, b entry) int {
		if a.at != b.at {
			return -cmpInt(a.at, b.at)
		}
		if a.place != b.place {
			return -cmpInt(a.place, b.place)
		}
		return -cmpInt(a.id, b.id)
	})
	if count >= 0 && int64(len(all)) > count {
		all = all[:count]
	}
	b := redcon.AppendArray(nil, len(all))
	for _, e := range all {
		b = append(b, e.raw...)
	}
	return b
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// leadingInt reads the integer reply at the start of b and returns it and
// what follows it.
func leadingInt(b []byte) (int64, []byte) {
	i := bytes.IndexByte(b, '\n')
	if i < 1 || b[0] != ':' {
		return 0, b
	}
	n, _ := strconv.ParseInt(string(bytes.TrimSpace(b[1:i])), 10, 64)
	return n, b[i+1:]
}

// infoPart is one "# Name" section of INFO: its fields in the order
// first seen, and each field's values on the masters that have it.
type infoPart struct {
	name   string
	fields []string
	values map[string][]string
}

// mergeInfo merges the masters' INFO replies into what one Redis would
// answer: a standalone server (redis_mode:standalone, cluster_enabled:0)
// holding all the keys. Sections and fields are in the order of the first
// master's reply (then of the fields only others have). The figures of the
// whole data set are summed over the masters: the Keyspace lines (avg_ttl
// weighted by expires), the Stats counters, the Commandstats and
// Errorstats counts, used_memory and its kin, and the blocked clients.
// connected_clients is the proxy's own number of clients. Every other
// field (the server's version, uptime, replication, persistence, CPU) is
// the first master's that has it.
func mergeInfo(replies [][]byte, clients int64) []byte {
	var typ byte
	var sections []*infoPart
	index := map[string]*infoPart{}
	for _, r := range replies {
		t, body, ok := infoBody(r)
		if !ok {
			return r
		}
		typ = t
		var cur *infoPart
		for _, line := range strings.Split(body, "\r\n") {
			switch {
			case line == "":
				continue
			case strings.HasPrefix(line, "# "):
				name := line[2:]
				if cur = index[name]; cur == nil {
					cur = &infoPart{name: name, values: map[string][]string{}}
					index[name] = cur
					sections = append(sections, cur)
				}
				continue
			case cur == nil:
				cur = &infoPart{values: map[string][]string{}}
				index[""] = cur
				sections = append(sections, cur)
			}
			k, v, _ := strings.Cut(line, ":")
			if _, ok := cur.values[k]; !ok {
				cur.fields = append(cur.fields, k)
			}
			cur.values[k] = append(cur.values[k], v)
		}
	}
	var b strings.Builder
	for i, sec := range sections {
		if i > 0 {
			b.WriteString("\r\n")
		}
		if sec.name != "" {
			b.WriteString("# " + sec.name + "\r\n")
		}
		for _, k := range sec.fields {
			b.WriteString(k + ":" + mergeField(sec, k, clients) + "\r\n")
		}
	}
	body := b.String()
	if typ == '=' {
		out := []byte("=")
		out = strconv.AppendInt(out, int64(len(body)+4), 10)
		return append(append(append(out, "\r\ntxt:"...), body...), "\r\n"...)
	}
	return redcon.AppendBulkString(nil, body)
}

// infoBody returns the text of an INFO reply: a bulk string, or in RESP3 a
// verbatim string.
func infoBody(r []byte) (byte, string, bool) {
	if len(r) == 0 || (r[0] != '$' && r[0] != '=') {
		return 0, "", false
	}
	i := bytes.IndexByte(r, '\n')
	if i < 0 {
		return 0, "", false
	}
	n, ok := resp.ParseLength(r[1 : i+1])
	if !ok || n < 0 || len(r) < i+1+int(n) {
		return 0, "", false
	}
	body := string(r[i+1 : i+1+int(n)])
	if r[0] == '=' {
		body = strings.TrimPrefix(body, "txt:")
	}
	return r[0], body, true
}

// Fields of INFO summed over the masters, by section (see mergeInfo).
var (
	summedMemory  = []string{"used_memory", "used_memory_rss", "used_memory_peak", "used_memory_overhead", "used_memory_dataset"}
	summedClients = []string{"blocked_clients", "clients_in_timeout_table", "pubsub_clients", "watching_clients", "total_blocking_keys", "total_watched_keys"}
)

// mergeField makes the value of field k of sec from the masters' values.
func mergeField(sec *infoPart, k string, clients int64) string {
	vals := sec.values[k]
	switch strings.ToLower(sec.name) {
	case "server":
		if k == "redis_mode" {
			return "standalone"
		}
	case "cluster":
		if k == "cluster_enabled" {
			return "0"
		}
	case "clients":
		if k == "connected_clients" {
			return strconv.FormatInt(clients, 10)
		}
		if k == "tracking_clients" {
			return maxInts(vals) // a tracking client tracks on every master
		}
		if slices.Contains(summedClients, k) {
			return sumInts(vals)
		}
	case "persistence":
		if k == "rdb_changes_since_last_save" {
			return sumInts(vals) // the writes of all the keys
		}
	case "memory":
		if slices.Contains(summedMemory, k) {
			return sumInts(vals)
		}
		if base, ok := strings.CutSuffix(k, "_human"); ok && slices.Contains(summedMemory, base) {
			n, _ := strconv.ParseInt(sumInts(sec.values[base]), 10, 64)
			return humanBytes(n)
		}
	case "stats":
		if k == "latest_fork_usec" {
			break
		}
		if k == "tracking_total_prefixes" {
			return maxInts(vals) // a BCAST prefix is on every master
		}
		if strings.HasPrefix(k, "instantaneous_") && strings.Contains(vals[0], ".") {
			var sum float64
			for _, v := range vals {
				f, _ := strconv.ParseFloat(v, 64)
				sum += f
			}
			return strconv.FormatFloat(sum, 'f', 2, 64)
		}
		if _, err := strconv.ParseInt(vals[0], 10, 64); err == nil {
			return sumInts(vals)
		}
	case "keyspace", "commandstats", "errorstats":
		return sumPairs(vals)
	}
	return vals[0]
}

// maxInts returns the largest of integers; a value that is not one is
// taken as 0.
func maxInts(vals []string) string {
	var most int64
	for _, v := range vals {
		n, _ := strconv.ParseInt(v, 10, 64)
		most = max(most, n)
	}
	return strconv.FormatInt(most, 10)
}

// sumInts adds integers; a value that is not one is taken as 0.
func sumInts(vals []string) string {
	var sum int64
	for _, v := range vals {
		n, _ := strconv.ParseInt(v, 10, 64)
		sum += n
	}
	return strconv.FormatInt(sum, 10)
}

// sumPairs adds "name=value,..." lists (a Keyspace, Commandstats or
// Errorstats line) field by field: integers are summed, avg_ttl is the
// mean weighted by expires, usec_per_call is usec over calls; any other
// field is the first value's.
func sumPairs(vals []string) string {
	var names []string
	sums := map[string]int64{}
	first := map[string]string{}
	var ttlWeighted float64
	for _, v := range vals {
		var expires, ttl int64
		for _, f := range strings.Split(v, ",") {
			name, num, _ := strings.Cut(f, "=")
			if _, ok := first[name]; !ok {
				names = append(names, name)
				first[name] = num
			}
			n, err := strconv.ParseInt(num, 10, 64)
			if err != nil {
				continue
			}
			sums[name] += n
			switch name {
			case "expires":
				expires = n
			case "avg_ttl":
				ttl = n
			}
		}
		ttlWeighted += float64(ttl) * float64(expires)
	}
	var b strings.Builder
	for i, name := range names {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(name + "=")
		switch {
		case name == "avg_ttl":
			avg := int64(0)
			if e := sums["expires"]; e > 0 {
				avg = int64(math.Round(ttlWeighted / float64(e)))
			}
			b.WriteString(strconv.FormatInt(avg, 10))
		case name == "usec_per_call":
			per := 0.0
			if c := sums["calls"]; c > 0 {
				per = float64(sums["usec"]) / float64(c)
			}
			b.WriteString(strconv.FormatFloat(per, 'f', 2, 64))
		default:
			if _, err := strconv.ParseInt(first[name], 10, 64); err == nil {
				b.WriteString(strconv.FormatInt(sums[name], 10))
			} else {
				b.WriteString(first[name])
			}
		}
	}
	return b.String()
}

// humanBytes writes n as Redis's INFO does (bytesToHuman): 1023B, 1.00K,
// 12.50M, ...
func humanBytes(n int64) string {
	const k = 1024
	d := float64(n)
	switch {
	case n < k:
		return strconv.FormatInt(n, 10) + "B"
	case n < k*k:
		return fmt.Sprintf("%.2fK", d/k)
	case n < k*k*k:
		return fmt.Sprintf("%.2fM", d/(k*k))
	case n < k*k*k*k:
		return fmt.Sprintf("%.2fG", d/(k*k*k))
	case n < k*k*k*k*k:
		return fmt.Sprintf("%.2fT", d/(k*k*k*k))
	case n < k*k*k*k*k*k:
		return fmt.Sprintf("%.2fP", d/(k*k*k*k*k))
	}
	return strconv.FormatInt(n, 10) + "B"
}

// nodeOwnConfigs are the parameters that are each node's own: its
// address, files and announced identity. One master's value set on every
// master would have them listen on one port, or write in one folder.
var nodeOwnConfigs = []string{"port", "tls-port", "bind", "bind-source-addr", "unixsocket", "unixsocketperm",
	"dir", "logfile", "pidfile", "cluster-port", "cluster-announce-ip", "cluster-announce-port",
	"cluster-announce-bus-port", "cluster-announce-tls-port", "cluster-announce-hostname",
	"replica-announce-ip", "replica-announce-port", "slave-announce-ip", "slave-announce-port"}

// nodeOwnConfig reports whether a CONFIG SET sets only parameters that
// are each node's own (nodeOwnConfigs): it goes to the slot-0 master
// only, whose CONFIG GET the client reads. One that sets others too goes
// to every master, as any CONFIG SET.
func nodeOwnConfig(args [][]byte) bool {
	if len(args) < 4 || len(args)%2 != 0 {
		return false
	}
	for i := 2; i < len(args); i += 2 {
		if !slices.Contains(nodeOwnConfigs, strings.ToLower(string(args[i]))) {
			return false
		}
	}
	return true
}
