package quorum

import (
	"fmt"
	"testing"
	"time"
)

// TestKilledNodeNotDialed: while a node that was killed is known down (its
// host refused a connection), Lock and Unlock over the two others succeed
// without dialing it: only its keeper does, at most once per backoff, and
// the watcher's checks, once per ProbeInterval. Once
// it runs again, the next calls use it within the keeper's bound
// (maxKeepBackoff and a reconnection; the bound asserted has room for a
// loaded machine, the figure is logged).
func TestKilledNodeNotDialed(t *testing.T) {
	c := startCluster(t, 3)
	cfg := testConfig()
	l := newLocker(t, c, cfg)
	warm(t, c, l)
	n := l.nodes[2]
	c.kill(2)
	eventually(t, "node 2 known down", func() bool {
		lk := mustLock(t, l, "down", time.Minute, Options{})
		mustUnlock(t, l, "down", lk.Token)
		return n.refused.Load()
	})

	const calls = 100
	misses := n.batches.PoolStats().Misses // a request that found no connection: a dial
	start := time.Now()
	for i := range calls {
		resource := fmt.Sprintf("down-%d", i)
		lk := mustLock(t, l, resource, time.Minute, Options{})
		mustUnlock(t, l, resource, lk.Token)
	}
	took := time.Since(start)
	dials := int(n.batches.PoolStats().Misses - misses)
	// The keeper's tries, one per backoff (at least NodeTimeout/2 or
	// maxKeepBackoff, the shorter), and the watcher's checks, one per
	// ProbeInterval; one more of each at each end.
	background := int(took/min(cfg.NodeTimeout/2, maxKeepBackoff)) + int(took/cfg.ProbeInterval) + 4
	if dials > background {
		t.Errorf("%d Lock+Unlock pairs with node 2 killed took %v and dialed it %d times, want at most %d (the keeper's and the watcher's tries alone)", calls, took.Round(time.Millisecond), dials, background)
	}

	c.restart(2)
	back := time.Now()
	const bound = 2 * time.Second
	var counted time.Duration
	for i := 0; counted == 0; i++ {
		resource := fmt.Sprintf("back-%d", i)
		lk := mustLock(t, l, resource, time.Minute, Options{})
		if c.pttl(t, 2, resource) > 0 {
			counted = time.Since(back)
		}
		mustUnlock(t, l, resource, lk.Token)
		if counted == 0 && time.Since(back) > bound {
			t.Fatalf("node 2 restarted %v ago, and no Lock reached it yet, want within %v", time.Since(back).Round(time.Millisecond), bound)
		}
	}
	t.Logf("%d Lock+Unlock pairs with node 2 killed in %v dialed it %d times; restarted, it held a lock %v later",
		calls, took.Round(time.Millisecond), dials, counted.Round(time.Millisecond))
}

// TestNeverReachedNodeDown: a node that the Locker could not reach from its
// start (cut off before New: its clock was never read) is reported down by
// Status once a call needed it; once it is let in again, Status says up,
// and once its keeper has read its clock, the next calls use it.
func TestNeverReachedNodeDown(t *testing.T) {
	c := startCluster(t, 3)
	first := newLocker(t, c, testConfig())
	warm(t, c, first) // the nodes' markers
	first.Close()
	c.servers[0].CutOff()
	defer c.servers[0].Reconnect()
	l := newLocker(t, c, testConfig())
	eventually(t, "a lock over nodes 1 and 2", func() bool {
		lk, err := l.Lock(ctxT(t), "never", time.Minute, Options{})
		if err != nil {
			return false
		}
		mustUnlock(t, l, "never", lk.Token)
		return true
	})
	if st := l.Status()[0]; st.State != NodeDown {
		t.Fatalf("node 0, cut off since the Locker started, has status %+v, want down", st)
	}
	c.servers[0].Reconnect()
	eventually(t, "node 0 up again", func() bool { return l.Status()[0].State == NodeUp })
	waitUsable(t, l, 0)
	lk := mustLock(t, l, "back", time.Minute, Options{})
	if c.pttl(t, 0, "back") <= 0 {
		t.Errorf("node 0 reported up, and the next Lock did not reach it")
	}
	mustUnlock(t, l, "back", lk.Token)
}

// waitUsable waits until l's calls send their requests to node i: the node
// is up, its batcher reached it, and its clock was read (a request carries
// a deadline on it). Status says up as soon as any check got an answer,
// the watcher's included, while the batcher's keeper reaches the node
// within its backoff (conn.go).
func waitUsable(tb testing.TB, l *Locker, i int) {
	tb.Helper()
	n := l.nodes[i]
	eventually(tb, fmt.Sprintf("node %d used by calls", i), func() bool {
		return l.Status()[i].State == NodeUp && n.reachable.Load() && !n.refused.Load() && n.clock.Load() != nil
	})
}
