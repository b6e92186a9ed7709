package quorum

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

var _ prometheus.Collector = (*Locker)(nil)

var (
	nodeUpDesc = prometheus.NewDesc("lockproxy_lock_node_up",
		"Whether the last call to the lock node succeeded (1) or failed (0). A node not called yet counts as up.",
		[]string{"node", "addr"}, nil)
	nodeErrorsDesc = prometheus.NewDesc("lockproxy_lock_node_errors_total",
		"Calls to the lock node that failed other than by a timeout. Calls cut short by the caller's context are not counted.",
		[]string{"node", "addr"}, nil)
	nodeTimeoutsDesc = prometheus.NewDesc("lockproxy_lock_node_timeouts_total",
		"Calls to the lock node that timed out (NodeTimeout or a socket timeout). Calls cut short by the caller's context are not counted.",
		[]string{"node", "addr"}, nil)
	nodeStateDesc = prometheus.NewDesc("lockproxy_lock_node_state",
		"1 for the lock node's current state: up (counts towards grants), down (its last call failed), recovering (lost its data; does not count until it recovers) or evicting (may evict keys: maxmemory-policy is not noeviction; never counts).",
		[]string{"node", "addr", "state"}, nil)
	nodeRecoveryDesc = prometheus.NewDesc("lockproxy_lock_node_recovery_deadline_seconds",
		"For a recovering lock node, the seconds until it counts again at the latest (every lock it may have held has expired); 0 otherwise. A copy of the live locks from the other nodes usually ends the recovery well before.",
		[]string{"node", "addr"}, nil)
	nodeLossesDesc = prometheus.NewDesc("lockproxy_lock_node_data_losses_total",
		"Times the lock node was seen without its marker: it lost its data (restart without persistence, flush, replacement) or was never used.",
		[]string{"node", "addr"}, nil)
	nodeRecoveriesDesc = prometheus.NewDesc("lockproxy_lock_node_recoveries_total",
		"Recoveries of the lock node that this proxy ended, by how: copy (the live locks were copied from the other nodes) or deadline (every lock it may have held had expired).",
		[]string{"node", "addr", "how"}, nil)
)

// NodeState is what a Locker knows of one lock node.
type NodeState string

// The states of a lock node.
const (
	NodeUp         NodeState = "up"         // answers, and counts towards grants
	NodeDown       NodeState = "down"       // its last call failed
	NodeRecovering NodeState = "recovering" // lost its data; does not count yet
	NodeEvicting   NodeState = "evicting"   // may evict keys; never counts
)

// NodeStatus describes one lock node as the Locker last saw it.
type NodeStatus struct {
	Index int
	Addr  string
	State NodeState
	// Reason says why the node is down (its last error) or recovering.
	Reason string
	// Until is, for a recovering node, when it counts again at the latest:
	// its recovery's deadline, MaxTTL after the loss was first seen. A copy
	// of the live locks from the other nodes usually ends the recovery
	// within a second. Zero in the other states.
	Until time.Time
}

// Status returns the state of every node, in the order of New's nodes, as
// the last calls and the watcher's last check saw it. It is safe for
// concurrent use.
func (l *Locker) Status() []NodeStatus {
	out := make([]NodeStatus, len(l.nodes))
	for i, n := range l.nodes {
		st := NodeStatus{Index: n.index, Addr: n.addr, State: NodeUp}
		n.health.mu.Lock()
		switch {
		case n.down.Load():
			st.State, st.Reason = NodeDown, n.health.lastErr
		case n.evicts.Load():
			st.State, st.Reason = NodeEvicting, "may evict lock keys (a memory limit with a maxmemory-policy other than noeviction)"
		case n.health.lost.Load():
			st.State, st.Until = NodeRecovering, n.health.deadline
			st.Reason = "lost its data (no marker): copying the live locks from the other nodes"
			if n.health.waitsCopy {
				st.Reason = "lost its data (no marker), and too few nodes that kept theirs answer to copy the live locks from: it counts again when every lock it may have held has expired"
			}
			if n.jumped.Load() {
				st.Reason = "its clock jumped forward, so its locks may have expired early: taken for a node that lost its data"
			}
		}
		n.health.mu.Unlock()
		out[i] = st
	}
	return out
}

// latencyBuckets span 0.1ms to about 13s.
var latencyBuckets = prometheus.ExponentialBuckets(0.0001, 2, 18)

func newWaitHistogram() prometheus.Histogram {
	return prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "lockproxy_lock_wait_seconds",
		Help:    "Time from a Lock call with a wait to the acquisition, for calls that acquired.",
		Buckets: latencyBuckets,
	})
}

func newHandoffHistogram() prometheus.Histogram {
	return prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "lockproxy_lock_handoff_seconds",
		Help:    "Time from a waiter's wake-up by a release notification to the acquisition, for wake-ups followed by an acquisition.",
		Buckets: latencyBuckets,
	})
}

// Describe sends the descriptors of the metrics Collect sends. It is part
// of prometheus.Collector.
func (l *Locker) Describe(ch chan<- *prometheus.Desc) {
	ch <- nodeUpDesc
	ch <- nodeErrorsDesc
	ch <- nodeTimeoutsDesc
	ch <- nodeStateDesc
	ch <- nodeRecoveryDesc
	ch <- nodeLossesDesc
	ch <- nodeRecoveriesDesc
	l.waitSeconds.Describe(ch)
	l.handoffSeconds.Describe(ch)
}

