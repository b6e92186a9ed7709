package quorum

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// Locker runs Redlock across a fixed set of lock nodes. It is safe for
// concurrent use. Several Lockers (in one process or many) may share nodes;
// they then exclude each other and wake each other's waiters. A Locker is a
// prometheus.Collector of its node health and wait times; see Collect.
type Locker struct {
	cfg    Config
	logger *zap.Logger
	nodes  []*node
	quorum int

	lockPrefix  string // "<prefix>lock:"
	channel     string // "<prefix>released"
	fenceArg    any    // "<prefix>fence", "<prefix>intact", "<prefix>recovery"
	markerArg   any    // and the channel as script arguments, boxed once
	recoveryArg any
	channelArg  any
	evictedArg  string // "<prefix>evicted"
	clockArg    any    // "<prefix>clock", boxed once
	bandArg     any    // ClockTolerance/2 in ms, boxed once

	mu       sync.Mutex
	queues   map[string]*waitQueue              // resources with local waiters only
	placing  map[string]map[string][]*placement // locks still to be placed, by resource and token (place.go)
	bgClosed bool                               // Close has begun: start no more bg work
	bg       sync.WaitGroup                     // placements running
	born     time.Time                          // New's time, on the monotonic clock
	clock    *refClock                          // the reference clock (clock.go)
	seenAt   atomic.Int64                       // ns after born that some node first had a marker or a recovery; 0: never

	initMu   sync.Mutex
	initN    int           // initFresh calls in flight
	initDone chan struct{} // closed when initN drops to 0; nil while none runs

	poke    chan struct{} // capacity 1: the watcher should look at once
	watchWG sync.WaitGroup
	keepWG  sync.WaitGroup // the node keepers (conn.go)

	attemptPrefix string        // random, for this Locker's attempt ids
	attemptSeq    atomic.Uint64 // the last attempt id's number

	subCtx    context.Context // ends the subscribers
	subCancel context.CancelFunc
	subWG     sync.WaitGroup
	batchWG   sync.WaitGroup // the node batchers
	done      chan struct{}  // closed by Close
	closeOnce sync.Once
	closeErr  error

	waitSeconds    prometheus.Histogram // Lock calls with a wait that acquired
	handoffSeconds prometheus.Histogram // wake-up by a release to acquisition
	// ridersGranted counts the readers granted in the round of a reader
	// ahead of them (shared_group.go).
	ridersGranted atomic.Int64
}

type node struct {
	index  int
	addr   string
	client *redis.Client // for the watcher's and the recovery's commands
	// batches is the batcher's own client: its pool holds the connection
	// the keeper keeps warm, and no other command takes it or dials beside
	// it (see conn.go).
	batches *redis.Client
	sub     *redis.PubSub
	down    atomic.Bool // last call outcome; logged once per change
	health  health      // whether the node kept its data (recovery.go)
	evicts  atomic.Bool // the node may evict keys: its grants do not count
	// jumped is set while a reply showed the node's clock ahead (clock.go)
	// and the watcher has not deleted its marker yet.
	jumped atomic.Bool

	errorCount   atomic.Uint64 // failed calls other than timeouts
	timeoutCount atomic.Uint64 // timed-out calls

	// The batcher's queue (see batch.go).
	wake     chan struct{} // capacity 1: pending is not empty
	mu       sync.Mutex
	pending  []request
	closed   bool             // the batcher stopped; requests fail at once
	cleanups []pendingCleanup // cleanups to send again (conn.go)
	// resend is held while kept cleanups are taken and queued again (by
	// the keeper, retryCleanups, or ahead of a reentrant attempt,
	// cleanupsFirst): a reentrant attempt queued after cleanupsFirst then
	// finds every cleanup of its token's earlier attempts queued ahead of
	// it, also those that the keeper took just before (reconnecting to a
	// node that was down, when it holds many).
	resend sync.Mutex
	// placements the node did not answer, to run again (place.go)
	placements []*placement

	// The keeper (conn.go): the last reading of the node's clock, and a
	// wake-up after a failed call.
	clock     atomic.Pointer[nodeClock]
	redial    chan struct{} // capacity 1
	reachable atomic.Bool   // no batch went unanswered since the last answer
	// refused: the last batch could not connect (the node's host refused
	// the connection): until a batch is answered, only the keeper's
	// requests go to the node (conn.go).
	refused   atomic.Bool
	rttLow    atomic.Int64 // round trip of a batch, ns, quick to fall (conn.go)
	dialed    atomic.Int64 // when the last dial ended, ns after dialClock's birth
	dialTook  atomic.Int64 // how long it took, ns
	refusedAt atomic.Int64 // when a dial last failed other than by a timeout, as dialed

	// Used by the batcher only: its pipeline, and buffers send reuses.
	pipe redis.Pipeliner
	cmds []redis.Cmder
	args []any
}

