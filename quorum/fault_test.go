package quorum

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestFenceAfterStalledConfirm: the Locker stalls between a granting round
// and its fence confirmation (here a handoff's) while node 0, which granted
// the largest fence, restarts empty and is recovered by copy from nodes
// whose counters are below that fence, and the raise then misses node 2.
// A confirmation that ends later than maxRounds after its round began is
// refused, so the next holder's fence is still larger.
func TestFenceAfterStalledConfirm(t *testing.T) {
	c := startCluster(t, 3)
	l := newLocker(t, c, noFallback(testConfig()))
	ctx := ctxT(t)
	warm(t, c, l)
	holder := mustLock(t, l, "R", 30*time.Second, Options{})

	// Counters diverge naturally: every acquire attempt INCRs, also when it
	// fails. Attempts that only node 0 answers push node 0 ahead.
	c.servers[1].CutOff()
	c.servers[2].CutOff()
	for range 50 {
		l.Lock(ctx, "other", time.Second, Options{})
	}
	c.servers[1].Reconnect()
	c.servers[2].Reconnect()
	t.Logf("counters before the handoff: %d %d %d", c.counter(t, 0), c.counter(t, 1), c.counter(t, 2))

	waiting := lockAsync(t, ctx, l, "R", 30*time.Second, Options{Wait: 20 * time.Second})
	waitQueued(t, l, "R", 1)
	waitIdle(t, l, "R")

	stall := context.CancelFunc(func() {
		// The Locker is stalled (GC, CPU starvation, stopped VM) right
		// after the handing round. Node 0 loses its data and comes back.
		c.servers[0].RestartEmpty()
		waitRecovered(t, l, 0)
		t.Logf("node 0 recovered by copy; counters: %d %d %d", c.counter(t, 0), c.counter(t, 1), c.counter(t, 2))
		// Afterwards node 2 drops its connections for a moment (one
		// node at a time is faulty): the raise does not reach it.
		c.servers[2].CutOff()
	})
	testHookHandOver.Store(&stall)
	mustUnlock(t, l, "R", holder.Token)
	testHookHandOver.Store(nil)
	w := recv(t, waiting)
	if w.err != nil {
		t.Fatalf("waiter: %v", w.err)
	}
	mustUnlock(t, l, "R", w.lk.Token)
	c.servers[2].Reconnect()
	l.Unlock(ctx, "R", w.lk.Token) // also off node 2, which was cut off at the first Unlock
	t.Logf("waiter got fence %d; counters: %d %d %d", w.lk.Fence, c.counter(t, 0), c.counter(t, 1), c.counter(t, 2))

	// Node 1 is now the faulty one; the next holder wins nodes 0 and 2.
	c.servers[1].CutOff()
	var next Lock
	eventually(t, "the next holder", func() bool {
		lk, err := l.Lock(ctx, "R", time.Second, Options{})
		next = lk
		return err == nil
	})
	c.servers[1].Reconnect()
	if next.Fence <= w.lk.Fence {
		t.Fatalf("fence went backwards: next holder got %d after %d", next.Fence, w.lk.Fence)
	}
}

// TestEvictionIsDataLoss: a node that may evict keys does not count, and
// one that evicted a lock key (its marker has no ttl and survives) is taken
// for a node that lost its data, also once its memory limit is gone again.
func TestEvictionIsDataLoss(t *testing.T) {
	c := startCluster(t, 3)
	l := newLocker(t, c, testConfig())
	ctx := ctxT(t)
	warm(t, c, l)
	c.servers[2].CutOff()
	a := mustLock(t, l, "R", 15*time.Second, Options{}) // on nodes 0 and 1
	c.servers[2].Reconnect()

	adm := c.admin[1]
	var used int64
	for _, line := range strings.Split(adm.Info(ctx, "memory").Val(), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			used, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	adm.ConfigSet(ctx, "maxmemory-policy", "volatile-ttl")
	adm.ConfigSet(ctx, "maxmemory", strconv.FormatInt(used+200_000, 10))
	eventually(t, "node 1 seen as evicting", func() bool { return l.Status()[1].State == NodeEvicting })
	// Node 1 does not count; nodes 0 and 2 still make a majority.
	mustUnlock(t, l, "other", mustLock(t, l, "other", time.Second, Options{}).Token)
	adm.Set(ctx, "unrelated", make([]byte, 400_000), 0) // memory pressure: R is evicted
	if h := c.holder(t, 1, "R"); h != "" {
		t.Fatalf("R was not evicted from node 1 (%q): the test proves nothing", h)
	}
	adm.ConfigSet(ctx, "maxmemory", "0")
	adm.ConfigSet(ctx, "maxmemory-policy", "noeviction")

	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		if b, err := l.Lock(ctxT(t), "R", 8*time.Second, Options{}); err == nil {
			t.Fatalf("R granted twice: fence %d, then %d", a.Fence, b.Fence)
		}
	}
	waitRecovered(t, l, 1)
	if h := c.holder(t, 1, "R"); h != a.Token {
		t.Errorf("node 1 holds R for %q after its recovery, want the lock copied back", h)
	}
}
