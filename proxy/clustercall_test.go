package proxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/internal/redistest"
	"github.com/lockproxy/lockproxy/proxy/internal/cluster"
)

// TestClusterMergeOutOfOrder: the parts of calls merged from several
// masters come back in any order when one master is slow; each client's
// reply is made when its last part comes, and every reply keeps its place
// in the client's order, behind and ahead of plain replies.
func TestClusterMergeOutOfOrder(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	addr, _ := startClusterProxy(t, c)
	flushCluster(t, c)
	a := dial(t, addr)
	k0, k1, k2 := keyOn(0, "o"), keyOn(1, "o"), keyOn(2, "o")
	// CLIENT SETNAME puts every command on the client's own connections,
	// which the first MGET opens.
	a.do(args("CLIENT SETNAME merger"))
	if got := string(a.do(args("MSET " + k0 + " v0 " + k1 + " v1 " + k2 + " v2"))); got != "+OK\r\n" {
		t.Fatalf("MSET: %q", got)
	}
	// Master 0 sleeps: the parts sent to it are answered after those of
	// masters 1 and 2.
	busyNode(t, c.Nodes[0].Addr, 400*time.Millisecond)
	cmds := [][]string{
		args("MGET " + k2 + " " + k0 + " " + k1),
		args("GET " + k1),
		args("DBSIZE"),
		args("EXISTS " + k1 + " " + k0 + " nokey"),
		args("MGET " + k1 + " " + k2),
		args("GET " + k0),
	}
	want := "*3\r\n$2\r\nv2\r\n$2\r\nv0\r\n$2\r\nv1\r\n" +
		"$2\r\nv1\r\n" +
		":3\r\n" +
		":2\r\n" +
		"*2\r\n$2\r\nv1\r\n$2\r\nv2\r\n" +
		"$2\r\nv0\r\n"
	start := time.Now()
	a.send(encode(cmds...))
	got, err := a.tryRead(len(cmds), 5*time.Second)
	if err != nil || string(got) != want {
		t.Fatalf("replies %q (%v), want %q", got, err, want)
	}
	if took := time.Since(start); took < 200*time.Millisecond {
		t.Errorf("answered in %v: master 0 did not hold its parts back", took)
	}
}

// TestClusterOwnRedirect: on a client's own connections, an ASK and a
// MOVED are followed on the client's own connection to the node named (it
// carries the client's name), and inside a transaction a redirection is
// answered as the proxy's TRYAGAIN, never followed, and EXEC aborts.
func TestClusterOwnRedirect(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	addr, p := startClusterProxy(t, c)
	flushCluster(t, c)
	from, to := c.Nodes[0], c.Nodes[1]
	idTo := nodeID(t, to)
	k := keyOn(0, "r")
	slot := strconv.Itoa(cluster.KeySlot([]byte(k)))
	a := dial(t, addr)
	a.do(args("CLIENT SETNAME mover"))
	if got := string(a.do(args("SET " + k + " v"))); got != "+OK\r\n" {
		t.Fatalf("SET: %q", got)
	}
	// The slot is being migrated and k has left: the old master asks.
	startMigrating(t, from, to, slot)
	mustOK(t, from, "MIGRATE 127.0.0.1 "+strconv.Itoa(to.Port())+" "+k+" 0 5000")
	asked := p.router.Asked.Load()
	if got := string(a.do(args("GET " + k))); got != "$1\r\nv\r\n" {
		t.Fatalf("GET during the migration: %q", got)
	}
	if p.router.Asked.Load() == asked {
		t.Errorf("no ASK followed")
	}
	// The slot has moved: the old master redirects for good.
	for _, n := range c.Nodes[:c.Masters] {
		mustOK(t, n, "CLUSTER SETSLOT "+slot+" NODE "+idTo)
	}
	// Inside a transaction the redirection is not followed.
	txn := a.do(args("MULTI"), args("SET "+k+" w"), args("EXEC"))
	if want := "+OK\r\n" + "-TRYAGAIN the slot moved while the transaction was queued\r\n" + string(replyExecAbort); string(txn) != want {
		t.Errorf("transaction: %q, want %q", txn, want)
	}
	moved := p.router.Moved.Load()
	if got := string(a.do(args("SET "+k+" x"), args("GET "+k))); got != "+OK\r\n$1\r\nx\r\n" {
		t.Fatalf("after the move: %q", got)
	}
	if p.router.Moved.Load() == moved {
		t.Errorf("no MOVED followed")
	}
	// Both went on connections of the client's own to the new master.
	list := string(dial(t, to.Addr).do(args("CLIENT LIST")))
	if n := strings.Count(list, " name=mover "); n != 1 {
		t.Errorf("the new master holds %d connections named mover, want 1:\n%s", n, list)
	}
	if got := string(dial(t, to.Addr).do(args("GET " + k))); got != "$1\r\nx\r\n" {
		t.Errorf("k on the new master: %q", got)
	}
}

