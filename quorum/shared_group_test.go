package quorum

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"
)

// rlockAsync is lockAsync for RLock.
func rlockAsync(tb testing.TB, ctx context.Context, l *Locker, resource string, ttl time.Duration, opt Options) <-chan lockResult {
	opt.shared = true // what RLock sets
	return lockAsync(tb, ctx, l, resource, ttl, opt)
}

// pending reports whether ch has no result yet.
func pending(ch <-chan lockResult) bool { return len(ch) == 0 }

// TestReadersAdmittedTogether: readers waiting together on one Locker for
// a writer are granted together once it releases: every node runs the
// release and one more call (two when fences need raising), not one call
// per reader.
func TestReadersAdmittedTogether(t *testing.T) {
	c := startCluster(t, 3)
	// Waiters wake by the release only; the watcher stays quiet.
	l := newLocker(t, c, quiet(noFallback(testConfig())))
	warm(t, c, l)
	w := mustLock(t, l, "doc", 10*time.Second, Options{})
	const n = 8
	var chs []<-chan lockResult
	for i := range n {
		chs = append(chs, rlockAsync(t, ctxT(t), l, "doc", 5*time.Second, Options{Wait: 10 * time.Second}))
		waitQueued(t, l, "doc", i+1)
	}
	eventually(t, "the head between attempts", func() bool { return headIdle(l, "doc") })
	before := make([]int, len(c.servers))
	for i := range c.servers {
		before[i] = c.scriptCalls(t, i)
	}
	released := time.Now()
	mustUnlock(t, l, "doc", w.Token)
	unlocked := time.Since(released) // one round, as a measure
	var last time.Time
	tokens, fences := map[string]bool{}, map[int64]bool{}
	for i, ch := range chs {
		r := recv(t, ch)
		if r.at.After(last) {
			last = r.at
		}
		if r.err != nil {
			t.Fatalf("reader %d: %v", i, r.err)
		}
		if r.lk.Fence <= w.Fence || tokens[r.lk.Token] || fences[r.lk.Fence] {
			t.Fatalf("reader %d: %+v after the writer's fence %d; tokens and fences seen %v %v", i, r.lk, w.Fence, tokens, fences)
		}
		tokens[r.lk.Token], fences[r.lk.Fence] = true, true
	}
	t.Logf("the writer's Unlock took %v; the last of %d readers was granted %v after it began", unlocked, n, last.Sub(released))
	for i := range c.servers {
		calls := c.scriptCalls(t, i) - before[i]
		t.Logf("node %d: %d calls from the writer's release to the last of %d readers' grants", i, calls, n)
		// The release, the readers' round and at most one raise of
		// their fences; one by one it would be 1 + n.
		if calls > 3 {
			t.Errorf("node %d ran %d calls for the release and %d readers admitted together, want at most 3", i, calls, n)
		}
	}
	if got := l.ridersGranted.Load(); got != n-1 {
		t.Errorf("%d readers granted in the round of a reader ahead of them, want %d", got, n-1)
	}
	// They hold together, each with its own holding on every node.
	for i, a := range c.admin {
		fields, err := a.HGetAll(ctxT(t), "lockproxy:lock:doc").Result()
		if err != nil {
			t.Fatalf("HGETALL on node %d: %v", i, err)
		}
		for tok := range tokens {
			if _, ok := fields["@"+tok]; !ok {
				t.Errorf("node %d lacks reader %s: %v", i, tok, fields)
			}
		}
	}
}

