package proxy

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/internal/redistest"
)

// The connection state a client set, across the loss of its backend
// connection (README, "What a lost backend connection does to a client's
// state"): every row sets one piece of state, the backend connections are
// lost, and the row checks that the client sees the state restored or a
// clear error (or has its connection closed), never a different state.

// lossRow is one row of the state table.
type lossRow struct {
	name string
	// before sets the state on c, a client of the proxy; it may leave a
	// command in flight.
	before func(t *testing.T, c *client)
	// closed: the proxy closes c's connection at the loss.
	closed bool
	// after checks c after the loss; o is another client of the proxy.
	after func(t *testing.T, c, o *client)
}

// expect sends cmds on c in one write and requires the replies, byte for
// byte.
func expect(t *testing.T, c *client, want string, cmds ...string) {
	t.Helper()
	expectN(t, c, len(cmds), want, cmds...)
}

// expectN is expect for commands of which n get a reply (CLIENT REPLY).
func expectN(t *testing.T, c *client, n int, want string, cmds ...string) {
	t.Helper()
	enc := make([][]string, len(cmds))
	for i, cmd := range cmds {
		enc[i] = args(cmd)
	}
	c.send(encode(enc...))
	if got := string(c.read(n)); got != want {
		t.Errorf("%q: got %q, want %q", cmds, got, want)
	}
}

// expectPrefix is expect for one command whose reply varies past prefix.
func expectPrefix(t *testing.T, c *client, prefix, cmd string) {
	t.Helper()
	if got := string(c.do(args(cmd))); !strings.HasPrefix(got, prefix) {
		t.Errorf("%q: got %q, want %q...", cmd, got, prefix)
	}
}

var txLost = string(replyTxnLost)