// New returns a Locker with two go-redis clients per entry of nodes (one
// that only the node's batcher uses, with at most 4 connections, so that
// the connection the keeper keeps warm is the one the calls find; one for
// everything else) and starts, for each node, a goroutine subscribed to
// release notifications,
// one that sends the node's calls in batches and one that keeps a
// connection warm and reads the node's clock (conn.go); Close stops them. New does not
// contact the nodes, so it succeeds while nodes are down.
//
// The options are copied and overridden where they would defeat Redlock's
// timing: MaxRetries is -1 (a retry would silently spend the lock's ttl),
// ContextTimeoutEnabled is true, DialerRetries is 1, PipelinePoolSize is
// -1 (pipelines use the main pool, which the keeper keeps warm),
// DisableIdentity is true (no CLIENT SETINFO: a round trip less to connect),
// DialTimeout and PoolTimeout are at most cfg.NodeTimeout, and ReadTimeout
// and WriteTimeout at most 3*cfg.NodeTimeout (the keeper's bound, see
// conn.go; every call is bounded by its context's deadline, at most
// NodeTimeout). The Dialer is wrapped so that go-redis never sees a dial
// fail (see dialer). While a node refused the last connection (it is
// down), or does not answer over a link too slow for a call to dial it,
// its calls fail at once without a dial and only its keeper reaches out to
// it (conn.go): a node that comes back is used by the next call after the
// keeper reached it, at most 100ms (the keeper's longest backoff) and a
// reconnection after it answers. An unset Protocol becomes 2 (RESP2): the scripts' replies are the same in both, and RESP3
// makes go-redis look for push notifications before every reply it reads,
// which costs CPU on every call.
//
// New also starts the watcher, which checks every node each
// cfg.ProbeInterval and brings back nodes that lost their data (see
// recovery.go).
//
// Any number of nodes from 1 up works; the quorum is len(nodes)/2+1. A nil
// logger means zap.NewNop(); the Locker logs only when a node goes down,
// comes back, loses its data or counts again.
func New(nodes []*redis.Options, cfg Config, logger *zap.Logger) (*Locker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if len(nodes) == 0 {
		return nil, errors.New("quorum: no lock nodes")
	}
	for i, o := range nodes {
		if o == nil {
			return nil, fmt.Errorf("quorum: lock node %d has nil options", i)
		}
	}
	if logger == nil {
		logger = zap.NewNop()
	}
	cfg.ClockTolerance = cfg.clockTolerance()
	ctx, cancel := context.WithCancel(context.Background())
	l := &Locker{
		cfg:         cfg,
		logger:      logger,
		quorum:      len(nodes)/2 + 1,
		lockPrefix:  cfg.KeyPrefix + "lock:",
		channel:     cfg.KeyPrefix + "released",
		fenceArg:    cfg.KeyPrefix + "fence",
		markerArg:   cfg.KeyPrefix + "intact",
		recoveryArg: cfg.KeyPrefix + "recovery",
		channelArg:  cfg.KeyPrefix + "released",
		evictedArg:  cfg.KeyPrefix + "evicted",
		clockArg:    cfg.KeyPrefix + "clock",
		bandArg:     (cfg.ClockTolerance / 2).Milliseconds(),
		born:        time.Now(),
		queues:      make(map[string]*waitQueue),
		placing:     make(map[string]map[string][]*placement),
		subCtx:      ctx,
		subCancel:   cancel,
		done:        make(chan struct{}),
		poke:        make(chan struct{}, 1),

		attemptPrefix: newAttemptPrefix(),

		waitSeconds:    newWaitHistogram(),
		handoffSeconds: newHandoffHistogram(),
	}
	l.clock = newRefClock(len(nodes), l.quorum, cfg)
	for i, o := range nodes {
		opt := *o
		opt.MaxRetries = -1
		opt.ContextTimeoutEnabled = true
		opt.DialerRetries = 1
		opt.DialTimeout = bound(opt.DialTimeout, cfg.NodeTimeout)
		// Every call carries a context deadline (at most NodeTimeout);
		// the keeper's may be longer, to reconnect over a slow link.
		opt.ReadTimeout = bound(opt.ReadTimeout, 3*cfg.NodeTimeout)
		opt.WriteTimeout = bound(opt.WriteTimeout, 3*cfg.NodeTimeout)
		opt.PoolTimeout = bound(opt.PoolTimeout, cfg.NodeTimeout)
		if opt.Protocol == 0 {
			opt.Protocol = 2
		}
		// CLIENT SETINFO only names the library in CLIENT LIST, and costs a
		// round trip on every new connection: over a slow link, one more
		// round trip before a node that comes back is used (conn.go).
		opt.DisableIdentity = true
		// The batcher's pipelines share the main pool with the keeper, which
		// keeps a connection of it warm (conn.go).
		opt.PipelinePoolSize = -1
		n := &node{
			index:  i,
			addr:   opt.Addr,
			wake:   make(chan struct{}, 1),
			redial: make(chan struct{}, 1),
		}
		n.reachable.Store(true) // until a call finds otherwise
		direct := opt
		direct.Dialer = dialer(&opt, nil)
		c := redis.NewClient(&direct)
		n.client = c
		n.sub = c.Subscribe(ctx) // no channel yet: no I/O here
		// One batch is in flight at a time: its connection, and a few
		// dialed in the background for batches that gave up.
		opt.PoolSize, opt.MinIdleConns, opt.MaxIdleConns = 4, 0, 2
		opt.Dialer = dialer(&opt, n)
		n.batches = redis.NewClient(&opt)
		n.pipe = n.batches.Pipeline()
		l.nodes = append(l.nodes, n)
	}
	for _, n := range l.nodes {
		l.subWG.Add(1)
		go l.subscribe(n)
		l.batchWG.Add(1)
		go l.batch(n)
		l.keepWG.Add(1)
		go l.keep(n)
	}
	l.watchWG.Add(1)
	go l.watch()
	return l, nil
}

