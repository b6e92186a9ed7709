package quorum

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

// contendReentrant starts reentrant clients for the chaos test: each takes
// a random resource with LOCK ... REENTRANT (waiting) through one Locker,
// re-enters it at once through the other, which must reply the holding's
// fence and 2 holds, gives the second hold back (HOLD 2) and keeps
// writing to st while the first hold remains, then releases the last
// hold. Every write carries the holding's fence, and the holding lasts
// until the last release or the end of its latest validity, so a release
// of one hold that freed the lock shows as an overlap with the next
// holder. The returned wait waits for the clients after stop closed and
// fails t for any unexpected error or hold count.
func contendReentrant(t *testing.T, lockers []*Locker, resources []string, clients int, st *storage, stop <-chan struct{}, wait time.Duration, firstID int) func() tallies {
	var (
		mu        sync.Mutex
		tl        tallies
		bad       []string
		wg        sync.WaitGroup
		round     int
		reentries int // re-entries granted
	)
	fail := func(format string, args ...any) {
		mu.Lock()
		bad = append(bad, fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	for w := range clients {
		wg.Go(func() {
			l, other := lockers[w%len(lockers)], lockers[(w+1)%len(lockers)]
			for {
				select {
				case <-stop:
					return
				default:
				}
				mu.Lock()
				id := firstID + round
				round++
				mu.Unlock()
				token := fmt.Sprintf("reentrant-%d", id) // one sequential owner per holding
				r := resources[rand.IntN(len(resources))]
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				lk, err := l.Lock(ctx, r, time.Second, Options{Wait: wait, Reentrant: true, Token: token})
				start := time.Now()
				var nq *NoQuorumError
				mu.Lock()
				tl.calls++
				if !tl.record(err) {
					bad = append(bad, fmt.Sprintf("Lock REENTRANT: %v", err))
				}
				mu.Unlock()
				if err != nil {
					cancel()
					if errors.As(err, &nq) {
						time.Sleep(10 * time.Millisecond)
					}
					continue
				}
				if lk.Holds != 1 {
					fail("%s: a fresh reentrant lock has %d holds", r, lk.Holds)
				}
				end := start.Add(lk.Validity)
				fence := lk.Fence
				writeUntil(st, r, fence, id, end)
				again, err := other.Lock(ctx, r, time.Second, Options{Reentrant: true, Token: token})
				reentered := time.Now()
				switch {
				case err == nil:
					if again.Holds != 2 {
						fail("%s: %d holds after one re-entry, want 2", r, again.Holds)
					}
					// Right after a waited grant, a node may still lack
					// the holding (a placement on its way, a node that
					// missed it) and take it afresh: the re-entry keeps
					// the holding's fence all the same.
					mu.Lock()
					reentries++
					mu.Unlock()
					if again.Fence != fence {
						fail("%s: re-entry fence %d, the holding's %d", r, again.Fence, fence)
					}
					if e := reentered.Add(again.Validity); e.After(end) {
						end = e
					}
					writeUntil(st, r, fence, id, end)
					// Give the second hold back: the lock must stay.
					if left, err := l.Release(ctx, r, token, 2); err == nil && left != 1 {
						fail("%s: %d holds left after HOLD 2, want 1", r, left)
					}
					writeUntil(st, r, fence, id, end)
				case errors.As(err, &nq) || errors.Is(err, ErrNotAcquired):
				default:
					fail("re-entry: %v", err)
				}
				released := time.Now()
				if released.After(end) {
					released = end
				}
				st.held(holding{resource: r, fence: fence, start: start, end: released, validity: end.Sub(start)})
				other.Release(ctx, r, token, 1) // the last hold, whatever is left
				cancel()
			}
		})
	}
	return func() tallies {
		<-stop
		wg.Wait()
		for _, b := range bad {
			t.Error(b)
		}
		t.Logf("reentrant clients: %d re-entries right after a waited grant; %d errors (hold counts, fences, unexpected)", reentries, len(bad))
		return tl
	}
}

// writeUntil writes once to st for holding id, unless its validity has
// run out.
func writeUntil(st *storage, r string, fence int64, id int, end time.Time) {
	if time.Now().Before(end) {
		st.write(r, fence, id)
		time.Sleep(time.Duration(rand.IntN(1000)) * time.Microsecond)
	}
}

// add sums two tallies.
func (a tallies) add(b tallies) tallies {
	return tallies{calls: a.calls + b.calls, grants: a.grants + b.grants, noQuorum: a.noQuorum + b.noQuorum, notGotten: a.notGotten + b.notGotten}
}