// stateRows is the state table. The backend must have the ACL users
// alice and bob (password pw, see addUsers). The keys of a transaction
// share a hash tag, for the cluster.
func stateRows() []lossRow {
	var target *client // the redirect target of CLIENT TRACKING ... REDIRECT
	return []lossRow{
		{
			name:   "db (SELECT)",
			before: func(t *testing.T, c *client) { expect(t, c, "+OK\r\n+OK\r\n", "SELECT 3", "SET tx:db v") },
			after:  func(t *testing.T, c, _ *client) { expect(t, c, "$1\r\nv\r\n", "GET tx:db") },
		},
		{
			name:   "protocol (HELLO 3)",
			before: func(t *testing.T, c *client) { expectPrefix(t, c, "%7\r\n", "HELLO 3") },
			after:  func(t *testing.T, c, _ *client) { expect(t, c, "%0\r\n", "HGETALL tx:none") },
		},
		{
			name:   "name (CLIENT SETNAME)",
			before: func(t *testing.T, c *client) { expect(t, c, "+OK\r\n", "CLIENT SETNAME keeper") },
			after:  func(t *testing.T, c, _ *client) { expect(t, c, "$6\r\nkeeper\r\n", "CLIENT GETNAME") },
		},
		{
			name: "name (HELLO SETNAME after CLIENT SETNAME)",
			before: func(t *testing.T, c *client) {
				expect(t, c, "+OK\r\n", "CLIENT SETNAME first")
				expectPrefix(t, c, "*14\r\n", "HELLO 2 SETNAME second")
			},
			after: func(t *testing.T, c, _ *client) {
				expect(t, c, "$6\r\nsecond\r\n*0\r\n", "CLIENT GETNAME", "HGETALL tx:none")
			},
		},
		{
			name:   "user (AUTH)",
			before: func(t *testing.T, c *client) { expect(t, c, "+OK\r\n", "AUTH alice pw") },
			after:  func(t *testing.T, c, _ *client) { expect(t, c, "$5\r\nalice\r\n", "ACL WHOAMI") },
		},
		{
			name: "user (HELLO AUTH, then AUTH)",
			before: func(t *testing.T, c *client) {
				expectPrefix(t, c, "%7\r\n", "HELLO 3 AUTH bob pw")
				expect(t, c, "+OK\r\n", "AUTH alice pw")
			},
			after: func(t *testing.T, c, _ *client) {
				expect(t, c, "$5\r\nalice\r\n%0\r\n", "ACL WHOAMI", "HGETALL tx:none")
			},
		},
		{
			name: "user and name (AUTH, then HELLO AUTH SETNAME)",
			before: func(t *testing.T, c *client) {
				expect(t, c, "+OK\r\n", "AUTH alice pw")
				expectPrefix(t, c, "*14\r\n", "HELLO 2 AUTH bob pw SETNAME bobs")
			},
			after: func(t *testing.T, c, _ *client) {
				expect(t, c, "$3\r\nbob\r\n$4\r\nbobs\r\n", "ACL WHOAMI", "CLIENT GETNAME")
			},
		},
		{
			name: "CLIENT TRACKING",
			before: func(t *testing.T, c *client) {
				expectPrefix(t, c, "%7\r\n", "HELLO 3")
				expect(t, c, "+OK\r\n", "CLIENT TRACKING on")
			},
			closed: true,
		},
		{
			name: "CLIENT TRACKING REDIRECT",
			before: func(t *testing.T, c *client) {
				target = dial(t, c.c.RemoteAddr().String())
				id := strings.TrimSuffix(strings.TrimPrefix(string(target.do(args("CLIENT ID"))), ":"), "\r\n")
				expectPrefix(t, target, "*3\r\n$9\r\nsubscribe\r\n", "SUBSCRIBE __redis__:invalidate")
				expect(t, c, "+OK\r\n", "CLIENT TRACKING on REDIRECT "+id)
			},
			closed: true,
			after: func(t *testing.T, _, _ *client) {
				if rest, closed := target.closedAfter(5 * time.Second); !closed {
					t.Errorf("the redirect target kept its connection (read %q)", rest)
				}
			},
		},
		{
			name: "CLIENT REPLY OFF",
			before: func(t *testing.T, c *client) {
				c.send(encode(args("CLIENT REPLY OFF"), args("SET tx:off 1")))
			},
			after: func(t *testing.T, c, _ *client) {
				expectN(t, c, 2, "+OK\r\n$1\r\n2\r\n", "SET tx:off 2", "CLIENT REPLY ON", "GET tx:off")
			},
		},
		{
			name:   "CLIENT REPLY SKIP",
			before: func(t *testing.T, c *client) { c.send(encode(args("CLIENT REPLY SKIP"))) },
			after: func(t *testing.T, c, _ *client) {
				expectN(t, c, 1, "$1\r\n1\r\n", "SET tx:skip 1", "GET tx:skip")
			},
		},
		{
			name:   "CLIENT NO-EVICT",
			before: func(t *testing.T, c *client) { expect(t, c, "+OK\r\n", "CLIENT NO-EVICT on") },
			after: func(t *testing.T, c, _ *client) {
				if got := string(c.do(args("CLIENT INFO"))); !strings.Contains(got, " flags=e ") {
					t.Errorf("CLIENT INFO after the loss: %q, want flags=e", got)
				}
			},
		},
		{
			// Redis 7.2 has NO-TOUCH; before it, the command is refused
			// and there is no state to keep.
			name: "CLIENT NO-TOUCH",
			before: func(t *testing.T, c *client) {
				if got := string(c.do(args("CLIENT NO-TOUCH on"))); got != "+OK\r\n" && !strings.HasPrefix(got, "-ERR unknown subcommand") {
					t.Errorf("CLIENT NO-TOUCH on: %q", got)
				}
			},
			after: func(t *testing.T, c, _ *client) {
				touch := !strings.HasPrefix(string(c.do(args("CLIENT NO-TOUCH off"))), "-")
				if !touch {
					return
				}
				c.do(args("CLIENT NO-TOUCH on"))
				if got := string(c.do(args("CLIENT INFO"))); !strings.Contains(got, "T") {
					t.Errorf("CLIENT INFO after the loss: %q, want flag T", got)
				}
			},
		},
		{
			// Only a cluster node accepts READONLY: one Redis refuses it
			// before and after alike.
			name:   "READONLY",
			before: func(t *testing.T, c *client) { expectPrefix(t, c, "-ERR", "READONLY") },
			after:  func(t *testing.T, c, _ *client) { expectPrefix(t, c, "-ERR", "READONLY") },
		},
		{
			name: "subscriptions",
			before: func(t *testing.T, c *client) {
				expect(t, c, "*3\r\n$9\r\nsubscribe\r\n$2\r\nch\r\n:1\r\n*3\r\n$10\r\npsubscribe\r\n$2\r\np*\r\n:2\r\n", "SUBSCRIBE ch", "PSUBSCRIBE p*")
			},
			closed: true,
		},
		{
			name:   "MONITOR",
			before: func(t *testing.T, c *client) { expect(t, c, "+OK\r\n", "MONITOR") },
			closed: true,
		},
		{
			name:   "a blocking command in flight",
			before: func(t *testing.T, c *client) { c.send(encode(args("BLPOP tx:none 0"))) },
			after: func(t *testing.T, c, _ *client) {
				if got := string(c.read(1)); got != string(replyConnLost) {
					t.Errorf("BLPOP in flight: %q, want %q", got, replyConnLost)
				}
				expect(t, c, "+PONG\r\n", "PING")
			},
		},
		{
			name:   "MULTI",
			before: func(t *testing.T, c *client) { expect(t, c, "+OK\r\n+QUEUED\r\n", "MULTI", "INCR {tx}a") },
			after: func(t *testing.T, c, _ *client) {
				expect(t, c, txLost+txLost+string(replyExecAbort)+"$-1\r\n$-1\r\n",
					"INCR {tx}b", "SET {tx}c 1", "EXEC", "GET {tx}a", "GET {tx}b")
			},
		},
		{
			// PING: in front of a cluster a MULTI waits for the first
			// command to go to a master (nothing is lost before it).
			name:   "MULTI ended by DISCARD",
			before: func(t *testing.T, c *client) { expect(t, c, "+OK\r\n+QUEUED\r\n", "MULTI", "PING") },
			after: func(t *testing.T, c, _ *client) {
				expect(t, c, "-ERR MULTI calls can not be nested\r\n"+txLost+"+OK\r\n$-1\r\n", "MULTI", "SET {tx}d 1", "DISCARD", "GET {tx}d")
			},
		},
		{
			name:   "WATCH",
			before: func(t *testing.T, c *client) { expect(t, c, "+OK\r\n", "WATCH tx:w") },
			after: func(t *testing.T, c, o *client) {
				expect(t, o, "+OK\r\n", "SET tx:w theirs")
				expect(t, c, "+OK\r\n+QUEUED\r\n*-1\r\n$6\r\ntheirs\r\n", "MULTI", "SET tx:w mine", "EXEC", "GET tx:w")
			},
		},
		{
			name: "WATCH in RESP3",
			before: func(t *testing.T, c *client) {
				expectPrefix(t, c, "%7\r\n", "HELLO 3")
				expect(t, c, "+OK\r\n", "WATCH tx:w3")
			},
			after: func(t *testing.T, c, _ *client) {
				expect(t, c, "+OK\r\n+QUEUED\r\n_\r\n_\r\n", "MULTI", "SET tx:w3 mine", "EXEC", "GET tx:w3")
			},
		},
		{
			name:   "WATCH ended by UNWATCH",
			before: func(t *testing.T, c *client) { expect(t, c, "+OK\r\n", "WATCH tx:u") },
			after: func(t *testing.T, c, _ *client) {
				expect(t, c, "+OK\r\n+OK\r\n+QUEUED\r\n*1\r\n+OK\r\n", "UNWATCH", "MULTI", "SET tx:u mine", "EXEC")
			},
		},
	}
}