// TestClusterBlockingOrder: a command that follows a blocking one, in the
// same pipeline, to another master, runs after the blocking one returns,
// as one Redis runs a client's commands; on the shared connections or the
// client's own.
func TestClusterBlockingOrder(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	addr, _ := startClusterProxy(t, c)
	for _, first := range [][]string{nil, args("CLIENT SETNAME blocker")} {
		t.Run(fmt.Sprintf("%q", first), func(t *testing.T) {
			flushCluster(t, c)
			a := dial(t, addr)
			if first != nil {
				a.do(first)
			}
			q, b := keyOn(0, "q"), keyOn(1, "b")
			cmds := [][]string{args("BLPOP " + q + " 5"), args("SET " + b + " x"), args("GET " + b)}
			a.send(encode(cmds...))
			time.Sleep(300 * time.Millisecond)
			if got := string(dial(t, c.Nodes[1].Addr).do(args("EXISTS " + b))); got != ":0\r\n" {
				t.Fatalf("the SET ran while the BLPOP before it waited: EXISTS %q", got)
			}
			if got := string(dial(t, c.Nodes[0].Addr).do(args("LPUSH " + q + " e"))); got != ":1\r\n" {
				t.Fatalf("LPUSH: %q", got)
			}
			want := fmt.Sprintf("*2\r\n$%d\r\n%s\r\n$1\r\ne\r\n+OK\r\n$1\r\nx\r\n", len(q), q)
			if got, err := a.tryRead(len(cmds), 5*time.Second); err != nil || string(got) != want {
				t.Fatalf("replies %q (%v), want %q", got, err, want)
			}
		})
	}
}

// TestClusterTLSClient: a client on TLS, whose replies the connections'
// readers do not write to its socket themselves, gets its replies from
// the shared connections and its own, merged ones and a blocking one
// included, in order.
func TestClusterTLSClient(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	certs := redistest.NewCerts(t)
	cert, err := tls.LoadX509KeyPair(certs.ServerCert, certs.ServerKey)
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := startProxy(t, "", func(cfg *Config) {
		cfg.Backend.Cluster = c.Seeds()[:2]
		cfg.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	})
	flushCluster(t, c)
	nc, err := tls.Dial("tcp", addr, certs.ClientTLS(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	a := &client{tb: t, c: nc, r: bufio.NewReaderSize(nc, 64<<10)}
	k0, k1, k2 := keyOn(0, "t"), keyOn(1, "t"), keyOn(2, "t")
	steps := []struct {
		cmds [][]string
		want string
	}{
		// On the shared connections, then split over the client's own.
		{[][]string{args("SET " + k0 + " a"), args("SET " + k1 + " b"), args("MGET " + k0 + " " + k1 + " " + k2), args("GET " + k1)},
			"+OK\r\n+OK\r\n*3\r\n$1\r\na\r\n$1\r\nb\r\n$-1\r\n$1\r\nb\r\n"},
		// On its own connections only, a blocking command among them.
		{[][]string{args("CLIENT SETNAME tls"), args("RPUSH " + k2 + " x"), args("BLPOP " + k2 + " 1"), args("DBSIZE"), args("GET " + k0)},
			fmt.Sprintf("+OK\r\n:1\r\n*2\r\n$%d\r\n%s\r\n$1\r\nx\r\n:2\r\n$1\r\na\r\n", len(k2), k2)},
		// On its own connections, nothing to wait for but the replies.
		{[][]string{args("GET " + k1), args("MGET " + k2 + " " + k0), args("DBSIZE")},
			"$1\r\nb\r\n*2\r\n$-1\r\n$1\r\na\r\n:2\r\n"},
	}
	for _, st := range steps {
		a.send(encode(st.cmds...))
		if got, err := a.tryRead(len(st.cmds), 5*time.Second); err != nil || string(got) != st.want {
			t.Fatalf("%q: %q (%v), want %q", st.cmds, got, err, st.want)
		}
	}
}

// ownReaders counts the goroutines reading a shared connection.
func ownReaders() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Count(string(buf[:n]), "backend.(*Mux).readShared(")
		}
		buf = make([]byte, 2*len(buf))
	}
}

