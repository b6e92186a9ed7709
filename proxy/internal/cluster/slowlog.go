package cluster

import (
	"bytes"
	"strconv"

	"github.com/tidwall/redcon"

	"github.com/lockproxy/lockproxy/proxy/internal/resp"
)

// The slow log in front of a Redis Cluster. A command the proxy applies
// to every master (CONFIG SET, SLOWLOG RESET, FLUSHALL, ...) is logged by
// each of them, so the masters' logs together would hold one copy per
// master of what one Redis logs once. The merged SLOWLOG GET and SLOWLOG
// LEN keep the first master's entry of such a command (the slot-0 master,
// which every fanned command reaches first) and leave out the other
// masters' copies. The other masters' logs are read whole (SLOWLOG GET -1,
// at most slowlog-max-len entries each), so that leaving copies out does
// not leave out older entries of theirs that belong among the newest;
// those reads are logged by the masters too, and left out likewise. The
// copies still order the masters' entries of one second (mergeSlowlog).

// The merged log holds at most slowlog-max-len entries, as one Redis's
// does, when the proxy knows it: from the last CONFIG SET of it that went
// through the proxy (applied to every master); a value set on the masters
// directly is not seen.

// LearnSlowlogMax records slowlog-max-len from a CONFIG SET that
// succeeded.
func (r *Router) LearnSlowlogMax(args [][]byte) {
	for i := 2; i+1 < len(args); i += 2 {
		if bytes.EqualFold(args[i], []byte("slowlog-max-len")) {
			if n, err := strconv.ParseInt(string(args[i+1]), 10, 64); err == nil && n >= 0 {
				r.slowlogMax.Store(n + 1)
			}
		}
	}
}

// SlowlogCap returns slowlog-max-len as last set through the proxy, -1
// when it is not known.
func (r *Router) SlowlogCap() int64 { return r.slowlogMax.Load() - 1 }

// cmdSlowlogAll reads a master's whole slow log.
var cmdSlowlogAll = []byte("*3\r\n$7\r\nSLOWLOG\r\n$3\r\nGET\r\n$2\r\n-1\r\n")

// slowlogParts sends the client's SLOWLOG command to the first master of
// c, and SLOWLOG GET -1 to the others.
func slowlogParts(c *Call) {
	for i := 1; i < len(c.Parts); i++ {
		c.Parts[i].Raw = cmdSlowlogAll
	}
}

// slowlogLen answers SLOWLOG LEN from the first master's LEN and the
// other masters' entries that are not copies.
func slowlogLen(replies [][]byte, most int64) []byte {
	n, _ := leadingInt(replies[0])
	for _, r := range replies[1:] {
		entries, err := slowlogEntries(r, true)
		if err != nil {
			return resp.ErrorReply(err)
		}
		n += int64(len(entries))
	}
	if most >= 0 {
		n = min(n, most) // one Redis keeps slowlog-max-len entries at most
	}
	return redcon.AppendInt(nil, n)
}

// slowlogEntries splits a SLOWLOG GET reply into its entries; with
// dropCopies, the entries of the commands the proxy applies to every
// master, and of its reads of the masters' logs, are left out.
func slowlogEntries(r []byte, dropCopies bool) ([][]byte, error) {
	raws, kinds, err := slowlogAll(r)
	if err != nil || !dropCopies {
		return raws, err
	}
	out := raws[:0]
	for i, raw := range raws {
		if kinds[i] != entryFanned && kinds[i] != entryRead {
			out = append(out, raw)
		}
	}
	return out, nil
}

// What a slow log entry is, for merging the masters' logs.
const (
	entryOwn    = iota // a command of a client's
	entryFanned        // a command the proxy sends to every master
	entryRead          // the proxy's SLOWLOG GET -1 of a master's whole log
	entryLog           // another SLOWLOG GET or LEN: a client's, on the first master
)

// slowlogAll splits a SLOWLOG GET reply into its entries and says what
// each is.
func slowlogAll(r []byte) ([][]byte, []int, error) {
	n, elems, err := elements(r)
	if err != nil {
		return nil, nil, err
	}
	var out [][]byte
	var kinds []int
	for range n {
		k, err := valueLen(elems)
		if err != nil {
			return nil, nil, err
		}
		out = append(out, elems[:k])
		kinds = append(kinds, entryKind(elems[:k]))
		elems = elems[k:]
	}
	return out, kinds, nil
}

// entryKind says what a slow log entry (id, time, duration, arguments,
// ...) is. The proxy's reads are SLOWLOG GET -1 as it sends them
// (cmdSlowlogAll); a client's SLOWLOG GET goes to the first master only.
func entryKind(e []byte) int {
	_, b, err := elements(e)
	if err != nil {
		return entryOwn
	}
	for range 3 { // id, time, duration
		k, err := valueLen(b)
		if err != nil {
			return entryOwn
		}
		b = b[k:]
	}
	n, b, err := elements(b)
	if err != nil {
		return entryOwn
	}
	args, err := scalarsUpTo(b, min(n, 3))
	if err != nil || len(args) == 0 {
		return entryOwn
	}
	if len(args) == 3 && string(args[0]) == "SLOWLOG" && string(args[1]) == "GET" && string(args[2]) == "-1" {
		return entryRead
	}
	var nb [24]byte
	name := resp.Lower(&nb, args[0])
	if resp.Of(name, args).Has(resp.Fanned) {
		return entryFanned
	}
	if string(name) == "slowlog" && len(args) > 1 && (bytes.EqualFold(args[1], []byte("get")) || bytes.EqualFold(args[1], []byte("len"))) {
		return entryLog
	}
	return entryOwn
}

// scalarsUpTo reads at most n scalars at the start of b.
func scalarsUpTo(b []byte, n int) ([][]byte, error) {
	var out [][]byte
	for len(out) < n && len(b) > 0 {
		var err error
		if out, b, err = scalarsAt(out, b); err != nil {
			return out, err
		}
	}
	return out, nil
}