// Collect sends the Locker's metrics: lockproxy_lock_node_up,
// lockproxy_lock_node_errors_total, lockproxy_lock_node_timeouts_total,
// lockproxy_lock_node_state, lockproxy_lock_node_recovery_deadline_seconds,
// lockproxy_lock_node_data_losses_total and
// lockproxy_lock_node_recoveries_total for every node, labelled with its
// index ("0", "1", ...) and address, and the histograms
// lockproxy_lock_wait_seconds and lockproxy_lock_handoff_seconds. It is part of prometheus.Collector and safe
// for concurrent use, also after Close. The metric names are fixed, so two
// Lockers registered with one registry need prometheus.WrapRegistererWith
// to tell them apart.
func (l *Locker) Collect(ch chan<- prometheus.Metric) {
	for _, n := range l.nodes {
		up := 1.0
		if n.down.Load() {
			up = 0
		}
		idx := strconv.Itoa(n.index)
		ch <- prometheus.MustNewConstMetric(nodeUpDesc, prometheus.GaugeValue, up, idx, n.addr)
		ch <- prometheus.MustNewConstMetric(nodeErrorsDesc, prometheus.CounterValue, float64(n.errorCount.Load()), idx, n.addr)
		ch <- prometheus.MustNewConstMetric(nodeTimeoutsDesc, prometheus.CounterValue, float64(n.timeoutCount.Load()), idx, n.addr)
	}
	for _, st := range l.Status() {
		idx := strconv.Itoa(st.Index)
		for _, s := range []NodeState{NodeUp, NodeDown, NodeRecovering, NodeEvicting} {
			v := 0.0
			if st.State == s {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(nodeStateDesc, prometheus.GaugeValue, v, idx, st.Addr, string(s))
		}
		left := 0.0
		if !st.Until.IsZero() {
			left = max(time.Until(st.Until).Seconds(), 0)
		}
		ch <- prometheus.MustNewConstMetric(nodeRecoveryDesc, prometheus.GaugeValue, left, idx, st.Addr)
	}
	for _, n := range l.nodes {
		idx := strconv.Itoa(n.index)
		n.health.mu.Lock()
		losses, byCopy, byExpiry := n.health.losses, n.health.byCopy, n.health.byExpiry
		n.health.mu.Unlock()
		ch <- prometheus.MustNewConstMetric(nodeLossesDesc, prometheus.CounterValue, float64(losses), idx, n.addr)
		ch <- prometheus.MustNewConstMetric(nodeRecoveriesDesc, prometheus.CounterValue, float64(byCopy), idx, n.addr, "copy")
		ch <- prometheus.MustNewConstMetric(nodeRecoveriesDesc, prometheus.CounterValue, float64(byExpiry), idx, n.addr, "deadline")
	}
	l.waitSeconds.Collect(ch)
	l.handoffSeconds.Collect(ch)
}

// NodesUp returns the number of nodes whose last call succeeded; a node not
// called yet counts as up. Calls cut short by their caller's context do not
// change it. It is safe for concurrent use.
func (l *Locker) NodesUp() int {
	up := 0
	for _, n := range l.nodes {
		if !n.down.Load() {
			up++
		}
	}
	return up
}

// Ready asks every node for its state in parallel, each bounded by
// NodeTimeout, and returns nil when at least a majority answered and
// counts towards grants (kept its data), for a readiness probe. Otherwise
// it returns a *NoQuorumError wrapped with the state of every node that
// does not count (down, with its error, or recovering, with the time it
// counts again at the latest); when ctx ended first, the error wraps
// ctx.Err() too. The answers update the nodes' states like any call. Ready
// is safe for concurrent use; on a closed Locker it returns an error.
func (l *Locker) Ready(ctx context.Context) error {
	if l.isClosed() {
		return errClosed
	}
	start := time.Now()
	res := l.probe(ctx)
	fresh := l.fresh(res, start)
	if fresh {
		l.initFresh(ctx, res)
	}
	var answered tally
	votes := 0
	for _, r := range res {
		l.tally(&answered, r, fresh, start)
		if counts(r, fresh) {
			votes++
		}
	}
	if votes >= l.quorum {
		return nil
	}
	nq := answered.noQuorum(len(l.nodes))
	var why []string
	for _, st := range l.Status() {
		switch st.State {
		case NodeDown:
			why = append(why, fmt.Sprintf("node %d (%s) down: %s", st.Index, st.Addr, st.Reason))
		case NodeEvicting:
			why = append(why, fmt.Sprintf("node %d (%s) %s", st.Index, st.Addr, st.Reason))
		case NodeRecovering:
			until := ""
			if !st.Until.IsZero() {
				until = fmt.Sprintf(", by %s at the latest", st.Until.Format(time.RFC3339))
			}
			why = append(why, fmt.Sprintf("node %d (%s) recovering: %s%s", st.Index, st.Addr, st.Reason, until))
		}
	}
	err := fmt.Errorf("%w (%s)", nq, strings.Join(why, "; "))
	if cerr := ctxErr(ctx); cerr != nil {
		return fmt.Errorf("ready: %w: %w", err, cerr)
	}
	return err
}

// countFailure counts a failed call to n that its caller's context did not
// cut short, as a timeout or as an error. errReconnecting, every call's
// while a node is down (node.skips), is an error, known without searching
// its chain for a timeout (which allocates).
func (n *node) countFailure(err error) {
	if !errors.Is(err, errReconnecting) && isTimeout(err) {
		n.timeoutCount.Add(1)
	} else {
		n.errorCount.Add(1)
	}
}

// isTimeout reports whether err is a timeout: the per-node deadline, a
// socket deadline or go-redis's wait for a pooled connection.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, redis.ErrPoolTimeout) ||
		(errors.As(err, &ne) && ne.Timeout())
}

// sinceSeconds is the time since t in seconds, for a histogram.
func sinceSeconds(t time.Time) float64 { return time.Since(t).Seconds() }
