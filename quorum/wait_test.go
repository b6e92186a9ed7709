package quorum

import (
	"context"
	"errors"
	"testing"
	"time"
)

// In these tests the random fallback delay is a minute and locks live for
// 10s, so a waiter that gets the lock within a second was woken by a
// release notification.

// TestWaitHandoffOnOneLocker: the holder's Unlock hands the lock to the
// head waiting on the same Locker in its own round: nothing is published,
// and the waiter holds it with a larger fence.
func TestWaitHandoffOnOneLocker(t *testing.T) {
	c := startCluster(t, 3)
	l := newLocker(t, c, noFallback(testConfig()))
	ctx := ctxT(t)
	c.waitSubscribed(t, 1)

	holder := mustLock(t, l, "orders", 10*time.Second, Options{})
	waiting := lockAsync(t, ctx, l, "orders", 10*time.Second, Options{Wait: 10 * time.Second})
	waitQueued(t, l, "orders", 1)
	waitIdle(t, l, "orders") // its first attempt failed: it waits to be handed the lock

	mustUnlock(t, l, "orders", holder.Token)
	released := time.Now()
	r := recv(t, waiting)
	if r.err != nil {
		t.Fatalf("waiter: %v", r.err)
	}
	if d := r.at.Sub(released); d > time.Second {
		t.Errorf("handoff took %v, want well under 1s", d)
	}
	if r.lk.Fence <= holder.Fence {
		t.Errorf("waiter's fence %d, want > %d", r.lk.Fence, holder.Fence)
	}
	for i := range c.servers {
		if n := c.calls(t, i, "publish"); n != 0 {
			t.Errorf("node %d published %d releases, want none: the lock was handed over", i, n)
		}
		if h := c.holder(t, i, "orders"); h != r.lk.Token {
			t.Errorf("node %d holds orders for %q, want the waiter", i, h)
		}
	}
}

func TestWaitAcrossLockers(t *testing.T) {
	c := startCluster(t, 3)
	a := newLocker(t, c, noFallback(testConfig()))
	b := newLocker(t, c, noFallback(testConfig()))
	ctx := ctxT(t)
	c.waitSubscribed(t, 2)

	holder := mustLock(t, a, "orders", 10*time.Second, Options{})
	base := c.scriptCalls(t, 0)
	waiting := lockAsync(t, ctx, b, "orders", 10*time.Second, Options{Wait: 10 * time.Second})
	// Let b's head fail its first attempt and go to sleep.
	eventually(t, "b's first attempt", func() bool { return c.scriptCalls(t, 0) > base })

	mustUnlock(t, a, "orders", holder.Token)
	released := time.Now()
	r := recv(t, waiting)
	if r.err != nil {
		t.Fatalf("waiter on the other Locker: %v", r.err)
	}
	if d := r.at.Sub(released); d > time.Second {
		t.Errorf("handoff across Lockers took %v, want well under 1s", d)
	}
}

func TestWaitFIFO(t *testing.T) {
	c := startCluster(t, 3)
	l := newLocker(t, c, noFallback(testConfig()))
	ctx := ctxT(t)
	c.waitSubscribed(t, 1)

	holder := mustLock(t, l, "orders", 10*time.Second, Options{})
	const n = 5
	order := make(chan int, n)
	done := make(chan error, n)
	for i := range n {
		go func() {
			lk, err := l.Lock(ctx, "orders", 10*time.Second, Options{Wait: 10 * time.Second})
			if err == nil {
				order <- i
				err = l.Unlock(ctx, "orders", lk.Token)
			}
			done <- err
		}()
		waitQueued(t, l, "orders", i+1)
	}
	mustUnlock(t, l, "orders", holder.Token)
	for range n {
		if err := <-done; err != nil {
			t.Errorf("waiter: %v", err)
		}
	}
	close(order)
	want := 0
	for got := range order {
		if got != want {
			t.Errorf("waiter %d acquired in place %d", got, want)
		}
		want++
	}
}

