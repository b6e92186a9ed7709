package quorum

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
)

func TestLockUnlockExtend(t *testing.T) {
	for _, n := range []int{1, 2, 3, 5} {
		t.Run(fmt.Sprintf("%d nodes", n), func(t *testing.T) {
			c := startCluster(t, n)
			l := newLocker(t, c, testConfig())
			ctx := ctxT(t)
			const ttl = 10 * time.Second

			lk, err := l.Lock(ctx, "orders", ttl, Options{})
			if err != nil {
				t.Fatalf("Lock: %v", err)
			}
			if u, err := uuid.Parse(lk.Token); err != nil || u.Version() != 4 {
				t.Errorf("token %q is not a UUID v4 (%v)", lk.Token, err)
			}
			if lk.Validity <= 0 || lk.Validity > ttl-ttl/100-2*time.Millisecond {
				t.Errorf("validity %v out of (0, ttl-drift]", lk.Validity)
			}
			if lk.Fence < 1 {
				t.Errorf("fence %d, want >= 1", lk.Fence)
			}
			for i := range n {
				if d := c.pttl(t, i, "orders"); d <= 0 || d > ttl {
					t.Errorf("node %d: PTTL %v, want in (0, %v]", i, d, ttl)
				}
			}

			if _, err := l.Lock(ctx, "orders", ttl, Options{}); !errors.Is(err, ErrNotAcquired) {
				t.Errorf("second Lock: %v, want ErrNotAcquired", err)
			}
			if _, err := l.Lock(ctx, "orders", ttl, Options{Token: "someone-else"}); !errors.Is(err, ErrNotAcquired) {
				t.Errorf("Lock with another token: %v, want ErrNotAcquired", err)
			}
			other := mustLock(t, l, "invoices", ttl, Options{})
			if other.Fence <= lk.Fence {
				t.Errorf("fence of a later lock %d <= %d", other.Fence, lk.Fence)
			}

			if _, err := l.Extend(ctx, "orders", "wrong", 20*time.Second); !errors.Is(err, ErrNotHeld) {
				t.Errorf("Extend with wrong token: %v, want ErrNotHeld", err)
			}
			v, err := l.Extend(ctx, "orders", lk.Token, 20*time.Second)
			if err != nil || v <= ttl || v > 20*time.Second {
				t.Errorf("Extend = %v, %v; want validity in (%v, 20s]", v, err, ttl)
			}
			for i := range n {
				if d := c.pttl(t, i, "orders"); d <= ttl {
					t.Errorf("node %d: PTTL %v after Extend to 20s", i, d)
				}
			}

			// A node that lost its script cache still runs the scripts.
			for _, a := range c.admin {
				if err := a.ScriptFlush(ctx).Err(); err != nil {
					t.Fatal(err)
				}
			}

			if err := l.Unlock(ctx, "orders", "wrong"); !errors.Is(err, ErrNotHeld) {
				t.Errorf("Unlock with wrong token: %v, want ErrNotHeld", err)
			}
			if err := l.Unlock(ctx, "orders", lk.Token); err != nil {
				t.Errorf("Unlock: %v", err)
			}
			if err := l.Unlock(ctx, "orders", lk.Token); !errors.Is(err, ErrNotHeld) {
				t.Errorf("second Unlock: %v, want ErrNotHeld", err)
			}
			if _, err := l.Extend(ctx, "orders", lk.Token, ttl); !errors.Is(err, ErrNotHeld) {
				t.Errorf("Extend after Unlock: %v, want ErrNotHeld", err)
			}
			if err := l.Unlock(ctx, "orders", ""); !errors.Is(err, ErrNotHeld) {
				t.Errorf("Unlock with empty token: %v, want ErrNotHeld", err)
			}
			for i := range n {
				if keys := c.lockKeys(t, i); len(keys) != 1 || keys[0] != "lockproxy:lock:invoices" {
					t.Errorf("node %d: lock keys %v, want only invoices", i, keys)
				}
			}

			again := mustLock(t, l, "orders", ttl, Options{})
			if again.Fence <= other.Fence {
				t.Errorf("fence after re-lock %d <= %d", again.Fence, other.Fence)
			}
			if _, err := l.Lock(ctx, "orders", 0, Options{}); err == nil {
				t.Error("Lock with ttl 0 succeeded")
			}
			if _, err := l.Extend(ctx, "orders", again.Token, 0); err == nil {
				t.Error("Extend with ttl 0 succeeded")
			}
		})
	}
}

