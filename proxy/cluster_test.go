package proxy

import (
	"bytes"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockproxy/lockproxy/internal/redistest"
)

// startClusterProxy serves a proxy in front of c.
func startClusterProxy(t testing.TB, c *redistest.Cluster) (string, *Proxy) {
	t.Helper()
	return startProxy(t, "", func(cfg *Config) { cfg.Backend.Cluster = c.Seeds()[:2] })
}

// flushCluster empties every master.
func flushCluster(t *testing.T, c *redistest.Cluster) {
	t.Helper()
	for _, s := range c.Nodes {
		s.Do("FLUSHALL") // replicas refuse it; their masters' flush reaches them
	}
}

// compareCluster plays steps against one standalone Redis and through the
// proxy in front of the cluster, and requires the same bytes.
func compareCluster(t *testing.T, srv *redistest.Server, c *redistest.Cluster, addr string, steps []step) {
	t.Helper()
	mustFlush(t, srv)
	want := mask(run(t, srv, srv.Addr, steps))
	flushCluster(t, c)
	got := mask(run(t, srv, addr, steps))
	if !bytes.Equal(got, want) {
		t.Errorf("replies differ\nthrough proxy: %q\ndirect:        %q", trunc(got), trunc(want))
		for i := range min(len(got), len(want)) {
			if got[i] != want[i] {
				t.Errorf("first difference at byte %d: proxy %q, direct %q", i,
					trunc(got[max(0, i-60):min(len(got), i+80)]), trunc(want[max(0, i-60):min(len(want), i+80)]))
				break
			}
		}
	}
}