func TestWaiterGivingUpLeavesQueue(t *testing.T) {
	c := startCluster(t, 3)
	l := newLocker(t, c, noFallback(testConfig()))
	ctx := ctxT(t)

	mustLock(t, l, "orders", 10*time.Second, Options{})
	ctx1, cancel1 := context.WithCancel(ctx)
	defer cancel1()
	ctx2, cancel2 := context.WithCancel(ctx)
	defer cancel2()
	first := lockAsync(t, ctx1, l, "orders", 10*time.Second, Options{Wait: 10 * time.Second})
	waitQueued(t, l, "orders", 1)
	second := lockAsync(t, ctx2, l, "orders", 10*time.Second, Options{Wait: 10 * time.Second})
	waitQueued(t, l, "orders", 2)
	third := lockAsync(t, ctx, l, "orders", 10*time.Second, Options{Wait: 10 * time.Second})
	waitQueued(t, l, "orders", 3)

	cancel2() // a waiter in the middle
	if r := recv(t, second); !errors.Is(r.err, context.Canceled) {
		t.Errorf("cancelled waiter: %v, want context.Canceled", r.err)
	}
	waitQueued(t, l, "orders", 2)

	// The lock vanishes without a notification (as if it expired). The head
	// sleeps on the holder's ttl; once it gives up, the next waiter must
	// become the head at once and find the lock free.
	for _, a := range c.admin {
		if err := a.Del(ctx, "lockproxy:lock:orders").Err(); err != nil {
			t.Fatal(err)
		}
	}
	cancel1()
	gaveUp := time.Now()
	if r := recv(t, first); !errors.Is(r.err, context.Canceled) {
		t.Errorf("cancelled head: %v, want context.Canceled", r.err)
	}
	r := recv(t, third)
	if r.err != nil {
		t.Fatalf("next waiter: %v", r.err)
	}
	if d := r.at.Sub(gaveUp); d > time.Second {
		t.Errorf("next waiter took %v after the head gave up, want well under 1s", d)
	}
	waitQueued(t, l, "orders", 0)
}

func TestWaitWakesWhenHolderTTLRunsOut(t *testing.T) {
	c := startCluster(t, 3)
	l := newLocker(t, c, noFallback(testConfig()))
	ctx := ctxT(t)

	const ttl = 500 * time.Millisecond
	mustLock(t, l, "orders", ttl, Options{}) // never unlocked
	start := time.Now()
	lk, err := l.Lock(ctx, "orders", 10*time.Second, Options{Wait: 10 * time.Second})
	if err != nil {
		t.Fatalf("Lock: %v", err)
	}
	if d := time.Since(start); d > ttl+time.Second {
		t.Errorf("waiter took %v for a lock with %v left", d, ttl)
	}
	mustUnlock(t, l, "orders", lk.Token)
}

func TestWaitRunsOut(t *testing.T) {
	c := startCluster(t, 3)
	l := newLocker(t, c, testConfig()) // default fallback: polls every 5-50ms
	ctx := ctxT(t)

	mustLock(t, l, "orders", 10*time.Second, Options{})
	const wait = 200 * time.Millisecond
	start := time.Now()
	_, err := l.Lock(ctx, "orders", time.Second, Options{Wait: wait})
	if !errors.Is(err, ErrNotAcquired) {
		t.Errorf("Lock: %v, want ErrNotAcquired", err)
	}
	if d := time.Since(start); d < wait || d > wait+2*time.Second {
		t.Errorf("gave up after %v, want about %v", d, wait)
	}

	for i := range c.servers {
		c.kill(i)
	}
	_, err = l.Lock(ctx, "other", time.Second, Options{Wait: wait})
	var nq *NoQuorumError
	if !errors.As(err, &nq) || nq.Answered != 0 || nq.Total != 3 {
		t.Errorf("Lock with all nodes down: %v, want NoQuorumError{0, 3}", err)
	}
}

func TestWaitContextEnds(t *testing.T) {
	c := startCluster(t, 3)
	l := newLocker(t, c, noFallback(testConfig()))
	mustLock(t, l, "orders", 10*time.Second, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := l.Lock(ctx, "orders", time.Second, Options{Wait: 10 * time.Second})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Lock: %v, want context.DeadlineExceeded", err)
	}
	if n := queueLen(l, "orders"); n != 0 {
		t.Errorf("%d waiters left", n)
	}
}

