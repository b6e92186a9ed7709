package quorum

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// holdsOn returns the hold count and version stored on node i for
// resource, (0, 0) when node i has no lock for it.
func (c *cluster) holdsOn(tb testing.TB, i int, resource string) (holds, version int64) {
	tb.Helper()
	v, err := c.admin[i].Get(context.Background(), "lockproxy:lock:"+resource).Result()
	if err != nil {
		return 0, 0
	}
	h, _, _ := strings.Cut(v, ":")
	holds, version, _ = parseExt(h)
	return holds, version
}

func mustRelease(tb testing.TB, l *Locker, resource, token string, hold, wantLeft int64) {
	tb.Helper()
	left, err := l.Release(ctxT(tb), resource, token, hold)
	if err != nil || left != wantLeft {
		tb.Fatalf("Release(%s, HOLD %d) = %d, %v; want %d holds left", resource, hold, left, err, wantLeft)
	}
}

// TestReentrantHolds: re-entry by the token adds a hold with the same
// fence, a token-less request is a new owner, a plain refresh keeps the
// count, and only the release of the last hold frees the lock.
func TestReentrantHolds(t *testing.T) {
	c := startCluster(t, 3)
	l := newLocker(t, c, testConfig())
	other := newLocker(t, c, testConfig())
	warm(t, c, l)
	re := Options{Reentrant: true}

	lk := mustLock(t, l, "R", 10*time.Second, re)
	if lk.Holds != 1 {
		t.Fatalf("fresh reentrant lock has %d holds, want 1", lk.Holds)
	}
	again := mustLock(t, other, "R", 10*time.Second, Options{Reentrant: true, Token: lk.Token})
	if again.Holds != 2 || again.Fence != lk.Fence {
		t.Fatalf("re-entry through another Locker: holds %d fence %d, want 2 and fence %d", again.Holds, again.Fence, lk.Fence)
	}
	for i := range 3 {
		if h, v := c.holdsOn(t, i, "R"); h != 2 || v < 2 {
			t.Errorf("node %d stores %d holds version %d, want 2 holds", i, h, v)
		}
	}
	if _, err := l.Lock(ctxT(t), "R", time.Second, re); !errors.Is(err, ErrNotAcquired) {
		t.Fatalf("token-less reentrant LOCK of a held lock: %v, want ErrNotAcquired (a new owner)", err)
	}
	// A plain LOCK with the holder's token is the idempotent refresh.
	if plain := mustLock(t, l, "R", 10*time.Second, Options{Token: lk.Token}); plain.Holds != 0 || plain.Fence != lk.Fence {
		t.Fatalf("plain LOCK by the holder: holds %d fence %d", plain.Holds, plain.Fence)
	}
	mustUnlock(t, l, "R", lk.Token) // 2 -> 1
	refused(t, "one hold left", "R", other)
	mustRelease(t, other, "R", lk.Token, 0, 0)
	mustUnlock(t, other, "R", mustLock(t, other, "R", time.Second, Options{}).Token)

	// A plain holding re-entered gets a count: two holds.
	p := mustLock(t, l, "P", 10*time.Second, Options{})
	if lk := mustLock(t, l, "P", 10*time.Second, Options{Reentrant: true, Token: p.Token}); lk.Holds != 2 {
		t.Fatalf("re-entry of a plain holding: %d holds, want 2", lk.Holds)
	}
	mustRelease(t, l, "P", p.Token, 0, 1)
	mustRelease(t, l, "P", p.Token, 0, 0)
}

// TestReleaseHoldTwice: Release with HOLD n sent twice removes one hold;
// on a lock without a count it changes nothing.
func TestReleaseHoldTwice(t *testing.T) {
	c := startCluster(t, 3)
	l := newLocker(t, c, testConfig())
	warm(t, c, l)
	var lk Lock
	for range 3 {
		lk = mustLock(t, l, "R", 10*time.Second, Options{Reentrant: true, Token: "owner"})
	}
	if lk.Holds != 3 {
		t.Fatalf("holds %d after three LOCK REENTRANT, want 3", lk.Holds)
	}
	mustRelease(t, l, "R", "owner", 3, 2)
	mustRelease(t, l, "R", "owner", 3, 2) // resent: nothing more
	mustRelease(t, l, "R", "owner", 2, 1)
	mustRelease(t, l, "R", "owner", 2, 1)
	mustRelease(t, l, "R", "owner", 1, 0)
	if _, err := l.Release(ctxT(t), "R", "owner", 1); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("HOLD 1 after the release: %v, want ErrNotHeld", err)
	}

	p := mustLock(t, l, "P", 10*time.Second, Options{})
	if _, err := l.Release(ctxT(t), "P", p.Token, 1); !errors.Is(err, ErrNotReentrant) {
		t.Fatalf("HOLD on a plain lock: %v, want ErrNotReentrant", err)
	}
	if h := c.holder(t, 0, "P"); h != p.Token {
		t.Fatalf("plain lock gone after a refused HOLD release")
	}
}