// TestCluster runs the forwarding sessions through a proxy in front of a
// cluster of 3 masters with a replica each, with keys on every master,
// and compares them byte for byte with one standalone Redis.
func TestCluster(t *testing.T) {
	c := redistest.StartCluster(t, 3, 1)
	srv := redistest.Start(t)
	addr, _ := startClusterProxy(t, c)

	pipeline := make([]string, 0, 1000)
	for i := range 500 {
		pipeline = append(pipeline, fmt.Sprintf("SET key:%d %d", i, i), fmt.Sprintf("GET key:%d", i))
	}
	t.Run("strings", func(t *testing.T) {
		compareCluster(t, srv, c, addr, []step{send("a",
			"SET s hello", "GET s", "GET missing", "APPEND s world", "GETRANGE s 0 3",
			"INCR n", "INCRBY n 41", "INCRBYFLOAT f 1.5", "MGET s missing n", "SETNX s x",
			"SET s v GET", "GETDEL s", "STRLEN n", "SET e 1 PX 100000 NX", "TTL e", "TYPE n")})
	})
	many := make([]string, 0, 40)
	for i := range 40 {
		many = append(many, fmt.Sprintf("k%d", i))
	}
	keys := strings.Join(many, " ")
	pairs := ""
	for i, k := range many {
		pairs += fmt.Sprintf(" %s v%d", k, i)
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"pipeline of 1000", []step{send("a", pipeline...)}},
		{"lists", []step{send("a",
			"RPUSH l a b c d", "LPUSH l z", "LRANGE l 0 -1", "LINDEX l 99", "LPOP l 2",
			"LPOP nolist 2", "LPOP nolist", "LPOS l c", "LLEN l", "RPOPLPUSH {l}x {l}y", "RPUSH {l}x 1",
			"LMOVE {l}x {l}y LEFT RIGHT", "LRANGE {l}y 0 -1")}},
		{"hashes", []step{send("a",
			"HSET h f1 v1 f2 v2", "HGET h f1", "HMGET h f1 nope f2", "HGETALL h", "HINCRBY h n 5",
			"HINCRBYFLOAT h x 2.5", "HLEN h", "HEXISTS h nope", "HKEYS h", "HGETALL nohash")}},
		{"sets", []step{send("a",
			"SADD {s}1 3 1 2", "SMEMBERS {s}1", "SISMEMBER {s}1 2", "SMISMEMBER {s}1 1 9", "SCARD {s}1",
			"SADD {s}2 2 3 4", "SINTER {s}1 {s}2", "SDIFF {s}1 {s}2", "SREM {s}1 1", "SMEMBERS nothing")}},
		{"zsets", []step{send("a",
			"ZADD z 1 a 2.5 b 3 c", "ZRANGE z 0 -1 WITHSCORES", "ZSCORE z b", "ZSCORE z nope",
			"ZRANK z c", "ZINCRBY z 0.5 a", "ZPOPMIN z", "ZRANGEBYSCORE z -inf +inf", "ZCARD z",
			"ZUNIONSTORE {z}u 2 z {z}u", "ZADD {z}a 1 x", "ZUNIONSTORE {z}u 1 {z}a", "ZRANGE {z}u 0 -1 WITHSCORES")}},
		{"streams", []step{send("a",
			"XADD st 1-1 a 1", "XADD st 1-2 b 2 c 3", "XLEN st", "XRANGE st - +",
			"XREAD COUNT 10 STREAMS st 0", "XREAD STREAMS st 9-9", "XGROUP CREATE st g 0",
			"XREADGROUP GROUP g c1 COUNT 1 STREAMS st >", "XPENDING st g", "XDEL st 1-1", "XRANGE st - +")}},
		{"scripting", []step{
			cmdArgs("a", "EVAL", "return {1, 'two', {3, 'four'}, redis.status_reply('OK'), false}", "0"),
			cmdArgs("a", "EVAL", "return redis.error_reply('MYERR custom')", "0"),
			cmdArgs("a", "EVAL", "return redis.call('SET', KEYS[1], ARGV[1])", "1", "k", "v"),
			cmdArgs("a", "EVAL", "return redis.call('INCR', KEYS[1])", "1", "k"),
			cmdArgs("a", "EVAL", "return {redis.call('INCR', KEYS[1]), redis.call('INCR', KEYS[2])}", "2", "{t}a", "{t}b"),
			cmdArgs("a", "EVALSHA", "ffffffffffffffffffffffffffffffffffffffff", "0"),
			cmdArgs("a", "SCRIPT", "LOAD", "return redis.call('GET', KEYS[1])"),
			cmdArgs("a", "EVALSHA", "4e6d8fc8bb01276962cce5371fa795a7763657ae", "1", "zz"),
			cmdArgs("a", "EVAL", "return 3.99", "0"),
		}},
		{"errors", []step{send("a",
			"SET w x", "LPUSH w y", "NOSUCHCOMMAND a b", "GET", "SET a", "ZADD z x a",
			"INCR w", "SET a b NX XX", "EXPIRE a notanumber", "OBJECT FOO")}},
		{"split and merge", []step{send("a",
			"MSET"+pairs, "MGET "+keys+" nope k3", "EXISTS "+keys+" k1 nope", "TOUCH "+keys,
			"DEL k0 k1 k2 nope", "UNLINK k3 k4 k5", "MGET "+keys, "DBSIZE", "MSET a 1 b", "DEL nope", "MGET x")}},
		{"transactions", []step{
			send("a", "WATCH wk"),
			send("b", "SET wk changed"),
			send("a", "MULTI", "SET wk mine", "GET wk", "EXEC", "GET wk"),
			send("a", "MULTI", "INCR cnt", "INCR cnt", "EXEC"),
			send("a", "MULTI", "PING", "ECHO e", "INCR {cnt}2", "GET {cnt}2", "EXEC"),
			send("a", "MULTI", "SET x", "EXEC"),
			send("a", "MULTI", "SET y 1", "DISCARD", "EXEC", "GET y"),
			send("a", "MULTI", "SET {y}1 1", "SET {y}2 2", "EXEC", "MGET {y}1 {y}2"),
			send("a", "MULTI", "EXEC", "MULTI", "DISCARD", "EXEC"),
			send("a", "MULTI", "MULTI", "SET z 1", "EXEC", "GET z"),
			send("a", "MULTI", "NOSUCH", "SET z 2", "EXEC", "GET z"),
			send("a", "MULTI", "SET z", "PING", "EXEC", "GET z"),
			send("a", "MULTI", "DISCARD", "GET z"),
		}},
		{"blocking", []step{
			sendNoRead("a", "BLPOP q 10"),
			sendNoRead("c", "BRPOP q2 10"),
			send("b", "LPUSH q2 first"),
			readOn("c", 1),
			send("b", "RPUSH q v"),
			readOn("a", 1),
			send("a", "BLPOP q 0.01"),
			sendNoRead("a", "BLMOVE {q}src {q}dst LEFT RIGHT 10"),
			send("b", "RPUSH {q}src m"),
			readOn("a", 1),
			sendNoRead("a", "BZPOPMIN zq 10"),
			send("b", "ZADD zq 1 m"),
			readOn("a", 1),
			sendNoRead("a", "XREAD BLOCK 10000 STREAMS xs 5-0"),
			send("b", "XADD xs 5-1 f v"),
			readOn("a", 1),
			sendNoRead("a", "SET before 1", "BLPOP q3 10"),
			readOn("a", 1),
			send("b", "RPUSH q3 x"),
			readOn("a", 1),
		}},
		{"resp3", []step{
			send("a", "HELLO 3"),
			send("a", "SET s v", "GET missing", "HSET h a 1", "HGETALL h", "ZADD z 1.5 m",
				"ZSCORE z m", "SADD st x", "SMEMBERS st", "EXISTS s", "LPOP nolist 2", "MGET s h missing",
				"EVAL 'return 1' 0", "XADD xs 1-1 a b", "XINFO STREAM xs"),
			send("a", "HELLO 2", "HGETALL h"),
		}},
		{"client", []step{send("a",
			"CLIENT GETNAME", "CLIENT SETNAME worker", "CLIENT GETNAME", "SET k v", "GET k", "CLIENT SETNAME bad name",
			"CLIENT NOSUCH")}},
		{"select 0", []step{send("a", "SELECT 0", "SET k one", "GET k")}},
		{"quit", []step{send("a", "SET q 1", "QUIT")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { compareCluster(t, srv, c, addr, tt.steps) })
	}
}

