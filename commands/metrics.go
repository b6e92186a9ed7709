package commands

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockproxy/lockproxy/quorum"
)

var _ prometheus.Collector = (*Handler)(nil)

// outcome is one value of the command and outcome labels of
// lockproxy_commands_total; the Handler counts each in an atomic.
type outcome int

const (
	lockAcquired outcome = iota
	lockNotAcquired
	lockNoQuorum
	lockError
	lockBadRequest
	unlockReleased
	unlockNotHeld
	unlockNoQuorum
	unlockError
	unlockBadRequest
	extendExtended
	extendNotHeld
	extendNoQuorum
	extendError
	extendBadRequest
	mlockAcquired
	mlockNotAcquired
	mlockNoQuorum
	mlockError
	mlockBadRequest
	rlockAcquired
	rlockNotAcquired
	rlockNoQuorum
	rlockError
	rlockBadRequest
	lockinfoAnswered
	lockinfoNoQuorum
	lockinfoError
	lockinfoBadRequest
	locksAnswered
	locksNoQuorum
	locksError
	locksBadRequest
	fencedAccepted
	fencedStale
	fencedError
	fencedBadRequest
	numOutcomes
)

// outcomeNames are the values of the outcome label; the command label is
// the name of the command whose spec lists the outcome (see outcomeLabels).
var outcomeNames = [numOutcomes]string{
	lockAcquired:     "acquired",
	lockNotAcquired:  "not_acquired",
	lockNoQuorum:     "noquorum",
	lockError:        "error",
	lockBadRequest:   "bad_request",
	unlockReleased:   "released",
	unlockNotHeld:    "not_held",
	unlockNoQuorum:   "noquorum",
	unlockError:      "error",
	unlockBadRequest: "bad_request",
	extendExtended:   "extended",
	extendNotHeld:    "not_held",
	extendNoQuorum:   "noquorum",
	extendError:      "error",
	extendBadRequest: "bad_request",
	mlockAcquired:    "acquired",
	mlockNotAcquired: "not_acquired",
	mlockNoQuorum:    "noquorum",
	mlockError:       "error",
	mlockBadRequest:  "bad_request",
	rlockAcquired:    "acquired",
	rlockNotAcquired: "not_acquired",
	rlockNoQuorum:    "noquorum",
	rlockError:       "error",
	rlockBadRequest:  "bad_request",

	lockinfoAnswered:   "answered",
	lockinfoNoQuorum:   "noquorum",
	lockinfoError:      "error",
	lockinfoBadRequest: "bad_request",

	locksAnswered:    "answered",
	locksNoQuorum:    "noquorum",
	locksError:       "error",
	locksBadRequest:  "bad_request",
	fencedAccepted:   "accepted",
	fencedStale:      "stale",
	fencedError:      "error",
	fencedBadRequest: "bad_request",
}

var (
	commandsDesc = prometheus.NewDesc("lockproxy_commands_total",
		"Lock commands served (LOCK, UNLOCK, EXTEND, MLOCK, RLOCK, LOCKINFO, LOCKS, FENCED), by command and outcome.",
		[]string{"command", "outcome"}, nil)
	keepaliveExtensionsDesc = prometheus.NewDesc("lockproxy_keepalive_extensions_total",
		"Successful extensions of locks taken with KEEPALIVE.", nil, nil)
	keepaliveLostDesc = prometheus.NewDesc("lockproxy_keepalive_lost_total",
		"Locks taken with KEEPALIVE that the keepalive gave up: no longer held, or validity ran out before an extension succeeded.", nil, nil)
	locksHeldDesc = prometheus.NewDesc("lockproxy_locks_held",
		"Locks recorded on open client connections whose validity has not run out.", nil, nil)
)

// count adds one to the counter of o.
func (h *Handler) count(o outcome) { h.outcomes[o].Add(1) }

// countEngineErr counts an error from quorum other than the command's
// regular outcomes: noquorum for a *quorum.NoQuorumError, other otherwise.
func (h *Handler) countEngineErr(err error, noquorum, other outcome) {
	var nq *quorum.NoQuorumError
	if errors.As(err, &nq) {
		h.count(noquorum)
		return
	}
	h.count(other)
}

// argOutcome is the outcome of an error from Conn.lookup: a closed
// connection is an error, a missing token a bad request.
func argOutcome(err error, badRequest, other outcome) outcome {
	if errors.Is(err, errClosed) {
		return other
	}
	return badRequest
}