// rowsNamed returns the rows of the table whose names start with one of
// prefixes.
func rowsNamed(prefixes ...string) []lossRow {
	var rows []lossRow
	for _, row := range stateRows() {
		for _, prefix := range prefixes {
			if strings.HasPrefix(row.name, prefix) {
				rows = append(rows, row)
				break
			}
		}
	}
	return rows
}

// addUsers creates the ACL users the table's rows authenticate as.
func addUsers(t *testing.T, servers ...*redistest.Server) {
	t.Helper()
	for _, s := range servers {
		for _, u := range []string{"alice", "bob"} {
			if r, err := s.Do("ACL", "SETUSER", u, "on", ">pw", "~*", "&*", "+@all"); err != nil || r != "+OK" {
				t.Fatalf("ACL SETUSER %s on %s: %q %v", u, s.Addr, r, err)
			}
		}
	}
}

// runRows sets every row's state on a client of its own at addr, calls
// lose, waits until p has seen every client's backend connection go and
// ready reports the backend usable, and checks every row.
func runRows(t *testing.T, p *Proxy, addr string, rows []lossRow, lose func(), ready func() bool) {
	clients := make([]*client, len(rows))
	for i, row := range rows {
		clients[i] = dial(t, addr)
		t.Run(row.name+"/before", func(t *testing.T) {
			clients[i].tb = t
			row.before(t, clients[i])
		})
	}
	// What the rows sent without waiting for a reply has been handled.
	time.Sleep(50 * time.Millisecond)
	lose()
	waitUntil(t, 10*time.Second, "every backend connection seen lost", func() bool { return allLost(p) })
	waitUntil(t, 20*time.Second, "the backend usable again", ready)
	o := dial(t, addr)
	waitUntil(t, 5*time.Second, "a command through the proxy", func() bool { return string(o.do(args("PING"))) == "+PONG\r\n" })
	for i, row := range rows {
		t.Run(row.name+"/after", func(t *testing.T) {
			clients[i].tb, o.tb = t, t
			if row.closed {
				if rest, closed := clients[i].closedAfter(5 * time.Second); !closed {
					t.Errorf("kept its connection (read %q)", rest)
				}
			}
			if row.after != nil {
				row.after(t, clients[i], o)
			}
		})
	}
}