// TestClusterDifferences lists where the proxy in front of a cluster
// answers differently from one Redis, on purpose, as the cluster would.
func TestClusterDifferences(t *testing.T) {
	c := redistest.StartCluster(t, 3, 1)
	addr, p := startClusterProxy(t, c)
	a := dial(t, addr)
	tests := []struct {
		give []string
		want string
	}{
		{args("SINTERSTORE c a b"), "-CROSSSLOT Keys in request don't hash to the same slot\r\n"},
		{args("ZUNIONSTORE c 2 a b"), "-CROSSSLOT Keys in request don't hash to the same slot\r\n"},
		{args("RENAME a b"), "-CROSSSLOT Keys in request don't hash to the same slot\r\n"},
		{args("SMOVE a b m"), "-CROSSSLOT Keys in request don't hash to the same slot\r\n"},
		{args("SORT a STORE b"), "-CROSSSLOT Keys in request don't hash to the same slot\r\n"},
		{args("READONLY"), "-ERR This instance has cluster support disabled\r\n"},
		{args("MSETNX a 1 b 2"), "-CROSSSLOT Keys in request don't hash to the same slot\r\n"},
		{[]string{"EVAL", "return 1", "2", "a", "b"}, "-CROSSSLOT Keys in request don't hash to the same slot\r\n"},
		{args("SELECT 1"), "-ERR SELECT is not allowed in cluster mode\r\n"},
		{args("SYNC"), "-ERR 'sync' is not supported by lockproxy in front of a Redis Cluster\r\n"},
		// A command for another slot in a transaction is refused and EXEC aborts.
		{args("MULTI"), "+OK\r\n"},
		{args("SET a 1"), "+QUEUED\r\n"},
		{args("SET b 1"), "-CROSSSLOT Keys in request don't hash to the same slot\r\n"},
		{args("EXEC"), "-EXECABORT Transaction discarded because of previous errors.\r\n"},
		{args("GET a"), "$-1\r\n"},
	}
	for _, tt := range tests {
		if got := string(a.do(tt.give)); got != tt.want {
			t.Errorf("%q: got %q, want %q", tt.give, got, tt.want)
		}
	}
	// SCAN through the proxy sees every key exactly once.
	var all []string
	for i := range 300 {
		all = append(all, fmt.Sprintf("scan:%d", i), "x")
	}
	a.do(append([]string{"MSET"}, all...))
	seen := map[string]int{}
	cursor := "0"
	for n := 0; ; n++ {
		if n > 1000 {
			t.Fatal("SCAN does not end")
		}
		reply := string(a.do(args("SCAN " + cursor + " MATCH scan:* COUNT 37 TYPE string")))
		parts := strings.Split(reply, "\r\n")
		cursor = parts[2]
		for i := 5; i < len(parts); i += 2 {
			seen[parts[i]]++
		}
		if cursor == "0" {
			break
		}
	}
	if len(seen) != 300 {
		t.Errorf("SCAN saw %d keys, want 300", len(seen))
	}
	for k, n := range seen {
		if n != 1 {
			t.Errorf("SCAN saw %s %d times", k, n)
		}
	}
	if got := string(a.do(args("DBSIZE"))); got != ":300\r\n" {
		t.Errorf("DBSIZE: %q", got)
	}
	if got := a.do(args("KEYS scan:*")); !bytes.HasPrefix(got, []byte("*300\r\n")) {
		t.Errorf("KEYS: %q", trunc(got))
	}
	if got := string(a.do(args("RANDOMKEY"))); !strings.Contains(got, "scan:") {
		t.Errorf("RANDOMKEY: %q", got)
	}
	if got := string(a.do(args("FLUSHALL"), args("DBSIZE"), args("RANDOMKEY"))); got != "+OK\r\n:0\r\n$-1\r\n" {
		t.Errorf("FLUSHALL, DBSIZE, RANDOMKEY: %q", got)
	}
	_ = p
}

