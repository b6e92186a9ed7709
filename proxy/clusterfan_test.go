package proxy

import (
	"crypto/sha1"
	"fmt"
	"math/rand/v2"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/internal/redistest"
	"github.com/lockproxy/lockproxy/proxy/internal/cluster"
)

// startClusterServer starts a cluster of 3 masters, one standalone Redis
// to compare with, and a proxy in front of the cluster that has its own
// commands (testDocs) and INFO section, as main wires it.
func startClusterServer(t *testing.T) (*redistest.Cluster, *redistest.Server, string, *Proxy) {
	t.Helper()
	c := redistest.StartCluster(t, 3, 0)
	srv := redistest.Start(t)
	addr, p := startProxy(t, "", func(cfg *Config) {
		cfg.Backend.Cluster = c.Seeds()[:2]
		cfg.Docs = testDocs
		cfg.Info = func() string { return "answer:42\r\n" }
	})
	return c, srv, addr, p
}

// keyOn returns a key with prefix whose slot is served by the i-th master
// of a cluster made by StartCluster (the i-th third of the slots).
func keyOn(i int, prefix string) string {
	for n := 0; ; n++ {
		k := fmt.Sprintf("%s%d", prefix, n)
		if cluster.KeySlot([]byte(k))*3/cluster.NumSlots == i {
			return k
		}
	}
}

