package quorum

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// storedFence returns the fence in resource's lock value on node i, and
// the token that owns it ("" when the node holds no lock of a token).
func (c *cluster) storedFence(tb testing.TB, i int, resource string) (int64, string) {
	tb.Helper()
	v, err := c.admin[i].Get(context.Background(), "lockproxy:lock:"+resource).Result()
	if errors.Is(err, redis.Nil) || strings.HasPrefix(v, "x") {
		return 0, "" // none, or a tombstone of an attempt
	}
	if err != nil {
		tb.Fatalf("GET on node %d: %v", i, err)
	}
	head, token, _ := strings.Cut(v, ":")
	head, _, _ = strings.Cut(head[1:], "/")
	f, err := strconv.ParseInt(head, 10, 64)
	if err != nil {
		tb.Fatalf("node %d: lock value %q has no fence", i, v)
	}
	return f, token
}

// handWithNodePaused hands resource from holder to the waiter waiting
// (queued and idle on l) while node 2 is paused: the waiter is granted and
// the holder's Unlock returns before node 2 answers; node 2 is then
// resumed (within the node timeout), and handWithNodePaused returns once
// its reply was dealt with. With leave, the Unlock's context is cancelled
// as soon as it returned: the rest of the round does not depend on it.
func handWithNodePaused(t *testing.T, c *cluster, l *Locker, resource string, holder Lock, waiting <-chan lockResult, leave ...bool) Lock {
	t.Helper()
	var early atomic.Int32
	hook := func() { early.Add(1) }
	testHookHandedEarly.Store(&hook)
	defer testHookHandedEarly.Store(nil)
	rested := make(chan struct{}, 1)
	restHook := func() {
		select {
		case rested <- struct{}{}:
		default:
		}
	}
	testHookHandRest.Store(&restHook)
	defer testHookHandRest.Store(nil)

	c.servers[2].Pause()
	resumed := false
	defer func() {
		if !resumed {
			c.servers[2].Resume()
		}
	}()
	uctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	if err := l.Unlock(uctx, resource, holder.Token); err != nil {
		t.Fatalf("Unlock with node 2 paused: %v", err)
	}
	if len(leave) > 0 && leave[0] {
		cancel()
	}
	w := recv(t, waiting)
	if w.err != nil {
		t.Fatalf("waiter: %v", w.err)
	}
	if early.Load() != 1 {
		t.Fatalf("%d handing rounds decided at a majority, want 1", early.Load())
	}
	select {
	case <-rested:
		t.Fatal("the handing round ended before node 2 answered: it waited for node 2's timeout")
	default:
	}
	time.Sleep(20 * time.Millisecond) // node 2's request stays in flight
	c.servers[2].Resume()
	resumed = true
	select {
	case <-rested:
	case <-time.After(10 * time.Second):
		t.Fatal("node 2's reply to the handing round was not dealt with after it resumed")
	}
	return w.lk
}

// TestHandoffAtMajorityWithNodePaused: with node 2 paused, a handing round
// grants the waiter on nodes 0 and 1 before node 2 answers, with their
// fence, and the holder's Unlock returns; node 2, resumed within the node
// timeout, then takes the lock for the waiter too, and the next Unlock
// releases it everywhere.
func TestHandoffAtMajorityWithNodePaused(t *testing.T) {
	c, l, ctx := startHanding(t)
	holder := mustLock(t, l, "R", 10*time.Second, Options{})
	waiting := queueWaiter(t, ctx, l, "R")

	got := handWithNodePaused(t, c, l, "R", holder, waiting)
	if got.Fence <= holder.Fence {
		t.Fatalf("waiter's fence %d is not above the holder's %d", got.Fence, holder.Fence)
	}
	for i := range c.servers {
		f, token := c.storedFence(t, i, "R")
		if token != got.Token || f != got.Fence {
			t.Errorf("node %d stores fence %d of %q, want %d of the waiter %q", i, f, token, got.Fence, got.Token)
		}
	}
	info, err := l.Info(ctx, "R", got.Token)
	if err != nil || !info.Owned || info.Fence != got.Fence {
		t.Errorf("Info: %+v, %v; want owned with fence %d", info, err, got.Fence)
	}
	mustUnlock(t, l, "R", got.Token)
	for i := range c.servers {
		if keys := c.lockKeys(t, i); len(keys) != 0 {
			t.Errorf("node %d: %v left locked", i, keys)
		}
	}
}

