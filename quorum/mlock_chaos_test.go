package quorum

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

// mcontend is contend for MLock clients: each takes a random set of two or
// three of resources, in random order, with Options.Wait wait, writes to
// each resource of the set with its fence while the validity lasts, and
// records a holding per resource in st (so that the checker sees MLock and
// Lock holdings of one resource side by side), until stop closes. The
// returned wait is contend's.
func mcontend(t *testing.T, lockers []*Locker, resources []string, clients int, st *storage, stop <-chan struct{}, wait time.Duration, nextID func() int) func() tallies {
	var (
		mu    sync.Mutex
		tl    tallies
		other []error
		wg    sync.WaitGroup
	)
	for w := range clients {
		wg.Go(func() {
			l := lockers[(w+1)%len(lockers)]
			for {
				select {
				case <-stop:
					return
				default:
				}
				set := append([]string(nil), resources...)
				rand.Shuffle(len(set), func(i, j int) { set[i], set[j] = set[j], set[i] })
				set = set[:2+rand.IntN(2)]
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				ml, err := l.MLock(ctx, set, time.Second, Options{Wait: wait})
				start := time.Now()
				mu.Lock()
				tl.count(err, &other)
				mu.Unlock()
				if err != nil {
					cancel()
					backOff(err)
					continue
				}
				id, end := nextID(), start.Add(ml.Validity)
				for range 1 + rand.IntN(3) {
					if time.Now().After(end) {
						break
					}
					for j, r := range set {
						st.write(r, ml.Fences[j], id)
					}
					time.Sleep(time.Duration(rand.IntN(1000)) * time.Microsecond)
				}
				if now := time.Now(); now.Before(end) {
					end = now
				}
				for j, r := range set {
					st.held(holding{resource: r, fence: ml.Fences[j], start: start, end: end, validity: ml.Validity})
				}
				for _, r := range set {
					l.Unlock(ctx, r, ml.Token)
				}
				cancel()
			}
		})
	}
	return func() tallies {
		<-stop
		wg.Wait()
		for _, err := range other {
			t.Errorf("MLock: %v", err)
		}
		return tl
	}
}

// groupIDs returns ids for the MLock holdings' writes that no Lock
// holding of contend uses (contend counts up from 0).
func groupIDs() func() int {
	var mu sync.Mutex
	next := -1
	return func() int {
		mu.Lock()
		defer mu.Unlock()
		next--
		return next
	}
}

// logGroups logs the figures of mcontend's MLock calls and fails t for a
// run with fewer than minGrants of them: the checker's verdict on their
// holdings is check's.
func logGroups(t *testing.T, tl tallies, minGrants int) {
	t.Helper()
	t.Logf("MLOCK: %d calls, %d grants, %d not acquired after the wait, %d NOQUORUM (%.1f%%)",
		tl.calls, tl.grants, tl.notGotten, tl.noQuorum, 100*float64(tl.noQuorum)/float64(max(tl.calls, 1)))
	if tl.grants < minGrants {
		t.Errorf("only %d MLOCK grants: the run proves little", tl.grants)
	}
}
