package quorum

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"
)

// storage is the independent checker: it plays the storage that the locks
// protect. Each holder writes to it with its fence while it believes it
// holds the lock, and it records every holding for the overlap check.
type storage struct {
	mu       sync.Mutex
	last     map[string]int64 // the largest fence written, per resource
	lastBy   map[string]int   // the holding that wrote it
	stale    []string         // writes with a fence older than one seen
	holdings []holding
}

func newStorage() *storage {
	return &storage{last: map[string]int64{}, lastBy: map[string]int{}}
}

// write is one write of holding id to resource with fence. A fence below
// the largest seen, or equal to it from another holding, is a stale write
// that the storage would have to reject: a lock service with fences in
// order never lets a holder present one.
func (s *storage) write(resource string, fence int64, id int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	last := s.last[resource]
	if fence < last || (fence == last && s.lastBy[resource] != id) {
		s.stale = append(s.stale, fmt.Sprintf("%s: fence %d written after %d", resource, fence, last))
		return
	}
	s.last[resource], s.lastBy[resource] = fence, id
}

func (s *storage) held(h holding) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.holdings = append(s.holdings, h)
}

// overlaps returns every pair of holdings of one resource that overlap
// within their validity.
func (s *storage) overlaps() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	byResource := map[string][]holding{}
	for _, h := range s.holdings {
		byResource[h.resource] = append(byResource[h.resource], h)
	}
	for r, hs := range byResource {
		slices.SortFunc(hs, func(a, b holding) int { return a.start.Compare(b.start) })
		for i := 1; i < len(hs); i++ {
			// The earliest end among the earlier holdings that may still
			// run is not enough: any earlier holding may reach past.
			for j := i - 1; j >= 0 && i-j <= 64; j-- {
				if hs[i].start.Before(hs[j].end) {
					out = append(out, fmt.Sprintf("%s: fence %d began before fence %d ended", r, hs[i].fence, hs[j].fence))
				}
			}
		}
	}
	return out
}

// fault is one kind of failure the chaos test injects into one node.
type fault struct {
	name  string
	apply func(c *cluster, i int) (heal func())
}

var faults = []fault{
	{"kill", func(c *cluster, i int) func() {
		c.servers[i].Kill()
		return func() { c.servers[i].Restart() } // with its data (AOF)
	}},
	{"pause", func(c *cluster, i int) func() {
		c.servers[i].Pause()
		return c.servers[i].Resume
	}},
	{"restart empty", func(c *cluster, i int) func() {
		c.servers[i].RestartEmpty()
		return func() {}
	}},
	{"cut off", func(c *cluster, i int) func() {
		c.servers[i].CutOff()
		return c.servers[i].Reconnect
	}},
	// The node's wall clock jumps forward 1-30s (two times in three; its
	// locks expire early, and it must be taken for a node that lost its
	// data) or back 1-30s (its locks live longer). The clock stays where
	// it jumped to.
	{"clock jump", func(c *cluster, i int) func() {
		d := time.Duration(1+rand.IntN(30)) * time.Second
		if rand.IntN(3) == 0 {
			d = -d
		}
		c.servers[i].ShiftClock(d)
		return func() {}
	}},
}

// TestChaos runs two Lockers with 16 clients taking a few resources with
// waits, while one node at a time is killed, paused, restarted empty, cut
// off or has its clock jump, and checks with the independent storage that no two holdings
// overlapped within their validity and that no stale fence was presented.
func TestChaos(t *testing.T) {
	for _, n := range []int{3, 5} {
		t.Run(fmt.Sprintf("%d nodes", n), func(t *testing.T) { chaos(t, n, *chaosRun) })
	}
}

// chaosRun is how long each TestChaos run injects faults: longer runs
// (go test -run TestChaos -chaos.run 60s) find rarer interleavings.
var chaosRun = flag.Duration("chaos.run", 30*time.Second, "how long each TestChaos run lasts")

func chaos(t *testing.T, nodes int, run time.Duration) {
	c, lockers := chaosCluster(t, nodes)

	st := newStorage()
	stop := make(chan struct{})
	wait := contend(t, lockers, []string{"r0", "r1", "r2", "r3"}, 16, st, stop, time.Second, writeBriefly)
	mwait := mcontend(t, lockers, []string{"r0", "r1", "r2", "r3"}, 4, st, stop, time.Second, groupIDs())
	// Reentrant clients on the same resources (chaos_reentrant_test.go).
	waitReentrant := contendReentrant(t, lockers, []string{"r0", "r1", "r2", "r3"}, 4, st, stop, time.Second, 1<<30)

	injected := injectFaults(t, c, lockers, run)
	close(stop)
	plain, mtl, re := wait(), mwait(), waitReentrant()
	t.Logf("of which reentrant clients: %d LOCK REENTRANT calls, %d grants, %d not acquired, %d NOQUORUM",
		re.calls, re.grants, re.notGotten, re.noQuorum)
	check(t, fmt.Sprintf("%d nodes, %v, faults %v", nodes, run, injected), st, plain.add(re), 100)
	logGroups(t, mtl, 20)
}

// chaosCluster starts nodes lock nodes for a chaos test and two warmed-up
// Lockers over them (MaxTTL 3s). appendfsync always: a kill loses
// nothing, so a node that keeps its marker really kept every lock it
// granted.
func chaosCluster(t *testing.T, nodes int) (*cluster, []*Locker) {
	c := startClockCluster(t, nodes, "--appendonly", "yes", "--appendfsync", "always")
	cfg := testConfig()
	cfg.MaxTTL = 3 * time.Second
	lockers := []*Locker{newLocker(t, c, cfg), newLocker(t, c, cfg)}
	warm(t, c, lockers[0])
	return c, lockers
}

