package proxy

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/internal/redistest"
)

// holdLocal answers HOLDLOCAL once the test lets it, on the client's own
// goroutine (it is not a command that may wait), as LOCK without WAIT is
// answered during its round trip to the lock nodes.
type holdLocal struct{ entered, release chan struct{} }

func (h holdLocal) Serve(ctx context.Context, dst []byte, args [][]byte, resp3 bool) []byte {
	h.entered <- struct{}{}
	<-h.release
	return append(dst, "+OK\r\n"...)
}

func (h holdLocal) Close() {}

// TestArrivalOrderLocalCommandHoldsNobody: while a client's own command is
// answered (a lock command's round trip to the nodes), its read is no
// longer in the arrival order, so other clients' commands do not wait for
// it (each would wait up to orderWait, and every LOCK and UNLOCK would
// cost the others that).
func TestArrivalOrderLocalCommandHoldsNobody(t *testing.T) {
	srv := redistest.Start(t).Addr
	h := holdLocal{entered: make(chan struct{}), release: make(chan struct{})}
	addr, p := startProxy(t, srv, func(c *Config) {
		c.IsLocal = func(name []byte) bool { return bytes.EqualFold(name, []byte("holdlocal")) }
		c.MayWait = func([][]byte) bool { return false }
		c.NewLocal = func() Local { return h }
	})
	if p.order == nil {
		t.Fatal("no arrival order with the default Config")
	}
	a, b := dial(t, addr), dial(t, addr)
	a.send(encode(args("HOLDLOCAL")))
	select {
	case <-h.entered:
	case <-time.After(5 * time.Second):
		t.Fatal("HOLDLOCAL was not served")
	}
	if held := p.order.Held(); len(held) > 0 {
		t.Errorf("reads numbered %v are still in the arrival order while HOLDLOCAL is answered", held)
	}
	if got := string(b.do(args("SET k v"))); got != "+OK\r\n" {
		t.Errorf("SET of another client: %q", got)
	}
	close(h.release)
	if got := string(a.read(1)); got != "+OK\r\n" {
		t.Errorf("HOLDLOCAL: %q", got)
	}
}

// TestArrivalOrderLocalReadWaitsForNobody: a read that carries only
// commands the proxy answers itself (lock commands) does not wait for the
// reads numbered before it; a read with a command for the backend does.
// The read before is one whose client is stuck in its handler: awake, its
// commands never passed on.
func TestArrivalOrderLocalReadWaitsForNobody(t *testing.T) {
	srv := redistest.Start(t).Addr
	addr, p := startProxy(t, srv, func(c *Config) {
		c.IsLocal = func(name []byte) bool { return bytes.EqualFold(name, []byte("echolocal")) }
		c.MayWait = func([][]byte) bool { return false }
		c.NewLocal = func() Local { return echoLocal{new(atomic.Int64)} }
	})
	c := dial(t, addr)
	c.do(args("PING"))
	waitedFor, _, release := p.order.Stuck()
	defer release()
	if got := string(c.do(args("ECHOLOCAL x"))); got != "$1\r\nx\r\n" {
		t.Fatalf("ECHOLOCAL: %q", got)
	}
	if waitedFor() {
		t.Error("a read with only a local command waited for the read before it")
	}
	if got := string(c.do(args("SET k v"))); got != "+OK\r\n" {
		t.Fatalf("SET: %q", got)
	}
	if !waitedFor() {
		t.Error("a read with a command for the backend did not wait for the read before it")
	}
}

// TestArrivalOrderReadsMissNoData: a read that finds the socket's data
// already collected, or none since the last read emptied it, skips the
// read(2) and waits for the poller; data that comes while the client's
// goroutine is busy must still wake it. Clients send commands cut at random
// places, in pieces a few microseconds apart, some pipelined and some
// one at a time with the reply awaited, some with values larger than a
// read's buffer: every reply comes (a lost wake-up leaves a client
// waiting for the rest of its command, or for its reply, for ever).
func TestArrivalOrderReadsMissNoData(t *testing.T) {
	srv := redistest.Start(t).Addr
	addr, p := startProxy(t, srv, nil)
	if p.order == nil {
		t.Fatal("no arrival order with the default Config")
	}
	const clients, rounds = 8, 150
	errs := make(chan error, clients)
	for i := range clients {
		c := dial(t, addr)
		go func() {
			rng := rand.New(rand.NewPCG(uint64(i), 35))
			key := fmt.Sprintf("miss:%d", i)
			var want int
			for r := range rounds {
				n := 1 + rng.IntN(3)
				var cmds [][]string
				for range n {
					if rng.IntN(10) == 0 {
						cmds = append(cmds, []string{"SET", key + ":big", strings.Repeat("v", 20000+rng.IntN(50000))})
					} else {
						cmds = append(cmds, []string{"INCR", key})
					}
				}
				raw := encode(cmds...)
				for len(raw) > 0 {
					k := min(len(raw), 1+rng.IntN(64))
					if rng.IntN(8) == 0 {
						k = len(raw)
					}
					if _, err := c.c.Write(raw[:k]); err != nil {
						errs <- err
						return
					}
					raw = raw[k:]
					if rng.IntN(3) == 0 {
						time.Sleep(time.Duration(rng.IntN(100)) * time.Microsecond)
					}
				}
				got, err := c.tryRead(n, 5*time.Second)
				if err != nil {
					errs <- fmt.Errorf("client %d, round %d: %d replies: %v (got %q)", i, r, n, err, trunc(got))
					return
				}
				var exp bytes.Buffer
				for _, cmd := range cmds {
					if cmd[0] == "SET" {
						exp.WriteString("+OK\r\n")
					} else {
						want++
						fmt.Fprintf(&exp, ":%d\r\n", want)
					}
				}
				if !bytes.Equal(got, exp.Bytes()) {
					errs <- fmt.Errorf("client %d, round %d: %q, want %q", i, r, trunc(got), exp.String())
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
}

// TestArrivalOrderStuckReadExpires: a read stuck before the others (its
// client stuck in its handler) holds the reads after it up once: the first
// wait for it gives up after orderWait, and no read waits for it again,
// neither a client goroutine's nor the reading loop's, which would
// otherwise pay orderWait for every read of every client it reads.
func TestArrivalOrderStuckReadExpires(t *testing.T) {
	srv := redistest.Start(t).Addr
	addr, p := startProxy(t, srv, nil)
	c := dial(t, addr)
	c.do(args("PING"))
	waitedFor, expired, release := p.order.Stuck()
	defer release()
	if got := string(c.do(args("SET k v"))); got != "+OK\r\n" {
		t.Fatalf("SET: %q", got)
	}
	if !waitedFor() || !expired() {
		t.Fatalf("the first read after the stuck one: waited %v, gave up %v; want both", waitedFor(), expired())
	}
	if n := p.m.loopClients.Load(); n != 1 {
		t.Fatalf("the client is not the reading loop's (%d clients are)", n)
	}
}