// TestHandoffAtMajorityLateNodeBehind: node 2's counter is behind, and it
// answers the handing round after the majority decided: its grant is
// raised to the waiter's fence, as a full round's confirmation raises a
// node behind.
func TestHandoffAtMajorityLateNodeBehind(t *testing.T) {
	c, l, ctx := startHanding(t)
	holder := mustLock(t, l, "R", 10*time.Second, Options{})
	c.admin[2].Set(ctx, "lockproxy:fence", 1, 0) // behind the others
	waiting := queueWaiter(t, ctx, l, "R")

	got := handWithNodePaused(t, c, l, "R", holder, waiting)
	if f, token := c.storedFence(t, 2, "R"); token != got.Token || f != got.Fence {
		t.Errorf("node 2 stores fence %d of %q, want %d of the waiter %q (raised)", f, token, got.Fence, got.Token)
	}
	if n := c.counter(t, 2); n < got.Fence {
		t.Errorf("node 2's counter is %d, below the waiter's fence %d", n, got.Fence)
	}
	mustUnlock(t, l, "R", got.Token)
	next := mustLock(t, l, "R", time.Second, Options{})
	if next.Fence <= got.Fence {
		t.Fatalf("fence went backwards: %d after %d", next.Fence, got.Fence)
	}
}

// TestHandoffAtMajorityOutlivesCaller: the releasing client's context
// ends as soon as its Unlock returned (a session cancels its command
// context when it makes the next one): node 2's late grant, behind, is
// raised all the same.
func TestHandoffAtMajorityOutlivesCaller(t *testing.T) {
	c, l, ctx := startHanding(t)
	holder := mustLock(t, l, "R", 10*time.Second, Options{})
	c.admin[2].Set(ctx, "lockproxy:fence", 1, 0) // behind the others
	waiting := queueWaiter(t, ctx, l, "R")

	got := handWithNodePaused(t, c, l, "R", holder, waiting, true)
	if f, token := c.storedFence(t, 2, "R"); token != got.Token || f != got.Fence {
		t.Errorf("node 2 stores fence %d of %q, want %d of the waiter %q (raised)", f, token, got.Fence, got.Token)
	}
}

// TestHandoffAtMajorityLateNodeAhead: node 2's counter is ahead, and it
// answers the handing round after the majority decided with a larger
// fence than the waiter got: its grant is undone, so that no node shows
// the holding with another fence than its holder's (LOCKINFO reports the
// holder's), and the holding rests on the majority until it is extended.
func TestHandoffAtMajorityLateNodeAhead(t *testing.T) {
	c, l, ctx := startHanding(t)
	holder := mustLock(t, l, "R", 10*time.Second, Options{})
	c.admin[2].IncrBy(ctx, "lockproxy:fence", 1000) // ahead of the others
	waiting := queueWaiter(t, ctx, l, "R")

	got := handWithNodePaused(t, c, l, "R", holder, waiting)
	if f, token := c.storedFence(t, 2, "R"); token != "" {
		t.Errorf("node 2 stores fence %d of %q, want no holding (the waiter's fence is %d)", f, token, got.Fence)
	}
	for i := range 2 {
		if f, token := c.storedFence(t, i, "R"); token != got.Token || f != got.Fence {
			t.Errorf("node %d stores fence %d of %q, want %d of the waiter %q", i, f, token, got.Fence, got.Token)
		}
	}
	info, err := l.Info(ctx, "R", got.Token)
	if err != nil || !info.Owned || info.Fence != got.Fence {
		t.Errorf("Info: %+v, %v; want owned with fence %d", info, err, got.Fence)
	}
	if _, err := l.Extend(ctx, "R", got.Token, 10*time.Second); err != nil {
		t.Fatalf("Extend: %v", err)
	}
	if f, token := c.storedFence(t, 2, "R"); token != got.Token || f != got.Fence {
		t.Errorf("after Extend, node 2 stores fence %d of %q, want %d of the waiter %q", f, token, got.Fence, got.Token)
	}
	mustUnlock(t, l, "R", got.Token)
	next := mustLock(t, l, "R", time.Second, Options{})
	if next.Fence <= got.Fence {
		t.Fatalf("fence went backwards: %d after %d", next.Fence, got.Fence)
	}
}

