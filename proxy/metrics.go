package proxy

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

var _ prometheus.Collector = (*Proxy)(nil)

// metrics are the proxy's counters. The hot path only adds to atomics and
// observes the latency histogram; Collect turns the atomics into metrics.
type metrics struct {
	start          time.Time
	connections    atomic.Uint64
	maxClients     atomic.Uint64
	protocolErrors atomic.Uint64
	forwarded      atomic.Uint64
	unavailable    atomic.Uint64
	connLost       atomic.Uint64
	local          atomic.Uint64
	aclRefused     atomic.Uint64 // lock commands Redis's ACL refused at the proxy
	sampled        atomic.Uint64
	loopClients    atomic.Int64  // clients the reading loop reads now (loop.go)
	handedOver     atomic.Uint64 // clients the reading loop handed to their goroutines
	latency        prometheus.Histogram
}

var (
	descClients     = prometheus.NewDesc("lockproxy_client_connections", "Client connections open now.", nil, nil)
	descConnections = prometheus.NewDesc("lockproxy_client_connections_total", "Client connections accepted.", nil, nil)
	descRejected    = prometheus.NewDesc("lockproxy_clients_rejected_total", "Client connections closed for breaking a limit.", []string{"reason"}, nil)
	descForwarded   = prometheus.NewDesc("lockproxy_commands_forwarded_total", "Commands forwarded to the backend.", nil, nil)
	descForwardErrs = prometheus.NewDesc("lockproxy_forward_errors_total", "Forwarded commands answered with an error because the backend could not be reached (unavailable) or its connection broke before the reply (connection_lost).", []string{"reason"}, nil)
	descRefreshes   = prometheus.NewDesc("lockproxy_cluster_slot_map_refreshes_total", "Readings of a Redis Cluster's slot map (at start, after MOVED, while a slot is not served).", nil, nil)
	descRedirects   = prometheus.NewDesc("lockproxy_cluster_redirections_total", "MOVED and ASK replies from a Redis Cluster, followed by the proxy.", []string{"kind"}, nil)
	descPerMaster   = prometheus.NewDesc("lockproxy_cluster_commands_forwarded_total", "Commands forwarded to each master of a Redis Cluster.", []string{"master"}, nil)
	descLoopClients = prometheus.NewDesc("lockproxy_read_loop_clients", "Client connections the reading loop reads now (read_loop).", nil, nil)
	descHandedOver  = prometheus.NewDesc("lockproxy_read_loop_handovers_total", "Clients the reading loop handed to a goroutine of their own, at their first command that is not forwarded on a shared connection.", nil, nil)
	descLocal       = prometheus.NewDesc("lockproxy_local_commands_total", "Commands the proxy answered itself (lock commands, INFO lockproxy, COMMAND, refusals).", nil, nil)
	descACLRefused  = prometheus.NewDesc("lockproxy_acl_refused_total", "Lock commands refused by Redis's ACL rules at the proxy (the command's category @lock, or a resource checked as a key).", nil, nil)
	descPrimary     = prometheus.NewDesc("lockproxy_backend_primary", "1 with the address commands are forwarded to; 0 with addr=\"\" while Sentinel names no primary the proxy could confirm.", []string{"addr"}, nil)
	descFailovers   = prometheus.NewDesc("lockproxy_backend_failovers_total", "Changes of the backend primary the proxy followed (Sentinel).", nil, nil)
	descSentinels   = prometheus.NewDesc("lockproxy_backend_sentinels_answering", "Sentinels that answered the last query for the primary.", nil, nil)
)

func newMetrics() *metrics {
	return &metrics{
		start: time.Now(),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "lockproxy_backend_latency_seconds",
			Help:    "Time from writing a forwarded command to the backend to reading its reply (blocking commands included); one command in 8 is measured.",
			Buckets: prometheus.ExponentialBuckets(0.00005, 2, 20),
		}),
	}
}

// since returns the time since the proxy started: a monotonic timestamp.
func (m *metrics) since() int64 { return int64(time.Since(m.start)) }

// latencySample is how often a forwarded command's latency is measured:
// reading the clock and observing the histogram for every command costs a
// tenth of the forwarding path with deep pipelines.
const latencySample = 32

// stamp returns the timestamp of a command whose latency is measured, one
// command in latencySample, and 0 for the others.
func (m *metrics) stamp() int64 {
	if m.sampled.Add(1)%latencySample != 0 {
		return 0
	}
	return max(m.since(), 1)
}

// stampRun counts n commands sent together, as n calls of stamp would,
// and returns the index among them of the one measured, or -1, and its
// timestamp. n is below latencySample.
func (m *metrics) stampRun(n int) (int, int64) {
	last := m.sampled.Add(uint64(n))
	i := n - 1 - int(last%latencySample)
	if i < 0 {
		return -1, 0
	}
	return i, max(m.since(), 1)
}

// Describe implements prometheus.Collector.
func (p *Proxy) Describe(ch chan<- *prometheus.Desc) { prometheus.DescribeByCollect(p, ch) }

// Collect implements prometheus.Collector.
func (p *Proxy) Collect(ch chan<- prometheus.Metric) {
	m := p.m
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	ch <- prometheus.MustNewConstMetric(descClients, prometheus.GaugeValue, float64(p.clients.Load()))
	counter(descConnections, m.connections.Load())
	counter(descRejected, m.maxClients.Load(), "max_clients")
	counter(descRejected, m.protocolErrors.Load(), "protocol")
	counter(descForwarded, m.forwarded.Load())
	counter(descForwardErrs, m.unavailable.Load(), "unavailable")
	counter(descForwardErrs, m.connLost.Load(), "connection_lost")
	counter(descLocal, m.local.Load())
	if p.looping.Load() {
		ch <- prometheus.MustNewConstMetric(descLoopClients, prometheus.GaugeValue, float64(m.loopClients.Load()))
		counter(descHandedOver, m.handedOver.Load())
	}
	if p.acl != nil {
		counter(descACLRefused, m.aclRefused.Load())
	}
	bs := p.Backend()
	known := 0.0
	if bs.Primary != "" {
		known = 1
	}
	ch <- prometheus.MustNewConstMetric(descPrimary, prometheus.GaugeValue, known, bs.Primary)
	counter(descFailovers, bs.Failovers)
	if bs.Sentinel {
		ch <- prometheus.MustNewConstMetric(descSentinels, prometheus.GaugeValue, float64(bs.SentinelsAnswering))
	}
	if r := p.router; r != nil {
		counter(descRefreshes, r.Refreshes.Load())
		counter(descRedirects, r.Moved.Load(), "moved")
		counter(descRedirects, r.Asked.Load(), "ask")
		r.PerMaster.Range(func(k, v any) bool {
			counter(descPerMaster, v.(*atomic.Uint64).Load(), k.(string))
			return true
		})
	}
	m.latency.Collect(ch)
}

// Stats is a snapshot of the proxy's counters, for INFO.
type Stats struct {
	Clients, Connections, Forwarded, ForwardErrors, Local uint64
}

// Stats returns the proxy's counters. It is safe for concurrent use.
func (p *Proxy) Stats() Stats {
	m := p.m
	return Stats{
		Clients:       uint64(p.clients.Load()),
		Connections:   m.connections.Load(),
		Forwarded:     m.forwarded.Load(),
		ForwardErrors: m.unavailable.Load() + m.connLost.Load(),
		Local:         m.local.Load(),
	}
}
