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
		t.Run(fmt.Sprintf("%d nodes", n), func(t *testing.T) { chaos(t, n, 30*time.Second) })
	}
}

func chaos(t *testing.T, nodes int, run time.Duration) {
	// appendfsync always: a kill loses nothing, so a node that keeps its
	// marker really kept every lock it granted.
	c := startClockCluster(t, nodes, "--appendonly", "yes", "--appendfsync", "always")
	cfg := testConfig()
	cfg.MaxTTL = 3 * time.Second
	lockers := []*Locker{newLocker(t, c, cfg), newLocker(t, c, cfg)}
	warm(t, c, lockers[0])

	st := &storage{last: map[string]int64{}, lastBy: map[string]int{}}
	resources := []string{"r0", "r1", "r2", "r3"}
	const clients = 16
	var (
		mu                                    sync.Mutex
		attempts, grants, noQuorum, notGotten int
		other                                 []error
		nextID                                int
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
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
				lk, err := l.Lock(ctx, r, time.Second, Options{Wait: time.Second})
				start := time.Now()
				var nq *NoQuorumError
				mu.Lock()
				attempts++
				id := nextID
				nextID++
				switch {
				case err == nil:
					grants++
				case errors.As(err, &nq):
					noQuorum++
				case errors.Is(err, ErrNotAcquired):
					notGotten++
				default:
					other = append(other, err)
				}
				mu.Unlock()
				if err != nil {
					cancel()
					if errors.As(err, &nq) {
						time.Sleep(10 * time.Millisecond) // do not spin while too few nodes count
					}
					continue
				}
				end := start.Add(lk.Validity)
				for range 1 + rand.IntN(3) {
					if time.Now().After(end) {
						break
					}
					st.write(r, lk.Fence, id)
					time.Sleep(time.Duration(rand.IntN(1000)) * time.Microsecond)
				}
				if now := time.Now(); now.Before(end) {
					end = now
				}
				st.held(holding{resource: r, fence: lk.Fence, start: start, end: end, validity: lk.Validity})
				l.Unlock(ctx, r, lk.Token)
				cancel()
			}
		}()
	}

	injected := map[string]int{}
	deadline := time.Now().Add(run)
	for time.Now().Before(deadline) {
		time.Sleep(time.Duration(300+rand.IntN(500)) * time.Millisecond)
		f := faults[rand.IntN(len(faults))]
		i := rand.IntN(nodes)
		heal := f.apply(c, i)
		injected[f.name]++
		time.Sleep(time.Duration(200+rand.IntN(1300)) * time.Millisecond)
		heal()
		// One node at a time: the next fault waits until every node
		// counts again for both Lockers (bounded: a node that must wait
		// for its deadline takes MaxTTL).
		waitAllUp(t, c, lockers, 2*cfg.MaxTTL)
	}
	close(stop)
	wg.Wait()

	for _, err := range other {
		t.Errorf("Lock: %v", err)
	}
	overlaps := st.overlaps()
	for _, o := range overlaps {
		t.Error("overlap: " + o)
	}
	for _, s := range st.stale {
		t.Error("stale fence: " + s)
	}
	t.Logf("%d nodes, %v: %d LOCK attempts, %d grants, %d not acquired after the wait, %d NOQUORUM (%.1f%%); faults %v; %d overlaps, %d stale fences",
		nodes, run, attempts, grants, notGotten, noQuorum, 100*float64(noQuorum)/float64(max(attempts, 1)), injected, len(overlaps), len(st.stale))
	if grants < 100 {
		t.Errorf("only %d grants: the run proves little", grants)
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
