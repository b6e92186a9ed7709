package proxy

import (
	"bytes"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/internal/redistest"
)

// TestEarlyWritesWhileRepliesAreInFlight: while replies are in flight on
// the shared connection (a slow script's), what a turn of the reading
// loop queues goes out at the end of the turn (backend.Mux.FlushTurn) if
// Redis answers from another CPU than the proxy's, or if 64 commands or
// more wait; a few commands wait for the reply otherwise, to go out with
// what comes meanwhile. Redis and the test's process are pinned. Every
// reply comes, in order.
func TestEarlyWritesWhileRepliesAreInFlight(t *testing.T) {
	for _, tc := range []struct {
		name     string
		redisCPU int
		fewWait  bool
	}{
		{name: "one CPU", redisCPU: 0, fewWait: true},
		{name: "two CPUs", redisCPU: 1, fewWait: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pinTestToCPU0(t)
			srv := redistest.Start(t)
			srv.PinCPU(tc.redisCPU)
			playEarlyWrites(t, srv, tc.fewWait)
		})
	}
}

// playEarlyWrites plays TestEarlyWritesWhileRepliesAreInFlight's steps
// through a proxy in front of srv.
func playEarlyWrites(t *testing.T, srv *redistest.Server, fewWait bool) {
	addr, p := startProxy(t, srv.Addr, func(c *Config) { c.Backend.SharedConnections = 1 })
	s, few, many := dial(t, addr), dial(t, addr), dial(t, addr)
	for _, c := range []*client{s, few, many} {
		c.do(args("PING"))
	}
	eventually(t, "the clients in the reading loop", func() bool { return p.m.loopClients.Load() == 3 })
	// Busy for two seconds: the checks below are made meanwhile.
	const slow = `local s = redis.call('TIME')
while true do
  local n = redis.call('TIME')
  if (n[1] - s[1]) * 1000000 + (n[2] - s[2]) > 2000000 then return 1 end
end`
	s.send(encode([]string{"EVAL", slow, "0"}))
	eventually(t, "the script in flight", func() bool { return sharedCounts(p).out == 1 })
	few.send(incrs(3, "few"))
	if fewWait {
		eventually(t, "the few commands waiting", func() bool { c := sharedCounts(p); return c.queued == 3 && c.out == 1 })
	} else {
		eventually(t, "the few commands written", func() bool { c := sharedCounts(p); return c.queued == 0 && c.out == 1+3 })
	}
	many.send(incrs(100, "many"))
	eventually(t, "the pipeline written behind the script", func() bool {
		c := sharedCounts(p)
		return c.queued == 0 && c.out == 1+3+100
	})
	if got := s.read(1); string(got) != ":1\r\n" {
		t.Fatalf("script: %q", got)
	}
	readIncrs(t, few, 3)
	readIncrs(t, many, 100)
}

// TestEarlyWritesNeverWaitForAStoppedRedis: with Redis on another CPU
// than the proxy (early writes on) and stopped with SIGSTOP, a client
// that sends 12.8 MB of SETs fills the sockets' buffers, not the reading
// loop: the loop writes only what the socket takes at once, and still
// reads and queues another client's command. Once Redis runs again, both
// get every reply.
func TestEarlyWritesNeverWaitForAStoppedRedis(t *testing.T) {
	pinTestToCPU0(t)
	srv := redistest.Start(t)
	srv.PinCPU(1)
	addr, p := startProxy(t, srv.Addr, func(c *Config) { c.Backend.SharedConnections = 1 })
	a, b := dial(t, addr), dial(t, addr)
	a.do(args("PING"))
	b.do(args("PING"))
	eventually(t, "the clients in the reading loop", func() bool { return p.m.loopClients.Load() == 2 })
	srv.Pause()
	resumed := false
	defer func() {
		if !resumed {
			srv.Resume()
		}
	}()
	const big = 200 // 12.8 MB
	val := strings.Repeat("v", 64<<10)
	sent := make(chan error, 1)
	go func() {
		a.c.SetWriteDeadline(time.Now().Add(20 * time.Second))
		for range big {
			if _, err := a.c.Write(encode([]string{"SET", "a", val})); err != nil {
				sent <- err
				return
			}
		}
		sent <- nil
	}()
	total := func() int { c := sharedCounts(p); return c.out + c.queued }
	eventually(t, "the 200 SETs read by the loop", func() bool { return total() == big })
	if err := <-sent; err != nil {
		t.Fatalf("sending the SETs: %v", err)
	}
	b.send(encode(args("SET b 1")))
	deadline := time.Now().Add(2 * time.Second)
	for total() != big+1 {
		if time.Now().After(deadline) {
			t.Fatalf("the other client's SET not read in 2 s: %+v (the loop waits on the stopped Redis)", sharedCounts(p))
		}
		time.Sleep(5 * time.Millisecond)
	}
	srv.Resume()
	resumed = true
	if got, err := a.tryRead(big, 30*time.Second); err != nil || string(got) != strings.Repeat("+OK\r\n", big) {
		t.Fatalf("the SETs' replies after Redis runs: %q %v", trunc(got), err)
	}
	if got := string(b.read(1)); got != "+OK\r\n" {
		t.Fatalf("the other client: %q", got)
	}
}

