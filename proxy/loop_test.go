package proxy

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/internal/redistest"
)

// loopState returns where each client's socket is, by the client's
// address (lIdle ... lClosed; 0: never the loop's).
func loopState(p *Proxy) map[string]int32 {
	states := map[string]int32{}
	for s := range p.sessionsNow() {
		states[s.addr] = s.nc.lstate.Load()
	}
	return states
}

// TestReadLoopServesStatelessClients: a client that sends only stateless
// commands is read by the loop, whole requests or cut anywhere, and gets
// every reply; its first other command, alone or in the middle of a
// pipeline, hands it to its goroutine, which answers what follows in
// order, as Redis does.
func TestReadLoopServesStatelessClients(t *testing.T) {
	srv := redistest.Start(t)
	addr, p := startProxy(t, srv.Addr, nil)
	c := dial(t, addr)
	me := c.c.LocalAddr().String()
	rng := rand.New(rand.NewPCG(7, 41))
	for i := range 200 {
		val := strings.Repeat("x", rng.IntN(3)*40000+i)
		raw := encode(append(args(fmt.Sprintf("SET loop:%d", i%7)), val), args(fmt.Sprintf("STRLEN loop:%d", i%7)), args("PING"))
		for len(raw) > 0 {
			k := min(len(raw), 1+rng.IntN(200))
			if rng.IntN(4) == 0 {
				k = min(len(raw), 1+rng.IntN(30000))
			}
			c.send(raw[:k])
			raw = raw[k:]
			if rng.IntN(4) == 0 {
				time.Sleep(50 * time.Microsecond)
			}
		}
		want := fmt.Sprintf("+OK\r\n:%d\r\n+PONG\r\n", len(val))
		if got := string(c.read(3)); got != want {
			t.Fatalf("round %d: %q, want %q", i, trunc([]byte(got)), want)
		}
	}
	if st := loopState(p)[me]; st != lIdle {
		t.Fatalf("after stateless commands only, the socket is in state %d, want the loop's (%d)", st, lIdle)
	}
	// SELECT in the middle of a pipeline: the SET before it went from
	// the loop, the GET after it is the goroutine's, on database 1.
	got := string(c.do(args("SET loop:db zero"), args("SELECT 1"), args("GET loop:db"), args("SET loop:db one"), args("SELECT 0"), args("GET loop:db")))
	if want := "+OK\r\n+OK\r\n$-1\r\n+OK\r\n+OK\r\n$4\r\nzero\r\n"; got != want {
		t.Fatalf("across the hand-over: %q, want %q", got, want)
	}
	if st := loopState(p)[me]; st != lHanded {
		t.Fatalf("after SELECT, the socket is in state %d, want handed over (%d)", st, lHanded)
	}
	if n, h := p.m.loopClients.Load(), p.m.handedOver.Load(); n != 0 || h != 1 {
		t.Fatalf("lockproxy_read_loop_clients %d, handovers %d; want 0 and 1", n, h)
	}
	if got := string(c.do(args("MULTI"), args("INCR loop:n"), args("EXEC"))); got != "+OK\r\n+QUEUED\r\n*1\r\n:1\r\n" {
		t.Fatalf("a transaction after the hand-over: %q", got)
	}
}

// TestReadLoopHandsOverLocalCommands: a lock command (one of the proxy's
// own, answered locally) and QUIT leave the loop too, with the requests
// after them in the same read.
func TestReadLoopHandsOverLocalCommands(t *testing.T) {
	addr, _, _ := startLocalProxy(t)
	c := dial(t, addr)
	if got := string(c.do(args("SET k v"), args("ECHOLOCAL mine"), args("GET k"))); got != "+OK\r\n$4\r\nmine\r\n$1\r\nv\r\n" {
		t.Fatalf("a local command in a pipeline: %q", got)
	}
	q := dial(t, addr)
	q.send(encode(args("GET k"), args("QUIT"), args("GET k")))
	if got := string(q.read(2)); got != "$1\r\nv\r\n+OK\r\n" {
		t.Fatalf("QUIT in a pipeline: %q", got)
	}
	if rest, closed := q.closedAfter(5 * time.Second); !closed {
		t.Fatalf("QUIT left the connection open (read %q)", rest)
	}
}

