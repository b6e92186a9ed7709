package quorum

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"
)

// TestPlacementBacksOffBehindIntent: a reader granted without a node where
// a waiting writer's intent refuses it is tried there again with a growing
// delay, not every RetryMin for as long as the intent lives, and is still
// placed soon after the intent ends. The writer's Locker reaches only that
// node and stops waiting after its attempt recorded the intent there, so
// the intent lives out the writer's ttl with nothing held on the node: no
// release notification comes, and the node gives no time to wait for.
func TestPlacementBacksOffBehindIntent(t *testing.T) {
	c := startCluster(t, 3)
	cfg := quiet(testConfig()) // no keeper or watcher calls meanwhile
	l := newLocker(t, c, cfg)
	warm(t, c, l)
	wl := newLockerOpts(t, c.opts[2:], noFallback(quiet(testConfig())))
	eventually(t, "the writer's Locker warm", func() bool {
		lk, err := wl.Lock(ctxT(t), "warm-up", time.Second, Options{})
		return err == nil && wl.Unlock(ctxT(t), "warm-up", lk.Token) == nil
	})
	ctx := context.Background()
	const key = "lockproxy:lock:doc"

	// A reader holds on every node; the writer waits for it on node 2 and
	// records its intent there (for intentTTL), then stops waiting.
	const intentTTL = 3 * time.Second
	b := mustRLock(t, l, "doc", 30*time.Second, Options{})
	wctx, stop := context.WithCancel(ctx)
	w := lockAsync(t, wctx, wl, "doc", intentTTL, Options{Wait: 30 * time.Second})
	eventually(t, "the writer's intent on node 2", func() bool {
		return c.admin[2].HExists(ctx, key, "i").Val()
	})
	stop()
	if r := recv(t, w); !errors.Is(r.err, context.Canceled) {
		t.Fatalf("the writer: %+v, %v", r.lk, r.err)
	}
	mustUnlock(t, l, "doc", b.Token)

	// A new reader: nodes 0 and 1 grant it, node 2 refuses it while the
	// intent lives.
	rd := mustRLock(t, l, "doc", 30*time.Second, Options{})
	placed := func() bool { return c.admin[2].HExists(ctx, key, "@"+rd.Token).Val() }
	if placed() {
		t.Fatal("node 2 took the reader behind the writer's intent")
	}
	intentEnd := func() time.Time {
		v, err := c.admin[2].HGet(ctx, key, "i").Result()
		if err != nil {
			t.Fatalf("the intent on node 2: %v", err)
		}
		exp, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("the intent on node 2: %q", v)
		}
		now, err := c.admin[2].Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		return time.Now().Add(time.Duration(exp-now.UnixMilli()) * time.Millisecond)
	}

	const window = time.Second
	before := c.scriptCalls(t, 2)
	time.Sleep(window) // a count over a fixed time: what it measures
	calls := c.scriptCalls(t, 2) - before
	end := intentEnd() // it still lives: the count was all behind it
	// Doubling from RetryMin to maxPlaceBackoff with the delay at least
	// half the backoff: the doublings, then one call every half cap.
	most := 2
	for d := cfg.RetryMin; d < maxPlaceBackoff; d *= 2 {
		most++
	}
	most += int(window / (maxPlaceBackoff / 2))
	t.Logf("node 2 ran %d scripts in %v behind the intent (at most %d allowed; every RetryMin would be about %d)",
		calls, window, most, int(window/(cfg.RetryMin+time.Millisecond)))
	if calls > most {
		t.Errorf("node 2 ran %d scripts in %v behind the writer's intent, want at most %d", calls, window, most)
	}
	if placed() {
		t.Fatal("node 2 took the reader behind the writer's intent")
	}

	eventually(t, "the reader placed on node 2", placed)
	took := time.Since(end)
	t.Logf("the reader was placed on node 2 %v after the intent ended", took)
	if limit := maxPlaceBackoff + cfg.NodeTimeout + 100*time.Millisecond; took > limit {
		t.Errorf("the reader was placed on node 2 %v after the intent ended, want within %v", took, limit)
	}
	mustUnlock(t, l, "doc", rd.Token)
}

// BenchmarkUnlockPlacedReaders: readers of one resource granted while a
// node is down, each with its placement onto that node pending; one op is
// one reader's Unlock, which drops the reader's placement (readers=N: N
// granted before the timed Unlocks, which release them in the order
// granted). The nodes' share of an Unlock grows with the readers in the
// resource's record (each hash operation reads the record whole, hload in
// hashLua); BenchmarkCancelPlacement measures the Locker's own step.
func BenchmarkUnlockPlacedReaders(b *testing.B) {
	for _, n := range []int{100, 2000} {
		b.Run(fmt.Sprintf("readers=%d", n), func(b *testing.B) {
			c := startCluster(b, 3)
			l := newLocker(b, c, quiet(testConfig()))
			warm(b, c, l)
			c.kill(2)
			ctx := context.Background()
			grant := func() []Lock {
				lks := make([]Lock, n)
				for i := range lks {
					lk, err := l.RLock(ctx, "doc", time.Minute, Options{})
					if err != nil {
						b.Fatalf("RLock: %v", err)
					}
					lks[i] = lk
				}
				eventually(b, "the placements kept for node 2", func() bool {
					l.mu.Lock()
					defer l.mu.Unlock()
					return placementsOf(l, "doc") == n
				})
				return lks
			}
			b.ReportAllocs()
			b.ResetTimer()
			for done := 0; done < b.N; {
				b.StopTimer()
				lks := grant()
				b.StartTimer()
				i := 0
				for ; i < len(lks) && done < b.N; i, done = i+1, done+1 {
					if err := l.Unlock(ctx, "doc", lks[i].Token); err != nil {
						b.Fatalf("Unlock: %v", err)
					}
				}
				b.StopTimer()
				for _, lk := range lks[i:] {
					mustUnlock(b, l, "doc", lk.Token)
				}
				b.StartTimer()
			}
		})
	}
}

// BenchmarkCancelPlacement: the step of Unlock that drops the token's
// placements, alone, with the placements of readers=N readers of one
// resource pending (as BenchmarkUnlockPlacedReaders has them); one op
// cancels one reader's, in the order registered.
func BenchmarkCancelPlacement(b *testing.B) {
	for _, n := range []int{100, 2000} {
		b.Run(fmt.Sprintf("readers=%d", n), func(b *testing.B) {
			c := startCluster(b, 3)
			l := newLocker(b, c, quiet(testConfig()))
			end := time.Now().Add(time.Hour)
			form := &holdingForm{shared: true}
			ps := make([]*placement, n)
			b.ReportAllocs()
			b.ResetTimer()
			for done := 0; done < b.N; {
				b.StopTimer()
				l.mu.Lock()
				for i := range ps {
					ps[i] = &placement{resource: "doc", token: "reader-" + strconv.Itoa(i), attempt: "a", form: form, end: end, nodes: l.nodes[2:]}
					ps[i].timer = time.AfterFunc(time.Hour, func() {})
					l.register(ps[i])
				}
				l.mu.Unlock()
				b.StartTimer()
				i := 0
				for ; i < n && done < b.N; i, done = i+1, done+1 {
					l.cancelPlacement("doc", ps[i].token)
				}
				b.StopTimer()
				for _, p := range ps[i:] {
					l.cancelPlacement("doc", p.token)
				}
				b.StartTimer()
			}
		})
	}
}

// placementsOf counts the pending placements of resource. l.mu is held.
func placementsOf(l *Locker, resource string) int {
	n := 0
	for _, ps := range l.placing[resource] {
		n += len(ps)
	}
	return n
}
