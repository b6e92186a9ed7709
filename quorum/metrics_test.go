package quorum

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
)

// registry registers l with a fresh registry, which checks that Describe
// and Collect agree.
func registry(tb testing.TB, l *Locker) *prometheus.Registry {
	tb.Helper()
	reg := prometheus.NewRegistry()
	if err := reg.Register(l); err != nil {
		tb.Fatalf("Register: %v", err)
	}
	return reg
}

// metric gathers reg and returns the metric of family name whose labels are
// exactly labels (name, value, name, value, ...).
func metric(tb testing.TB, reg prometheus.Gatherer, name string, labels ...string) *dto.Metric {
	tb.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		tb.Fatalf("Gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel())*2 != len(labels) {
				continue
			}
			for i, lp := range m.GetLabel() {
				if lp.GetName() != labels[2*i] || lp.GetValue() != labels[2*i+1] {
					continue next
				}
			}
			return m
		}
	}
	tb.Fatalf("no metric %s%q", name, labels)
	return nil
}

// nodeMetrics is what the metrics say about node i.
type nodeMetrics struct{ up, errors, timeouts float64 }

func nodeStats(tb testing.TB, reg prometheus.Gatherer, c *cluster, i int) nodeMetrics {
	tb.Helper()
	labels := []string{"addr", c.servers[i].Addr, "node", strconv.Itoa(i)} // sorted by name
	return nodeMetrics{
		up:       metric(tb, reg, "lockproxy_lock_node_up", labels...).GetGauge().GetValue(),
		errors:   metric(tb, reg, "lockproxy_lock_node_errors_total", labels...).GetCounter().GetValue(),
		timeouts: metric(tb, reg, "lockproxy_lock_node_timeouts_total", labels...).GetCounter().GetValue(),
	}
}

func histogram(tb testing.TB, reg prometheus.Gatherer, name string) (count uint64, sum time.Duration) {
	tb.Helper()
	h := metric(tb, reg, name).GetHistogram()
	return h.GetSampleCount(), time.Duration(h.GetSampleSum() * float64(time.Second))
}