// TestReadLoopProtocolError: a protocol error after requests the loop
// forwarded is answered after their replies, and the connection closed,
// as Redis does.
func TestReadLoopProtocolError(t *testing.T) {
	srv := redistest.Start(t)
	addr, _ := startProxy(t, srv.Addr, nil)
	for _, target := range []string{srv.Addr, addr} {
		c := dial(t, target)
		c.send([]byte("*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n*1\r\n$4\r\nPING\r\n*1\r\n$x\r\n"))
		got := string(c.read(3))
		if want := "+OK\r\n+PONG\r\n-ERR Protocol error: invalid bulk length\r\n"; got != want {
			t.Fatalf("%s: %q, want %q", target, got, want)
		}
		if rest, closed := c.closedAfter(5 * time.Second); !closed {
			t.Fatalf("%s: the connection stayed open (read %q)", target, rest)
		}
	}
}

// TestReadLoopClientsComeAndGo: clients the loop reads that hang up, idle
// or with commands in flight, are cleaned up; clients still connected at
// Shutdown are closed by it, at once.
func TestReadLoopClientsComeAndGo(t *testing.T) {
	srv := redistest.Start(t)
	cfg := DefaultConfig()
	cfg.Backend.Addr = srv.Addr
	p, addr, served := serveNew(t, cfg)
	for i := range 40 {
		c := dial(t, addr)
		switch i % 3 {
		case 0: // idle
		case 1: // a reply read
			c.do(args("INCR loop:gone"))
		case 2: // a reply in flight
			c.send(encode(args("INCR loop:gone"), args("GET loop:gone")))
		}
		c.c.Close()
	}
	eventually(t, "every client cleaned up", func() bool { return p.clients.Load() == 0 && p.m.loopClients.Load() == 0 })
	var stay []*client
	for range 10 {
		c := dial(t, addr)
		c.do(args("PING"))
		stay = append(stay, c)
	}
	for addr, st := range loopState(p) {
		if st != lIdle {
			t.Errorf("client %s in state %d, want the loop's", addr, st)
		}
	}
	if n := p.m.loopClients.Load(); n != 10 {
		t.Errorf("lockproxy_read_loop_clients %d, want 10", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	if err := p.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if err := <-served; err != nil {
		t.Fatalf("Serve: %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Shutdown took %v with idle clients", d)
	}
	for _, c := range stay {
		if _, closed := c.closedAfter(time.Second); !closed {
			t.Error("a client the loop read stayed connected after Shutdown")
		}
	}
}

// TestReadLoopArrivalOrder: a client the loop reads and one its goroutine
// reads keep one arrival order: a SET sent right after another client's
// XREAD BLOCK reaches Redis after it, as with Redis itself. The XREAD's
// client is handed over at its XREAD, the SET's stays the loop's.
func TestReadLoopArrivalOrder(t *testing.T) {
	srv := redistest.Start(t)
	addr, p := startProxy(t, srv.Addr, nil)
	const rounds = 100
	wrong, sample := arrivalRounds(t, addr, rounds, false)
	t.Logf("%d of %d rounds out of order %s", wrong, rounds, sample)
	if wrong > rounds/4 {
		t.Fatalf("%d of %d rounds out of order: %s", wrong, rounds, sample)
	}
	if h := p.m.handedOver.Load(); h != rounds {
		t.Fatalf("%d clients handed over, want %d (the XREADs' only)", h, rounds)
	}
}

// TestReadLoopCluster: in front of a cluster the loop forwards a client's
// commands whose keys are in one slot, on the masters' shared
// connections, its replies in order across masters; a command with keys in
// several slots, or none, hands the client to its goroutine, which answers
// it as before.
func TestReadLoopCluster(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	addr, p := startClusterProxy(t, c)
	// The slot map and the COMMAND table are read as the proxy starts;
	// a client that came before would be handed over at once.
	eventually(t, "the cluster's COMMAND table read", func() bool {
		_, ok := p.router.Table().Loaded()
		return ok
	})
	cl := dial(t, addr)
	me := cl.c.LocalAddr().String()
	for round := range 20 {
		var cmds [][]string
		var want strings.Builder
		for i := range 30 {
			key := fmt.Sprintf("loop:%d:%d", round, i) // slots all over
			cmds = append(cmds, []string{"SET", key, key}, []string{"GET", key})
			fmt.Fprintf(&want, "+OK\r\n$%d\r\n%s\r\n", len(key), key)
		}
		if got := string(cl.do(cmds...)); got != want.String() {
			t.Fatalf("round %d: %q, want %q", round, trunc([]byte(got)), want.String())
		}
	}
	if st := loopState(p)[me]; st != lIdle {
		t.Fatalf("after single-slot commands, the socket is in state %d, want the loop's (%d)", st, lIdle)
	}
	got := string(cl.do(args("SET {a}x 1"), args("MGET loop:0:0 loop:0:1 {a}x"), args("GET {a}x")))
	if want := "+OK\r\n*3\r\n$8\r\nloop:0:0\r\n$8\r\nloop:0:1\r\n$1\r\n1\r\n$1\r\n1\r\n"; got != want {
		t.Fatalf("a cross-slot MGET in a pipeline: %q, want %q", got, want)
	}
	if st := loopState(p)[me]; st != lHanded {
		t.Fatalf("after a cross-slot MGET, the socket is in state %d, want handed over (%d)", st, lHanded)
	}
}

// TestReadLoopMixedClients: clients that send pipelines cut at random
// places, some handed over mid-pipeline (a SELECT of the same database),
// some hanging up with a command in flight while the loop reads them and
// coming back, get every reply they are owed, in order, and the command
// sent before a hang-up runs before those sent after it. One shared
// connection: across two, the command before the hang-up can still reach
// Redis after one sent on the other after it (with or without the loop).
func TestReadLoopMixedClients(t *testing.T) {
	srv := redistest.Start(t)
	addr, p := startProxy(t, srv.Addr, func(c *Config) { c.Backend.SharedConnections = 1 })
	const clients, rounds = 8, 120
	errs := make(chan error, clients)
	for i := range clients {
		go func() {
			rng := rand.New(rand.NewPCG(uint64(i), 53))
			key := fmt.Sprintf("mixed:%d", i)
			c := dial(t, addr)
			var want int
			handed := false
			for r := range rounds {
				if !handed && rng.IntN(10) == 0 {
					// Hang up with a command in flight, and come back.
					c.send(encode(args("INCR " + key)))
					want++
					c.c.Close()
					c = dial(t, addr)
				}
				var cmds [][]string
				var exp strings.Builder
				for range 1 + rng.IntN(6) {
					switch rng.IntN(12) {
					case 0:
						handed = true
						cmds = append(cmds, args("SELECT 0"))
						exp.WriteString("+OK\r\n")
					case 1:
						v := strings.Repeat("v", rng.IntN(70000))
						cmds = append(cmds, []string{"SET", key + ":big", v}, args("STRLEN "+key+":big"))
						fmt.Fprintf(&exp, "+OK\r\n:%d\r\n", len(v))
					default:
						cmds = append(cmds, args("INCR "+key))
						want++
						fmt.Fprintf(&exp, ":%d\r\n", want)
					}
				}
				raw := encode(cmds...)
				for len(raw) > 0 {
					k := min(len(raw), 1+rng.IntN(3000))
					if _, err := c.c.Write(raw[:k]); err != nil {
						errs <- err
						return
					}
					raw = raw[k:]
				}
				got, err := c.tryRead(len(cmds), 10*time.Second)
				if err != nil || string(got) != exp.String() {
					errs <- fmt.Errorf("client %d, round %d: %q %v, want %q", i, r, trunc(got), err, trunc([]byte(exp.String())))
					return
				}
			}
			errs <- nil
		}()
	}
	for range clients {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	if p.m.handedOver.Load() == 0 {
		t.Error("no client was handed over")
	}
}

// TestReadLoopPanicClosesOnlyThatClient: a panic while the loop serves a
// client closes that client's connection; the loop and its other clients
// carry on.
func TestReadLoopPanicClosesOnlyThatClient(t *testing.T) {
	srv := redistest.Start(t)
	addr, p := startProxy(t, srv.Addr, func(c *Config) {
		c.IsLocal = func(name []byte) bool {
			if string(name) == "PANICLOOP" {
				panic("PANICLOOP")
			}
			return false
		}
		c.NewLocal = func() Local { return echoLocal{new(atomic.Int64)} }
	})
	bystander := dial(t, addr)
	bystander.do(args("SET k v"))
	victim := dial(t, addr)
	// Two plain commands before it: a run the loop had not queued yet
	// when the panic came, and must not queue with another client's read.
	victim.send(append(append(encode(args("SET ka 1")), encode(args("SET kb 2"))...), encode(args("PANICLOOP"))...))
	if _, gone := victim.closedAfter(5 * time.Second); !gone {
		t.Fatal("the panicking client's connection stayed open")
	}
	eventually(t, "the victim cleaned up", func() bool { return p.clients.Load() == 1 && p.m.loopClients.Load() == 1 })
	if got := string(bystander.do(args("GET k"))); got != "$1\r\nv\r\n" {
		t.Fatalf("the other client: %q", got)
	}
	if got := string(bystander.do(args("PING"))); got != "+PONG\r\n" {
		t.Fatalf("the other client, next: %q", got)
	}
	if got := string(dial(t, addr).do(args("PING"))); got != "+PONG\r\n" {
		t.Fatalf("a new client: %q", got)
	}
}

// TestReadLoopPausedMaster: a master stopped with SIGSTOP while a client
// the loop reads keeps sending to it (12.8 MB) holds up only the commands
// for it: another client the loop reads is answered by the other masters
// meanwhile (with the read_loop off alike), and the stopped master's
// replies come once it runs again.
func TestReadLoopPausedMaster(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	for _, n := range c.Nodes {
		// The others keep their slots once the stopped one is marked
		// failed (after the cluster-node-timeout of a second).
		if r, err := n.Do("CONFIG", "SET", "cluster-require-full-coverage", "no"); err != nil || r != "+OK" {
			t.Fatalf("CONFIG SET: %q %v", r, err)
		}
	}
	addr, p := startClusterProxy(t, c)
	eventually(t, "the cluster's COMMAND table read", func() bool {
		_, ok := p.router.Table().Loaded()
		return ok
	})
	a, b := dial(t, addr), dial(t, addr)
	k1 := keyOn(1, "paused")
	a.do(args("SET " + k1 + " x"))
	c.Nodes[1].Pause()
	resumed := false
	defer func() {
		if !resumed {
			c.Nodes[1].Resume()
		}
	}()
	val := strings.Repeat("v", 64<<10)
	const big = 200 // 12.8 MB for the stopped master
	go func() {
		for range big {
			a.c.SetWriteDeadline(time.Now().Add(20 * time.Second))
			if _, err := a.c.Write(encode([]string{"SET", k1, val})); err != nil {
				return
			}
		}
	}()
	k0 := keyOn(0, "running")
	for i := range 40 {
		start := time.Now()
		b.send(encode(args(fmt.Sprintf("SET %s %d", k0, i)), args("GET "+k0)))
		got, err := b.tryRead(2, 5*time.Second)
		if want := fmt.Sprintf("+OK\r\n$%d\r\n%d\r\n", len(fmt.Sprint(i)), i); err != nil || string(got) != want {
			t.Fatalf("round %d, the other client: %q %v, want %q", i, got, err, want)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Fatalf("round %d, the other client waited %v while a master was stopped", i, d)
		}
		time.Sleep(50 * time.Millisecond)
	}
	states := loopState(p)
	for _, cl := range []*client{a, b} {
		if st := states[cl.c.LocalAddr().String()]; st != lIdle && st != lBusy {
			t.Fatalf("a client in state %d, want the loop's", st)
		}
	}
	c.Nodes[1].Resume()
	resumed = true
	got, err := a.tryRead(big, 30*time.Second)
	if err != nil || string(got) != strings.Repeat("+OK\r\n", big) {
		t.Fatalf("the stopped master's replies after it runs: %q %v", trunc(got), err)
	}
}
