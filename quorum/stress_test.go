package quorum

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"
)

func TestNodeHealthWarnsOncePerChange(t *testing.T) {
	c := startCluster(t, 3)
	core, logs := observer.New(zap.WarnLevel)
	logger := zaptest.NewLogger(t).WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
		return zapcore.NewTee(c, core)
	}))
	l := newLockerLog(t, c, testConfig(), logger)

	for range 3 {
		mustUnlock(t, l, "orders", mustLock(t, l, "orders", time.Second, Options{}).Token)
	}
	if n := logs.Len(); n != 0 {
		t.Fatalf("%d warnings while all nodes are up: %v", n, logs.All())
	}

	c.kill(1)
	for range 3 {
		mustUnlock(t, l, "orders", mustLock(t, l, "orders", time.Second, Options{}).Token)
	}
	down := logs.FilterMessage("lock node down").All()
	if len(down) != 1 {
		t.Fatalf("%d 'lock node down' warnings, want 1: %v", len(down), logs.All())
	}
	if f := down[0].ContextMap(); f["node"] != int64(1) || f["addr"] != c.servers[1].Addr || f["error"] == nil {
		t.Errorf("down warning fields %v", f)
	}

	c.restart(1)
	eventually(t, "node 1 back up", func() bool {
		mustUnlock(t, l, "orders", mustLock(t, l, "orders", time.Second, Options{}).Token)
		return logs.FilterMessage("lock node up").Len() > 0
	})
	for range 3 {
		mustUnlock(t, l, "orders", mustLock(t, l, "orders", time.Second, Options{}).Token)
	}
	if up, down := logs.FilterMessage("lock node up").Len(), logs.FilterMessage("lock node down").Len(); up != 1 || down != 1 {
		t.Errorf("%d up and %d down warnings, want 1 each: %v", up, down, logs.All())
	}
}

// holding is one acquisition as seen by its holder.
type holding struct {
	resource   string
	fence      int64
	start, end time.Time // Lock returned, Unlock called
	validity   time.Duration
}

// TestConcurrentHoldersNeverOverlap hammers a few resources from many
// goroutines on eight Lockers sharing three nodes. An independent checker
// then verifies, per resource, that no two holdings overlap within their
// validity and that fences strictly increase in acquisition order.
func TestConcurrentHoldersNeverOverlap(t *testing.T) {
	c := startCluster(t, 3)
	// Many Lockers, so that several queue heads contend for each release
	// and votes really split.
	var lockers []*Locker
	for range 8 {
		lockers = append(lockers, newLocker(t, c, testConfig()))
	}
	ctx := ctxT(t)
	resources := []string{"a", "b", "c"}
	const (
		workers = 16
		rounds  = 25
		ttl     = 2 * time.Second
	)

	var (
		mu       sync.Mutex
		holdings []holding
		busy     = map[string]bool{}
		overlaps []string
		errs     []error
	)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := lockers[w%len(lockers)]
			for range rounds {
				r := resources[rand.IntN(len(resources))]
				lk, err := l.Lock(ctx, r, ttl, Options{Wait: 15 * time.Second})
				if err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("Lock %s: %w", r, err))
					mu.Unlock()
					return
				}
				start := time.Now()
				mu.Lock()
				if busy[r] {
					overlaps = append(overlaps, fmt.Sprintf("%s entered while held (fence %d)", r, lk.Fence))
				}
				busy[r] = true
				mu.Unlock()

				time.Sleep(time.Duration(rand.IntN(1000)) * time.Microsecond) // the protected work

				end := time.Now()
				mu.Lock()
				busy[r] = false
				holdings = append(holdings, holding{r, lk.Fence, start, end, lk.Validity})
				mu.Unlock()
				if err := l.Unlock(ctx, r, lk.Token); err != nil && end.Sub(start) < lk.Validity {
					mu.Lock()
					errs = append(errs, fmt.Errorf("Unlock %s: %w", r, err))
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()

	for _, err := range errs {
		t.Error(err)
	}
	for _, o := range overlaps {
		t.Error(o)
	}
	if len(holdings) != workers*rounds {
		t.Fatalf("%d holdings, want %d", len(holdings), workers*rounds)
	}
	for _, r := range resources {
		var hs []holding
		for _, h := range holdings {
			if h.resource == r && h.end.Sub(h.start) < h.validity {
				hs = append(hs, h)
			}
		}
		slices.SortFunc(hs, func(a, b holding) int { return a.start.Compare(b.start) })
		for i := 1; i < len(hs); i++ {
			prev, cur := hs[i-1], hs[i]
			if cur.start.Before(prev.end) {
				t.Errorf("%s: holding with fence %d started before the one with fence %d ended", r, cur.fence, prev.fence)
			}
			if cur.fence <= prev.fence {
				t.Errorf("%s: fence %d acquired after fence %d", r, cur.fence, prev.fence)
			}
		}
		t.Logf("%s: %d holdings", r, len(hs))
	}
}
