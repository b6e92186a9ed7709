package quorum

import (
	"testing"
	"time"
)

// pttlCalls returns how many PTTLs the nodes of c ran: an acquisition that
// finds the lock held reads its pttl, a handoff never does.
func (c *cluster) pttlCalls(tb testing.TB) int {
	tb.Helper()
	n := 0
	for i := range c.admin {
		n += c.calls(tb, i, "pttl")
	}
	return n
}

// TestHandoffNextHeadSkipsAttempt: the waiter that becomes the head when
// the lock was handed to the one ahead of it makes no attempt (which could
// only find the lock held) and is ready for the next handoff at once; the
// chain keeps its order and its fences.
func TestHandoffNextHeadSkipsAttempt(t *testing.T) {
	c := startCluster(t, 3)
	l := newLocker(t, c, quiet(noFallback(testConfig())))
	ctx := ctxT(t)
	warm(t, c, l)
	holder := mustLock(t, l, "orders", 10*time.Second, Options{})
	first := waitOrders(t, ctx, l, 1)
	waitIdle(t, l, "orders")
	second := waitOrders(t, ctx, l, 2)

	before := c.pttlCalls(t)
	mustUnlock(t, l, "orders", holder.Token)
	one := recv(t, first)
	if one.err != nil {
		t.Fatalf("first waiter: %v", one.err)
	}
	waitIdle(t, l, "orders") // the second, at once
	if got := c.pttlCalls(t) - before; got != 0 {
		t.Errorf("the next head read the held lock's pttl %d times, want 0: it attempted", got)
	}
	mustUnlock(t, l, "orders", one.lk.Token)
	two := recv(t, second)
	if two.err != nil {
		t.Fatalf("second waiter: %v", two.err)
	}
	if one.lk.Fence <= holder.Fence || two.lk.Fence <= one.lk.Fence {
		t.Errorf("fences %d, %d, %d: want strictly growing", holder.Fence, one.lk.Fence, two.lk.Fence)
	}
	if got := c.pttlCalls(t) - before; got != 0 {
		t.Errorf("%d PTTLs in a chain of handoffs, want 0", got)
	}
	mustUnlock(t, l, "orders", two.lk.Token)
}

// TestHandoffSkipWokenByReleaseElsewhere: a head that skipped its attempt
// after a handoff is still woken by a release of the holder through
// another Locker: the handing kept the waiters' mark on the nodes, so the
// release is published.
func TestHandoffSkipWokenByReleaseElsewhere(t *testing.T) {
	a, b := twoLockers(t)
	ctx := ctxT(t)
	holder := mustLock(t, a, "orders", 10*time.Second, Options{})
	first := waitOrders(t, ctx, a, 1)
	waitIdle(t, a, "orders")
	second := waitOrders(t, ctx, a, 2)

	mustUnlock(t, a, "orders", holder.Token)
	one := recv(t, first)
	if one.err != nil {
		t.Fatalf("first waiter: %v", one.err)
	}
	waitIdle(t, a, "orders")
	mustUnlock(t, b, "orders", one.lk.Token) // through the other Locker
	released := time.Now()
	two := recv(t, second)
	if two.err != nil {
		t.Fatalf("second waiter: %v", two.err)
	}
	// Without the notification it would wait for the handed lock's
	// validity (about 10s): noFallback leaves no earlier retry.
	if d := two.at.Sub(released); d > 2*time.Second {
		t.Errorf("the head acquired %v after a release through another Locker, want by notification", d)
	}
	if two.lk.Fence <= one.lk.Fence {
		t.Errorf("fence %d after %d", two.lk.Fence, one.lk.Fence)
	}
	mustUnlock(t, a, "orders", two.lk.Token)
}
