package quorum

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// stat returns a field of INFO stats on node i.
func (c *cluster) stat(tb testing.TB, i int, field string) int {
	tb.Helper()
	info, err := c.admin[i].Info(context.Background(), "stats").Result()
	if err != nil {
		tb.Fatalf("INFO on node %d: %v", i, err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				tb.Fatalf("INFO %s on node %d: %q", field, i, v)
			}
			return n
		}
	}
	tb.Fatalf("no %s in INFO on node %d", field, i)
	return 0
}

// hammer runs Lock+Unlock of its own resource rounds times in each of
// clients goroutines and reports every error.
func hammer(t *testing.T, l *Locker, clients, rounds int) {
	t.Helper()
	ctx := ctxT(t)
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for c := range clients {
		wg.Go(func() {
			r := fmt.Sprintf("r%d", c)
			for range rounds {
				lk, err := l.Lock(ctx, r, 10*time.Second, Options{})
				if err == nil {
					err = l.Unlock(ctx, r, lk.Token)
				}
				if err != nil {
					errs <- fmt.Errorf("%s: %w", r, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestConcurrentCallsShareRoundTrips checks that concurrent callers share
// both the nodes' reads and their script calls: every acquisition runs one
// INCR and every release one DEL, so those count the operations.
func TestConcurrentCallsShareRoundTrips(t *testing.T) {
	c := startCluster(t, 3)
	l := newLocker(t, c, testConfig())
	mustUnlock(t, l, "warmup", mustLock(t, l, "warmup", time.Second, Options{}).Token)
	reads, scripts, ops := make([]int, 3), make([]int, 3), make([]int, 3)
	for i := range 3 {
		reads[i], scripts[i] = c.stat(t, i, "total_reads_processed"), c.scriptCalls(t, i)
		ops[i] = c.calls(t, i, "incr") + c.calls(t, i, "del")
	}

	const clients, rounds = 50, 10
	hammer(t, l, clients, rounds)

	for i := range 3 {
		// Four of the reads are this test's INFO calls.
		r := c.stat(t, i, "total_reads_processed") - reads[i] - 4
		s := c.scriptCalls(t, i) - scripts[i]
		o := c.calls(t, i, "incr") + c.calls(t, i, "del") - ops[i]
		if o < 2*clients*rounds {
			t.Errorf("node %d ran %d operations, want at least %d", i, o, 2*clients*rounds)
		}
		if s >= o {
			t.Errorf("node %d ran %d script calls for %d operations: no batching", i, s, o)
		}
		if r >= o {
			t.Errorf("node %d read %d times for %d operations: no batching", i, r, o)
		}
		t.Logf("node %d: %d operations in %d script calls, %d reads", i, o, s, r)
	}
}

func TestScriptCacheLostUnderLoad(t *testing.T) {
	c := startCluster(t, 3)
	l := newLocker(t, c, testConfig())
	ctx := ctxT(t)
	mustUnlock(t, l, "warmup", mustLock(t, l, "warmup", time.Second, Options{}).Token)
	for _, a := range c.admin {
		if err := a.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// Concurrent callers meet NOSCRIPT in the same batches.
	hammer(t, l, 20, 5)
	for i, a := range c.admin {
		ok, err := a.ScriptExists(ctx, opsScript.sha.(string)).Result()
		if err != nil || !ok[0] {
			t.Errorf("node %d: script cached %v, %v; want it", i, ok, err)
		}
	}
}

// TestShortDeadlineDoesNotWait gives a call a context deadline far shorter
// than NodeTimeout while another call's request is in flight to, or queued
// at, a node that does not answer. The short call returns at its deadline
// with the answers of the other nodes, and neither call's outcome counts
// against the node: the short call's context ended, and the long call was
// not cut short by the short one's deadline.
func TestShortDeadlineDoesNotWait(t *testing.T) {
	c := startCluster(t, 3)
	cfg := testConfig()
	cfg.NodeTimeout = 3 * time.Second
	l := newLocker(t, c, cfg)
	reg := registry(t, l)
	holder := mustLock(t, l, "orders", 10*time.Second, Options{})

	c.servers[2].Pause()
	resumed := false
	defer func() {
		if !resumed {
			c.servers[2].Resume()
		}
	}()
	long := lockAsync(t, ctxT(t), l, "other", 10*time.Second, Options{})

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	v, err := l.Extend(ctx, "orders", holder.Token, 10*time.Second)
	if err != nil || v <= 0 {
		t.Errorf("Extend with node 2 paused = %v, %v; want success on nodes 0 and 1", v, err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("Extend took %v with a 200ms deadline", d)
	}

	c.servers[2].Resume()
	resumed = true
	if r := recv(t, long); r.err != nil {
		t.Fatalf("Lock with node 2 paused for a while: %v", r.err)
	}
	if got := nodeStats(t, reg, c, 2); got != (nodeMetrics{up: 1}) {
		t.Errorf("node 2 metrics %+v, want up and no failures", got)
	}
}