// writers runs n clients through addr, each setting its own keys in turn
// until stop is closed; it returns the keys and values written and the
// error replies seen, with the time of each.
type writeLog struct {
	mu      sync.Mutex
	written map[string]string
	at      map[string]time.Time
	errs    []string
	okAt    []time.Time // the time of every successful write
}

func writers(t *testing.T, addr string, n int, stop chan struct{}) (*writeLog, *sync.WaitGroup) {
	log := &writeLog{written: map[string]string{}, at: map[string]time.Time{}}
	var wg sync.WaitGroup
	for w := range n {
		c := dial(t, addr)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k, v := fmt.Sprintf("w%d:%d", w, i), fmt.Sprint(i)
				c.c.SetDeadline(time.Now().Add(20 * time.Second))
				c.c.Write(encode([]string{"SET", k, v}))
				var out bytes.Buffer
				err := readValue(&out, c.r)
				log.mu.Lock()
				switch {
				case err != nil:
					log.errs = append(log.errs, err.Error())
				case out.String() == "+OK\r\n":
					log.written[k] = v
					log.at[k] = time.Now()
					log.okAt = append(log.okAt, time.Now())
				default:
					log.errs = append(log.errs, out.String())
				}
				log.mu.Unlock()
				if err != nil {
					return
				}
			}
		}()
	}
	return log, &wg
}

// checkWritten reads every written key back through addr.
func checkWritten(t *testing.T, addr string, log *writeLog) {
	t.Helper()
	if lost := missing(t, addr, log, nil); len(lost) > 0 {
		t.Errorf("%d writes lost: %q", len(lost), lost[:min(5, len(lost))])
	}
}

// missing returns the written keys, of those keep selects (nil: all), that
// do not read back with their value.
func missing(t *testing.T, addr string, log *writeLog, keep func(k string) bool) []string {
	t.Helper()
	var lost []string
	c := dial(t, addr)
	var keys []string
	for k := range log.written {
		if keep == nil || keep(k) {
			keys = append(keys, k)
		}
	}
	for i := 0; i < len(keys); i += 500 {
		batch := keys[i:min(i+500, len(keys))]
		var cmds [][]string
		for _, k := range batch {
			cmds = append(cmds, []string{"GET", k})
		}
		c.send(encode(cmds...))
		c.c.SetReadDeadline(time.Now().Add(10 * time.Second))
		for _, k := range batch {
			var out bytes.Buffer
			if err := readValue(&out, c.r); err != nil {
				t.Fatal(err)
			}
			v := log.written[k]
			if out.String() != fmt.Sprintf("$%d\r\n%s\r\n", len(v), v) {
				lost = append(lost, k)
			}
		}
	}
	return lost
}

func nodeID(t *testing.T, s *redistest.Server) string {
	t.Helper()
	id, err := s.DoAll("CLUSTER", "MYID")
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(id)
}

// TestClusterReshard moves slots from one master to another with
// redis-cli --cluster reshard while 20 clients write: no client sees an
// error, and every write is readable afterwards.
func TestClusterReshard(t *testing.T) {
	c := redistest.StartCluster(t, 3, 1)
	addr, p := startClusterProxy(t, c)
	from, to := c.Nodes[0], c.Nodes[1]
	stop := make(chan struct{})
	log, wg := writers(t, addr, 20, stop)
	start := time.Now()
	cmd := exec.Command("redis-cli", "--cluster", "reshard", from.Addr,
		"--cluster-from", nodeID(t, from), "--cluster-to", nodeID(t, to),
		"--cluster-slots", "200", "--cluster-yes", "--cluster-pipeline", "10")
	out, err := cmd.CombinedOutput()
	took := time.Since(start)
	// The writers go on until one met a moved slot: a reshard that ends
	// within a few hundred ms leaves most of the writes before each
	// slot's move.
	for deadline := time.Now().Add(3 * time.Second); p.router.Moved.Load() == 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatalf("reshard: %v: %s", err, out)
	}
	log.mu.Lock()
	defer log.mu.Unlock()
	t.Logf("reshard of 200 slots took %v; %d writes, %d error replies; MOVED %d, ASK %d, slot map readings %d",
		took.Round(time.Millisecond), len(log.written), len(log.errs), p.router.Moved.Load(), p.router.Asked.Load(), p.router.Refreshes.Load())
	metrics := scrape(t, p)
	for _, want := range []string{"lockproxy_cluster_slot_map_refreshes_total", `lockproxy_cluster_redirections_total{kind="moved"}`, "lockproxy_cluster_commands_forwarded_total{master=\"" + to.Addr + "\"}"} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if len(log.errs) > 0 {
		t.Errorf("error replies during the reshard: %q", log.errs[:min(5, len(log.errs))])
	}
	if p.router.Moved.Load() == 0 {
		t.Errorf("no MOVED seen: the writes did not touch the moved slots")
	}
	checkWritten(t, addr, log)
}