// TestClusterServerCommands checks the commands about the whole server in
// front of a cluster: COMMAND and INFO as one Redis answers them, and the
// commands that set server state applied on every master.
func TestClusterServerCommands(t *testing.T) {
	c, srv, addr, p := startClusterServer(t)
	masters := c.Nodes[:c.Masters]

	t.Run("COMMAND", func(t *testing.T) {
		// The answers are the slot-0 master's: the order of COMMAND and
		// COMMAND LIST differs from one process to another.
		checkOwnCommands(t, dial(t, c.Nodes[0].Addr), dial(t, addr))
		direct, a := dial(t, c.Nodes[0].Addr), dial(t, addr)
		want := string(direct.do(args("COMMAND")))
		i := strings.Index(want, "\r\n")
		n, _ := strconv.Atoi(want[1:i])
		want = "*" + strconv.Itoa(n+1) + want[i:] + "*1\r\n$9\r\ninfo:lock\r\n"
		if got := string(a.do(args("COMMAND"))); got != want {
			t.Errorf("COMMAND: %q", trunc([]byte(got)))
		}
		one := dial(t, srv.Addr)
		for _, cmd := range []string{"COMMAND DOCS get", "COMMAND INFO get set", "COMMAND GETKEYS MSET a 1 b 2", "COMMAND COUNT x", "COMMAND NOSUCH"} {
			if got, want := string(a.do(args(cmd))), string(one.do(args(cmd))); got != want {
				t.Errorf("%s: %q, want %q", cmd, trunc([]byte(got)), trunc([]byte(want)))
			}
		}
	})

	t.Run("INFO", func(t *testing.T) {
		flushCluster(t, c)
		mustFlush(t, srv)
		direct, a := dial(t, srv.Addr), dial(t, addr)
		var cmds [][]string
		for i := range 30 {
			cmds = append(cmds, args(fmt.Sprintf("SET info:%d v", i)))
			if i%3 == 0 {
				cmds = append(cmds, args(fmt.Sprintf("EXPIRE info:%d 1000", i)))
			}
		}
		direct.do(cmds...)
		a.do(cmds...)
		// avg_ttl is an estimate that changes with time, and so the
		// reply's length.
		ttl := regexp.MustCompile(`avg_ttl=\d+|^[$=]\d+`)
		for _, cmd := range []string{"INFO keyspace", "INFO KEYSPACE", "INFO nosuchsection", "HELLO 3", "INFO keyspace"} {
			got := ttl.ReplaceAllString(string(mask(a.do(args(cmd)))), "<masked>")
			want := ttl.ReplaceAllString(string(mask(direct.do(args(cmd)))), "<masked>")
			if got != want {
				t.Errorf("%s: %q, want %q", cmd, got, want)
			}
		}
		a.do(args("HELLO 2"))
		all := string(a.do(args("INFO")))
		for _, want := range []string{"\r\nredis_mode:standalone\r\n", "\r\ncluster_enabled:0\r\n",
			"\r\ndb0:keys=30,expires=10,", "# Server\r\n", "\r\n\r\n# Keyspace\r\n"} {
			if !strings.Contains(all, want) {
				t.Errorf("INFO lacks %q: %q", want, trunc([]byte(all)))
			}
		}
		// The proxy's clients, not the masters' connections.
		if m := regexp.MustCompile(`\r\nconnected_clients:(\d+)\r\n`).FindStringSubmatch(all); m == nil || m[1] != strconv.FormatInt(p.clients.Load(), 10) {
			t.Errorf("INFO connected_clients: %q, the proxy has %d", m, p.clients.Load())
		}
		if strings.Contains(all, "cluster_enabled:1") || strings.Contains(all, "redis_mode:cluster") {
			t.Errorf("INFO says cluster: %q", all)
		}
		// The command counts of the three masters are summed.
		stats := string(a.do(args("INFO commandstats")))
		if m := regexp.MustCompile(`cmdstat_set:calls=(\d+),`).FindStringSubmatch(stats); m == nil || m[1] != "30" {
			t.Errorf("INFO commandstats: %q", stats)
		}
		// One section only, as Redis answers.
		server := string(a.do(args("INFO server")))
		if strings.Count(server, "# ") != 1 || !strings.Contains(server, "redis_mode:standalone") {
			t.Errorf("INFO server: %q", server)
		}
		if got := string(a.do(args("INFO lockproxy"))); !strings.Contains(got, "answer:42\r\n") {
			t.Errorf("INFO lockproxy: %q", got)
		}
	})

	t.Run("SCRIPT EXISTS", func(t *testing.T) {
		// EVAL caches the script where its key is: on one master.
		compareCluster(t, srv, c, addr, []step{
			cmdArgs("a", "EVAL", "return 7", "1", keyOn(2, "k")),
			send("a", "SCRIPT EXISTS 0fb4b3ad2b9af1aea2eba0b6f3b5a2b7a3c7b4b5 "+sha1hex("return 7")+" nosuch", "SCRIPT EXISTS", "SCRIPT FLUSH",
				"SCRIPT EXISTS "+sha1hex("return 7"))})
	})

	t.Run("SCAN errors", func(t *testing.T) {
		compareCluster(t, srv, c, addr, []step{send("a", "SCAN abc", "SCAN 0 COUNT 0", "SCAN 0 COUNT x",
			"SCAN 0 FOO bar", "SCAN", "SCAN 0 MATCH")})
	})

	t.Run("READONLY", func(t *testing.T) {
		compareCluster(t, srv, c, addr, []step{send("a", "READONLY", "READWRITE", "GET k")})
	})

	t.Run("CONFIG", func(t *testing.T) {
		compareCluster(t, srv, c, addr, []step{send("a",
			"CONFIG SET maxmemory-policy allkeys-lru", "CONFIG GET maxmemory-policy",
			"CONFIG SET maxmemory-policy nosuch", "CONFIG SET", "CONFIG RESETSTAT",
			"CONFIG SET maxmemory-policy noeviction")})
		a := dial(t, addr)
		a.do(args("CONFIG SET maxmemory-policy volatile-lfu"))
		defer a.do(args("CONFIG SET maxmemory-policy noeviction"))
		for _, m := range masters {
			if got := string(dial(t, m.Addr).do(args("CONFIG GET maxmemory-policy"))); !strings.Contains(got, "volatile-lfu") {
				t.Errorf("%s: maxmemory-policy %q", m.Addr, got)
			}
		}
	})

	t.Run("ACL", func(t *testing.T) {
		compareCluster(t, srv, c, addr, []step{send("a",
			"ACL SETUSER alice on >pw ~* +@all", "ACL SETUSER alice nosuchrule", "AUTH alice pw",
			"GET "+keyOn(1, "k"), "GET "+keyOn(2, "k"), "AUTH default x")})
		for _, m := range masters {
			if got := string(dial(t, m.Addr).do(args("ACL USERS"))); !strings.Contains(got, "alice") {
				t.Errorf("%s: ACL USERS %q", m.Addr, got)
			}
		}
		compareCluster(t, srv, c, addr, []step{send("a", "ACL DELUSER alice nobody", "ACL DELUSER alice")})
		for _, m := range masters {
			if got := string(dial(t, m.Addr).do(args("ACL USERS"))); strings.Contains(got, "alice") {
				t.Errorf("%s: ACL USERS %q after DELUSER", m.Addr, got)
			}
		}
	})

	t.Run("SLOWLOG", func(t *testing.T) {
		a := dial(t, addr)
		a.do(args("CONFIG SET slowlog-log-slower-than 0"))
		a.do(args("SLOWLOG RESET"))
		keys := []string{keyOn(0, "slow"), keyOn(1, "slow"), keyOn(2, "slow")}
		for i, k := range keys {
			if i > 0 {
				time.Sleep(1050 * time.Millisecond) // a new second for each entry's time
			}
			a.do(args("SET " + k + " 1"))
		}
		a.do(args("CONFIG SET slowlog-log-slower-than 10000"))
		got := string(a.do(args("SLOWLOG GET -1")))
		// Newest first: the three SETs, on three masters, in reverse.
		i0, i1, i2 := strings.Index(got, keys[0]), strings.Index(got, keys[1]), strings.Index(got, keys[2])
		if i0 < 0 || i1 < 0 || i2 < 0 || !(i2 < i1 && i1 < i0) {
			t.Errorf("SLOWLOG GET -1 is not the three masters' entries, newest first: %q", got)
		}
		// The SLOWLOG RESET each master logged counts once, as on one
		// Redis: it and the three SETs.
		if n := strings.Count(strings.ToLower(got), "$5\r\nreset\r\n"); n != 1 {
			t.Errorf("SLOWLOG GET -1 has %d SLOWLOG RESET entries, want 1: %q", n, got)
		}
		if got := string(a.do(args("SLOWLOG LEN"))); got != ":4\r\n" {
			t.Errorf("SLOWLOG LEN %q, want 4", got)
		}
		if got := string(a.do(args("SLOWLOG GET 2"))); !strings.HasPrefix(got, "*2\r\n") {
			t.Errorf("SLOWLOG GET 2: %q", got)
		}
		if got := string(a.do(args("SLOWLOG RESET"), args("SLOWLOG LEN"), args("SLOWLOG GET"))); got != "+OK\r\n:0\r\n*0\r\n" {
			t.Errorf("SLOWLOG RESET, LEN, GET: %q", got)
		}
	})

	t.Run("CLIENT PAUSE, SCRIPT KILL", func(t *testing.T) {
		compareCluster(t, srv, c, addr, []step{send("a", "CLIENT PAUSE 100000 WRITE", "CLIENT UNPAUSE", "SCRIPT KILL", "FUNCTION KILL")})
		// Writes wait on every master until CLIENT UNPAUSE.
		a := dial(t, addr)
		a.do(args("CLIENT PAUSE 100000 WRITE"))
		var direct []*client
		for i, m := range masters {
			d := dial(t, m.Addr)
			d.send(encode(args("SET " + keyOn(i, "paused") + " 1")))
			if b, err := d.tryRead(1, 200*time.Millisecond); err == nil {
				t.Errorf("%s: a write during CLIENT PAUSE answered %q", m.Addr, b)
			}
			direct = append(direct, d)
		}
		a.do(args("CLIENT UNPAUSE"))
		for _, d := range direct {
			if got := string(d.read(1)); got != "+OK\r\n" {
				t.Errorf("write after CLIENT UNPAUSE: %q", got)
			}
		}
	})

	t.Run("requirepass", func(t *testing.T) {
		// Set last: the proxy's own connections to the nodes have no
		// password (backend.password is not set).
		defer func() {
			for _, m := range masters {
				raw := dial(t, m.Addr)
				raw.do(args("AUTH x"), []string{"CONFIG", "SET", "requirepass", ""})
			}
		}()
		a := dial(t, addr)
		a.do(args("GET " + keyOn(0, "k")))
		start := time.Now()
		got := string(a.do(args("CONFIG SET requirepass x"), args("AUTH x"),
			args("GET "+keyOn(1, "k")), args("SET "+keyOn(2, "k")+" v"), args("GET "+keyOn(2, "k"))))
		if took := time.Since(start); got != "+OK\r\n+OK\r\n$-1\r\n+OK\r\n$1\r\nv\r\n" || took > time.Second {
			t.Errorf("CONFIG SET requirepass, AUTH, GET: %q after %v", got, took)
		}
		for _, m := range masters {
			if got, _ := m.Do("GET", "k"); !strings.HasPrefix(got, "-NOAUTH") {
				t.Errorf("%s without a password: %q", m.Addr, got)
			}
		}
		// A new client authenticates as with one Redis.
		b := dial(t, addr)
		if got := string(b.do(args("GET "+keyOn(2, "k")), args("AUTH x"), args("GET "+keyOn(2, "k")))); got != "-NOAUTH Authentication required.\r\n+OK\r\n$1\r\nv\r\n" {
			t.Errorf("new client: %q", got)
		}
		// A node that refuses the client's AUTH on a new connection: the
		// client hears at once, with the node's whole error.
		cl := dial(t, addr)
		cl.do(args("AUTH x"))
		raw := dial(t, masters[2].Addr)
		raw.do(args("AUTH x"), []string{"CONFIG", "SET", "requirepass", ""})
		start = time.Now()
		got = string(cl.do(args("GET " + keyOn(2, "k"))))
		want := "-ERR backend unavailable: AUTH: ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?\r\n"
		if took := time.Since(start); got != want || took > time.Second {
			t.Errorf("refused AUTH: %q after %v, want %q at once", got, took, want)
		}
	})
}

