package proxy

import (
	"bytes"
	"fmt"
	"os"
	"runtime"
	"testing"

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
	if runtime.NumCPU() < 2 {
		t.Fatalf("this test needs 2 CPUs, this machine has %d", runtime.NumCPU())
	}
	for _, tc := range []struct {
		name     string
		redisCPU int
		fewWait  bool
	}{
		{name: "one CPU", redisCPU: 0, fewWait: true},
		{name: "two CPUs", redisCPU: 1, fewWait: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := redistest.PinThreads(os.Getpid(), 0); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { redistest.PinThreads(os.Getpid(), -1) })
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
	pipeline := func(n int, key string) []byte {
		var b bytes.Buffer
		for range n {
			b.Write(encode(args("INCR " + key)))
		}
		return b.Bytes()
	}
	few.send(pipeline(3, "few"))
	if fewWait {
		eventually(t, "the few commands waiting", func() bool { c := sharedCounts(p); return c.queued == 3 && c.out == 1 })
	} else {
		eventually(t, "the few commands written", func() bool { c := sharedCounts(p); return c.queued == 0 && c.out == 1+3 })
	}
	many.send(pipeline(100, "many"))
	eventually(t, "the pipeline written behind the script", func() bool {
		c := sharedCounts(p)
		return c.queued == 0 && c.out == 1+3+100
	})
	if got := s.read(1); string(got) != ":1\r\n" {
		t.Fatalf("script: %q", got)
	}
	for _, c := range []struct {
		cl *client
		n  int
	}{{few, 3}, {many, 100}} {
		var want bytes.Buffer
		for i := 1; i <= c.n; i++ {
			fmt.Fprintf(&want, ":%d\r\n", i)
		}
		if got := c.cl.read(c.n); !bytes.Equal(got, want.Bytes()) {
			t.Fatalf("replies to %d INCRs: %q", c.n, got)
		}
	}
}
