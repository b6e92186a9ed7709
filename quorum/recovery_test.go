package quorum

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// losses returns how many times l saw node i without its marker.
func losses(l *Locker, i int) uint64 {
	n := l.nodes[i]
	n.health.mu.Lock()
	defer n.health.mu.Unlock()
	return n.health.losses
}

// holder returns the token that holds resource on node i, "" when the lock
// is free there.
func (c *cluster) holder(tb testing.TB, i int, resource string) string {
	tb.Helper()
	v, err := c.admin[i].Get(context.Background(), "lockproxy:lock:"+resource).Result()
	if errors.Is(err, redis.Nil) {
		return ""
	}
	if err != nil {
		tb.Fatalf("GET on node %d: %v", i, err)
	}
	_, token, _ := strings.Cut(v, ":")
	return token
}

// refused checks that resource cannot be locked through any of lockers:
// each answers not acquired or NOQUORUM, never a lock.
func refused(tb testing.TB, what, resource string, lockers ...*Locker) {
	tb.Helper()
	for i, l := range lockers {
		lk, err := l.Lock(ctxT(tb), resource, 8*time.Second, Options{})
		var nq *NoQuorumError
		if err == nil {
			tb.Fatalf("%s: Locker %d granted %s again (fence %d)", what, i, resource, lk.Fence)
		}
		if !errors.Is(err, ErrNotAcquired) && !errors.As(err, &nq) {
			tb.Fatalf("%s: Locker %d: %v", what, i, err)
		}
	}
}

// TestDataLossScenario is the delayed-restart case: a lock placed on a
// bare majority while the third node was cut off must not be granted
// again when one node of that majority restarts empty, through any proxy,
// including one started after the crash.
func TestDataLossScenario(t *testing.T) {
	c := startCluster(t, 3)
	a := newLocker(t, c, testConfig())
	b := newLocker(t, c, testConfig())
	warm(t, c, a)

	// A locks R while node 2 is cut off: R is on nodes 0 and 1.
	c.servers[2].CutOff()
	lk := mustLock(t, a, "R", 15*time.Second, Options{})
	validUntil := time.Now().Add(lk.Validity)
	if h := c.holder(t, 1, "R"); h != lk.Token {
		t.Fatalf("node 1 holds R for %q, want A", h)
	}
	c.servers[2].Reconnect()

	// Node 1 crashes and comes back empty: nodes 1 and 2, a majority, do
	// not know of R.
	c.restart(1)
	waitClientUp(t, a, 1)
	late := newLocker(t, c, testConfig())

	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		refused(t, "after node 1 lost its data", "R", a, b, late)
	}
	for _, l := range []*Locker{a, b, late} {
		waitRecovered(t, l, 1)
	}
	if h := c.holder(t, 1, "R"); h != lk.Token {
		t.Errorf("node 1 holds R for %q after its recovery, want A's lock copied back", h)
	}
	refused(t, "after node 1 recovered", "R", a, b, late)

	// Node 0 pauses: node 1 counts again, so fresh resources are granted,
	// and R is still A's.
	c.servers[0].Pause()
	for _, l := range []*Locker{a, b, late} {
		mustUnlock(t, l, "fresh", mustLock(t, l, "fresh", time.Second, Options{}).Token)
	}
	refused(t, "with node 0 paused", "R", a, b, late)
	if time.Now().After(validUntil) {
		t.Fatalf("the checks ran past A's validity; they prove nothing")
	}
	c.servers[0].Resume()

	nextFenceLarger(t, a, late, "R", lk)
}

// nextFenceLarger releases lk, held through holder, and checks that the
// next holder of resource, through next, gets a larger fence.
func nextFenceLarger(t *testing.T, holder, next *Locker, resource string, lk Lock) {
	t.Helper()
	mustUnlock(t, holder, resource, lk.Token)
	if n := mustLock(t, next, resource, 8*time.Second, Options{}); n.Fence <= lk.Fence {
		t.Errorf("next holder's fence %d, want > %d", n.Fence, lk.Fence)
	}
}