// TestHandoffAtMajorityLateNodeHeld: node 2 still shows another holder
// when it answers the handing round after the majority decided: the lock
// is placed there once that holder's ttl has run out, as after a full
// round; and when the new holder released it first, it is not.
func TestHandoffAtMajorityLateNodeHeld(t *testing.T) {
	c, l, ctx := startHanding(t)
	for _, releaseFirst := range []bool{false, true} {
		r := "R" + strconv.FormatBool(releaseFirst)
		holder := mustLock(t, l, r, 10*time.Second, Options{})
		c.admin[2].Set(ctx, "lockproxy:lock:"+r, "05:previous", 300*time.Millisecond)
		waiting := queueWaiter(t, ctx, l, r)

		if !releaseFirst {
			got := handWithNodePaused(t, c, l, r, holder, waiting)
			eventually(t, "the waiter's lock placed on node 2", func() bool {
				_, token := c.storedFence(t, 2, r)
				return token == got.Token
			})
			mustUnlock(t, l, r, got.Token)
			continue
		}
		// The new holder releases while node 2 is still paused: its
		// Unlock cancels the placement that the handing round's late
		// reply would schedule.
		c.servers[2].Pause()
		unlocked := make(chan error, 2)
		go func() { unlocked <- l.Unlock(context.Background(), r, holder.Token) }()
		w := recv(t, waiting)
		if w.err != nil {
			c.servers[2].Resume()
			t.Fatalf("waiter: %v", w.err)
		}
		go func() { unlocked <- l.Unlock(context.Background(), r, w.lk.Token) }()
		time.Sleep(20 * time.Millisecond)
		c.servers[2].Resume()
		for range 2 {
			if err := <-unlocked; err != nil {
				t.Errorf("Unlock: %v", err)
			}
		}
		time.Sleep(300*time.Millisecond + l.cfg.NodeTimeout + 100*time.Millisecond)
		if _, token := c.storedFence(t, 2, r); token == w.lk.Token {
			t.Errorf("node 2 holds %s for the waiter, which released it before the handing round ended", r)
		}
	}
}

// TestHandoffAtMajorityChaos: clients of two Lockers (two proxies over the
// same nodes) contend for one resource with waits, so that nearly every
// acquisition is a handoff within a Locker while the other Locker's
// clients try to take the lock between them, and one node at a time is
// paused, cut off, killed or restarted empty; the independent storage of
// the chaos tests finds no two holdings that overlap within their
// validity and no stale fence, and handing rounds were decided at a
// majority while a node was slow.
func TestHandoffAtMajorityChaos(t *testing.T) {
	c := startClockCluster(t, 3, "--appendonly", "yes", "--appendfsync", "always")
	cfg := testConfig()
	cfg.MaxTTL = 3 * time.Second
	lockers := []*Locker{newLocker(t, c, cfg), newLocker(t, c, cfg)}
	warm(t, c, lockers[0])
	warm(t, c, lockers[1])

	var early atomic.Int64
	hook := func() { early.Add(1) }
	testHookHandedEarly.Store(&hook)
	defer testHookHandedEarly.Store(nil)

	st := newStorage()
	stop := make(chan struct{})
	wait := contend(t, lockers, []string{"r0"}, 8, st, stop, 2*time.Second, writeBriefly)
	var fs []fault
	for _, f := range faults {
		switch f.name {
		case "pause", "cut off", "kill", "restart empty":
			fs = append(fs, f)
		}
	}
	injected := injectFaultsOf(t, c, lockers, 12*time.Second, fs)
	close(stop)
	tl := wait()
	check(t, fmt.Sprintf("one resource, 8 clients of two Lockers, faults %v", injected), st, tl, 200)
	t.Logf("%d handing rounds decided at a majority", early.Load())
	if early.Load() == 0 {
		t.Error("no handing round was decided at a majority")
	}
}

// startHanding starts three nodes and a Locker over them without the
// fallback, its connections warm, for a handing round to be watched.
func startHanding(t *testing.T) (*cluster, *Locker, context.Context) {
	c := startCluster(t, 3)
	l := newLocker(t, c, noFallback(testConfig()))
	warm(t, c, l)
	return c, l, ctxT(t)
}

// queueWaiter queues a plain waiter for resource, held by another, and
// returns once it waits idle: the holder's Unlock hands the lock to it.
func queueWaiter(t *testing.T, ctx context.Context, l *Locker, resource string) <-chan lockResult {
	waiting := lockAsync(t, ctx, l, resource, 10*time.Second, Options{Wait: 10 * time.Second})
	waitQueued(t, l, resource, 1)
	waitIdle(t, l, resource)
	return waiting
}