func TestMetricsLint(t *testing.T) {
	c := startCluster(t, 3)
	l := newLocker(t, c, testConfig())
	registry(t, l)
	// 3 nodes times 11 series (up, errors, timeouts, 4 states, recovery
	// deadline, data losses, 2 kinds of recovery), and the two histograms.
	if n := testutil.CollectAndCount(l); n != 35 {
		t.Errorf("Collect sent %d metrics, want 35", n)
	}
	problems, err := testutil.CollectAndLint(l)
	if err != nil {
		t.Fatalf("CollectAndLint: %v", err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

func TestNodeMetrics(t *testing.T) {
	c := startCluster(t, 3)
	l := newLocker(t, c, quiet(testConfig()))
	reg := registry(t, l)
	ctx := ctxT(t)
	check := func(what string, i int, want nodeMetrics) {
		t.Helper()
		if got := nodeStats(t, reg, c, i); got != want {
			t.Errorf("%s: node %d metrics %+v, want %+v", what, i, got, want)
		}
	}

	for i := range 3 {
		check("before any call", i, nodeMetrics{up: 1})
	}
	mustUnlock(t, l, "orders", mustLock(t, l, "orders", time.Second, Options{}).Token)
	for i := range 3 {
		check("all nodes up", i, nodeMetrics{up: 1})
	}

	// A call cut short by the caller's context says nothing about a node.
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := l.Lock(cancelled, "orders", time.Second, Options{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Lock with a cancelled context: %v", err)
	}
	for i := range 3 {
		check("cancelled call", i, nodeMetrics{up: 1})
	}

	c.kill(1)
	mustUnlock(t, l, "orders", mustLock(t, l, "orders", time.Second, Options{}).Token)
	check("node 1 killed", 0, nodeMetrics{up: 1})
	check("node 1 killed", 1, nodeMetrics{up: 0, errors: 2}) // Lock and Unlock
	check("node 1 killed", 2, nodeMetrics{up: 1})
	if n := l.NodesUp(); n != 2 {
		t.Errorf("NodesUp with node 1 killed = %d, want 2", n)
	}

	c.servers[2].Pause()
	_, err := l.Lock(ctx, "orders", 10*time.Second, Options{})
	var nq *NoQuorumError
	if !errors.As(err, &nq) {
		t.Fatalf("Lock with 1 of 3 nodes answering: %v, want NoQuorumError", err)
	}
	// The attempt and its cleanup (which asks the nodes that did not
	// answer) both ran while node 2 was paused; the cleanup times out too,
	// unless it came while the keeper reconnects (conn.go), and then it
	// fails at once, an error. The keepers' requests in the background are not counted.
	if got := nodeStats(t, reg, c, 2); got != (nodeMetrics{up: 0, timeouts: 2}) && got != (nodeMetrics{up: 0, timeouts: 1, errors: 1}) {
		t.Errorf("node 2 paused: node 2 metrics %+v, want down with 2 timeouts, or a timeout and an error", got)
	}
	// Node 1, known to be down, failed the attempt's request without
	// sending it (no dial): it needs no cleanup there.
	check("node 1 still killed", 1, nodeMetrics{up: 0, errors: 3})
	check("node 0 up", 0, nodeMetrics{up: 1})
	if n := l.NodesUp(); n != 1 {
		t.Errorf("NodesUp with node 1 killed and node 2 paused = %d, want 1", n)
	}
	c.servers[2].Resume()

	// Node 1 comes back empty: its first answer shows the loss, and the
	// watcher copies the lock state back to it.
	c.restart(1)
	waitClientUp(t, l, 1)
	if _, err := l.Extend(ctx, "orders", "t", time.Second); err == nil {
		t.Fatal("Extend of a lock nobody holds succeeded")
	}
	waitRecovered(t, l, 1)
	// "orders" may still be held by the attempt whose cleanup never reached
	// the paused node 2, and node 1 got that lock back with the copy.
	mustUnlock(t, l, "invoices", mustLock(t, l, "invoices", time.Second, Options{}).Token)
	for i := range 3 {
		if got := nodeStats(t, reg, c, i); got.up != 1 {
			t.Errorf("after recovery: node %d up = %v, want 1", i, got.up)
		}
	}
	if n := l.NodesUp(); n != 3 {
		t.Errorf("NodesUp after recovery = %d, want 3", n)
	}
}

func TestReady(t *testing.T) {
	c := startCluster(t, 3)
	l := newLocker(t, c, testConfig())
	reg := registry(t, l)
	ctx := ctxT(t)
	warm(t, c, l)

	if err := l.Ready(ctx); err != nil {
		t.Fatalf("Ready with 3 of 3 nodes: %v", err)
	}
	c.kill(0)
	if err := l.Ready(ctx); err != nil {
		t.Errorf("Ready with 2 of 3 nodes: %v", err)
	}
	if up := nodeStats(t, reg, c, 0).up; up != 0 || l.NodesUp() != 2 {
		t.Errorf("after Ready with node 0 killed: node_up %v, NodesUp %d; want 0 and 2", up, l.NodesUp())
	}
	c.servers[1].Pause()
	err := l.Ready(ctx)
	var nq *NoQuorumError
	if !errors.As(err, &nq) || nq.Answered != 1 || nq.Total != 3 {
		t.Errorf("Ready with 1 of 3 nodes: %v, want NoQuorumError{1, 3}", err)
	}
	if n := l.NodesUp(); n != 1 {
		t.Errorf("NodesUp with 1 of 3 nodes = %d, want 1", n)
	}

	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	err = l.Ready(cancelled)
	if !errors.As(err, &nq) || !errors.Is(err, context.Canceled) {
		t.Errorf("Ready with a cancelled context: %v, want a NoQuorumError wrapping context.Canceled", err)
	}

	// Node 0 comes back empty while node 1 is paused: it answers, but
	// cannot count until it has the lock state back, which takes both
	// other nodes. Ready says why.
	c.restart(0)
	waitClientUp(t, l, 0)
	err = l.Ready(ctx)
	if !errors.As(err, &nq) || nq.Answered != 2 || nq.Recovering != 1 ||
		!strings.Contains(err.Error(), "node 0 ("+c.servers[0].Addr+") recovering: lost its data") ||
		!strings.Contains(err.Error(), "node 1 ("+c.servers[1].Addr+") down") {
		t.Errorf("Ready with node 0 recovering and node 1 paused: %v", err)
	}
	// The deadline is known once the watcher registered the recovery.
	eventually(t, "recovery deadline", func() bool { return !l.Status()[0].Until.IsZero() })
	if st := l.Status()[0]; st.State != NodeRecovering || time.Until(st.Until) < 50*time.Minute {
		t.Errorf("node 0 status %+v, want recovering until about MaxTTL from now", st)
	}
	c.servers[1].Resume()
	waitRecovered(t, l, 0)
	if err := l.Ready(ctx); err != nil {
		t.Errorf("Ready after node 0 recovered: %v", err)
	}
	if up := nodeStats(t, reg, c, 0).up; up != 1 {
		t.Errorf("node_up of node 0 after Ready reached it = %v, want 1", up)
	}

	l.Close()
	if err := l.Ready(ctx); err == nil {
		t.Error("Ready on a closed Locker: nil")
	}
}

func TestWaitAndHandoffMetrics(t *testing.T) {
	c := startCluster(t, 3)
	l := newLocker(t, c, noFallback(testConfig()))
	reg := registry(t, l)
	ctx := ctxT(t)
	c.waitSubscribed(t, 1)
	check := func(what string, wantWait, wantHandoff uint64) {
		t.Helper()
		w, _ := histogram(t, reg, "lockproxy_lock_wait_seconds")
		h, _ := histogram(t, reg, "lockproxy_lock_handoff_seconds")
		if w != wantWait || h != wantHandoff {
			t.Errorf("%s: %d wait and %d handoff samples, want %d and %d", what, w, h, wantWait, wantHandoff)
		}
	}

	holder := mustLock(t, l, "orders", 10*time.Second, Options{})
	check("Lock without a wait", 0, 0)
	if _, err := l.Lock(ctx, "orders", time.Second, Options{Wait: 20 * time.Millisecond}); !errors.Is(err, ErrNotAcquired) {
		t.Fatalf("Lock with a wait that runs out: %v", err)
	}
	check("wait that ran out", 0, 0)

	base := c.scriptCalls(t, 0)
	waiting := lockAsync(t, ctx, l, "orders", 10*time.Second, Options{Wait: 10 * time.Second})
	eventually(t, "the head's first attempt", func() bool { return c.scriptCalls(t, 0) > base })
	const held = 100 * time.Millisecond
	time.Sleep(held) // the waiter waits at least this long
	check("waiter still waiting", 0, 0)
	// The holder refreshing its lock with a wait, past the queued waiter.
	mustLock(t, l, "orders", 10*time.Second, Options{Token: holder.Token, Wait: time.Second})
	check("refresh by the holder", 1, 0)
	_, before := histogram(t, reg, "lockproxy_lock_wait_seconds")
	mustUnlock(t, l, "orders", holder.Token)
	r := recv(t, waiting)
	if r.err != nil {
		t.Fatalf("waiter: %v", r.err)
	}
	check("handoff", 2, 1)
	_, wait := histogram(t, reg, "lockproxy_lock_wait_seconds")
	wait -= before
	_, handoff := histogram(t, reg, "lockproxy_lock_handoff_seconds")
	if wait < held || wait > 10*time.Second {
		t.Errorf("wait sample %v, want between %v and 10s", wait, held)
	}
	if handoff <= 0 || handoff > wait || handoff > time.Second {
		t.Errorf("handoff sample %v, want positive, under the wait (%v) and well under 1s", handoff, wait)
	}

	// A wait that acquires at once counts as a wait, not as a handoff.
	mustUnlock(t, l, "orders", r.lk.Token)
	mustLock(t, l, "orders", time.Second, Options{Wait: time.Second})
	check("wait that acquired at once", 3, 1)
}

// TestHandoffOnlyOnWokenAttempt wakes a waiter with a release notification
// while the lock is still held: the attempt after that wake-up fails, and
// the acquisition that follows when the holder's ttl runs out is a wait but
// no handoff.
func TestHandoffOnlyOnWokenAttempt(t *testing.T) {
	c := startCluster(t, 3)
	l := newLocker(t, c, noFallback(testConfig()))
	reg := registry(t, l)
	ctx := ctxT(t)
	c.waitSubscribed(t, 1)

	mustLock(t, l, "orders", 10*time.Second, Options{})
	base := c.scriptCalls(t, 0)
	waiting := lockAsync(t, ctx, l, "orders", 10*time.Second, Options{Wait: 10 * time.Second})
	eventually(t, "the head's first attempt", func() bool { return c.scriptCalls(t, 0) > base })

	for i, a := range c.admin {
		if err := a.PExpire(ctx, "lockproxy:lock:orders", 500*time.Millisecond).Err(); err != nil {
			t.Fatalf("PEXPIRE on node %d: %v", i, err)
		}
	}
	base = c.scriptCalls(t, 0)
	if err := c.admin[0].Publish(ctx, "lockproxy:released", "orders").Err(); err != nil {
		t.Fatalf("PUBLISH: %v", err)
	}
	eventually(t, "the attempt after the wake-up", func() bool { return c.scriptCalls(t, 0) > base })
	r := recv(t, waiting)
	if r.err != nil {
		t.Fatalf("waiter: %v", r.err)
	}
	if n, _ := histogram(t, reg, "lockproxy_lock_wait_seconds"); n != 1 {
		t.Errorf("%d wait samples, want 1", n)
	}
	if n, _ := histogram(t, reg, "lockproxy_lock_handoff_seconds"); n != 0 {
		t.Errorf("%d handoff samples after an acquisition on the ttl's expiry, want 0", n)
	}
}