// Describe sends the descriptors of the metrics Collect sends. It is part
// of prometheus.Collector.
func (h *Handler) Describe(ch chan<- *prometheus.Desc) {
	ch <- commandsDesc
	ch <- keepaliveExtensionsDesc
	ch <- keepaliveLostDesc
	ch <- locksHeldDesc
}

// Collect sends the Handler's metrics: lockproxy_commands_total{command,
// outcome} for every command and outcome, lockproxy_keepalive_extensions_total,
// lockproxy_keepalive_lost_total and the gauge lockproxy_locks_held. It is
// part of prometheus.Collector and safe for concurrent use.
//
// The outcomes are acquired, not_acquired, noquorum, error and bad_request
// for lock; released, not_held, noquorum, error and bad_request for unlock;
// extended, not_held, noquorum, error and bad_request for extend;
// acquired, not_acquired, noquorum, error and bad_request for mlock (a
// -DEADLOCK counts as error).
// bad_request covers argument errors and a token-less UNLOCK or EXTEND of a
// lock the connection does not hold; error covers timeouts, cancellations
// and closed connections.
func (h *Handler) Collect(ch chan<- prometheus.Metric) {
	for o := range numOutcomes {
		l := outcomeLabels[o]
		ch <- prometheus.MustNewConstMetric(commandsDesc, prometheus.CounterValue, float64(h.outcomes[o].Load()), l[0], l[1])
	}
	ch <- prometheus.MustNewConstMetric(keepaliveExtensionsDesc, prometheus.CounterValue, float64(h.keepaliveExtensions.Load()))
	ch <- prometheus.MustNewConstMetric(keepaliveLostDesc, prometheus.CounterValue, float64(h.keepaliveLost.Load()))
	ch <- prometheus.MustNewConstMetric(locksHeldDesc, prometheus.GaugeValue, float64(h.held(time.Now())))
}

// Stats are the Handler's counters since New, for the lockproxy section of
// INFO. Each matches a series of the Handler's metrics.
type Stats struct {
	Acquired    uint64 // LOCK and RLOCK replies with a lock
	NotAcquired uint64 // LOCK and RLOCK replies with null: held by another owner
	NoQuorum    uint64 // LOCK, RLOCK, UNLOCK and EXTEND replies with NOQUORUM
	Released    uint64 // UNLOCK replies with 1
	Extended    uint64 // EXTEND replies with a validity (keepalives not included)

	KeepaliveExtensions uint64 // successful extensions by KEEPALIVE
	KeepaliveLost       uint64 // KEEPALIVE locks given up

	// Held is the number of locks recorded on open connections whose
	// validity has not run out, as lockproxy_locks_held.
	Held int
}

// Stats returns the Handler's counters, for an INFO lockproxy section. It
// is safe for concurrent use; the counters are read one by one, not as one
// snapshot.
func (h *Handler) Stats() Stats {
	return Stats{
		Acquired:            h.outcomes[lockAcquired].Load() + h.outcomes[rlockAcquired].Load(),
		NotAcquired:         h.outcomes[lockNotAcquired].Load() + h.outcomes[rlockNotAcquired].Load(),
		NoQuorum:            h.outcomes[lockNoQuorum].Load() + h.outcomes[unlockNoQuorum].Load() + h.outcomes[extendNoQuorum].Load() + h.outcomes[rlockNoQuorum].Load(),
		Released:            h.outcomes[unlockReleased].Load(),
		Extended:            h.outcomes[extendExtended].Load(),
		KeepaliveExtensions: h.keepaliveExtensions.Load(),
		KeepaliveLost:       h.keepaliveLost.Load(),
		Held:                h.held(time.Now()),
	}
}

// lockID identifies a lock, so that one recorded on several connections
// (LOCK ... TOKEN again after a reconnect) counts once.
type lockID struct{ resource, token string }

// held counts the distinct locks recorded on open connections whose
// validity lasts beyond now. It locks the Handler, then each Conn in turn.
func (h *Handler) held(now time.Time) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	seen := make(map[lockID]struct{})
	for c := range h.conns {
		c.mu.Lock()
		for resource, hs := range c.held {
			for _, hd := range hs {
				if hd.validAt(now) {
					seen[lockID{resource, hd.token}] = struct{}{}
				}
			}
		}
		c.mu.Unlock()
	}
	return len(seen)
}