// TestReentrantMajorities is the contract's counterexample: with 5 nodes,
// a hold taken through {0,1,2}, another through {0,1,3}, and a release
// attempted through {2,3,4} must not lose the lock while a hold remains.
func TestReentrantMajorities(t *testing.T) {
	c := startCluster(t, 5)
	l := newLocker(t, c, testConfig())
	other := newLocker(t, c, testConfig())
	warm(t, c, l)
	var cut [5]bool
	only := func(up ...int) {
		for i := range 5 {
			keep := false
			for _, u := range up {
				keep = keep || u == i
			}
			switch {
			case keep && cut[i]:
				c.servers[i].Reconnect()
			case !keep && !cut[i]:
				c.servers[i].CutOff()
			}
			cut[i] = !keep
		}
	}
	defer only(0, 1, 2, 3, 4)

	only(0, 1, 2)
	lk := mustLock(t, l, "R", 20*time.Second, Options{Reentrant: true, Token: "owner"})
	only(0, 1, 3)
	if lk = mustLock(t, l, "R", 20*time.Second, Options{Reentrant: true, Token: "owner"}); lk.Holds != 2 {
		t.Fatalf("second hold through {0,1,3}: %d holds, want 2", lk.Holds)
	}
	only(2, 3, 4)
	if left, err := l.Release(ctxT(t), "R", "owner", 0); err == nil && left == 0 {
		t.Fatalf("release through {2,3,4} freed a lock with two holds")
	}
	for _, i := range []int{2, 3} {
		if c.holder(t, i, "R") != "owner" {
			t.Errorf("node %d lost the lock in a release through {2,3,4}", i)
		}
	}
	only(0, 1, 2, 3, 4)
	refused(t, "two holds, after the release through {2,3,4}", "R", other)
	mustRelease(t, l, "R", "owner", 0, 1)
	refused(t, "one hold left", "R", other)
	mustRelease(t, l, "R", "owner", 0, 0)
	mustUnlock(t, other, "R", mustLock(t, other, "R", time.Second, Options{}).Token)
}

// TestReentrantSurvivesLossAndRestart: the count is restored with the
// lock to a node that lost its data, and a new Locker (a proxy restart)
// sees it.
func TestReentrantSurvivesLossAndRestart(t *testing.T) {
	c := startCluster(t, 3)
	l := newLocker(t, c, testConfig())
	warm(t, c, l)
	for range 3 {
		mustLock(t, l, "R", 20*time.Second, Options{Reentrant: true, Token: "owner"})
	}
	c.restart(1)
	waitRecovered(t, l, 1)
	if h, _ := c.holdsOn(t, 1, "R"); h != 3 {
		t.Fatalf("node 1 stores %d holds after its recovery, want 3", h)
	}
	l.Close()

	fresh := newLocker(t, c, testConfig())
	c.servers[0].CutOff() // the recovered node makes the majority
	defer c.servers[0].Reconnect()
	// A new Locker answers NOQUORUM until it has placed the nodes' clocks.
	eventually(t, "the new Locker's clocks", func() bool {
		_, err := fresh.Info(ctxT(t), "R", "")
		return err == nil
	})
	mustRelease(t, fresh, "R", "owner", 0, 2)
	c.servers[0].Reconnect()
	// The last release must reach node 0 too: wait until the Locker's
	// calls use it again (its connection was cut, and the new Locker may
	// never have read its clock).
	waitUsable(t, fresh, 0)
	if h, _ := c.holdsOn(t, 0, "R"); h != 3 {
		t.Logf("node 0, cut off during the release, keeps %d holds (a later version elsewhere)", h)
	}
	mustRelease(t, fresh, "R", "owner", 0, 1)
	mustRelease(t, fresh, "R", "owner", 0, 0)
	for i := range 3 {
		if h := c.holder(t, i, "R"); h != "" {
			t.Errorf("node %d still holds R after the last release", i)
		}
	}
}

// TestReentrantNotHandedOn: an Unlock that removes one of two holds does
// not hand the lock to a local waiter; the one that removes the last does.
func TestReentrantNotHandedOn(t *testing.T) {
	c := startCluster(t, 3)
	l := newLocker(t, c, noFallback(testConfig()))
	warm(t, c, l)
	for range 2 {
		mustLock(t, l, "R", 20*time.Second, Options{Reentrant: true, Token: "owner"})
	}
	ch := lockAsync(t, ctxT(t), l, "R", 5*time.Second, Options{Wait: 10 * time.Second})
	waitQueued(t, l, "R", 1)
	time.Sleep(50 * time.Millisecond) // the waiter's first attempt, then idle
	mustUnlock(t, l, "R", "owner")
	select {
	case r := <-ch:
		t.Fatalf("the waiter got R (%v) while one hold remained", r.err)
	case <-time.After(300 * time.Millisecond):
	}
	mustUnlock(t, l, "R", "owner")
	if r := recv(t, ch); r.err != nil {
		t.Fatalf("waiter after the last hold: %v", r.err)
	}
}