func TestTokenReacquireKeepsFence(t *testing.T) {
	c := startCluster(t, 3)
	l := newLocker(t, c, testConfig())
	ctx := ctxT(t)

	first := mustLock(t, l, "orders", time.Second, Options{Token: "my-token"})
	mustUnlock(t, l, "other", mustLock(t, l, "other", time.Second, Options{}).Token) // advance the counters
	again, err := l.Lock(ctx, "orders", 30*time.Second, Options{Token: "my-token"})
	if err != nil {
		t.Fatalf("re-acquire: %v", err)
	}
	if again.Fence != first.Fence || again.Token != "my-token" {
		t.Errorf("re-acquire = %+v, want fence %d and token my-token", again, first.Fence)
	}
	if again.Validity <= time.Second {
		t.Errorf("re-acquire validity %v, want about 30s", again.Validity)
	}
	for i := range 3 {
		if d := c.pttl(t, i, "orders"); d <= time.Second {
			t.Errorf("node %d: PTTL %v, want the refreshed ttl", i, d)
		}
	}
	if _, err := l.Lock(ctx, "orders", time.Second, Options{Token: "not-mine"}); !errors.Is(err, ErrNotAcquired) {
		t.Errorf("Lock with another token: %v, want ErrNotAcquired", err)
	}
}

func TestQuorumByKillingNodes(t *testing.T) {
	tests := []struct {
		nodes, kill int
		wantOK      bool
	}{
		{1, 0, true},
		{1, 1, false},
		{2, 1, false},
		{3, 1, true},
		{3, 2, false},
		{4, 1, true},
		{4, 2, false},
		{5, 2, true},
		{5, 3, false},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%d of %d up", tt.nodes-tt.kill, tt.nodes), func(t *testing.T) {
			c := startCluster(t, tt.nodes)
			l := newLocker(t, c, testConfig())
			ctx := ctxT(t)
			warm(t, c, l)
			for i := range tt.kill {
				c.kill(i)
			}

			lk, err := l.Lock(ctx, "orders", 10*time.Second, Options{})
			if !tt.wantOK {
				var nq *NoQuorumError
				if !errors.As(err, &nq) || nq.Answered != tt.nodes-tt.kill || nq.Total != tt.nodes {
					t.Fatalf("Lock: %v, want NoQuorumError{%d, %d}", err, tt.nodes-tt.kill, tt.nodes)
				}
				if _, err := l.Extend(ctx, "orders", "t", time.Second); !errors.As(err, &nq) {
					t.Errorf("Extend: %v, want NoQuorumError", err)
				}
				if err := l.Unlock(ctx, "orders", "t"); !errors.As(err, &nq) {
					t.Errorf("Unlock: %v, want NoQuorumError", err)
				}
				for i := tt.kill; i < tt.nodes; i++ {
					if keys := c.lockKeys(t, i); len(keys) != 0 {
						t.Errorf("node %d: left locked: %v", i, keys)
					}
					if c.counter(t, i) == 0 {
						t.Errorf("node %d was never asked", i)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("Lock: %v", err)
			}
			if _, err := l.Extend(ctx, "orders", lk.Token, 10*time.Second); err != nil {
				t.Errorf("Extend: %v", err)
			}
			if err := l.Unlock(ctx, "orders", lk.Token); err != nil {
				t.Errorf("Unlock: %v", err)
			}
		})
	}
}

