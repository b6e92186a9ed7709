package quorum

import (
	"context"
	"errors"
	"testing"
	"time"
)

// waitIdle waits until the head waiting for resource on l is between
// attempts, where an Unlock may hand it the lock.
func waitIdle(tb testing.TB, l *Locker, resource string) {
	tb.Helper()
	eventually(tb, "the head between attempts", func() bool { return headIdle(l, resource) })
}

// headIdle reports whether the head waiting for resource on l is between
// attempts.
func headIdle(l *Locker, resource string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	q := l.queues[resource]
	return q != nil && len(q.waiters) > 0 && q.waiters[0].idle
}

// TestHandoffChainKeepsOrderAndFences: a chain of waiters on one Locker
// gets the lock in arrival order, each from the previous holder's Unlock,
// with strictly growing fences. Each holder unlocks once the next head is
// between attempts, as the first does: a head still in its first attempt
// (it tries as soon as it is at the head) is not handed the lock, and the
// release is published instead.
func TestHandoffChainKeepsOrderAndFences(t *testing.T) {
	c := startCluster(t, 3)
	l := newLocker(t, c, noFallback(testConfig()))
	ctx := ctxT(t)
	warm(t, c, l)
	holder := mustLock(t, l, "orders", 10*time.Second, Options{})
	const n = 6
	type got struct {
		i     int
		fence int64
	}
	order := make(chan got, n)
	done := make(chan error, n)
	for i := range n {
		go func() {
			lk, err := l.Lock(ctx, "orders", 10*time.Second, Options{Wait: 10 * time.Second})
			if err == nil {
				order <- got{i, lk.Fence}
				for deadline := time.Now().Add(10 * time.Second); i < n-1 && !headIdle(l, "orders"); {
					if time.Now().After(deadline) {
						err = errors.New("the next head was not between attempts within 10s")
						break
					}
					time.Sleep(time.Millisecond)
				}
			}
			if err == nil {
				err = l.Unlock(ctx, "orders", lk.Token)
			}
			done <- err
		}()
		waitQueued(t, l, "orders", i+1)
	}
	waitIdle(t, l, "orders")
	mustUnlock(t, l, "orders", holder.Token)
	for range n {
		if err := <-done; err != nil {
			t.Errorf("waiter: %v", err)
		}
	}
	close(order)
	want, last := 0, holder.Fence
	for g := range order {
		if g.i != want {
			t.Errorf("waiter %d acquired in place %d", g.i, want)
		}
		if g.fence <= last {
			t.Errorf("waiter %d: fence %d after %d", g.i, g.fence, last)
		}
		want, last = want+1, g.fence
	}
	if got := c.calls(t, 0, "publish"); got != 1 {
		t.Errorf("%d releases published, want 1: the last, with nobody left waiting", got)
	}
}

// TestHandoffToWaiterThatLeft: a lock handed to a waiter whose caller left
// while the handing round ran is released at once, and the caller gets its
// context's error.
func TestHandoffToWaiterThatLeft(t *testing.T) {
	c := startCluster(t, 3)
	l := newLocker(t, c, noFallback(testConfig()))
	warm(t, c, l)
	holder := mustLock(t, l, "orders", 10*time.Second, Options{})
	wctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	waiting := lockAsync(t, wctx, l, "orders", 10*time.Second, Options{Wait: 10 * time.Second})
	waitQueued(t, l, "orders", 1)
	waitIdle(t, l, "orders")

	testHookHandOver.Store(&cancel) // the caller leaves during the round
	defer testHookHandOver.Store(nil)
	mustUnlock(t, l, "orders", holder.Token)
	r := recv(t, waiting)
	if !errors.Is(r.err, context.Canceled) {
		t.Fatalf("waiter whose caller left: %v, %+v; want context.Canceled", r.err, r.lk)
	}
	for i := range c.servers {
		if keys := c.lockKeys(t, i); len(keys) != 0 {
			t.Errorf("node %d: %v left locked", i, keys)
		}
	}
	mustLock(t, l, "orders", time.Second, Options{})
}

// twoLockers starts three lock nodes and two Lockers on them without the
// fallback retry, both subscribed to the nodes' release notifications.
func twoLockers(t *testing.T) (a, b *Locker) {
	c := startCluster(t, 3)
	a = newLocker(t, c, noFallback(testConfig()))
	b = newLocker(t, c, noFallback(testConfig()))
	warm(t, c, a)
	c.waitSubscribed(t, 2)
	return a, b
}

// waitOrders starts a LOCK of "orders" on l (10 s validity, waiting up to
// 10 s) and returns once it is the n-th waiter l has queued for it.
func waitOrders(t *testing.T, ctx context.Context, l *Locker, n int) <-chan lockResult {
	ch := lockAsync(t, ctx, l, "orders", 10*time.Second, Options{Wait: 10 * time.Second})
	waitQueued(t, l, "orders", n)
	return ch
}

// TestHandoffThenOtherLocker: waiters on another Locker are not handed the
// lock, but acquire by notification once the releasing Locker has nobody
// left waiting.
func TestHandoffThenOtherLocker(t *testing.T) {
	a, b := twoLockers(t)
	ctx := ctxT(t)
	holder := mustLock(t, a, "orders", 10*time.Second, Options{})
	local := waitOrders(t, ctx, a, 1)
	waitIdle(t, a, "orders")
	remote := waitOrders(t, ctx, b, 1)
	waitIdle(t, b, "orders")

	mustUnlock(t, a, "orders", holder.Token)
	first := recv(t, local)
	if first.err != nil {
		t.Fatalf("local waiter: %v", first.err)
	}
	mustUnlock(t, a, "orders", first.lk.Token)
	released := time.Now()
	second := recv(t, remote)
	if second.err != nil {
		t.Fatalf("waiter on the other Locker: %v", second.err)
	}
	if d := second.at.Sub(released); d > time.Second {
		t.Errorf("the other Locker's waiter acquired %v after the release, want by notification", d)
	}
	if second.lk.Fence <= first.lk.Fence {
		t.Errorf("fence %d after %d", second.lk.Fence, first.lk.Fence)
	}
}