// allLost reports whether no client of p has a backend connection of its
// own that p has not seen lost.
func allLost(p *Proxy) bool {
	for s := range p.sessionsNow() {
		s.q.mu.Lock()
		live := s.q.be != nil && !s.q.be.Dead
		s.q.mu.Unlock()
		if live {
			return false
		}
	}
	return true
}

// killClients closes every client connection of srv (CLIENT KILL TYPE
// normal, and TYPE pubsub for the subscribed ones, from a connection of
// its own) and returns how many it closed.
func killClients(t testing.TB, srv *redistest.Server) int {
	n := 0
	for _, typ := range []string{"normal", "pubsub"} {
		r, err := srv.Do("CLIENT", "KILL", "TYPE", typ)
		if err != nil || !strings.HasPrefix(r, ":") {
			t.Errorf("CLIENT KILL TYPE %s on %s: %q %v", typ, srv.Addr, r, err)
			continue
		}
		k, _ := strconv.Atoi(r[1:])
		n += k
	}
	return n
}

// TestStateAcrossConnectionLoss runs the state table against one Redis
// whose clients are killed.
func TestStateAcrossConnectionLoss(t *testing.T) {
	srv := redistest.Start(t)
	addUsers(t, srv)
	addr, p := startProxy(t, srv.Addr, nil)
	runRows(t, p, addr, stateRows(), func() { killClients(t, srv) }, func() bool { return true })
}

// TestStateAcrossFailover runs the state table through a Sentinel
// failover: SENTINEL FAILOVER, and a SIGKILL of the primary.
func TestStateAcrossFailover(t *testing.T) {
	for _, kill := range []bool{false, true} {
		t.Run(map[bool]string{false: "SENTINEL FAILOVER", true: "primary killed"}[kill], func(t *testing.T) {
			t.Parallel()
			g := redistest.StartGroup(t, "txloss", 1, 3)
			addUsers(t, g.Servers()...)
			addr, p, _ := startSentinelProxy(t, g)
			old := g.Primary
			runRows(t, p, addr, stateRows(), func() {
				waitReplicated(t, old)
				if kill {
					old.Kill()
				} else {
					g.Failover()
				}
			}, func() bool {
				b := p.Backend()
				return b.Primary != "" && b.Primary != old.Addr
			})
		})
	}
}

// TestTxAcrossRepeatedFailovers runs the MULTI and WATCH rows of the
// table through three Sentinel failovers in a row (SENTINEL FAILOVER).
func TestTxAcrossRepeatedFailovers(t *testing.T) {
	t.Parallel()
	g := redistest.StartGroup(t, "txrepeat", 2, 3)
	for _, s := range g.Servers() {
		// A replica moved to a new primary syncs at once, not 5 s later.
		if r, err := s.Do("CONFIG", "SET", "repl-diskless-sync-delay", "0"); err != nil || r != "+OK" {
			t.Fatalf("CONFIG SET on %s: %q %v", s.Addr, r, err)
		}
	}
	addr, p, _ := startSentinelProxy(t, g)
	rows := rowsNamed("MULTI", "WATCH")
	for i := range 3 {
		old := p.Backend().Primary
		start := time.Now()
		t.Run(fmt.Sprintf("failover %d", i+1), func(t *testing.T) {
			runRows(t, p, addr, rows, func() { failoverWhenReady(t, g) }, func() bool {
				b := p.Backend()
				return b.Primary != "" && b.Primary != old
			})
		})
		t.Logf("failover %d: %v", i+1, time.Since(start).Round(time.Millisecond))
	}
	if f := p.Backend().Failovers; f != 3 {
		t.Errorf("the proxy followed %d failovers, want 3", f)
	}
}

