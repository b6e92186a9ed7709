package quorum

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

// TestClockJumpScenario is the data-loss scenario with a clock jump in
// place of the empty restart: A locks R (ttl 15s) while node 2 is cut off,
// so R is on nodes 0 and 1; node 2 comes back; node 1's wall clock jumps.
// Forward, R expires early on node 1, and nodes 1 and 2, a majority, no
// longer know it: no Locker, including one started after the jump, may
// grant R again within A's validity. Backward, R only lives longer there,
// and nothing may break. Afterwards R and fresh resources are granted
// again.
func TestClockJumpScenario(t *testing.T) {
	for _, jump := range []time.Duration{5 * time.Second, 60 * time.Second, -60 * time.Second} {
		t.Run(fmt.Sprintf("%+v", jump), func(t *testing.T) { clockJump(t, jump) })
	}
}

func clockJump(t *testing.T, jump time.Duration) {
	c := startClockCluster(t, 3)
	cfg := testConfig()
	a := newLocker(t, c, cfg)
	b := newLocker(t, c, cfg)
	warm(t, c, a)
	waitRecovered(t, b, 0)

	c.servers[2].CutOff()
	lk := mustLock(t, a, "R", 15*time.Second, Options{})
	validUntil := time.Now().Add(lk.Validity)
	if h := c.holder(t, 1, "R"); h != lk.Token {
		t.Fatalf("node 1 holds R for %q, want A", h)
	}
	c.servers[2].Reconnect()
	waitClientUp(t, a, 2)

	c.servers[1].ShiftClock(jump)
	jumped := time.Now()
	if jump > 0 && jump < 15*time.Second {
		// R has not expired on node 1 yet, but will before A's validity
		// ends: the jump must be caught all the same.
		if p := c.pttl(t, 1, "R"); p <= 0 {
			t.Fatalf("R's pttl on node 1 is %v after a %v jump, want it still there", p, jump)
		}
	}
	late := newLocker(t, c, cfg)
	lockers := []*Locker{a, b, late}

	// Within A's validity, R is refused through every Locker, while the
	// jump is detected and node 1 recovered.
	var counted time.Duration // when node 1 counted again for every Locker
	seen := make([]bool, len(lockers))
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		refused(t, fmt.Sprintf("after node 1's clock jumped %v", jump), "R", lockers...)
		up := true
		for i, l := range lockers {
			st := l.Status()[1].State
			seen[i] = seen[i] || st == NodeRecovering
			up = up && seen[i] && st == NodeUp
		}
		if up && counted == 0 {
			counted = time.Since(jumped)
		}
	}
	if jump > 0 {
		for i, l := range lockers {
			if n := losses(l, 1); n == 0 {
				t.Errorf("Locker %d never took node 1 for lost after its clock jumped %v", i, jump)
			}
		}
	}
	for _, l := range lockers {
		waitRecovered(t, l, 1)
	}
	if jump > 0 {
		if counted == 0 {
			counted = time.Since(jumped)
		}
		t.Logf("node 1 counted again for every Locker %v after its clock jumped %v", counted, jump)
		if counted > 2*time.Second {
			t.Errorf("node 1 counted again %v after its clock jumped, want within 2s (a recovery by copy)", counted)
		}
		if h := c.holder(t, 1, "R"); h != lk.Token {
			t.Errorf("node 1 holds R for %q after its recovery, want A's lock copied back", h)
		}
	} else {
		for i, l := range lockers {
			if n := losses(l, 1); n != 0 {
				t.Errorf("Locker %d took node 1 for lost %d times after its clock went back %v", i, n, -jump)
			}
		}
	}
	refused(t, "after node 1 counts again", "R", lockers...)

	// With node 0 paused, node 1 must count for a grant: fresh resources
	// are granted through every Locker, R is still A's, and a wait for R
	// runs out on time (it is measured on the Locker's clock).
	c.servers[0].Pause()
	for i, l := range lockers {
		var got Lock
		eventually(t, fmt.Sprintf("a fresh lock through Locker %d with node 0 paused", i), func() bool {
			var err error
			got, err = l.Lock(ctxT(t), "fresh", time.Second, Options{})
			return err == nil
		})
		mustUnlock(t, l, "fresh", got.Token)
	}
	refused(t, "with node 0 paused", "R", lockers...)
	start := time.Now()
	_, err := late.Lock(ctxT(t), "R", time.Second, Options{Wait: 300 * time.Millisecond})
	if waited := time.Since(start); !errors.Is(err, ErrNotAcquired) || waited > 2*time.Second {
		t.Errorf("Lock R with WAIT 300ms = %v after %v, want not acquired within 2s", err, waited)
	}
	if time.Now().After(validUntil) {
		t.Fatalf("the checks ran past A's validity; they prove nothing")
	}
	c.servers[0].Resume()

	nextFenceLarger(t, a, late, "R", lk)
}
