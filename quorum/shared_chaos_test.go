package quorum

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"
)

// formHolding is one holding of the lock family's forms as the
// independent checker records it: called when the acquiring call began,
// start when it returned, end when the holder stopped relying on it (at
// the latest, when its validity ran out).
type formHolding struct {
	resource string
	write    bool // an exclusive (write) holding
	k        int  // semaphore permits; 0 for the read-write resources
	slot     int
	fence    int64
	called   time.Time
	start    time.Time
	end      time.Time
}

// formChecker checks recorded holdings against the contract: no writer
// overlaps any other holding, at most k permits within their validity at
// once, never two holders of one slot, and an acquisition's fence above the
// fence of every holding (of the same slot, for permits) that ended before
// the acquisition began.
func formChecker(hs []formHolding) (violations []string) {
	byRes := map[string][]formHolding{}
	for _, h := range hs {
		byRes[h.resource] = append(byRes[h.resource], h)
	}
	for r, hs := range byRes {
		slices.SortFunc(hs, func(a, b formHolding) int { return a.start.Compare(b.start) })
		// Overlaps: with starts sorted, a holding overlaps every earlier
		// one that ends after it starts.
		for i := range hs {
			live := 0
			for j := i - 1; j >= 0; j-- {
				if !hs[i].start.Before(hs[j].end) {
					continue
				}
				live++
				switch {
				case hs[i].k == 0 && (hs[i].write || hs[j].write):
					violations = append(violations, fmt.Sprintf("%s: fence %d (write %v) overlaps fence %d (write %v)", r, hs[i].fence, hs[i].write, hs[j].fence, hs[j].write))
				case hs[i].k > 0 && hs[i].slot == hs[j].slot:
					violations = append(violations, fmt.Sprintf("%s: slot %d held by fences %d and %d at once", r, hs[i].slot, hs[j].fence, hs[i].fence))
				}
			}
			if hs[i].k > 0 && live+1 > hs[i].k {
				violations = append(violations, fmt.Sprintf("%s: %d holders of %d permits at once (fence %d)", r, live+1, hs[i].k, hs[i].fence))
			}
		}
		// Fences, per slot: sorted by end, a running maximum.
		bySlot := map[int][]formHolding{}
		for _, h := range hs {
			bySlot[h.slot] = append(bySlot[h.slot], h)
		}
		for s, group := range bySlot {
			ends := slices.Clone(group)
			slices.SortFunc(ends, func(a, b formHolding) int { return a.end.Compare(b.end) })
			maxUpTo := make([]int64, len(ends))
			for i, h := range ends {
				maxUpTo[i] = h.fence
				if i > 0 {
					maxUpTo[i] = max(maxUpTo[i], maxUpTo[i-1])
				}
			}
			for _, h := range group {
				// The holdings that ended before h's call began.
				n, _ := slices.BinarySearchFunc(ends, h.called, func(e formHolding, t time.Time) int { return e.end.Compare(t) })
				if n > 0 && maxUpTo[n-1] >= h.fence {
					violations = append(violations, fmt.Sprintf("%s slot %d: fence %d granted after a holding with fence %d ended", r, s, h.fence, maxUpTo[n-1]))
				}
			}
		}
	}
	return violations
}

// TestFormsChaos is TestChaos for the read-write lock and semaphores: two
// Lockers, 18 clients mixing RLock and Lock on two resources and permits of
// 2 and of 3 on two others, while one node at a time is paused, killed and
// restarted with its data, restarted empty, cut off, or has its clock
// jump.
func TestFormsChaos(t *testing.T) {
	for _, n := range []int{3, 5} {
		t.Run(fmt.Sprintf("%d nodes", n), func(t *testing.T) { formsChaos(t, n, 15*time.Second) })
	}
}