// bound returns v, or limit when v is unset, disabled or larger.
func bound(v, limit time.Duration) time.Duration {
	if v <= 0 || v > limit {
		return limit
	}
	return v
}

// Nodes returns the number of configured lock nodes.
func (l *Locker) Nodes() int { return len(l.nodes) }

// Close stops the watcher, the keepers, the placements, the notification
// subscribers and the batchers, waits for them and closes the node clients. Calls still
// running fail (a batch already sent is awaited, at most 3*NodeTimeout, the
// keeper's bound; see send); waiting Lock calls return. Close is idempotent and returns the same
// result every time.
func (l *Locker) Close() error {
	l.closeOnce.Do(func() {
		close(l.done)
		l.subCancel()
		for _, n := range l.nodes {
			n.sub.Close() // unblocks a pending Receive
		}
		l.subWG.Wait()
		l.watchWG.Wait()
		l.keepWG.Wait()
		l.stopPlacements()
		l.batchWG.Wait()
		var errs []error
		for _, n := range l.nodes {
			if err := errors.Join(n.client.Close(), n.batches.Close()); err != nil {
				errs = append(errs, fmt.Errorf("close lock node %d (%s): %w", n.index, n.addr, err))
			}
		}
		l.closeErr = errors.Join(errs...)
	})
	return l.closeErr
}

// observe tracks whether n is up from the outcome of one call, warns once
// per change and counts failures. A call cut short by the caller's context
// says nothing about the node.
func (l *Locker) observe(ctx context.Context, n *node, err error) {
	if err == nil {
		if n.down.Load() && n.down.CompareAndSwap(true, false) {
			l.logger.Warn("lock node up", zap.Int("node", n.index), zap.String("addr", n.addr))
		}
		return
	}
	if ctxErr(ctx) != nil || errors.Is(err, errClosed) {
		return
	}
	n.countFailure(err)
	if n.down.CompareAndSwap(false, true) {
		n.health.mu.Lock()
		n.health.lastErr = err.Error()
		n.health.mu.Unlock()
		l.logger.Warn("lock node down", zap.Int("node", n.index), zap.String("addr", n.addr), zap.Error(err))
	}
}

// subscribe keeps n's subscription to the release channel alive until Close
// and turns every notification into a wake-up of the local waiters. go-redis
// reconnects and resubscribes on the Receive after a failure; notifications
// published meanwhile are lost, so a (re)subscription wakes every waiter.
func (l *Locker) subscribe(n *node) {
	defer l.subWG.Done()
	ctx := l.subCtx
	_ = n.sub.Subscribe(ctx, l.channel) // on failure the next Receive retries
	const maxBackoff = time.Second
	backoff := l.cfg.NodeTimeout
	for {
		msg, err := n.sub.Receive(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			t := time.NewTimer(backoff)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			backoff = min(2*backoff, maxBackoff)
			continue
		}
		backoff = l.cfg.NodeTimeout
		switch m := msg.(type) {
		case *redis.Message:
			l.notify(m.Payload)
			l.placeOn(n, m.Payload)
		case *redis.Subscription:
			if m.Kind == "subscribe" {
				l.notifyAll()
			}
		}
	}
}