// failoverWhenReady asks a Sentinel to fail over, again while it answers
// that the last failover is still in progress or that no replica is fit
// yet (a replica of the new primary is still syncing), for at most 20 s.
func failoverWhenReady(t *testing.T, g *redistest.Group) {
	c := redis.NewSentinelClient(&redis.Options{Addr: g.Sentinels[0].Addr})
	defer c.Close()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := c.Failover(ctx, g.MasterName).Err()
		cancel()
		if err == nil {
			return
		}
		retry := strings.HasPrefix(err.Error(), "INPROG") || strings.HasPrefix(err.Error(), "NOGOODSLAVE")
		if !retry || time.Now().After(deadline) {
			t.Fatalf("SENTINEL FAILOVER: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitReplicated waits until the replicas of srv have everything it wrote.
func waitReplicated(t *testing.T, srv *redistest.Server) {
	t.Helper()
	c := dial(t, srv.Addr)
	defer c.c.Close()
	waitUntil(t, 5*time.Second, "the replicas in sync", func() bool {
		info := string(c.do(args("INFO replication")))
		var offset string
		for _, line := range strings.Split(info, "\r\n") {
			if v, ok := strings.CutPrefix(line, "master_repl_offset:"); ok {
				offset = v
			}
		}
		return strings.Contains(info, ",offset="+offset+",")
	})
}

// TestClusterTxAcrossConnectionLoss runs the rows of the table that a
// cluster keeps (protocol, name, user, MULTI, WATCH, CLIENT TRACKING
// without REDIRECT) through a proxy in front of a Redis Cluster whose
// masters kill their clients.
func TestClusterTxAcrossConnectionLoss(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	addUsers(t, c.Nodes...)
	addr, p := startClusterProxy(t, c)
	rows := rowsNamed("protocol", "name", "user", "MULTI", "WATCH", "CLIENT REPLY", "CLIENT NO-EVICT", "CLIENT NO-TOUCH", "CLIENT TRACKING")
	runRows(t, p, addr, rows, func() {
		for _, s := range c.Nodes[:c.Masters] {
			killClients(t, s)
		}
	}, func() bool { return true })
}

// loopConn is a RESP connection for the loops' goroutines: it returns
// errors instead of failing the test.
type loopConn struct {
	c net.Conn
	r *bufio.Reader
}

func loopDial(addr string) (*loopConn, error) {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return nil, err
	}
	return &loopConn{c: c, r: bufio.NewReader(c)}, nil
}

// do sends cmds in one write and returns each reply, raw.
func (l *loopConn) do(cmds ...[]string) ([]string, error) {
	l.c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := l.c.Write(encode(cmds...)); err != nil {
		return nil, err
	}
	out := make([]string, len(cmds))
	for i := range out {
		var b bytes.Buffer
		if err := readValue(&b, l.r); err != nil {
			return out[:i], err
		}
		out[i] = b.String()
	}
	return out, nil
}

// lossBackend is where the loops run: the proxy in front of it, how to
// make it close every client connection, and the master of the hash tag
// {tx}, where the checker reads.
type lossBackend struct {
	addr   string
	master string
	kill   func()
}

// TestTxUnderConnectionLoss runs transactions and WATCH compare-and-set
// loops through the proxy while the backend closes every client
// connection every 20 ms, in front of one Redis and of a cluster.
func TestTxUnderConnectionLoss(t *testing.T) {
	t.Run("one Redis", func(t *testing.T) {
		t.Parallel()
		srv := redistest.Start(t)
		addr, _ := startProxy(t, srv.Addr, nil)
		b := lossBackend{addr: addr, master: srv.Addr, kill: func() { killClients(t, srv) }}
		t.Run("MULTI INCR INCR EXEC", func(t *testing.T) { testTxLoop(t, b) })
		t.Run("WATCH compare-and-set", func(t *testing.T) { testCASLoop(t, b) })
	})
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		c := redistest.StartCluster(t, 3, 0)
		addr, _ := startClusterProxy(t, c)
		masters := c.Nodes[:c.Masters]
		b := lossBackend{addr: addr, kill: func() {
			for _, s := range masters {
				killClients(t, s)
			}
		}}
		for _, s := range masters {
			if r, _ := s.Do("GET", "{tx}a"); !strings.HasPrefix(r, "-MOVED") {
				b.master = s.Addr
			}
		}
		t.Run("MULTI INCR INCR EXEC", func(t *testing.T) { testTxLoop(t, b) })
		t.Run("WATCH compare-and-set", func(t *testing.T) { testCASLoop(t, b) })
	})
}