// TestClusterCrossSlotReads compares the set and sorted-set reads whose
// keys are on three masters with one Redis holding the same keys.
func TestClusterCrossSlotReads(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	srv := redistest.Start(t)
	addr, _ := startClusterProxy(t, c)
	r := strings.NewReplacer("s0", keyOn(0, "s"), "s1", keyOn(1, "s"), "s2", keyOn(2, "s"),
		"z0", keyOn(0, "z"), "z1", keyOn(1, "z"), "z2", keyOn(2, "z"),
		"none", keyOn(2, "none"), "str", keyOn(1, "str"), "lcsa", keyOn(0, "lcsa"), "lcsb", keyOn(2, "lcsb"))
	cmds := func(list ...string) []string {
		for i, l := range list {
			list[i] = r.Replace(l)
		}
		return list
	}
	data := cmds("SADD s0 1 2 3 4 5", "SADD s1 3 4 5 6", "SADD s2 5 4 10 -3", "SET str x",
		"ZADD z0 1 a 2 b 3 c", "ZADD z1 2 b 3 c 4 d 0.1 e", "ZADD z2 -1 c 5 a inf f")
	sets := cmds("SINTER s0 s1 s2", "SUNION s0 s1 s2", "SDIFF s0 s1 s2", "SDIFF s1 s0", "SDIFF s0 none s1",
		"SINTERCARD 3 s0 s1 s2", "SINTERCARD 2 s0 s1 LIMIT 1", "SINTERCARD 2 s0 s1 LIMIT -1",
		"SINTERCARD 2 s0 s1 FOO", "SINTERCARD 2 s0 s1 LIMIT", "SINTERCARD 3 s0 none str",
		"SINTER s0 none s1", "SINTER s0 none str", "SINTER s0 str none", "SUNION s0 none",
		"SUNION none str", "SDIFF none s0", "SDIFF s0 none", "SDIFF s0 s0", "SUNION s0 z0")
	zsets := cmds("ZUNION 3 z0 z1 z2 WITHSCORES", "ZUNION 2 z0 z1", "ZINTER 2 z0 z1 WITHSCORES",
		"ZINTER 2 z0 z1 WEIGHTS 2 0.5 AGGREGATE MAX WITHSCORES", "ZUNION 3 z0 z1 s0 WEIGHTS 1 2 3 AGGREGATE MIN WITHSCORES",
		"ZINTER 2 s0 s1 WITHSCORES", "ZDIFF 2 z0 z1 WITHSCORES", "ZDIFF 3 z0 none z2", "ZINTERCARD 2 z0 z1",
		"ZINTERCARD 2 z0 z1 LIMIT 1", "ZINTERCARD 2 z0 z1 LIMIT -2", "ZUNION 2 z0 z1 WEIGHTS 1 x",
		"ZUNION 2 z0 z1 AGGREGATE foo", "ZDIFF 2 z0 z1 WEIGHTS 1 1", "ZUNION 2 z0 str", "ZUNION 2 str z0 WEIGHTS x",
		"ZINTER 2 z0 none WITHSCORES", "ZUNION 2 z2 z0 WEIGHTS 0 1 WITHSCORES", "ZUNION 2 z2 z1 WEIGHTS -1 3 WITHSCORES",
		"ZINTER 3 z0 z1 z2 AGGREGATE SUM WITHSCORES",
		"SET lcsa ohmytext", "SET lcsb mynewtext", "LCS lcsa lcsb", "LCS lcsa lcsb LEN", "LCS lcsa lcsb IDX",
		"LCS lcsa lcsb IDX MINMATCHLEN 4 WITHMATCHLEN", "LCS lcsa lcsb IDX WITHMATCHLEN", "LCS lcsa lcsb LEN IDX",
		"LCS lcsa none", "LCS lcsa none IDX", "LCS lcsa s0", "LCS lcsa lcsb MINMATCHLEN x IDX", "LCS lcsa lcsb FOO",
		"SET lcsa abcabcXYZabababab", "SET lcsb bacbacZYXbbaab", "LCS lcsa lcsb", "LCS lcsa lcsb IDX WITHMATCHLEN")
	t.Run("RESP2", func(t *testing.T) {
		compareCluster(t, srv, c, addr, []step{send("a", data...), send("a", sets...), send("a", zsets...)})
	})
	t.Run("RESP3", func(t *testing.T) {
		compareCluster(t, srv, c, addr, []step{send("a", "HELLO 3"), send("a", data...), send("a", sets...), send("a", zsets...)})
	})
	t.Run("LCS of random strings", func(t *testing.T) {
		direct, a := dial(t, srv.Addr), dial(t, addr)
		rnd := rand.New(rand.NewPCG(1, 2))
		word := func() string {
			b := make([]byte, rnd.IntN(40))
			for i := range b {
				b[i] = "abc"[rnd.IntN(3)]
			}
			return string(b)
		}
		for range 50 {
			x, y := word(), word()
			cmds := [][]string{{"SET", r.Replace("lcsa"), x}, {"SET", r.Replace("lcsb"), y},
				args(r.Replace("LCS lcsa lcsb")), args(r.Replace("LCS lcsa lcsb IDX WITHMATCHLEN MINMATCHLEN 2"))}
			if got, want := string(a.do(cmds...)), string(direct.do(cmds...)); got != want {
				t.Fatalf("LCS %q %q: %q, want %q", x, y, got, want)
			}
		}
	})
	t.Run("PFCOUNT", func(t *testing.T) {
		direct, a := dial(t, srv.Addr), dial(t, addr)
		h := []string{keyOn(0, "hll"), keyOn(1, "hll"), keyOn(2, "hll")}
		var cmds [][]string
		// Sparse ones, and a dense one (more than hll-sparse-max-bytes).
		for i, n := range []int{10, 300, 20000} {
			add := []string{"PFADD", h[i]}
			for e := range n {
				add = append(add, fmt.Sprintf("e%d", e*(i+1)))
			}
			cmds = append(cmds, add)
		}
		for _, q := range []string{"PFCOUNT h0 h1", "PFCOUNT h0 h1 h2", "PFCOUNT h2 none h0", "PFCOUNT h0 str", "PFCOUNT h0 s0"} {
			cmds = append(cmds, args(strings.NewReplacer("h0", h[0], "h1", h[1], "h2", h[2]).Replace(r.Replace(q))))
		}
		cmds = append(cmds, args(r.Replace("SET str x")), args(r.Replace("SADD s0 1")))
		cmds = append(cmds, cmds[len(cmds)-4:len(cmds)-2]...)
		if got, want := string(a.do(cmds...)), string(direct.do(cmds...)); got != want {
			t.Errorf("PFCOUNT: %q, want %q", got, want)
		}
	})
	// Members that are not integers: Redis's order is a hash table's, so
	// the members are compared as sets.
	t.Run("unordered", func(t *testing.T) {
		flushCluster(t, c)
		mustFlush(t, srv)
		direct, a := dial(t, srv.Addr), dial(t, addr)
		words := cmds("SADD s0 a b c x1", "SADD s1 b c d", "SADD s2 c 7 b")
		direct.do(argsAll(words)...)
		a.do(argsAll(words)...)
		for _, cmd := range cmds("SINTER s0 s1 s2", "SUNION s0 s1 s2", "SDIFF s0 s1", "SDIFF s0 s2") {
			got, want := sortedElems(t, a.do(args(cmd))), sortedElems(t, direct.do(args(cmd)))
			if got != want {
				t.Errorf("%s: %q, want %q", cmd, got, want)
			}
		}
	})
}