// TestReadersTogetherKeepArrivalOrder: a reader at the head takes along the
// readers right behind it, never those queued behind a waiting writer.
func TestReadersTogetherKeepArrivalOrder(t *testing.T) {
	c := startCluster(t, 3)
	l := newLocker(t, c, testConfig())
	warm(t, c, l)
	w0 := mustLock(t, l, "doc", 10*time.Second, Options{})
	opt := Options{Wait: 10 * time.Second}
	r1 := rlockAsync(t, ctxT(t), l, "doc", 5*time.Second, opt)
	waitQueued(t, l, "doc", 1)
	r2 := rlockAsync(t, ctxT(t), l, "doc", 5*time.Second, opt)
	waitQueued(t, l, "doc", 2)
	w2 := lockAsync(t, ctxT(t), l, "doc", 5*time.Second, opt)
	waitQueued(t, l, "doc", 3)
	r3 := rlockAsync(t, ctxT(t), l, "doc", 5*time.Second, opt)
	waitQueued(t, l, "doc", 4)

	mustUnlock(t, l, "doc", w0.Token)
	g1, g2 := recv(t, r1), recv(t, r2)
	if g1.err != nil || g2.err != nil {
		t.Fatalf("readers ahead of the writer: %v, %v", g1.err, g2.err)
	}
	waitQueued(t, l, "doc", 2)
	if !pending(w2) || !pending(r3) {
		t.Fatal("the writer or the reader behind it got the lock while the first readers hold it")
	}
	mustUnlock(t, l, "doc", g1.lk.Token)
	mustUnlock(t, l, "doc", g2.lk.Token)
	gw := recv(t, w2)
	if gw.err != nil || gw.lk.Fence <= max(g1.lk.Fence, g2.lk.Fence) {
		t.Fatalf("the writer after the readers: %+v %v", gw.lk, gw.err)
	}
	if !pending(r3) {
		t.Fatal("the reader queued behind the writer got the lock while the writer holds it")
	}
	mustUnlock(t, l, "doc", gw.lk.Token)
	g3 := recv(t, r3)
	if g3.err != nil || g3.lk.Fence <= gw.lk.Fence {
		t.Fatalf("the last reader: %+v %v", g3.lk, g3.err)
	}
	mustUnlock(t, l, "doc", g3.lk.Token)
}

// TestReadersTogetherUnderFaults: two Lockers, each with readers that wait
// together and a writer, on one resource, while one node at a time is
// killed (and restarted with its data) or paused; the independent checker
// finds no writer overlapping another holding and fences in order.
func TestReadersTogetherUnderFaults(t *testing.T) {
	c, lockers := chaosCluster(t, 3)
	var (
		mu    sync.Mutex
		hs    []formHolding
		other []error
		tl    = map[bool]*tallies{false: {}, true: {}}
		wg    sync.WaitGroup
		stop  = make(chan struct{})
	)
	client := func(l *Locker, write bool) {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			called := time.Now()
			var lk Lock
			var err error
			if write {
				lk, err = l.Lock(ctx, "doc", time.Second, Options{Wait: time.Second})
			} else {
				lk, err = l.RLock(ctx, "doc", time.Second, Options{Wait: time.Second})
			}
			start := time.Now()
			mu.Lock()
			tl[write].count(err, &other)
			mu.Unlock()
			if err != nil {
				cancel()
				time.Sleep(time.Millisecond)
				continue
			}
			end := start.Add(lk.Validity)
			time.Sleep(time.Duration(rand.IntN(10000)) * time.Microsecond)
			if now := time.Now(); now.Before(end) {
				end = now
			}
			mu.Lock()
			hs = append(hs, formHolding{resource: "doc", write: write, fence: lk.Fence, called: called, start: start, end: end})
			mu.Unlock()
			l.Unlock(ctx, "doc", lk.Token)
			cancel()
			if write {
				// Room for the readers queued meanwhile to be admitted.
				time.Sleep(time.Duration(5+rand.IntN(20)) * time.Millisecond)
			}
		}
	}
	for _, l := range lockers {
		for i := range 7 {
			wg.Add(1)
			go client(l, i == 0)
		}
	}
	injected := injectFaultsOf(t, c, lockers, 8*time.Second, faults[:2]) // kill (restarted with its data), pause
	close(stop)
	wg.Wait()
	for _, err := range other {
		t.Errorf("error other than NOQUORUM or not acquired: %v", err)
	}
	violations := formChecker(hs)
	for _, v := range violations {
		t.Error(v)
	}
	together := lockers[0].ridersGranted.Load() + lockers[1].ridersGranted.Load()
	t.Logf("faults %v: readers %+v, writers %+v; %d readers granted together with one ahead; %d holdings checked, %d violations; most holders at once %v",
		injected, *tl[false], *tl[true], together, len(hs), len(violations), peaks(hs))
	switch {
	case tl[false].grants < 50 || tl[true].grants < 5:
		t.Errorf("only %d reader and %d writer grants: the run proves little", tl[false].grants, tl[true].grants)
	case together == 0:
		t.Error("no reader was admitted together with another: the run did not exercise it")
	}
}