// lossLoop runs work on n goroutines, kills the backend's clients every
// 20 ms and calls check every 2 ms, for 2 s; it returns the kills made.
func lossLoop(t *testing.T, b lossBackend, n int, work func(i int, stop <-chan struct{}), check func()) int {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			work(i, stop)
		}()
	}
	kills := 0
	killT := time.NewTicker(20 * time.Millisecond)
	checkT := time.NewTicker(2 * time.Millisecond)
	end := time.After(2 * time.Second)
loop:
	for {
		select {
		case <-killT.C:
			b.kill()
			kills++
		case <-checkT.C:
			check()
		case <-end:
			break loop
		}
	}
	killT.Stop()
	checkT.Stop()
	close(stop)
	wg.Wait()
	check()
	return kills
}

// readInts reads the integer values of keys from the master directly,
// in one MGET; ok is false when the connection was killed meanwhile.
func readInts(t *testing.T, master string, keys ...string) (vals []int, ok bool) {
	l, err := loopDial(master)
	if err != nil {
		t.Errorf("checker: %v", err)
		return nil, false
	}
	defer l.c.Close()
	r, err := l.do(append([]string{"MGET"}, keys...))
	if err != nil {
		return nil, false // killed
	}
	lines := strings.Split(r[0], "\r\n")[1:] // after *n: $len and value, or $-1
	for range keys {
		n := 0
		if lines[0] != "$-1" {
			n, _ = strconv.Atoi(lines[1])
			lines = lines[1:]
		}
		lines = lines[1:]
		vals = append(vals, n)
	}
	return vals, true
}

// testTxLoop runs clients doing MULTI, INCR {tx}a, INCR {tx}b, EXEC, half
// of them one command at a time, half in one pipeline, under repeated
// connection loss. a and b must be equal on the backend at every check,
// every INCR answered inside the transaction must be QUEUED or an error
// (never run at once), and every EXEC that succeeded applied both.
func testTxLoop(t *testing.T, b lossBackend) {
	var ok, lost, aborted atomic.Int64 // EXECs: applied, unknown, aborted
	var mu sync.Mutex
	bad := map[string]int{}
	note := func(what string) {
		mu.Lock()
		bad[what]++
		mu.Unlock()
	}
	work := func(i int, stop <-chan struct{}) {
		l, err := loopDial(b.addr)
		if err != nil {
			t.Error(err)
			return
		}
		defer l.c.Close()
		cmds := [][]string{args("MULTI"), args("INCR {tx}a"), args("INCR {tx}b"), args("EXEC")}
		for {
			select {
			case <-stop:
				return
			default:
			}
			var r []string
			if i%2 == 0 {
				r, err = l.do(cmds...)
			} else {
				for _, cmd := range cmds {
					var one []string
					if one, err = l.do(cmd); err != nil {
						break
					}
					r = append(r, one...)
				}
			}
			if err != nil {
				t.Errorf("client %d: %v", i, err)
				return
			}
			for _, q := range r[1:3] {
				if !strings.HasPrefix(q, "+QUEUED") && !strings.HasPrefix(q, "-") {
					note("queued command answered " + q)
				}
			}
			switch exec := r[3]; {
			case strings.HasPrefix(exec, "*2\r\n:"):
				v := strings.Split(exec, "\r\n")
				if v[1] != v[2] {
					note("EXEC applied a and b apart: " + exec)
				}
				ok.Add(1)
			case exec == string(replyConnLost) || strings.HasPrefix(exec, "-ERR backend unavailable"):
				lost.Add(1)
			case exec == string(replyExecAbort):
				aborted.Add(1)
			default:
				note("EXEC answered " + exec)
			}
		}
	}
	checks := 0
	check := func() {
		v, read := readInts(t, b.master, "{tx}a", "{tx}b")
		if !read {
			return
		}
		checks++
		if v[0] != v[1] {
			note(fmt.Sprintf("a=%d b=%d on the backend", v[0], v[1]))
		}
	}
	before, _ := readInts(t, b.master, "{tx}a")
	kills := lossLoop(t, b, 4, work, check)
	after, read := readInts(t, b.master, "{tx}a")
	if !read {
		t.Fatal("no final read")
	}
	applied := int64(after[0] - before[0])
	t.Logf("%d kills, %d checks; EXEC: %d applied, %d aborted, %d unknown (connection lost); a grew by %d",
		kills, checks, ok.Load(), aborted.Load(), lost.Load(), applied)
	for what, n := range bad {
		t.Errorf("%d times: %s", n, what)
	}
	if applied < ok.Load() || applied > ok.Load()+lost.Load() {
		t.Errorf("a grew by %d, with %d EXECs applied and %d unknown", applied, ok.Load(), lost.Load())
	}
	if ok.Load() == 0 || aborted.Load() == 0 {
		t.Errorf("the loop did not exercise both outcomes: %d applied, %d aborted", ok.Load(), aborted.Load())
	}
}