func TestPausedNodeBoundsLatency(t *testing.T) {
	c := startCluster(t, 3)
	cfg := testConfig()
	l := newLocker(t, c, cfg)
	ctx := ctxT(t)
	mustUnlock(t, l, "warmup", mustLock(t, l, "warmup", time.Second, Options{}).Token)

	c.servers[2].Pause()
	defer c.servers[2].Resume()
	limit := cfg.NodeTimeout + 500*time.Millisecond

	start := time.Now()
	lk, err := l.Lock(ctx, "orders", 10*time.Second, Options{})
	if err != nil {
		t.Fatalf("Lock with a paused node: %v", err)
	}
	if d := time.Since(start); d > limit {
		t.Errorf("Lock took %v, want at most %v", d, limit)
	}
	start = time.Now()
	if _, err := l.Extend(ctx, "orders", lk.Token, 10*time.Second); err != nil {
		t.Errorf("Extend: %v", err)
	}
	if err := l.Unlock(ctx, "orders", lk.Token); err != nil {
		t.Errorf("Unlock: %v", err)
	}
	if d := time.Since(start); d > 2*limit {
		t.Errorf("Extend+Unlock took %v, want at most %v", d, 2*limit)
	}
}

func TestCancelledWhileAcquiringReleases(t *testing.T) {
	c := startCluster(t, 3)
	cfg := testConfig()
	cfg.NodeTimeout = 500 * time.Millisecond
	l := newLocker(t, c, cfg)
	mustUnlock(t, l, "warmup", mustLock(t, l, "warmup", time.Second, Options{}).Token)

	// Nodes 0 and 1 grant at once; node 2 is paused, so the caller's context
	// ends while the round still waits for it: a majority is held for a
	// caller that is gone.
	c.servers[2].Pause()
	defer c.servers[2].Resume()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := l.Lock(ctx, "orders", 10*time.Second, Options{})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock: %v, want context.DeadlineExceeded", err)
	}
	for i := range 2 {
		if keys := c.lockKeys(t, i); len(keys) != 0 {
			t.Errorf("node %d: left locked: %v", i, keys)
		}
	}
}

func TestFenceAfterNodeRestartedEmpty(t *testing.T) {
	c := startCluster(t, 3)
	l := newLocker(t, c, testConfig())
	warm(t, c, l)
	var last int64
	for range 3 {
		lk := mustLock(t, l, "orders", 10*time.Second, Options{})
		mustUnlock(t, l, "orders", lk.Token)
		last = lk.Fence
	}

	// Node 0 comes back empty, and does not count until it recovered (the
	// lock state and the counter copied from nodes 1 and 2). Then node 1
	// goes away: the next majority is {0, 2}, and without the copy node 0
	// would hand out fence 1.
	c.restart(0)
	waitClientUp(t, l, 0)
	waitRecovered(t, l, 0)
	c.kill(1)
	lk := mustLock(t, l, "orders", 10*time.Second, Options{})
	if lk.Fence <= last {
		t.Fatalf("fence %d after restart, want > %d", lk.Fence, last)
	}
	if got := c.counter(t, 0); got < lk.Fence {
		t.Errorf("restarted node's counter %d, want at least %d", got, lk.Fence)
	}
	mustUnlock(t, l, "orders", lk.Token)
	next := mustLock(t, l, "orders", 10*time.Second, Options{})
	if next.Fence <= lk.Fence {
		t.Errorf("fence %d, want > %d", next.Fence, lk.Fence)
	}
}

