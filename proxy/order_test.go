package proxy

import (
	"bytes"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/lockproxy/lockproxy/internal/redistest"
)

// gate sits between the proxy and Redis. While it is shut, the connections
// it accepts get nowhere: a dial through it stalls, as a slow dial would,
// for as long as the test wants.
type gate struct {
	addr    string
	shut    atomic.Bool
	relayed atomic.Int64 // connections let through
}

func startGate(t *testing.T, target string) *gate {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := &gate{addr: ln.Addr().String()}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			if g.shut.Load() {
				continue // held until the test ends
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, up)
			mu.Unlock()
			g.relayed.Add(1)
			wg.Add(2)
			go func() {
				defer wg.Done()
				io.Copy(up, c)
				up.Close()
			}()
			go func() {
				defer wg.Done()
				io.Copy(c, up)
				c.Close()
			}()
		}
	}()
	return g
}

// TestDifferentialBlockingOrder is the Redis test suite's "Blocking XREAD:
// key type changed with SET" and its BLPOP twin: a client's first
// blocking command moves it to a dedicated backend connection, and another
// client changes the key right after. Redis serves them in the order they
// were sent: the blocked client waits on through the type change and gets
// the entry added later. Had the move dialed a connection on the request
// path, the other client's SET could reach Redis first, and the blocking
// command would answer WRONGTYPE at once.
//
// So that the outcome does not hang on how goroutines are scheduled, no new
// backend connection can be made once the clients are connected (the gate
// holds them), and the other client writes once Redis has the blocking
// command: that happens only if the move took a connection dialed before.
func TestDifferentialBlockingOrder(t *testing.T) {
	srv := redistest.Start(t)
	g := startGate(t, srv.Addr)
	// The proxy selects a database on each new backend connection: a
	// dial is a round trip, which the gate holds once shut.
	addr, _ := startProxy(t, g.addr, func(c *Config) { c.Backend.DB = 1 })
	steps := []step{
		// Connected, as the suite's redis_deferring_client is, and still
		// on a shared backend connection.
		send("a", "PING"),
		send("l", "PING"),
		send("b", "DEL mystream", "XADD mystream 666 f v", "DEL list"),
		sendNoRead("a", "XREAD BLOCK 0 STREAMS mystream $"),
		{blocked: 1},
		send("b", "SET mystream val1"),
		send("b", "DEL mystream", "XADD mystream 667 f v"),
		readOn("a", 1),
		sendNoRead("l", "BLPOP list 0"),
		{blocked: 1},
		send("b", "SET list notalist"),
		send("b", "DEL list", "RPUSH list v"),
		readOn("l", 1),
	}
	// Direct, in database 0; through the proxy, in database 1: the
	// replies do not depend on the database.
	mustFlush(t, srv)
	want := run(t, srv, srv.Addr, steps)

	// The shared connections are dialed on first use: use them all, and
	// wait for the spare ones, before the gate shuts.
	shared, spares := DefaultConfig().Backend.SharedConnections, DefaultConfig().Backend.SpareConnections
	for range 2 * shared {
		dial(t, addr).do(args("PING"))
	}
	eventually(t, "the shared and spare backend connections", func() bool {
		return g.relayed.Load() == int64(shared+spares)
	})
	g.shut.Store(true)
	mustFlush(t, srv)
	got := run(t, srv, addr, steps)
	if !bytes.Equal(got, want) {
		t.Fatalf("replies differ\nthrough proxy: %q\ndirect:        %q", trunc(got), trunc(want))
	}
}

// TestSpareClosedByRedis: a spare connection Redis closed while it waited
// (CLIENT KILL, the timeout setting, a restart) is not handed to a client,
// which gets a working one instead of a lost connection.
func TestSpareClosedByRedis(t *testing.T) {
	srv := redistest.Start(t)
	addr, _ := startProxy(t, srv.Addr, nil)
	spares := DefaultConfig().Backend.SpareConnections
	eventually(t, "the spare connections", func() bool { return connectedClients(t, srv) == spares })
	// Kills every connection but the one that asks (SKIPME yes): the
	// proxy's spares.
	if r, err := srv.Do("CLIENT", "KILL", "TYPE", "normal"); err != nil || r != ":"+strconv.Itoa(spares) {
		t.Fatalf("CLIENT KILL: %q %v", r, err)
	}
	for i := range spares + 1 {
		c := dial(t, addr)
		if got := string(c.do(args("SELECT 0"), args("BLPOP nothing 0.01"))); got != "+OK\r\n*-1\r\n" {
			t.Fatalf("client %d: %q", i, got)
		}
	}
}