// TestEarlyWritesNotToAClusterMaster: a cluster master's shared
// connection keeps the rule of one batch in flight even when the master
// answers from another CPU than the proxy's (only the 64 commands' rule
// writes early there; backend.Mux.FlushTurn says why). A master is
// stopped (SIGSTOP) with one command in flight on its shared connection:
// a client's 3 commands for it wait, 100 more go out at once, and after
// SIGCONT every reply comes, in order.
func TestEarlyWritesNotToAClusterMaster(t *testing.T) {
	pinTestToCPU0(t)
	c := redistest.StartCluster(t, 3, 0)
	for _, n := range c.Nodes {
		n.PinCPU(1)
	}
	addr, p := startProxy(t, "", func(cfg *Config) {
		cfg.Backend.Cluster = c.Seeds()[:2]
		cfg.Backend.SharedConnections = 1
	})
	eventually(t, "the cluster's COMMAND table read", func() bool {
		_, ok := p.router.Table().Loaded()
		return ok
	})
	first, few, many := keyOn(1, "first"), keyOn(1, "few"), keyOn(1, "many")
	s, fc, mc := dial(t, addr), dial(t, addr), dial(t, addr)
	// Replies from the master's CPU: what FlushTurn would look at.
	for range 20 {
		for _, cl := range []*client{s, fc, mc} {
			cl.do(args("GET " + first))
		}
	}
	eventually(t, "the clients in the reading loop", func() bool { return p.m.loopClients.Load() == 3 })
	master := c.Nodes[1]
	master.Pause()
	resumed := false
	defer func() {
		if !resumed {
			master.Resume()
		}
	}()
	s.send(encode(args("INCR " + first)))
	eventually(t, "the first command in flight", func() bool { c := sharedCounts(p); return c.out == 1 && c.queued == 0 })
	fc.send(incrs(3, few))
	eventually(t, "the few commands waiting", func() bool { c := sharedCounts(p); return c.queued == 3 && c.out == 1 })
	time.Sleep(100 * time.Millisecond) // many turns of the loop later, still waiting
	if c := sharedCounts(p); c.queued != 3 || c.out != 1 {
		t.Fatalf("the few commands went out with the master's reply in flight: %+v", c)
	}
	mc.send(incrs(100, many))
	eventually(t, "the pipeline written behind the first command", func() bool {
		c := sharedCounts(p)
		return c.queued == 0 && c.out == 1+3+100
	})
	master.Resume()
	resumed = true
	if got := s.read(1); string(got) != ":1\r\n" {
		t.Fatalf("first: %q", got)
	}
	readIncrs(t, fc, 3)
	readIncrs(t, mc, 100)
}

// incrs returns n INCRs of key, one pipeline.
func incrs(n int, key string) []byte {
	var b bytes.Buffer
	for range n {
		b.Write(encode(args("INCR " + key)))
	}
	return b.Bytes()
}

// readIncrs reads the replies to n INCRs of a fresh key from cl: 1 to n.
func readIncrs(t *testing.T, cl *client, n int) {
	t.Helper()
	var want bytes.Buffer
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&want, ":%d\r\n", i)
	}
	if got := cl.read(n); !bytes.Equal(got, want.Bytes()) {
		t.Fatalf("replies to %d INCRs: %q", n, got)
	}
}

// pinTestToCPU0 runs every thread of the test's process on CPU 0 until
// the test ends; the tests pin Redis to CPU 0 or 1 beside it.
func pinTestToCPU0(t *testing.T) {
	t.Helper()
	if runtime.NumCPU() < 2 {
		t.Fatalf("this test needs 2 CPUs, this machine has %d", runtime.NumCPU())
	}
	if err := redistest.PinThreads(os.Getpid(), 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { redistest.PinThreads(os.Getpid(), -1) })
}