// TestHashHoldingPlaced: a reader and a permit granted while a node was
// unreachable (cut off, or paused) are on that node soon after it is back,
// without an Extend.
func TestHashHoldingPlaced(t *testing.T) {
	c := startCluster(t, 3)
	l := newLocker(t, c, testConfig())
	warm(t, c, l)
	const ttl = 8 * time.Second
	// placed waits until node i stores holding field of resource for
	// token with fence, and returns how long that took.
	placed := func(i int, resource, field string, lk Lock) time.Duration {
		t.Helper()
		start := time.Now()
		want := fmt.Sprintf("|%d/", lk.Fence)
		eventually(t, fmt.Sprintf("%s of %s on node %d", field, resource, i), func() bool {
			v, err := c.admin[i].HGet(context.Background(), "lockproxy:lock:"+resource, field).Result()
			return err == nil && strings.Contains(v, want) && strings.HasSuffix(v, ":"+lk.Token)
		})
		took := time.Since(start)
		if took > ttl/2 {
			t.Errorf("%s of %s reached node %d %v after it was back", field, resource, i, took)
		}
		return took
	}

	c.servers[2].CutOff()
	rd := mustRLock(t, l, "r", ttl, Options{})
	pm, err := l.Lock(ctxT(t), "s", ttl, Options{Permits: 2})
	if err != nil {
		t.Fatalf("permit: %v", err)
	}
	c.servers[2].Reconnect()
	t.Logf("after a cut-off: the reader placed in %v, the permit in %v",
		placed(2, "r", "@"+rd.Token, rd), placed(2, "s", fmt.Sprintf("#%d", pm.Slot), pm))

	c.servers[0].Pause()
	rd2 := mustRLock(t, l, "r", ttl, Options{})
	c.servers[0].Resume()
	t.Logf("after a pause: the reader placed in %v", placed(0, "r", "@"+rd2.Token, rd2))
	for _, h := range []struct {
		resource string
		lk       Lock
	}{{"r", rd}, {"s", pm}, {"r", rd2}} {
		if err := l.Unlock(ctxT(t), h.resource, h.lk.Token); err != nil && !errors.Is(err, ErrNotHeld) {
			t.Fatalf("Unlock: %v", err)
		}
	}
}

// BenchmarkReadersAfterWriter: 8 readers on one Locker over 3 nodes wait
// behind a writer; one op is from the writer's Unlock to the last
// reader's grant, and calls-per-node/op is how many calls each node ran in
// that time (one reader after the other: 1 + 8).
func BenchmarkReadersAfterWriter(b *testing.B) {
	c := startCluster(b, 3)
	l := newLocker(b, c, quiet(noFallback(testConfig())))
	ctx := context.Background()
	const n = 8
	calls := 0
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		w := mustLock(b, l, "doc", 10*time.Second, Options{})
		results := make(chan lockResult, n)
		for i := range n {
			go func() {
				lk, err := l.RLock(ctx, "doc", 10*time.Second, Options{Wait: 10 * time.Second})
				results <- lockResult{lk, err, time.Now()}
			}()
			waitQueued(b, l, "doc", i+1)
		}
		eventually(b, "the head between attempts", func() bool { return headIdle(l, "doc") })
		before := c.allScriptCalls(b)
		b.StartTimer()
		mustUnlock(b, l, "doc", w.Token)
		var got []Lock
		for range n {
			r := <-results
			if r.err != nil {
				b.Fatalf("reader: %v", r.err)
			}
			got = append(got, r.lk)
		}
		b.StopTimer()
		calls += c.allScriptCalls(b) - before
		for _, lk := range got {
			mustUnlock(b, l, "doc", lk.Token)
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(calls)/float64(b.N)/float64(len(c.servers)), "calls-per-node/op")
}