// TestClusterOwnIdle: a client whose commands went on connections of its
// own to every master keeps no goroutine reading them once it is owed
// nothing, as before those connections were read by the shared
// machinery; and its next commands, and a connection a master closed
// meanwhile, are served as before.
func TestClusterOwnIdle(t *testing.T) {
	c, _, a, base := startOwnClient(t, "idler")
	k0, k1, k2 := keyOn(0, "i"), keyOn(1, "i"), keyOn(2, "i")
	if got := string(a.do(args("MSET " + k0 + " v0 " + k1 + " v1 " + k2 + " v2"))); got != "+OK\r\n" {
		t.Fatalf("MSET: %q", got)
	}
	eventually(t, "no reader left on the idle client's connections", func() bool { return ownReaders() <= base })
	// A master closes the client's connection while it is idle: the next
	// command dials again, in the client's state.
	kill, err := net.Dial("tcp", c.Nodes[1].Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer kill.Close()
	if _, err := kill.Write(encode(args("CLIENT KILL TYPE normal SKIPME yes"))); err != nil {
		t.Fatal(err)
	}
	if _, err := bufio.NewReader(kill).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	want := "*3\r\n$2\r\nv0\r\n$2\r\nv1\r\n$2\r\nv2\r\n"
	for range 2 {
		if got := string(a.do(args("MGET " + k0 + " " + k1 + " " + k2))); got != want {
			t.Fatalf("MGET: %q, want %q", got, want)
		}
	}
	if got := string(a.do(args("CLIENT GETNAME"))); got != "$5\r\nidler\r\n" {
		t.Fatalf("CLIENT GETNAME: %q", got)
	}
	eventually(t, "no reader left after more commands", func() bool { return ownReaders() <= base })
}

// TestClusterMovedOrder: a client's command routed by a slot map newer
// than the one its earlier commands went by runs after them, as one Redis
// runs a client's commands in order: a SET sent to the old master of its
// key, redirected from there (MOVED) only after the map was read again
// for another client, is followed by the client's GET of the key sent to
// the new master, which sees the value. On the shared connections and on
// the client's own.
func TestClusterMovedOrder(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	addr, _ := startClusterProxy(t, c)
	from, to := c.Nodes[2], c.Nodes[1]
	idTo := nodeID(t, to)
	for i, first := range [][]string{nil, args("CLIENT SETNAME mover")} {
		t.Run(fmt.Sprintf("%q", first), func(t *testing.T) {
			flushCluster(t, c)
			a, b := dial(t, addr), dial(t, addr)
			if first != nil {
				a.do(first)
			}
			// k moves from `from` to `to`, and so does k2 from `other`,
			// without the proxy reading the map again.
			k, k2 := keyOn(2, fmt.Sprintf("m%d-", i)), keyOn(0, fmt.Sprintf("m%d-", i))
			a.do(args("PING"))
			for _, key := range []string{k, k2} {
				slot := strconv.Itoa(cluster.KeySlot([]byte(key)))
				for _, n := range c.Nodes[:c.Masters] {
					mustOK(t, n, "CLUSTER SETSLOT "+slot+" NODE "+idTo)
				}
			}
			// `from` is busy: the SET waits there, and its MOVED comes
			// after b's MOVED from `other` made the proxy read the map.
			busyNode(t, from.Addr, 600*time.Millisecond)
			a.send(encode(args("SET " + k + " v")))
			time.Sleep(50 * time.Millisecond)
			if got := string(b.do(args("GET " + k2))); got != "$-1\r\n" {
				t.Fatalf("GET k2: %q", got)
			}
			a.send(encode(args("GET " + k)))
			got, err := a.tryRead(2, 5*time.Second)
			if err != nil {
				// Seen twice in fifteen runs beside another test run, and
				// not since in a hundred: the goroutines say where it
				// stood.
				pprof.Lookup("goroutine").WriteTo(os.Stderr, 1)
			}
			if want := "+OK\r\n$1\r\nv\r\n"; err != nil || string(got) != want {
				t.Fatalf("SET then GET: %q (%v), want %q", got, err, want)
			}
		})
	}
}

// TestClusterGoneWithPartsInFlight: a client that hangs up while the
// parts of a merged call wait on a busy master and a blocking command
// waits behind them leaves nothing behind: its session, its connections
// to the masters and their readers all end.
func TestClusterGoneWithPartsInFlight(t *testing.T) {
	c, p, a, base := startOwnClient(t, "leaver")
	busyNode(t, c.Nodes[0].Addr, 400*time.Millisecond)
	k0, k1, k2 := keyOn(0, "g"), keyOn(1, "g"), keyOn(2, "g")
	a.send(encode(args("MGET "+k0+" "+k1+" "+k2), args("BLPOP "+keyOn(1, "q")+" 0")))
	time.Sleep(100 * time.Millisecond)
	a.c.Close()
	eventually(t, "the session gone", func() bool { return len(p.sessionsNow()) == 0 && p.clients.Load() == 0 })
	eventually(t, "no reader left", func() bool { return ownReaders() <= base })
	for _, n := range c.Nodes[:c.Masters] {
		eventually(t, "no connection of the client's left on "+n.Addr, func() bool {
			return !strings.Contains(string(dial(t, n.Addr).do(args("CLIENT LIST"))), " name=leaver ")
		})
	}
}

// TestClusterPartCutShort: a master that dies in the middle of the reply
// to one part of a merged call, which the proxy was gathering and had
// written nothing of to the client, costs the client the call's
// connection-lost error, as it costs the other commands on their way to
// that master, and not its connection.
func TestClusterPartCutShort(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	addr, _ := startClusterProxy(t, c)
	flushCluster(t, c)
	a := dial(t, addr)
	a.do(args("CLIENT SETNAME cutter"))
	k0, k1 := keyOn(0, "c"), keyOn(1, "c")
	big := strings.Repeat("x", 48<<20)
	if got := string(dial(t, c.Nodes[1].Addr).do([]string{"SET", k1, big})); got != "+OK\r\n" {
		t.Fatalf("SET: %q", got)
	}
	if got := string(a.do(args("EXISTS " + k1))); got != ":1\r\n" { // opens the connection to the master
		t.Fatalf("EXISTS: %q", got)
	}
	a.send(encode(args("MGET " + k0 + " " + k1)))
	// Stopped while it sends the value, then killed: the proxy has read
	// part of it.
	ctl := dial(t, c.Nodes[1].Addr)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		sending := false
		for _, l := range strings.Split(string(ctl.do(args("CLIENT LIST"))), "\n") {
			sending = sending || (strings.Contains(l, " name=cutter ") && strings.Contains(l, " cmd=mget ") && !strings.Contains(l, " omem=0 "))
		}
		if sending {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the master never sent the value")
		}
	}
	c.Nodes[1].Pause()
	time.Sleep(100 * time.Millisecond)
	c.Nodes[1].Kill()
	got, err := a.tryRead(1, 5*time.Second)
	if err != nil || string(got) != string(replyConnLost) {
		t.Fatalf("MGET: %q (%v), want %q", trunc(got), err, replyConnLost)
	}
	if got := string(a.do(args("GET " + k0))); got != "$-1\r\n" {
		t.Fatalf("GET after: %q", got)
	}
}

