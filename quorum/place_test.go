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

// TestPlaceDelay: the delay after a node refused a reader's or a permit's
// placement backs off from RetryMin to maxPlaceBackoff (at most a quarter
// of the holding's ttl left), drawn from the bound's upper half, and is
// never shorter than the node's own wait; an exclusive lock's is the
// node's wait.
func TestPlaceDelay(t *testing.T) {
	l := &Locker{cfg: DefaultConfig()} // RetryMin 5ms
	ms := time.Millisecond
	shared := &holdingForm{shared: true}
	tests := []struct {
		name   string
		form   *holdingForm
		left   time.Duration // the holding's ttl left
		wait   time.Duration // what the node said, each time
		bounds []time.Duration
		want   time.Duration // the delay, when it is not drawn
	}{
		{name: "doubles to the cap", form: shared, left: time.Hour, wait: ms,
			bounds: []time.Duration{5 * ms, 10 * ms, 20 * ms, 40 * ms, 80 * ms, 160 * ms, maxPlaceBackoff, maxPlaceBackoff}},
		{name: "a quarter of the ttl left", form: shared, left: 200 * ms, wait: ms,
			bounds: []time.Duration{5 * ms, 10 * ms, 20 * ms, 40 * ms, 50 * ms, 50 * ms}},
		{name: "the node's longer wait", form: &holdingForm{permit: true, k: 2}, left: time.Hour, wait: 2 * time.Second,
			bounds: []time.Duration{5 * ms, 10 * ms}, want: 2 * time.Second},
		{name: "exclusive: the holder's ttl there", left: time.Hour, wait: 3 * ms,
			bounds: []time.Duration{0, 0}, want: 3 * ms},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := &placement{form: tt.form, end: time.Now().Add(tt.left)}
			for i, bound := range tt.bounds {
				d := l.placeDelay(p, tt.wait)
				// A bound from the ttl left is as of the call: up to a
				// millisecond below bound.
				if p.backoff > bound || p.backoff < bound-ms {
					t.Errorf("refusal %d: bound %v, want %v", i+1, p.backoff, bound)
				}
				lo, hi := max(p.backoff/2, l.cfg.RetryMin), p.backoff
				if tt.want > 0 {
					lo, hi = tt.want, tt.want
				}
				if d < lo || d > hi {
					t.Errorf("refusal %d: delay %v, want within [%v, %v]", i+1, d, lo, hi)
				}
			}
		})
	}
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
			grant := func() []string {
				tokens := make([]string, n)
				for i := range tokens {
					lk, err := l.RLock(ctx, "doc", time.Minute, Options{})
					if err != nil {
						b.Fatalf("RLock: %v", err)
					}
					tokens[i] = lk.Token
				}
				eventually(b, "the placements kept for node 2", func() bool {
					l.mu.Lock()
					defer l.mu.Unlock()
					return placementsOf(l, "doc") == n
				})
				return tokens
			}
			benchEnds(b, grant, func(token string) {
				if err := l.Unlock(ctx, "doc", token); err != nil {
					b.Fatalf("Unlock: %v", err)
				}
			})
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
			register := func() []string {
				l.mu.Lock()
				defer l.mu.Unlock()
				tokens := make([]string, n)
				for i := range tokens {
					tokens[i] = "reader-" + strconv.Itoa(i)
					p := &placement{resource: "doc", token: tokens[i], attempt: "a", form: form, end: end, nodes: l.nodes[2:]}
					p.timer = time.AfterFunc(time.Hour, func() {})
					l.register(p)
				}
				return tokens
			}
			benchEnds(b, register, func(token string) { l.cancelPlacement("doc", token) })
		})
	}
}

// benchEnds times b.N calls of end, each ending one holding that start
// made (untimed, a batch at a time, returning their tokens), in the order
// made; the holdings of the last batch that b.N leaves are ended untimed.
func benchEnds(b *testing.B, start func() []string, end func(token string)) {
	b.ReportAllocs()
	b.ResetTimer()
	for done := 0; done < b.N; {
		b.StopTimer()
		tokens := start()
		b.StartTimer()
		i := 0
		for ; i < len(tokens) && done < b.N; i, done = i+1, done+1 {
			end(tokens[i])
		}
		b.StopTimer()
		for _, token := range tokens[i:] {
			end(token)
		}
		b.StartTimer()
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