// TestDataLossDetection checks which events count as a loss of a node's
// data, and that every Locker, also one started afterwards, reaches the
// same verdict from the nodes.
func TestDataLossDetection(t *testing.T) {
	aof := []string{"--appendonly", "yes", "--appendfsync", "always"}
	tests := []struct {
		name     string
		args     []string // the nodes' configuration
		fault    func(c *cluster)
		wantLoss bool
	}{
		{"restart without persistence", nil, func(c *cluster) { c.restart(1) }, true},
		{"flushall", nil, func(c *cluster) { c.admin[1].FlushAll(context.Background()) }, true},
		{"restart with AOF", aof, func(c *cluster) { c.restart(1) }, false},
		{"AOF lost", aof, func(c *cluster) { c.servers[1].RestartEmpty(); c.killed[1] = false }, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := startClusterArgs(t, 3, tt.args...)
			l := newLocker(t, c, testConfig())
			warm(t, c, l)
			lk := mustLock(t, l, "R", 20*time.Second, Options{})
			for i := range 3 {
				if h := c.holder(t, i, "R"); h != lk.Token {
					t.Fatalf("node %d holds %q, want the lock", i, h)
				}
			}
			l.Close()

			tt.fault(c)
			later := newLocker(t, c, testConfig())
			waitClientUp(t, later, 1)
			if _, err := later.Lock(ctxT(t), "R", time.Second, Options{}); !errors.Is(err, ErrNotAcquired) {
				t.Fatalf("Lock of the held R: %v, want not acquired", err)
			}
			waitRecovered(t, later, 1)
			if got := losses(later, 1) > 0; got != tt.wantLoss {
				t.Errorf("loss of node 1 seen: %v, want %v", got, tt.wantLoss)
			}
			// Either way node 1 has the lock: kept, or copied back.
			if h := c.holder(t, 1, "R"); h != lk.Token {
				t.Errorf("node 1 holds %q, want the lock", h)
			}
			c.servers[0].Pause()
			defer c.servers[0].Resume()
			if _, err := later.Lock(ctxT(t), "R", time.Second, Options{}); !errors.Is(err, ErrNotAcquired) {
				t.Errorf("Lock of the held R with node 0 paused: %v, want not acquired", err)
			}
			if _, err := later.Extend(ctxT(t), "R", lk.Token, 20*time.Second); err != nil {
				t.Errorf("Extend by the holder with node 0 paused: %v", err)
			}
		})
	}
}

// TestFreshDeploymentUsableAtOnce: nodes that no Locker ever used grant
// the first lock, and come out of it with their markers.
func TestFreshDeploymentUsableAtOnce(t *testing.T) {
	c := startCluster(t, 3)
	l := newLocker(t, c, quiet(testConfig()))
	mustUnlock(t, l, "R", mustLock(t, l, "R", time.Second, Options{}).Token)
	for i, a := range c.admin {
		if a.Exists(context.Background(), "lockproxy:intact").Val() != 1 {
			t.Errorf("node %d has no marker after the first lock", i)
		}
		if n := losses(l, i); n != 0 {
			t.Errorf("node %d counted as lost %d times", i, n)
		}
	}
}

// TestRecoveryWithinASecond measures how long a node that lost its data
// takes to count again when the other nodes are reachable, with the
// default timeouts.
func TestRecoveryWithinASecond(t *testing.T) {
	c := startCluster(t, 3)
	cfg := DefaultConfig()
	cfg.ClockTolerance = testConfig().ClockTolerance // replies under -race
	l := newLocker(t, c, cfg)
	warm(t, c, l)
	for i := range 50 {
		mustLock(t, l, fmt.Sprintf("held-%d", i), 30*time.Second, Options{})
	}
	c.restart(1)
	back := time.Now()
	waitRecovered(t, l, 1)
	took := time.Since(back)
	t.Logf("node 1 counted again %v after it came back empty", took)
	if took > time.Second {
		t.Errorf("node 1 counted again after %v, want within 1s", took)
	}
	if keys := c.lockKeys(t, 1); len(keys) != 50 {
		t.Errorf("node 1 has %d locks after its recovery, want the 50 held", len(keys))
	}
	// Node 0 pauses: the recovered node 1 makes the majority.
	c.servers[0].Pause()
	defer c.servers[0].Resume()
	mustUnlock(t, l, "fresh", mustLock(t, l, "fresh", time.Second, Options{}).Token)
}