// busyNode keeps the Redis at addr busy for d with a script that spins, on
// a connection of the test's own, and returns once the script runs: the
// commands sent there meanwhile are answered after it.
func busyNode(t *testing.T, addr string, d time.Duration) {
	t.Helper()
	slow, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { slow.Close() })
	spin := fmt.Sprintf("local s = redis.call('TIME') local e = s[1]*1000000 + s[2] + %d "+
		"while true do local n = redis.call('TIME') if n[1]*1000000 + n[2] >= e then return 1 end end", d.Microseconds())
	if _, err := slow.Write(encode([]string{"EVAL", spin, "0"})); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
}

// TestClusterFanAfterRedirect: a command about the whole keyspace that
// follows, in the same pipeline, a write the cluster redirects runs after
// the write at its new master, as one Redis runs a client's commands in
// order: DBSIZE, KEYS, SCAN, RANDOMKEY and INFO count a key that an ASK
// sent to the master importing its slot, FUNCTION DELETE leaves the
// function to an FCALL sent there, FLUSHALL removes the key a split MSET
// sent there, and KEYS sees the key a MOVED sent to the slot's new
// master. The old master is busy, so its redirection comes long after the
// fan-out would have reached the new one. On the shared connections and
// on the client's own.
func TestClusterFanAfterRedirect(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	addr, p := startClusterProxy(t, c)
	from, to := c.Nodes[1], c.Nodes[0]
	idFrom, idTo := nodeID(t, from), nodeID(t, to)
	// pipeline sends cmds while `from` is busy and requires want.
	pipeline := func(t *testing.T, a *client, want string, cmds ...[]string) {
		t.Helper()
		busyNode(t, from.Addr, 300*time.Millisecond)
		a.send(encode(cmds...))
		if got, err := a.tryRead(len(cmds), 5*time.Second); err != nil || string(got) != want {
			t.Errorf("%q:\n%q (%v), want\n%q", cmds, got, err, want)
		}
	}
	bulk := func(s string) string { return fmt.Sprintf("$%d\r\n%s\r\n", len(s), s) }
	for i, first := range [][]string{nil, args("CLIENT SETNAME fanner")} {
		t.Run(fmt.Sprintf("%q", first), func(t *testing.T) {
			flushCluster(t, c)
			a := dial(t, addr)
			if first != nil {
				a.do(first)
			}
			k := keyOn(1, fmt.Sprintf("f%d-", i))
			slot := strconv.Itoa(cluster.KeySlot([]byte(k)))

			// The slot is being migrated from `from` to `to`: `from`
			// answers a write of a new key with ASK.
			startMigrating(t, from, to, slot)
			asked := p.router.Asked.Load()
			// SCAN walks every master in one call (COUNT is not
			// filled), `to` first.
			busyNode(t, from.Addr, 300*time.Millisecond)
			cmds := [][]string{args("SET " + k + " v"), args("DBSIZE"), args("KEYS *"), args("SCAN 0 COUNT 1000"), args("RANDOMKEY"), args("INFO keyspace")}
			a.send(encode(cmds...))
			want := "+OK\r\n:1\r\n*1\r\n" + bulk(k) + "*2\r\n$1\r\n0\r\n*1\r\n" + bulk(k) + bulk(k)
			if got, err := a.tryRead(len(cmds)-1, 5*time.Second); err != nil || string(got) != want {
				t.Errorf("%q:\n%q (%v), want\n%q", cmds, got, err, want)
			}
			if got, err := a.tryRead(1, 5*time.Second); err != nil || !strings.Contains(string(got), "db0:keys=1,") {
				t.Errorf("INFO keyspace: %q (%v), want db0:keys=1", got, err)
			}
			if p.router.Asked.Load() == asked {
				t.Fatalf("the SET was not asked to go elsewhere")
			}

			// A function call asked elsewhere, then FUNCTION DELETE: the
			// call finds its function.
			lib := "#!lua name=fanlib\nredis.register_function('fanset', function(keys, args) return redis.call('SET', keys[1], args[1]) end)"
			if got := string(a.do([]string{"FUNCTION", "LOAD", lib})); got != "$6\r\nfanlib\r\n" {
				t.Fatalf("FUNCTION LOAD: %q", got)
			}
			pipeline(t, a, "+OK\r\n+OK\r\n", args("FCALL fanset 1 {"+k+"}4 v"), args("FUNCTION DELETE fanlib"))

			// A split MSET whose part is asked elsewhere, then FLUSHALL:
			// nothing is left.
			k2, k3 := "{"+k+"}2", keyOn(2, fmt.Sprintf("f%d-", i))
			pipeline(t, a, "+OK\r\n+OK\r\n", args("MSET "+k2+" v "+k3+" v"), args("FLUSHALL"))
			for _, n := range c.Nodes[:c.Masters] {
				if got := string(dial(t, n.Addr).do(args("DBSIZE"))); got != ":0\r\n" {
					t.Errorf("DBSIZE on %s after FLUSHALL: %q", n.Addr, got)
				}
			}
			mustOK(t, to, "CLUSTER SETSLOT "+slot+" STABLE")
			mustOK(t, from, "CLUSTER SETSLOT "+slot+" STABLE")

			// The slot moves to `to` without the proxy knowing: the SET
			// goes to `from`, which answers MOVED.
			for _, n := range c.Nodes[:c.Masters] {
				mustOK(t, n, "CLUSTER SETSLOT "+slot+" NODE "+idTo)
			}
			moved := p.router.Moved.Load()
			pipeline(t, a, "+OK\r\n*1\r\n"+bulk(k), args("SET "+k+" v"), args("KEYS *"))
			if p.router.Moved.Load() == moved {
				t.Fatalf("the SET was not moved")
			}
			flushCluster(t, c)
			for _, n := range c.Nodes[:c.Masters] {
				mustOK(t, n, "CLUSTER SETSLOT "+slot+" NODE "+idFrom)
			}
			p.router.Reload(context.Background(), p.router.Gen.Load())
		})
	}
}

