package quorum

import (
	"bufio"
	"context"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/internal/redistest"
	"github.com/redis/go-redis/v9"
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

// TestFreshLockerDeadlines is the window of a fresh Locker: no request that
// needs a deadline (every operation but the clock reading and cleanups,
// see late.go) reaches a node without one, also before the Locker read
// the node's clock and over a link whose round trip (0.7 NodeTimeout) is
// too slow for a reading taken with a dial to look precise. A request sent
// without a deadline ("0") would run however late it arrived. The node's
// MONITOR shows every operation it received.
func TestFreshLockerDeadlines(t *testing.T) {
	c := startCluster(t, 3)
	cfg := testConfig()
	warm(t, c, newLocker(t, c, cfg))
	relay := redistest.NewRelay(t, c.opts[2].Addr)
	relay.SetDelay(cfg.NodeTimeout * 35 / 100)

	lines := monitor(t, c.opts[2].Addr)
	opts := []*redis.Options{{Addr: c.opts[0].Addr}, {Addr: c.opts[1].Addr}, {Addr: relay.Addr}}
	l := newLockerOpts(t, opts, cfg)
	// From New on, for 2s, and on until node 2 received acquisitions (its
	// requests fail while the keeper connects over the slow link), at most
	// 10s.
	acquired := func() bool {
		n := 0
		for _, line := range lines() {
			for _, op := range monitoredOps(line) {
				if op.code == "a" {
					n++
				}
			}
		}
		return n >= 3
	}
	for start := time.Now(); time.Since(start) < 2*time.Second || !acquired() && time.Since(start) < 10*time.Second; {
		if lk, err := l.Lock(ctxT(t), "fresh", time.Second, Options{}); err == nil {
			_ = l.Unlock(ctxT(t), "fresh", lk.Token)
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond)

	var ops, acquires int
	for _, line := range lines() {
		for _, op := range monitoredOps(line) {
			ops++
			if op.code == "a" {
				acquires++
			}
			if op.deadline == "0" && op.code != "t" && op.code != "c" && op.code != "cp" {
				t.Errorf("node 2 received operation %q without a deadline: %s", op.code, line)
			}
		}
	}
	if acquires == 0 {
		t.Fatalf("node 2 received no acquisition over the slow link (%d operations): nothing checked", ops)
	}
	t.Logf("node 2 received %d operations, %d acquisitions, every one with a deadline", ops, acquires)
}

// monitoredOp is one operation of an opsScript call as MONITOR shows it.
type monitoredOp struct{ code, deadline string }

// monitoredOps returns the operations of the opsScript call in line, a line
// of MONITOR's output, or none when line is another command. The call's
// arguments are the keys (one per operation, then three), five per
// operation (code, token, x, attempt, deadline) and four more.
func monitoredOps(line string) []monitoredOp {
	// The arguments are quoted: they sit at the odd indexes of the split.
	parts := strings.Split(line, "\"")
	var q []string
	for i := 1; i < len(parts); i += 2 {
		q = append(q, parts[i])
	}
	if len(q) < 3 || !strings.EqualFold(q[0], "evalsha") && !strings.EqualFold(q[0], "eval") {
		return nil
	}
	numKeys, err := strconv.Atoi(q[2])
	if err != nil || numKeys < 3 {
		return nil
	}
	k := numKeys - 3
	argv := q[3+numKeys:]
	if len(argv) != 5*k+4 {
		return nil
	}
	ops := make([]monitoredOp, k)
	for i := range ops {
		ops[i] = monitoredOp{code: argv[5*i], deadline: argv[5*i+4]}
	}
	return ops
}

// monitor runs MONITOR on the node at addr until the test ends and returns
// a function that returns the lines it showed so far.
func monitor(tb testing.TB, addr string) func() []string {
	tb.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		tb.Fatalf("MONITOR: %v", err)
	}
	tb.Cleanup(func() { conn.Close() })
	rd := bufio.NewReader(conn)
	if _, err := conn.Write([]byte("MONITOR\r\n")); err != nil {
		tb.Fatalf("MONITOR: %v", err)
	}
	if l, err := rd.ReadString('\n'); err != nil || l != "+OK\r\n" {
		tb.Fatalf("MONITOR: %q, %v", l, err)
	}
	var (
		mu    sync.Mutex
		lines []string
		done  = make(chan struct{})
	)
	go func() {
		defer close(done)
		for {
			l, err := rd.ReadString('\n')
			if err != nil {
				return
			}
			mu.Lock()
			lines = append(lines, strings.TrimSuffix(l, "\r\n"))
			mu.Unlock()
		}
	}()
	tb.Cleanup(func() { conn.Close(); <-done })
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(lines)
	}
}
