package quorum

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
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
)

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
	l.waitSeconds.Describe(ch)
	l.handoffSeconds.Describe(ch)
}

// Collect sends the Locker's metrics: lockproxy_lock_node_up,
// lockproxy_lock_node_errors_total and lockproxy_lock_node_timeouts_total
// for every node, labelled with its index ("0", "1", ...) and address, and
// the histograms lockproxy_lock_wait_seconds and
// lockproxy_lock_handoff_seconds. It is part of prometheus.Collector and safe
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

// Ready PINGs every node in parallel, each bounded by NodeTimeout, and
// returns nil when at least a majority answered, for a readiness probe. It
// returns a *NoQuorumError otherwise; when ctx ended first, the error wraps
// ctx.Err() too. The answers update the up/down state of the nodes like any
// call. Ready is safe for concurrent use; on a closed Locker it returns an
// error.
func (l *Locker) Ready(ctx context.Context) error {
	if l.isClosed() {
		return errClosed
	}
	answered := 0
	r := l.newRound(ctx, opPing, len(l.nodes))
	l.fanout(l.nodes, r, func(res []reply) {
		for _, r := range res {
			if r.err == nil {
				answered++
			}
		}
	})
	if answered >= l.quorum {
		return nil
	}
	nq := &NoQuorumError{Answered: answered, Total: len(l.nodes)}
	if err := ctxErr(ctx); err != nil {
		return fmt.Errorf("ready: %w: %w", nq, err)
	}
	return nq
}

// countFailure counts a failed call to n that its caller's context did not
// cut short, as a timeout or as an error.
func (n *node) countFailure(err error) {
	if isTimeout(err) {
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