// TestClusterWaitAfterRedirect: WAIT waits for the replicas of the master
// that ran the client's last write, also when an ASK sent that write to
// another master than the slot map names: there, the replica that does
// not answer makes WAIT time out with 0, and WAIT counts it once it is
// back, as one Redis would.
func TestClusterWaitAfterRedirect(t *testing.T) {
	c := redistest.StartCluster(t, 3, 1)
	addr, p := startClusterProxy(t, c)
	from, to := c.Nodes[1], c.Nodes[0]
	replica := replicaOf(t, c, to)
	a := dial(t, addr)
	a.do(args("CLIENT SETNAME waiter"))
	k := keyOn(1, "w")
	slot := strconv.Itoa(cluster.KeySlot([]byte(k)))
	startMigrating(t, from, to, slot)
	t.Cleanup(func() {
		mustOK(t, to, "CLUSTER SETSLOT "+slot+" STABLE")
		mustOK(t, from, "CLUSTER SETSLOT "+slot+" STABLE")
	})
	replica.Pause()
	asked := p.router.Asked.Load()
	if got := string(a.do(args("SET "+k+" v"), args("WAIT 1 300"))); got != "+OK\r\n:0\r\n" {
		replica.Resume()
		t.Fatalf("SET, WAIT while the replica of the master that took the write is stopped: %q, want +OK and 0", got)
	}
	replica.Resume()
	if p.router.Asked.Load() == asked {
		t.Fatalf("the SET was not asked to go elsewhere")
	}
	if got := string(a.do(args("WAIT 1 5000"))); got != ":1\r\n" {
		t.Fatalf("WAIT once the replica is back: %q", got)
	}
}