func TestFenceAcrossNodeThatMissedAcquisitions(t *testing.T) {
	c := startCluster(t, 3)
	l := newLocker(t, c, testConfig())

	// Node 2 misses three acquisitions while paused and keeps a low counter.
	// (It is paused after the deployment's first lock, which gave every
	// node its marker: a node paused then would count only once brought up
	// to date like a node that lost its data, counter included.)
	warm(t, c, l)
	c.servers[2].Pause()
	var last int64
	for i := range 3 {
		// Resources of their own: node 2 runs these attempts when it
		// resumes, after their cleanup gave up on it.
		r := fmt.Sprintf("paused-%d", i)
		lk := mustLock(t, l, r, 10*time.Second, Options{})
		mustUnlock(t, l, r, lk.Token)
		last = lk.Fence
	}
	c.servers[2].Resume()
	waitClientUp(t, l, 2)
	if got := c.counter(t, 2); got >= last {
		t.Fatalf("paused node's counter %d, want < %d", got, last)
	}

	lk := mustLock(t, l, "orders", 10*time.Second, Options{})
	if lk.Fence <= last {
		t.Fatalf("fence %d, want > %d", lk.Fence, last)
	}
	if got := c.counter(t, 2); got != lk.Fence {
		t.Fatalf("lagging node's counter %d, want raised to %d", got, lk.Fence)
	}
	mustUnlock(t, l, "orders", lk.Token)

	// Now the only node of that majority left with its data is node 2:
	// node 0 restarts empty (and recovers) and node 1 is gone. Without the
	// raise node 2 would still be far behind and the fence would go
	// backwards.
	c.restart(0)
	waitClientUp(t, l, 0)
	waitRecovered(t, l, 0)
	c.kill(1)
	next := mustLock(t, l, "orders", 10*time.Second, Options{})
	if next.Fence <= lk.Fence {
		t.Errorf("fence %d, want > %d", next.Fence, lk.Fence)
	}
}

func TestStateDoesNotGrowWithResources(t *testing.T) {
	c := startCluster(t, 3)
	l := newLocker(t, c, testConfig())
	ctx := ctxT(t)
	// On nodes without their markers yet, a round can fail for want of
	// votes and run again, advancing the counters twice: start from a
	// deployment in use, and count from there.
	warm(t, c, l)
	var base [3]int64
	for i := range base {
		base[i] = c.counter(t, i)
	}
	for i := range 1000 {
		r := fmt.Sprintf("resource-%d", i)
		mustUnlock(t, l, r, mustLock(t, l, r, 10*time.Second, Options{}).Token)
	}
	// Locks that are never unlocked go away with their ttl.
	for i := range 20 {
		mustLock(t, l, fmt.Sprintf("forgotten-%d", i), 400*time.Millisecond, Options{})
	}
	for i, a := range c.admin {
		// Left: the fence counter, the marker and, once a call moved it,
		// the clock offset.
		eventually(t, "expiry", func() bool {
			return a.DBSize(ctx).Val() == 2+a.Exists(ctx, "lockproxy:clock").Val()
		})
		if got := c.counter(t, i); got != base[i]+1020 {
			t.Errorf("node %d: counter %d, want %d (1020 acquisitions after %d)", i, got, base[i]+1020, base[i])
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if n := len(l.queues); n != 0 {
		t.Errorf("%d wait queues left", n)
	}
}

func TestClose(t *testing.T) {
	c := startCluster(t, 3)
	l := newLocker(t, c, noFallback(testConfig()))
	ctx := ctxT(t)
	mustLock(t, l, "orders", 10*time.Second, Options{})
	waiting := lockAsync(t, ctx, l, "orders", 10*time.Second, Options{Wait: 10 * time.Second})
	waitQueued(t, l, "orders", 1)

	if err := l.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if r := recv(t, waiting); r.err == nil || retryable(r.err) {
		t.Errorf("waiting Lock after Close: %v", r.err)
	}
	if err := l.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := l.Lock(ctx, "other", time.Second, Options{}); err == nil {
		t.Error("Lock after Close succeeded")
	}
	if err := l.Unlock(ctx, "orders", "t"); err == nil {
		t.Error("Unlock after Close succeeded")
	}
	c.waitSubscribed(t, 0)
}