func sha1hex(s string) string { return fmt.Sprintf("%x", sha1.Sum([]byte(s))) }

func argsAll(cmds []string) [][]string {
	var out [][]string
	for _, c := range cmds {
		out = append(out, args(c))
	}
	return out
}

// sortedElems returns an array reply's header and its elements, sorted.
func sortedElems(t *testing.T, reply []byte) string {
	t.Helper()
	head, body, ok := strings.Cut(string(reply), "\r\n")
	if !ok {
		t.Fatalf("not an array: %q", reply)
	}
	var elems []string
	for e := range strings.SplitSeq(strings.TrimSuffix(body, "\r\n"), "\r\n") {
		if !strings.HasPrefix(e, "$") {
			elems = append(elems, e)
		}
	}
	slices.Sort(elems)
	return head + " " + strings.Join(elems, ",")
}

// TestClusterSortPatterns compares SORT with BY and GET patterns, which a
// cluster node refuses, with one Redis holding the same keys.
func TestClusterSortPatterns(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	srv := redistest.Start(t)
	addr, _ := startClusterProxy(t, c)
	data := []string{"RPUSH mylist 3 1 2 10", "SET w_3 30", "SET w_1 100", "SET w_2 -5", "SET w_10 7.5",
		"HSET obj_1 name one", "HSET obj_2 name two", "HSET obj_3 name three", "SET obj_10 str",
		"SADD myset 5 4 9", "SET w_5 1", "ZADD myzset 1 x 2 y 3 z", "SET w_x 2", "SET str v"}
	queries := []string{"SORT mylist BY w_*", "SORT mylist BY w_* DESC", "SORT mylist BY w_* GET #",
		"SORT mylist BY w_* GET obj_*->name GET #", "SORT mylist GET obj_*->name", "SORT mylist BY w_* LIMIT 1 2",
		"SORT mylist BY w_* LIMIT 5 2", "SORT mylist BY w_* LIMIT -1 -1 GET #", "SORT mylist BY nosort GET obj_*->name",
		"SORT mylist BY nosort DESC GET #", "SORT mylist BY nosort LIMIT 1 2 GET #", "SORT mylist BY nosort DESC LIMIT 1 2 GET #",
		"SORT myset BY w_* GET #", "SORT myset GET # GET w_*", "SORT myzset BY nosort GET #", "SORT myzset BY nosort DESC LIMIT 0 2 GET #",
		"SORT myzset BY w_* GET #", "SORT mylist BY w_* ALPHA", "SORT mylist BY obj_*->name ALPHA GET #",
		"SORT mylist BY obj_*->name ALPHA DESC GET # GET obj_*", "SORT_RO mylist BY w_* GET #", "SORT mylist GET nostar",
		"SORT mylist BY w_* LIMIT x 1", "SORT mylist GET", "SORT mylist BY w_* FOO", "SORT_RO mylist BY w_* STORE x",
		"SORT str BY w_*", "SORT none BY w_* GET #", "SORT mylist BY obj_*->name", "SET w_1 notnum", "SORT mylist BY w_*"}
	t.Run("RESP2", func(t *testing.T) {
		compareCluster(t, srv, c, addr, []step{send("a", data...), send("a", queries...)})
	})
	t.Run("RESP3", func(t *testing.T) {
		compareCluster(t, srv, c, addr, []step{send("a", "HELLO 3"), send("a", data...), send("a", queries...)})
	})
	// RANDOMKEY, which asks the masters one after the other, in a
	// pipeline with commands for the same masters.
	t.Run("RANDOMKEY in a pipeline", func(t *testing.T) {
		flushCluster(t, c)
		a := dial(t, addr)
		k := []string{keyOn(0, "rk"), keyOn(1, "rk"), keyOn(2, "rk")}
		a.do(args("SET "+k[0]+" v0"), args("SET "+k[1]+" v1"), args("SET "+k[2]+" v2"))
		got := string(a.do(args("GET "+k[0]), args("RANDOMKEY"), args("GET "+k[1]), args("GET "+k[2]), args("GET "+k[0])))
		parts := strings.Split(got, "\r\n")
		if len(parts) != 11 || parts[1] != "v0" || parts[5] != "v1" || parts[7] != "v2" || parts[9] != "v0" || !strings.HasPrefix(parts[3], "rk") {
			t.Errorf("GET, RANDOMKEY, GET, GET, GET: %q", got)
		}
	})
}