// testCASLoop runs clients that increment {tx}cas with WATCH, GET, MULTI,
// SET, EXEC, against a writer that increments it with INCR, under repeated
// connection loss. No update is lost: the final value is at least the
// increments that answered success, and at most those plus the ones whose
// reply was lost.
func testCASLoop(t *testing.T, b lossBackend) {
	var casOK, casNull, writes, unknown atomic.Int64
	var mu sync.Mutex
	bad := map[string]int{}
	work := func(i int, stop <-chan struct{}) {
		l, err := loopDial(b.addr)
		if err != nil {
			t.Error(err)
			return
		}
		defer l.c.Close()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if i == 0 { // the writer
				r, err := l.do(args("INCR {tx}cas"))
				if err != nil {
					t.Errorf("writer: %v", err)
					return
				}
				if strings.HasPrefix(r[0], ":") {
					writes.Add(1)
				} else {
					unknown.Add(1)
				}
				continue
			}
			r, err := l.do(args("WATCH {tx}cas"), args("GET {tx}cas"))
			if err != nil {
				t.Errorf("client %d: %v", i, err)
				return
			}
			if r[0] != "+OK\r\n" || r[1][0] == '-' {
				l.do(args("UNWATCH"))
				continue
			}
			n := 0
			if v := strings.Split(r[1], "\r\n"); v[0] != "$-1" {
				n, _ = strconv.Atoi(v[1])
			}
			r, err = l.do(args("MULTI"), []string{"SET", "{tx}cas", strconv.Itoa(n + 1)}, args("EXEC"))
			if err != nil {
				t.Errorf("client %d: %v", i, err)
				return
			}
			switch exec := r[2]; {
			case exec == "*1\r\n+OK\r\n":
				casOK.Add(1)
			case exec == "*-1\r\n", exec == string(replyExecAbort):
				casNull.Add(1)
			case strings.HasPrefix(exec, "-ERR backend unavailable"):
				unknown.Add(1)
			default:
				mu.Lock()
				bad["EXEC answered "+exec]++
				mu.Unlock()
			}
		}
	}
	b.kill()
	before, _ := readInts(t, b.master, "{tx}cas")
	kills := lossLoop(t, b, 4, work, func() {})
	after, read := readInts(t, b.master, "{tx}cas")
	if !read {
		t.Fatal("no final read")
	}
	grew := int64(after[0] - before[0])
	done := casOK.Load() + writes.Load()
	t.Logf("%d kills; %d CAS applied, %d aborted, %d INCR applied, %d unknown; the value grew by %d",
		kills, casOK.Load(), casNull.Load(), writes.Load(), unknown.Load(), grew)
	for what, n := range bad {
		t.Errorf("%d times: %s", n, what)
	}
	if grew < done {
		t.Errorf("lost updates: the value grew by %d, %d increments answered success", grew, done)
	}
	if grew > done+unknown.Load() {
		t.Errorf("the value grew by %d, more than the %d applied and %d unknown", grew, done, unknown.Load())
	}
	if casOK.Load() == 0 || casNull.Load() == 0 {
		t.Errorf("the loop did not exercise both outcomes: %d applied, %d aborted", casOK.Load(), casNull.Load())
	}
}