func TestSpareConnectionsConfig(t *testing.T) {
	tests := []struct {
		give int
		want int // spare connections kept; -1: the config is refused
	}{
		{give: 0, want: 0},
		{give: -1, want: 0},
		{give: 5, want: 5},
		{give: 1024, want: 1024},
		{give: 1025, want: -1},
	}
	for _, tt := range tests {
		cfg := DefaultConfig()
		cfg.Backend.Addr = "127.0.0.1:1"
		cfg.Backend.SpareConnections = tt.give
		p, err := New(cfg, nil)
		if tt.want < 0 {
			if err == nil {
				t.Errorf("SpareConnections %d: accepted", tt.give)
			}
			continue
		}
		if err != nil {
			t.Fatalf("SpareConnections %d: %v", tt.give, err)
		}
		got := p.spares.Size()
		if got != tt.want {
			t.Errorf("SpareConnections %d: %d kept, want %d", tt.give, got, tt.want)
		}
	}
}

// TestDifferentialOrderBehindSlowCommand: a command that waits in the
// proxy for its shared backend connection (a slow script of another
// client is in flight on it) reaches Redis before a command another client
// sends afterwards on a different backend connection, as it would reach
// Redis first directly: a GET sent after a SET sees the SET, both when the
// GET goes on a dedicated connection and on the other shared one.
func TestDifferentialOrderBehindSlowCommand(t *testing.T) {
	for _, tc := range []struct {
		name   string
		shared int
		other  [][]string // what the GET's client sends first
	}{
		{name: "dedicated", shared: 1, other: [][]string{{"SELECT", "0"}}},
		{name: "other shared", shared: 2, other: [][]string{{"PING"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t)
			addr, p := startProxy(t, srv.Addr, func(c *Config) { c.Backend.SharedConnections = tc.shared })
			want := playBehindSlow(t, srv.Addr, tc.other, func() { mustFlush(t, srv) }, nil)
			got := playBehindSlow(t, addr, tc.other, func() { mustFlush(t, srv) }, p)
			if !bytes.Equal(got, want) {
				t.Fatalf("replies differ\nthrough proxy: %q\ndirect:        %q", got, want)
			}
		})
	}
}

// playBehindSlow plays TestDifferentialOrderBehindSlowCommand's steps
// against addr, after flush, and returns the replies: s runs a script that
// keeps Redis busy for a second, a sets k behind it on the same shared
// connection, g reads k on another connection (it sends other first, in one write). The
// proxy hands out its shared connections in turn. With p (the proxy at
// addr) the steps wait until the script is in flight and the SET waits
// for its shared connection; directly, each write is in Redis's socket
// when it returns.
func playBehindSlow(t *testing.T, addr string, other [][]string, flush func(), p *Proxy) []byte {
	// Busy for a second: Redis runs nothing else meanwhile, and then takes
	// the commands that arrived in the order they arrived. The proxy must
	// have queued the SET before the script ends, which on a loaded machine
	// under the race detector can take a good part of that second.
	const slow = `local s = redis.call('TIME')
while true do
  local n = redis.call('TIME')
  if (n[1] - s[1]) * 1000000 + (n[2] - s[2]) > 1000000 then return 1 end
end`
	return playBehindSlowCmd(t, addr, other, flush, p, nil, []string{"EVAL", slow, "1", "k"})
}

// playBehindSlowCmd is playBehindSlow with another slow command, sent
// after setup.
func playBehindSlowCmd(t *testing.T, addr string, other [][]string, flush func(), p *Proxy, setup [][]string, slow []string) []byte {
	flush()
	s, g, a := dial(t, addr), dial(t, addr), dial(t, addr)
	s.do(args("PING"))
	for _, cmd := range setup {
		s.do(cmd)
	}
	g.do(other...)
	a.do(args("SET k old"))
	var out bytes.Buffer
	s.send(encode(slow))
	if p != nil {
		eventually(t, "the script in flight", func() bool { return sharedCounts(p).out > 0 })
	}
	a.send(encode(args("SET k new")))
	if p != nil {
		// Waiting for the script's reply, or written behind it at once
		// (Redis on another CPU: backend.Mux.FlushTurn).
		eventually(t, "the SET waiting for its shared connection or written", func() bool {
			c := sharedCounts(p)
			return c.queued > 0 || c.out > 1
		})
	}
	g.send(encode(args("GET k")))
	out.Write(g.read(1))
	out.Write(a.read(1))
	out.Write(s.read(1))
	return out.Bytes()
}

// sharedCounts sums, over p's shared connections (to the backend or to
// the masters of a cluster), the commands written whose replies have not
// been read, and those waiting to be written.
func sharedCounts(p *Proxy) (c struct{ out, queued int }) {
	all := p.shared
	if p.router != nil {
		all = p.router.SharedList()
	}
	for _, sh := range all {
		out, queued := sh.Counts()
		c.out += out
		c.queued += queued
	}
	return c
}