func TestNoWaitDoesNotJumpQueue(t *testing.T) {
	c := startCluster(t, 3)
	l := newLocker(t, c, noFallback(testConfig()))
	ctx := ctxT(t)

	holder := mustLock(t, l, "orders", 10*time.Second, Options{})
	base := c.scriptCalls(t, 0)
	waiting := lockAsync(t, ctx, l, "orders", 10*time.Second, Options{Wait: 10 * time.Second})
	waitQueued(t, l, "orders", 1)
	eventually(t, "the head's first attempt", func() bool { return c.scriptCalls(t, 0) > base })

	before := c.scriptCalls(t, 0)
	if _, err := l.Lock(ctx, "orders", time.Second, Options{}); !errors.Is(err, ErrNotAcquired) {
		t.Errorf("Lock without Wait: %v, want ErrNotAcquired", err)
	}
	if after := c.scriptCalls(t, 0); after != before {
		t.Errorf("Lock without Wait ran %d scripts on a node while waiters were queued", after-before)
	}

	// The holder's idempotent retry still works, with or without Wait.
	for _, wait := range []time.Duration{0, 10 * time.Second} {
		again, err := l.Lock(ctx, "orders", 10*time.Second, Options{Token: holder.Token, Wait: wait})
		if err != nil || again.Fence != holder.Fence {
			t.Errorf("holder's re-acquire (wait %v) = %+v, %v; want fence %d", wait, again, err, holder.Fence)
		}
	}
	// Someone else's token does not get in ahead of the queue, not even
	// when the lock is free (it vanished without a notification, so the
	// head still sleeps on the holder's ttl).
	if _, err := l.Lock(ctx, "orders", time.Second, Options{Token: "other"}); !errors.Is(err, ErrNotAcquired) {
		t.Errorf("Lock with another token: %v, want ErrNotAcquired", err)
	}
	for _, a := range c.admin {
		if err := a.Del(ctx, "lockproxy:lock:orders").Err(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := l.Lock(ctx, "orders", time.Second, Options{Token: "other"}); !errors.Is(err, ErrNotAcquired) {
		t.Errorf("Lock with another token on a free lock: %v, want ErrNotAcquired", err)
	}
	for i := range c.admin {
		if keys := c.lockKeys(t, i); len(keys) != 0 {
			t.Errorf("node %d: %v locked ahead of the queue", i, keys)
		}
	}

	// A notification from any node wakes the head.
	if err := c.admin[1].Publish(ctx, "lockproxy:released", "orders").Err(); err != nil {
		t.Fatal(err)
	}
	if r := recv(t, waiting); r.err != nil {
		t.Errorf("waiter: %v", r.err)
	}
}

// TestWaitWakesAtExpiry lets short locks run out without UNLOCK: each time
// the waiter must take over when the holder's ttl ends, including when its
// attempt lands in the last millisecond of the ttl (PTTL 0, still held).
func TestWaitWakesAtExpiry(t *testing.T) {
	c := startCluster(t, 3)
	// A ttl above ClockTolerance plus the drift allowance leaves the
	// holder some validity.
	cfg := noFallback(testConfig())
	cfg.ClockTolerance = 20 * time.Millisecond
	l := newLocker(t, c, cfg)
	ctx := ctxT(t)

	for i := range 30 {
		holder := shortLock(t, l, "orders", time.Duration(30+i)*time.Millisecond)
		lk, err := l.Lock(ctx, "orders", time.Second, Options{Wait: 3 * time.Second})
		if err != nil {
			t.Fatalf("round %d: waiter after a %dms holding: %v", i, 30+i, err)
		}
		if lk.Fence <= holder.Fence {
			t.Fatalf("round %d: fence %d after %d", i, lk.Fence, holder.Fence)
		}
		mustUnlock(t, l, "orders", lk.Token)
	}
}

// shortLock acquires resource for a ttl of a few milliseconds. Such a lock
// is refused when the round took longer than its ttl minus the drift
// allowance, or when replies came too late for their clocks to be judged
// (NOQUORUM), which happens on a loaded machine under -race; the refusal
// releases what the round got, so it is tried again, a bounded number of
// times.
func shortLock(tb testing.TB, l *Locker, resource string, ttl time.Duration) Lock {
	tb.Helper()
	for try := 1; ; try++ {
		start := time.Now()
		lk, err := l.Lock(ctxT(tb), resource, ttl, Options{})
		if err == nil {
			return lk
		}
		var nq *NoQuorumError
		if !(errors.Is(err, ErrNotAcquired) || errors.As(err, &nq)) || try == 20 {
			tb.Fatalf("Lock(%q, %v), try %d after %v: %v", resource, ttl, try, time.Since(start), err)
		}
	}
}