// TestRecoveryByDeadline: with too few intact nodes to copy from, a node
// that lost its data counts again once every lock it may have held has
// expired, MaxTTL after the loss, and not before.
func TestRecoveryByDeadline(t *testing.T) {
	c := startCluster(t, 3)
	cfg := testConfig()
	cfg.MaxTTL = 2 * time.Second
	l := newLocker(t, c, cfg)
	warm(t, c, l)
	lk := mustLock(t, l, "R", 2*time.Second, Options{})
	validUntil := time.Now().Add(lk.Validity)

	c.servers[2].CutOff()
	defer c.servers[2].Reconnect()
	c.restart(1)
	lost := time.Now()
	waitClientUp(t, l, 1)

	// Only node 0 counts: nothing can be granted, R least of all.
	for time.Now().Before(validUntil) {
		_, err := l.Lock(ctxT(t), "other", time.Second, Options{})
		var nq *NoQuorumError
		if !errors.As(err, &nq) || nq.Recovering != 1 {
			t.Fatalf("Lock with node 1 recovering and node 2 cut off: %v, want NOQUORUM with 1 recovering", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if st := l.Status()[1]; st.State != NodeRecovering || st.Until.Before(lost.Add(cfg.MaxTTL)) {
		t.Errorf("node 1 status %+v, want recovering until MaxTTL after the loss", st)
	}
	waitRecovered(t, l, 1)
	took := time.Since(lost)
	t.Logf("node 1 counted again %v after the loss", took)
	if took < cfg.MaxTTL {
		t.Errorf("node 1 counted again %v after the loss, before MaxTTL", took)
	}
	mustUnlock(t, l, "R", mustLock(t, l, "R", time.Second, Options{}).Token)
}

// TestNodeBackUsedAtOnce: a node that was down is reached again by its
// keeper within its longest backoff (maxKeepBackoff) and a reconnection
// after it came back, however many dials failed meanwhile (go-redis,
// counting failed dials, would try it only once a second), and used by
// the next call after that. The calls do not dial a node known to be down
// (node.skips), so the keeper's reconnection is what brings it back.
func TestNodeBackUsedAtOnce(t *testing.T) {
	c := startClusterArgs(t, 3, "--appendonly", "yes", "--appendfsync", "always")
	l := newLocker(t, c, testConfig())
	warm(t, c, l)
	c.kill(0)
	for range 50 { // many more failed dials than any pool's size
		mustUnlock(t, l, "r", mustLock(t, l, "r", time.Second, Options{}).Token)
	}
	c.restart(0) // with its data
	back := time.Now()
	eventually(t, "node 0 reached by its keeper", func() bool { return l.nodes[0].reachable.Load() })
	const bound = 500 * time.Millisecond // maxKeepBackoff and a reconnection, with room for a loaded machine
	if took := time.Since(back); took > bound {
		t.Errorf("node 0 reached %v after it came back, want within %v", took.Round(time.Millisecond), bound)
	} else {
		t.Logf("node 0 reached %v after it came back", took.Round(time.Millisecond))
	}
	c.servers[1].Pause()
	defer c.servers[1].Resume()
	if _, err := l.Lock(ctxT(t), "r", time.Second, Options{}); err != nil {
		t.Fatalf("first Lock after node 0 came back, node 1 paused: %v", err)
	}
}

// TestExtendedLockSurvivesAnyNodeLoss: a lock that is extended survives
// the loss of any one node of three, and, once that node recovered, of
// another.
func TestExtendedLockSurvivesAnyNodeLoss(t *testing.T) {
	for lost := range 3 {
		t.Run(fmt.Sprint(lost), func(t *testing.T) {
			c := startCluster(t, 3)
			l := newLocker(t, c, testConfig())
			ctx := ctxT(t)
			warm(t, c, l)
			lk := mustLock(t, l, "R", 5*time.Second, Options{})

			c.kill(lost)
			if _, err := l.Extend(ctx, "R", lk.Token, 5*time.Second); err != nil {
				t.Fatalf("Extend with node %d down: %v", lost, err)
			}
			c.restart(lost)
			waitClientUp(t, l, lost)
			if _, err := l.Extend(ctx, "R", lk.Token, 5*time.Second); err != nil {
				t.Fatalf("Extend with node %d back empty: %v", lost, err)
			}
			waitRecovered(t, l, lost)
			if h := c.holder(t, lost, "R"); h != lk.Token {
				t.Fatalf("node %d holds %q after its recovery, want the lock", lost, h)
			}
			other := (lost + 1) % 3
			c.kill(other)
			if _, err := l.Extend(ctx, "R", lk.Token, 5*time.Second); err != nil {
				t.Fatalf("Extend with node %d recovered and node %d down: %v", lost, other, err)
			}
			if _, err := l.Lock(ctx, "R", time.Second, Options{}); !errors.Is(err, ErrNotAcquired) {
				t.Errorf("Lock of the held R: %v, want not acquired", err)
			}
		})
	}
}

// TestExtendHeals: an Extend puts the lock back on a node that lacks it,
// with the holder's fence, so that the next failed node costs nothing.
func TestExtendHeals(t *testing.T) {
	c := startCluster(t, 3)
	l := newLocker(t, c, testConfig())
	ctx := ctxT(t)
	warm(t, c, l)
	c.servers[2].CutOff()
	lk := mustLock(t, l, "R", 10*time.Second, Options{}) // on nodes 0 and 1
	c.servers[2].Reconnect()
	if h := c.holder(t, 2, "R"); h != "" {
		t.Fatalf("node 2 holds %q while cut off", h)
	}
	eventually(t, "node 2 answering", func() bool {
		_, err := l.Extend(ctx, "R", lk.Token, 10*time.Second)
		return err == nil && c.holder(t, 2, "R") == lk.Token
	})
	v, _ := c.admin[2].Get(ctx, "lockproxy:lock:R").Result()
	if tok, f, ok := splitLock(v); !ok || tok != lk.Token || f != lk.Fence || v[0] != '0' {
		t.Errorf("healed lock %q, want fence %d and token %s", v, lk.Fence, lk.Token)
	}
	if d := c.pttl(t, 2, "R"); d < 5*time.Second {
		t.Errorf("healed lock's ttl %v, want about 10s", d)
	}
	// One of the first two nodes fails: the lock keeps its majority.
	c.kill(0)
	if _, err := l.Extend(ctx, "R", lk.Token, 10*time.Second); err != nil {
		t.Errorf("Extend with node 0 down after healing: %v", err)
	}

	// A node where another token holds the resource is left alone.
	c.restart(0)
	waitRecovered(t, l, 0)
	c.admin[0].Set(ctx, "lockproxy:lock:S", "09:someone", 10*time.Second)
	lk2 := mustLock(t, l, "S", 10*time.Second, Options{})
	if _, err := l.Extend(ctx, "S", lk2.Token, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if h := c.holder(t, 0, "S"); h != "someone" {
		t.Errorf("node 0 holds S for %q, want the other token left alone", h)
	}
}

// TestPlacementAfterRelease: a lock won while one node still showed the
// previous holder is placed on that node once it is free, at its release
// notification or when the previous holder's ttl runs out there.
func TestPlacementAfterRelease(t *testing.T) {
	c := startCluster(t, 3)
	l := newLocker(t, c, testConfig())
	ctx := ctxT(t)
	warm(t, c, l)

	t.Run("notification", func(t *testing.T) {
		c.admin[2].Set(ctx, "lockproxy:lock:R", "05:previous", time.Minute)
		lk := mustLock(t, l, "R", 10*time.Second, Options{})
		if h := c.holder(t, 2, "R"); h != "previous" {
			t.Fatalf("node 2 holds R for %q, want the previous holder", h)
		}
		// The previous holder's release on node 2, as opsScript does it.
		c.admin[2].Del(ctx, "lockproxy:lock:R")
		c.admin[2].Publish(ctx, "lockproxy:released", "R")
		eventually(t, "lock placed on node 2", func() bool { return c.holder(t, 2, "R") == lk.Token })
		v, _ := c.admin[2].Get(ctx, "lockproxy:lock:R").Result()
		if tok, f, ok := splitLock(v); !ok || tok != lk.Token || f != lk.Fence || v[0] != '0' {
			t.Errorf("placed lock %q, want fence %d and token %s", v, lk.Fence, lk.Token)
		}
		mustUnlock(t, l, "R", lk.Token)
	})
	t.Run("expiry", func(t *testing.T) {
		c.admin[2].Set(ctx, "lockproxy:lock:S", "05:previous", 300*time.Millisecond)
		lk := mustLock(t, l, "S", 10*time.Second, Options{})
		eventually(t, "lock placed on node 2", func() bool { return c.holder(t, 2, "S") == lk.Token })
		mustUnlock(t, l, "S", lk.Token)
		if h := c.holder(t, 2, "S"); h != "" {
			t.Errorf("node 2 holds S for %q after Unlock", h)
		}
	})
	t.Run("unlocked first", func(t *testing.T) {
		c.admin[2].Set(ctx, "lockproxy:lock:T", "05:previous", 300*time.Millisecond)
		lk := mustLock(t, l, "T", 10*time.Second, Options{})
		l.mu.Lock()
		pending := len(l.placing["T"])
		l.mu.Unlock()
		if pending != 1 {
			t.Fatalf("%d placements of T pending, want 1", pending)
		}
		mustUnlock(t, l, "T", lk.Token)
		l.mu.Lock()
		pending = len(l.placing["T"])
		l.mu.Unlock()
		if pending != 0 {
			t.Errorf("%d placements of T pending after Unlock, want none", pending)
		}
	})
}