// BenchmarkClusterKeyless sends, through the proxy in front of a cluster
// of three masters, from a client on the shared connections and from one
// on connections of its own (after CLIENT SETNAME): a pipeline of 16 GETs
// (the common path), a DBSIZE alone (fanned out with no reply owed, which
// waits for nothing), and a GET followed by a DBSIZE in one write (the
// DBSIZE waits for the GET's reply, as a redirection of it could send it
// to where the DBSIZE goes). One op is one round trip.
func BenchmarkClusterKeyless(b *testing.B) {
	c := redistest.StartCluster(b, 3, 0)
	addr, _ := startClusterProxy(b, c)
	get := []string{"GET", keyOn(0, "bench")}
	cases := []struct {
		name  string
		cmds  [][]string
		reply string
	}{
		{"GET/pipeline=16", slices.Repeat([][]string{get}, 16), strings.Repeat("$-1\r\n", 16)},
		{"DBSIZE", [][]string{{"DBSIZE"}}, ":0\r\n"},
		{"GET+DBSIZE", [][]string{get, {"DBSIZE"}}, "$-1\r\n:0\r\n"},
	}
	for _, first := range []string{"shared", "own"} {
		for _, tc := range cases {
			b.Run(first+"/"+tc.name, func(b *testing.B) {
				bc := &benchConn{c: dial(b, addr).c, req: encode(tc.cmds...), want: []byte(tc.reply)}
				bc.c.SetDeadline(time.Now().Add(5 * time.Minute))
				if first == "own" {
					bc.req = append(encode([]string{"CLIENT", "SETNAME", "own"}), bc.req...)
					bc.want = append([]byte("+OK\r\n"), bc.want...)
				}
				bc.reply = make([]byte, len(bc.want))
				if err := bc.roundTrip(); err != nil {
					b.Fatal(err)
				}
				bc.req, bc.want = encode(tc.cmds...), []byte(tc.reply)
				bc.reply = bc.reply[:len(bc.want)]
				b.ReportAllocs()
				b.ResetTimer()
				for b.Loop() {
					if err := bc.roundTrip(); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// mustOK sends cmd to s and requires +OK.
func mustOK(t *testing.T, s *redistest.Server, cmd string) {
	t.Helper()
	if got := string(dial(t, s.Addr).do(args(cmd))); !strings.HasPrefix(got, "+OK") {
		t.Fatalf("%s: %q", cmd, got)
	}
}

// startMigrating starts moving slot from `from` to `to`, without moving
// a key: `from` answers a command on a key it does not hold with ASK, and
// `to` takes it after ASKING.
func startMigrating(t *testing.T, from, to *redistest.Server, slot string) {
	t.Helper()
	mustOK(t, to, "CLUSTER SETSLOT "+slot+" IMPORTING "+nodeID(t, from))
	mustOK(t, from, "CLUSTER SETSLOT "+slot+" MIGRATING "+nodeID(t, to))
}

// TestClusterWaitSharedWrites: WAIT from a client without connection state
// counts the replicas that have its writes, which went on the master's
// shared connections while WAIT goes on a connection of the client's own:
// with the replica stopped, one Redis answers :0 after the timeout (a
// fresh connection's WAIT would count every replica at once).
func TestClusterWaitSharedWrites(t *testing.T) {
	c := redistest.StartCluster(t, 3, 1)
	addr, _ := startClusterProxy(t, c)
	k := keyOn(0, "w")
	replica := replicaOf(t, c, c.Nodes[0])
	a := dial(t, addr)
	if got := string(a.do(args("SET "+k+" 0"), args("WAIT 1 5000"))); got != "+OK\r\n:1\r\n" {
		t.Fatalf("SET, WAIT with the replica up: %q", got)
	}
	replica.Pause()
	defer replica.Resume()
	b := dial(t, addr)
	if got := string(b.do(args("SET " + k + " 1"))); got != "+OK\r\n" {
		t.Fatalf("SET: %q", got)
	}
	if got := string(b.do(args("WAIT 1 300"))); got != ":0\r\n" {
		t.Errorf("WAIT 1 300 after a write the stopped replica cannot have: %q, want :0 as from Redis", got)
	}
}

// replicaOf returns the node of c that replicates master.
func replicaOf(tb testing.TB, c *redistest.Cluster, master *redistest.Server) *redistest.Server {
	tb.Helper()
	repl := string(dial(tb, master.Addr).do(args("INFO replication")))
	for _, n := range c.Nodes[c.Masters:] {
		if strings.Contains(repl, ",port="+strconv.Itoa(n.Port())+",") {
			return n
		}
	}
	tb.Fatalf("no replica of %s among the nodes: %q", master.Addr, repl)
	return nil
}

// startOwnClient starts a cluster of three masters, emptied, and a proxy
// in front of it, and returns a client named name (so on connections of
// its own) and how many own-connection readers ran before it.
func startOwnClient(tb *testing.T, name string) (*redistest.Cluster, *Proxy, *client, int) {
	tb.Helper()
	c := redistest.StartCluster(tb, 3, 0)
	addr, p := startClusterProxy(tb, c)
	flushCluster(tb, c)
	base := ownReaders()
	a := dial(tb, addr)
	a.do(args("CLIENT SETNAME " + name))
	return c, p, a, base
}