// TestClusterFailover kills a master while 20 clients write: its replica
// takes over, and the clients go on; only commands in flight on the
// broken connections get an error.
func TestClusterFailover(t *testing.T) {
	c := redistest.StartCluster(t, 3, 1)
	addr, p := startClusterProxy(t, c)
	stop := make(chan struct{})
	log, wg := writers(t, addr, 20, stop)
	waitFor(t, 10*time.Second, func() bool { log.mu.Lock(); defer log.mu.Unlock(); return len(log.written) > 2000 })
	killed := time.Now()
	c.Nodes[0].Kill()
	// Writes to every master succeed again.
	probe := dial(t, addr)
	var back time.Time
	waitFor(t, 20*time.Second, func() bool {
		r := string(probe.do(args("SET probe:{a} 1"), args("SET probe:{b} 1"), args("SET probe:{c} 1")))
		if r == "+OK\r\n+OK\r\n+OK\r\n" {
			back = time.Now()
			return true
		}
		return false
	})
	waitFor(t, 10*time.Second, func() bool { log.mu.Lock(); defer log.mu.Unlock(); return log.okAt[len(log.okAt)-1].After(back) })
	close(stop)
	wg.Wait()
	log.mu.Lock()
	defer log.mu.Unlock()
	// The longest time without a successful write after the kill.
	var gap time.Duration
	prev := killed
	for _, at := range log.okAt {
		if at.After(killed) {
			gap = max(gap, at.Sub(prev))
			prev = at
		}
	}
	t.Logf("master killed: writes to all masters back after %v; longest gap between successful writes %v; %d writes, %d error replies %q; connection_lost %d; slot map readings %d",
		back.Sub(killed).Round(time.Millisecond), gap.Round(time.Millisecond), len(log.written), len(log.errs), log.errs[:min(3, len(log.errs))], p.m.connLost.Load(), p.router.Refreshes.Load())
	// Redis replicates asynchronously: writes the master acknowledged just
	// before it died may not have reached the replica. Every write
	// acknowledged after the kill must be there.
	// (A reply read just after the kill may come from the old master.)
	early := missing(t, addr, log, func(k string) bool { return !log.at[k].After(back) })
	late := missing(t, addr, log, func(k string) bool { return log.at[k].After(back) })
	t.Logf("writes acknowledged before the failover and lost with the master (not replicated yet): %d", len(early))
	if len(late) > 0 {
		t.Errorf("%d writes acknowledged after the failover are lost: %q", len(late), late[:min(5, len(late))])
	}
	for _, e := range log.errs {
		if e != string(replyConnLost) {
			t.Errorf("error reply other than connection lost: %q", e)
		}
	}
	// Each client has one command in flight; one more may be written in
	// the moment between the master's death and its sockets' closing
	// reaching the proxy.
	if len(log.errs) > 40 {
		t.Errorf("%d error replies: more than two per client", len(log.errs))
	}
}

func waitFor(t *testing.T, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %v", d)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// scrape returns the proxy's metrics in the text format.
func scrape(t *testing.T, p *Proxy) string {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(p)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, f := range families {
		for _, m := range f.GetMetric() {
			b.WriteString(f.GetName())
			if len(m.GetLabel()) > 0 {
				b.WriteString("{")
				for i, l := range m.GetLabel() {
					if i > 0 {
						b.WriteString(",")
					}
					fmt.Fprintf(&b, "%s=%q", l.GetName(), l.GetValue())
				}
				b.WriteString("}")
			}
			b.WriteString("\n")
		}
	}
	return b.String()
}