// injectFaults applies a random fault of faults to a random node of c,
// one node at a time, until run has passed, and returns how many of each
// it applied. The next fault waits until every node counts again for
// every Locker (bounded: a node that must wait for its deadline takes
// MaxTTL).
func injectFaults(t *testing.T, c *cluster, lockers []*Locker, run time.Duration) map[string]int {
	return injectFaultsOf(t, c, lockers, run, faults)
}

// injectFaultsOf is injectFaults with the faults of fs only.
func injectFaultsOf(t *testing.T, c *cluster, lockers []*Locker, run time.Duration, fs []fault) map[string]int {
	injected := map[string]int{}
	deadline := time.Now().Add(run)
	for time.Now().Before(deadline) {
		time.Sleep(time.Duration(300+rand.IntN(500)) * time.Millisecond)
		f := fs[rand.IntN(len(fs))]
		heal := f.apply(c, rand.IntN(len(c.servers)))
		injected[f.name]++
		time.Sleep(time.Duration(200+rand.IntN(1300)) * time.Millisecond)
		heal()
		waitAllUp(t, c, lockers, 2*lockers[0].cfg.MaxTTL)
	}
	return injected
}

// writeBriefly holds a grant for one to three writes, each followed by up
// to 1ms of work.
func writeBriefly(_ context.Context, _ *Locker, st *storage, r string, lk Lock, id int, end time.Time) time.Time {
	for range 1 + rand.IntN(3) {
		if time.Now().After(end) {
			break
		}
		st.write(r, lk.Fence, id)
		time.Sleep(time.Duration(rand.IntN(1000)) * time.Microsecond)
	}
	return end
}

// tallies are the outcomes of contend's Lock calls.
type tallies struct{ calls, grants, noQuorum, notGotten int }

// count adds the outcome err of one call to tl, and an unexpected error to
// other.
func (tl *tallies) count(err error, other *[]error) {
	tl.calls++
	if !tl.record(err) {
		*other = append(*other, err)
	}
}

// record counts one Lock call's outcome err (tl.calls is counted apart);
// it reports false for an error other than ErrNotAcquired and NOQUORUM.
func (tl *tallies) record(err error) bool {
	var nq *NoQuorumError
	switch {
	case err == nil:
		tl.grants++
	case errors.As(err, &nq):
		tl.noQuorum++
	case errors.Is(err, ErrNotAcquired):
		tl.notGotten++
	default:
		return false
	}
	return true
}

// backOff sleeps a little after a NOQUORUM: a client does not spin while
// too few nodes count.
func backOff(err error) {
	var nq *NoQuorumError
	if errors.As(err, &nq) {
		time.Sleep(10 * time.Millisecond)
	}
}

// contend starts clients on lockers (in turn) that take random resources
// with Options.Wait wait, hold each grant with hold (which returns when
// the holding's validity ends, extended or not) and record every holding
// and write in st, until stop closes. The returned wait waits for the
// clients after stop closed, fails t for any error other than
// ErrNotAcquired and NOQUORUM, and returns the tallies.
func contend(t *testing.T, lockers []*Locker, resources []string, clients int, st *storage, stop <-chan struct{}, wait time.Duration,
	hold func(ctx context.Context, l *Locker, st *storage, r string, lk Lock, id int, end time.Time) time.Time) func() tallies {
	var (
		mu     sync.Mutex
		tl     tallies
		nextID int
		other  []error
		wg     sync.WaitGroup
	)
	for w := range clients {
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
				r := resources[rand.IntN(len(resources))]
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				lk, err := l.Lock(ctx, r, time.Second, Options{Wait: wait})
				start := time.Now()
				mu.Lock()
				tl.count(err, &other)
				id := nextID
				nextID++
				mu.Unlock()
				if err != nil {
					cancel()
					backOff(err)
					continue
				}
				end := hold(ctx, l, st, r, lk, id, start.Add(lk.Validity))
				if now := time.Now(); now.Before(end) {
					end = now
				}
				st.held(holding{resource: r, fence: lk.Fence, start: start, end: end, validity: lk.Validity})
				l.Unlock(ctx, r, lk.Token)
				cancel()
			}
		}()
	}
	return func() tallies {
		<-stop
		wg.Wait()
		for _, err := range other {
			t.Errorf("Lock: %v", err)
		}
		return tl
	}
}

// check fails t for every overlap and stale fence that st recorded, and
// for a run with fewer than minGrants grants, and logs the run's figures.
func check(t *testing.T, what string, st *storage, tl tallies, minGrants int) {
	t.Helper()
	overlaps := st.overlaps()
	for _, o := range overlaps {
		t.Error("overlap: " + o)
	}
	for _, s := range st.stale {
		t.Error("stale fence: " + s)
	}
	t.Logf("%s: %d LOCK calls, %d grants, %d not acquired after the wait, %d NOQUORUM (%.1f%%); %d overlaps, %d stale fences",
		what, tl.calls, tl.grants, tl.notGotten, tl.noQuorum, 100*float64(tl.noQuorum)/float64(max(tl.calls, 1)), len(overlaps), len(st.stale))
	if tl.grants < minGrants {
		t.Errorf("only %d grants: the run proves little", tl.grants)
	}
}

// waitAllUp waits, at most max, until every node answers with its marker
// for every Locker.
func waitAllUp(tb testing.TB, c *cluster, lockers []*Locker, max time.Duration) {
	tb.Helper()
	deadline := time.Now().Add(max)
	for time.Now().Before(deadline) {
		up := true
		for _, l := range lockers {
			for _, st := range l.Status() {
				up = up && st.State == NodeUp
			}
		}
		if up {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}
