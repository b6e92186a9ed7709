package quorum

import (
	"context"
	"testing"
	"time"
)

// TestDeadlineAfterClockBack: when a node's wall clock goes back, the
// deadlines that requests carry to it (late.go) must follow at the next
// reply from the node, not only at the keeper's next periodic reading
// (keepInterval ProbeIntervals, here an hour): a deadline that lies J
// later on the node than the call's own lets a late request run J after
// its call gave up, a late release among them.
func TestDeadlineAfterClockBack(t *testing.T) {
	c := startClockCluster(t, 3)
	cfg := quiet(testConfig())
	l := newLocker(t, c, cfg)
	warm(t, c, l)
	n := l.nodes[0]
	eventually(t, "a reading of node 0's clock", func() bool { return n.clock.Load() != nil })

	const back = 30 * time.Second
	c.servers[0].ShiftClock(-back)
	// One ordinary call that reaches node 0.
	lk := mustLock(t, l, "after", 2*time.Second, Options{})
	mustUnlock(t, l, "after", lk.Token)

	tm, err := c.admin[0].Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	nodeNow := tm.UnixMilli()
	est := n.deadlineOn(time.Now())
	t.Logf("node 0 reads %d, the Locker's deadline for now on it %d (%+d ms)", nodeNow, est, est-nodeNow)
	if est > nodeNow+50 {
		t.Fatalf("after node 0's clock went back %v and a call reached it, a request's deadline on it is %d ms later than the call's own", back, est-nodeNow)
	}
}