func formsChaos(t *testing.T, nodes int, run time.Duration) {
	c, lockers := chaosCluster(t, nodes)

	type form struct {
		resource string
		k        int // 0: read-write
	}
	forms := []form{{"rw0", 0}, {"rw1", 0}, {"sem2", 2}, {"sem3", 3}}
	var (
		mu       sync.Mutex
		hs       []formHolding
		tl       = map[string]*tallies{}
		other    []error
		wg       sync.WaitGroup
		stop     = make(chan struct{})
		kindName = func(f form, write bool) string {
			switch {
			case f.k > 0:
				return fmt.Sprintf("PERMITS %d", f.k)
			case write:
				return "LOCK"
			}
			return "RLOCK"
		}
	)
	for w := range 18 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := lockers[w%len(lockers)]
			for {
				select {
				case <-stop:
					return
				default:
				}
				f := forms[rand.IntN(len(forms))]
				write := f.k == 0 && rand.IntN(3) == 0
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				called := time.Now()
				var lk Lock
				var err error
				switch {
				case f.k > 0:
					lk, err = l.Lock(ctx, f.resource, time.Second, Options{Wait: time.Second, Permits: f.k})
				case write:
					lk, err = l.Lock(ctx, f.resource, time.Second, Options{Wait: time.Second})
				default:
					lk, err = l.RLock(ctx, f.resource, time.Second, Options{Wait: time.Second})
				}
				start := time.Now()
				var nq *NoQuorumError
				mu.Lock()
				name := kindName(f, write)
				if tl[name] == nil {
					tl[name] = &tallies{}
				}
				tl[name].calls++
				switch {
				case err == nil:
					tl[name].grants++
				case errors.As(err, &nq):
					tl[name].noQuorum++
				case errors.Is(err, ErrNotAcquired):
					tl[name].notGotten++
				default:
					other = append(other, fmt.Errorf("%s %s: %w", name, f.resource, err))
				}
				mu.Unlock()
				if err != nil {
					cancel()
					if errors.As(err, &nq) {
						time.Sleep(10 * time.Millisecond)
					}
					continue
				}
				end := start.Add(lk.Validity)
				time.Sleep(time.Duration(rand.IntN(15000)) * time.Microsecond) // long enough for all k permits to be taken at times
				if now := time.Now(); now.Before(end) {
					end = now
				}
				mu.Lock()
				hs = append(hs, formHolding{resource: f.resource, write: write, k: f.k, slot: lk.Slot, fence: lk.Fence, called: called, start: start, end: end})
				mu.Unlock()
				l.Unlock(ctx, f.resource, lk.Token)
				cancel()
			}
		}()
	}

	injected := injectFaults(t, c, lockers, run)
	close(stop)
	wg.Wait()
	for _, err := range other {
		t.Errorf("error other than NOQUORUM: %v", err)
	}
	violations := formChecker(hs)
	for _, v := range violations {
		t.Error(v)
	}
	for name, x := range tl {
		t.Logf("%d nodes, faults %v: %s: %d calls, %d grants, %d not acquired after the wait, %d NOQUORUM", nodes, injected, name, x.calls, x.grants, x.notGotten, x.noQuorum)
		if x.grants < 20 {
			t.Errorf("%s: only %d grants: the run proves little", name, x.grants)
		}
	}
	t.Logf("%d holdings checked, %d violations; most holders at once: %v", len(hs), len(violations), peaks(hs))
}

// peaks returns, per resource, the most holdings that overlapped at once:
// for a semaphore, whether the run ever had all k permits taken.
func peaks(hs []formHolding) map[string]int {
	type event struct {
		at    time.Time
		delta int
	}
	byRes := map[string][]event{}
	for _, h := range hs {
		byRes[h.resource] = append(byRes[h.resource], event{h.start, 1}, event{h.end, -1})
	}
	out := map[string]int{}
	for r, evs := range byRes {
		// Ends before starts at the same instant: touching is not overlapping.
		slices.SortFunc(evs, func(a, b event) int {
			if c := a.at.Compare(b.at); c != 0 {
				return c
			}
			return a.delta - b.delta
		})
		n := 0
		for _, e := range evs {
			n += e.delta
			out[r] = max(out[r], n)
		}
	}
	return out
}

// TestFormChecker makes sure that the checker finds what it must.
func TestFormChecker(t *testing.T) {
	t0 := time.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	tests := []struct {
		name string
		give []formHolding
		want int
	}{
		{"readers overlap", []formHolding{
			{resource: "r", fence: 1, called: at(0), start: at(1), end: at(10)},
			{resource: "r", fence: 2, called: at(0), start: at(2), end: at(10)},
		}, 0},
		{"writer overlaps a reader", []formHolding{
			{resource: "r", fence: 1, called: at(0), start: at(1), end: at(10)},
			{resource: "r", fence: 2, write: true, called: at(0), start: at(2), end: at(10)},
		}, 1},
		{"three of two permits", []formHolding{
			{resource: "s", k: 2, slot: 0, fence: 1, called: at(0), start: at(1), end: at(10)},
			{resource: "s", k: 2, slot: 1, fence: 2, called: at(0), start: at(2), end: at(10)},
			{resource: "s", k: 2, slot: 2, fence: 3, called: at(0), start: at(3), end: at(10)},
		}, 1},
		{"one slot twice", []formHolding{
			{resource: "s", k: 3, slot: 1, fence: 1, called: at(0), start: at(1), end: at(10)},
			{resource: "s", k: 3, slot: 1, fence: 2, called: at(0), start: at(2), end: at(10)},
		}, 1},
		{"fence going back", []formHolding{
			{resource: "r", fence: 5, write: true, called: at(0), start: at(1), end: at(2)},
			{resource: "r", fence: 4, called: at(3), start: at(4), end: at(5)},
		}, 1},
		{"fences per slot", []formHolding{
			{resource: "s", k: 2, slot: 0, fence: 5, called: at(0), start: at(1), end: at(2)},
			{resource: "s", k: 2, slot: 1, fence: 4, called: at(3), start: at(4), end: at(5)},
		}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := formChecker(tt.give); len(got) != tt.want {
				t.Errorf("got %d violations %v, want %d", len(got), got, tt.want)
			}
		})
	}
}
