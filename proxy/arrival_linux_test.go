package proxy

import (
	"bytes"
	"context"
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
	p.order.mu.Lock()
	var held []uint64
	for _, c := range p.order.conns {
		if c.n != 0 {
			held = append(held, c.n)
		}
	}
	p.order.mu.Unlock()
	if len(held) > 0 {
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
	o := p.order
	o.mu.Lock()
	stuck := &arrival{o: o}
	stuck.awake.Store(true)
	stuck.number()
	o.mu.Unlock()
	defer func() {
		o.mu.Lock()
		stuck.endLocked()
		o.mu.Unlock()
	}()
	waitedFor := func() bool {
		o.mu.Lock()
		defer o.mu.Unlock()
		return stuck.done != nil // made by a read that waits for it
	}
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
