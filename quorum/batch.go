package quorum

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Every node has one batcher goroutine (owned by the Locker: started in New,
// stopped and waited for in Close). A call that needs a node queues a request
// there, and the batcher sends every request waiting for its node as one
// pipeline: one write and one read on one connection, however many callers
// are in it. Concurrent callers therefore share round trips, and the node
// (whose CPU, on a small machine, is the budget) reads and writes once per
// batch instead of once per call. While a batch is in flight the next one
// collects, so batches grow with the load, and a lone caller does not wait
// for company.
//
// Each request keeps its own deadline: the earlier of its caller's context
// deadline and NodeTimeout after the call started. Every caller stops
// waiting at its deadline (fanout), and its request then fails with the
// timeout and is counted (metrics, node up/down) as a timed-out single
// call would be; the batch itself waits for its reply until the latest
// deadline in it or NodeTimeout after it was sent (keepTimeout while the
// node does not answer), whichever is later, so that a reply that comes a
// little late does not cost the connection (see send). A request whose deadline passed while it was queued, or that has
// less time left than the node's round trip, fails as a timeout without
// being sent, and such a request needs no cleanup (reply.unsent). Every
// other request queued goes in the next batch, whoever made it: a call's,
// the watcher's, the keeper's. A batch of background work alone would hold
// the calls that queue meanwhile back by a round trip; since no deadline
// cuts a batch short, one caller with little time left cannot cut short
// the round trip of the others.
//
// A node has one batch in flight at a time, and a request whose caller is
// gone is dropped if it was not sent yet. So the cleanup of an attempt that
// its caller abandoned (its context ended) never runs on a node before the
// attempt itself.

// op is what a round runs on each of its nodes: one operation of opsScript,
// whose result is an integer.
type op struct {
	name string
}

var (
	opAcquire = &op{name: "acquire"}
	opRaise   = &op{name: "raise"}
	opRelease = &op{name: "release"}
	opCleanup = &op{name: "cleanup"}
	opExtend  = &op{name: "extend"}
	opPlace   = &op{name: "place"}
	opStatus  = &op{name: "status"}
	opTime    = &op{name: "time"}
	opInit    = &op{name: "init"}
	opHandoff = &op{name: "handoff"}
	opGroup   = &op{name: "mlock"}
	opSetHold = &op{name: "sethold"}
	opQuery   = &op{name: "query"}
	opView    = &op{name: "view"}
)

// reply is one node's answer in a round.
type reply struct {
	val      int64   // the script's integer
	state    int8    // the node's state in the same call: stateIntact, ...
	released bool    // handoff: the releasing token owned the lock
	aux      int64   // a pair's first element (shared.go): a slot, a mode code
	vals     []int64 // group acquire: the result per key (val is the status)
	// arr is the whole reply of an operation that replies with more than
	// a pair (the hold count, a view; reentrant.go, info.go).
	arr    []any
	evicts bool // the node may evict keys (see checkEviction)
	// The node's clock, read in the same call (clock.go): hasClock when
	// the call reported it, and the verdict on it.
	hasClock bool
	clock    int8
	rd       clockReading
	err      error
	// unsent: the batcher failed the request without sending it (err
	// says why), so it cannot run on the node, ever: nothing to undo.
	unsent bool
	// When the reply was read, and how long before that its call was
	// sent: the node ran the script within that window (nodeTime).
	at     time.Time
	window time.Duration
}

// smallRound is the number of nodes that fit in a round without more
// allocations.
const smallRound = 8

// maxOps is the most operations one opsScript call carries; a larger batch
// is split into several calls in the same pipeline, so that one call never
// keeps the node busy for long.
const maxOps = 128

// round is one command sent to a set of nodes for one caller. The batchers
// write res[i], then set fin[i], then count left down; the one that reaches
// zero signals done, and the caller reads res after that.
type round struct {
	ctx         context.Context // the caller's
	start       time.Time       // when the round was made
	ctxDeadline time.Time       // ctx's deadline, if any
	deadline    time.Time       // of every request: ctxDeadline or NodeTimeout
	op          *op
	// The operation's arguments in opsScript: the lock key, the operation
	// code, the token, x and the attempt id, boxed once per round rather
	// than once per node (a string put in an interface is an allocation).
	// The deadline argument is deadline on each node's clock (see late.go).
	key     any
	code    any
	token   any
	x       any
	attempt any
	more    []string // a group's keys after key (mlock.go); nil otherwise
	anytime bool     // the operation is safe whenever it arrives: no deadline
	keeper  bool     // the keeper's: sent while the node is unreachable, failures not counted (conn.go)
	probe   bool     // a check of the nodes (Locker.probe): sent to a node known to be down too

	res []reply
	fin []atomic.Bool // fin[i]: res[i] is written
	// counted[i]: the failure of the i-th node's request was counted
	// (observe), by fanout when its caller left at the deadline or by the
	// batcher, whichever came first: never both.
	counted []atomic.Bool
	left    atomic.Int32
	done    chan struct{} // one value when left reaches zero
	// each, when early is set, gets a value (coalesced) as a reply comes
	// in before the last one: a handing round decides at a majority
	// (handearly.go).
	early bool
	each  chan struct{}
	// timer fires just after deadline: a request that waits in its node's
	// queue behind a longer batch (the keeper's) is given up then.
	timer *time.Timer

	resBuf [smallRound]reply
	finBuf [smallRound]atomic.Bool
	cntBuf [smallRound]atomic.Bool
}

var rounds = sync.Pool{New: func() any { return &round{done: make(chan struct{}, 1)} }}

// newRound returns a round of op o for ctx and nodes nodes, without
// arguments.
func (l *Locker) newRound(ctx context.Context, o *op, nodes int) *round {
	r := rounds.Get().(*round)
	r.ctx, r.op = ctx, o
	if nodes <= smallRound {
		r.res, r.fin, r.counted = r.resBuf[:nodes], r.finBuf[:nodes], r.cntBuf[:nodes]
	} else {
		r.res, r.fin, r.counted = make([]reply, nodes), make([]atomic.Bool, nodes), make([]atomic.Bool, nodes)
	}
	r.start = time.Now()
	r.deadline = r.start.Add(l.cfg.NodeTimeout)
	r.ctxDeadline = time.Time{}
	if d, ok := ctx.Deadline(); ok {
		r.ctxDeadline = d
		if d.Before(r.deadline) {
			r.deadline = d
		}
	}
	r.left.Store(int32(nodes))
	return r
}

// armTimer starts r's timer for just after r.deadline.
func (r *round) armTimer() {
	d := time.Until(r.deadline) + 2*time.Millisecond
	if r.timer == nil {
		r.timer = time.NewTimer(d)
	} else {
		r.timer.Reset(d)
	}
}

// call returns a round that runs the opsScript operation o with key, code,
// token, x and attempt.
func (l *Locker) call(ctx context.Context, o *op, nodes int, key string, code any, token, attempt string, x any) *round {
	r := l.newRound(ctx, o, nodes)
	r.key, r.code, r.token, r.x, r.attempt = key, code, token, x, attempt
	return r
}

// free returns r to the pool. r must not be used afterwards.
func (r *round) free() {
	clear(r.resBuf[:])
	for i := range r.finBuf {
		r.finBuf[i].Store(false)
		r.cntBuf[i].Store(false)
	}
	r.ctx, r.op, r.res, r.fin, r.counted = nil, nil, nil, nil, nil
	r.key, r.code, r.token, r.x, r.attempt, r.anytime, r.keeper, r.probe = nil, nil, nil, nil, nil, false, false, false
	r.more = nil
	if r.early {
		r.early = false
		select {
		case <-r.each:
		default:
		}
	}
	rounds.Put(r)
}

// complete records rep as the answer of the round's i-th node.
func (r *round) complete(i int, rep reply) {
	r.res[i] = rep
	r.fin[i].Store(true)
	if r.early {
		// Before the count: every signal happens before done, so none
		// reaches the round once it is freed.
		select {
		case r.each <- struct{}{}:
		default:
		}
	}
	if r.left.Add(-1) == 0 {
		r.done <- struct{}{}
	}
}

// request is the i-th node's part of a round, queued at that node.
type request struct {
	r *round
	i int
}

// fanout runs r on every node of nodes, batched with the requests of other
// callers, and calls f with the replies in the order of nodes. Each node
// gets until r's deadline. fanout returns when every node answered or
// failed, when r's context ends, or just after r's deadline; then the
// replies that are still missing are the context's error or
// context.DeadlineExceeded (requests not sent yet are dropped, and replies
// to those in flight are discarded). fanout takes r over.
func (l *Locker) fanout(nodes []*node, r *round, f func([]reply)) {
	if len(nodes) == 0 {
		f(nil)
		r.free()
		return
	}
	l.submitRound(nodes, r)
	l.await(nodes, r, f)
}

// submitRound is the first half of fanout: it arms r's timer and queues r's
// request at every node of nodes (or fails it there at once).
func (l *Locker) submitRound(nodes []*node, r *round) {
	r.armTimer()
	for i, n := range nodes {
		if n.skips(r) {
			l.failUnsent(n, request{r, i})
			continue
		}
		n.submit(request{r, i})
	}
}

// skips reports whether r's request is failed at once instead of being
// queued at n (failUnsent). The keeper's requests never are. The others
// are while n refused its last connection: only the keeper and the checks
// of the nodes (probe: the watcher's, every ProbeInterval, and Ready) dial
// a node known to be down (conn.go), so that a call pays no dial and
// allocates no connection for it. A cleanup also is while n did not answer its last
// batch: it would wait for its timeout, and keep the call that failed from
// returning. The keeper sends the cleanups that the caller keeps for it
// (deferCleanup) once it reaches the node, or with its next try
// (retryCleanups): a cleanup is safe whenever it arrives (late.go).
func (n *node) skips(r *round) bool {
	return !r.keeper && (n.refused.Load() && !r.probe || r.op == opCleanup && !n.reachable.Load())
}

// failUnsent fails req, which n never sees, as errReconnecting, counted
// as the batcher counts a request that it fails without sending it. The
// request cannot run on the node, ever: it needs no cleanup
// (reply.unsent), and a node skipped is a node that did not grant.
func (l *Locker) failUnsent(n *node, req request) {
	l.observeReq(n, req, errReconnecting)
	req.r.complete(req.i, reply{err: errReconnecting, unsent: true})
}

// fanoutAll is fanout of several rounds over the same nodes at once: each
// node gets the requests of all of them queued together, so that they go
// in one batch (one call, up to maxOps operations), and f is called with
// each round's index and replies in the order of rs.
func (l *Locker) fanoutAll(nodes []*node, rs []*round, f func(j int, res []reply)) {
	for _, r := range rs {
		r.armTimer()
	}
	reqs := make([]request, 0, len(rs))
	for i, n := range nodes {
		reqs = reqs[:0]
		for _, r := range rs {
			if n.skips(r) {
				l.failUnsent(n, request{r, i})
			} else {
				reqs = append(reqs, request{r, i})
			}
		}
		if len(reqs) > 0 {
			n.submitAll(reqs)
		}
	}
	for j, r := range rs {
		l.await(nodes, r, func(res []reply) { f(j, res) })
	}
}

// await is the second half of fanout: it waits for r, whose requests were
// submitted to nodes, and calls f with its replies. It takes r over.
func (l *Locker) await(nodes []*node, r *round, f func([]reply)) {
	l.awaitEnd(nodes, r, r.wait(), f)
}

// wait waits until every node of r answered or failed (nil), r's context
// ended (its error) or r's deadline passed (context.DeadlineExceeded).
func (r *round) wait() error {
	select {
	case <-r.done:
		return nil
	case <-r.ctx.Done():
		return r.ctx.Err()
	case <-r.timer.C:
		return context.DeadlineExceeded
	}
}

// awaitEnd is the end of await once wait returned gone: it calls f with r's
// replies, those still missing failed with gone, and takes r over.
func (l *Locker) awaitEnd(nodes []*node, r *round, gone error, f func([]reply)) {
	if gone != nil {
		select {
		case <-r.done:
		default:
			// Abandoned: a batcher may still write the unfinished replies,
			// so r is not reused.
			out := make([]reply, len(nodes))
			for i := range out {
				if r.fin[i].Load() {
					out[i] = r.res[i]
				} else {
					out[i].err = gone
					if gone == context.DeadlineExceeded && !r.keeper {
						// Still queued behind a slower batch: the node did
						// not answer in time.
						l.observeReq(nodes[i], request{r, i}, gone)
					}
				}
			}
			f(out)
			return
		}
	}
	r.timer.Stop()
	f(r.res)
	r.free()
}

// submit queues q for n's batcher, or fails it at once when the Locker is
// closed.
func (n *node) submit(q request) {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		q.r.complete(q.i, reply{err: errClosed, unsent: true})
		return
	}
	n.pending = append(n.pending, q)
	first := len(n.pending) == 1
	n.mu.Unlock()
	if first {
		select {
		case n.wake <- struct{}{}:
		default: // a wake-up is pending already
		}
	}
}

// submitAll is submit of every request of qs at once: the batcher takes
// them in one batch.
func (n *node) submitAll(qs []request) {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		for _, q := range qs {
			q.r.complete(q.i, reply{err: errClosed})
		}
		return
	}
	n.pending = append(n.pending, qs...)
	first := len(n.pending) == len(qs)
	n.mu.Unlock()
	if first {
		select {
		case n.wake <- struct{}{}:
		default: // a wake-up is pending already
		}
	}
}

// batch runs n's batcher until Close.
func (l *Locker) batch(n *node) {
	defer l.batchWG.Done()
	var spare []request // the last batch, emptied, to queue the next one in
	busy := false       // the last batch carried more than one request
	for {
		select {
		case <-n.wake:
		case <-l.done:
			n.shut()
			return
		}
		if busy {
			// Under load the request that woke this batcher seldom comes
			// alone: the poll that woke its caller also made other callers
			// runnable (clients whose commands arrived at the same time),
			// and the wake-up put this goroutine ahead of them. Letting them
			// run first puts their requests in this batch instead of the
			// next: fewer, larger batches, less CPU per lock in the proxy
			// and on the nodes. A lone caller's batcher does not yield.
			runtime.Gosched()
		}
		for !l.isClosed() {
			n.mu.Lock()
			q := n.pending
			n.pending = spare
			n.mu.Unlock()
			if len(q) == 0 {
				spare = q
				break
			}
			busy = len(q) > 1
			l.sendPending(n, q)
			clear(q)
			spare = q[:0]
		}
	}
}

// shut fails every queued request of n and makes later ones fail at once.
func (n *node) shut() {
	n.mu.Lock()
	n.closed = true
	q := n.pending
	n.pending = nil
	n.mu.Unlock()
	for _, req := range q {
		req.r.complete(req.i, reply{err: errClosed, unsent: true})
	}
}

// sendPending sends q, the requests that were queued at n, in batches: it
// fails those whose caller is gone or whose deadline has passed, and sends
// the others in groups of similar deadlines, each bounded by its earliest.
func (l *Locker) sendPending(n *node, q []request) {
	noClock := n.clock.Load() == nil
	var clockErr error // why n's clock could not be read
	switch {
	case noClock && n.reachable.Load():
		clockErr = l.firstReading(n, q)
		noClock = n.clock.Load() == nil
	case noClock:
		clockErr = errReconnecting // the keeper reads the clock when it reaches n
	}
	now := time.Now()
	live := q[:0]
	// A request that waited in the queue is not sent when less than the
	// node's round trip is left; one that did not always is (the bound:
	// half a NodeTimeout), so a high estimate cannot keep the node unused.
	reachable, rttLow := n.reachable.Load(), time.Duration(n.rttLow.Load())
	refused := n.refused.Load()
	for _, req := range q {
		r := req.r
		if err := r.ctx.Err(); err != nil {
			// The caller is gone; the node never sees the request.
			r.complete(req.i, reply{err: err, unsent: true})
			continue
		}
		if noClock && !r.anytime {
			// A request without a deadline could run however late it
			// arrives (late.go).
			r.complete(req.i, reply{err: clockErr, unsent: true})
			continue
		}
		if !reachable && !r.keeper && (refused && !r.probe || 3*rttLow >= r.deadline.Sub(now)) {
			// The keeper is reconnecting (conn.go), and the node refused
			// its last connection (queued before that was known: see
			// skips), or a dial, the handshake and the call would not fit
			// in the time left. Over a fast link to a node that did not
			// refuse they fit: the next call tries the node itself.
			l.failUnsent(n, req)
			continue
		}
		if r.op == opCleanup && r.anytime {
			// A cleanup is safe whenever it arrives (late.go), and sent
			// late it still runs before the requests queued after it: a
			// retry of the same token must not find the failed attempt's
			// holding (a reentrant retry would count it as a hold taken
			// before, settleHolds).
			live = append(live, req)
			continue
		}
		if r.deadline.Sub(now) < rttLow {
			// Queued behind a slow batch, it has less time left than the
			// node's round trip: fail it as a timeout without sending it.
			// Its reply would come after its caller left, and what it did
			// on the node would need undoing.
			r.complete(req.i, reply{err: context.DeadlineExceeded, unsent: true})
			continue
		}
		if !now.Before(r.deadline) {
			err := context.DeadlineExceeded
			if r.deadline != r.ctxDeadline {
				// Its NodeTimeout ran out in the queue, behind a slow
				// batch: the node did not answer in time.
				l.observeReq(n, req, err)
			}
			r.complete(req.i, reply{err: err, unsent: true})
			continue
		}
		live = append(live, req)
	}
	if len(live) == 0 {
		return
	}
	latest := live[0].r.deadline
	for _, req := range live[1:] {
		if req.r.deadline.After(latest) {
			latest = req.r.deadline
		}
	}
	l.send(n, live, latest)
}

// firstReading reads n's clock, which was never read, before the requests
// of q are sent, when one of them needs a deadline on it (late.go): one
// round trip, bounded by the earliest deadline of those, spent once per
// node and Locker (the keeper's first reading, started by New, usually
// comes first). It returns why the clock could not be read, for the
// requests that then fail without being sent.
func (l *Locker) firstReading(n *node, q []request) error {
	var deadline time.Time
	for _, req := range q {
		if r := req.r; !r.anytime && r.ctx.Err() == nil && (deadline.IsZero() || r.deadline.Before(deadline)) {
			deadline = r.deadline
		}
	}
	if deadline.IsZero() {
		return nil
	}
	r := l.call(l.subCtx, opTime, 1, "", codeTime, "", "", 0)
	r.anytime = true
	r.deadline = deadline
	l.send(n, []request{{r, 0}}, deadline) // takes the reading in
	<-r.done
	err := r.res[0].err
	r.free()
	if err == nil && n.clock.Load() == nil {
		err = errNoReading // an answer, but its reading was not taken
	}
	return err
}

var errNoReading = errors.New("quorum: lock node's clock not read yet")

// send runs batch on n as one pipeline and completes every request in it,
// as opsScript calls of at most maxOps operations each (appendCalls). The
// batch waits for its reply until deadline (the latest of its requests'),
// or longer (replyWait). Each caller stops waiting at its own deadline all
// the same (fanout). A reply that comes a little late keeps its connection
// (go-redis closes one that timed out, and over a slow link the next batch
// would pay a dial and a handshake, and likely time out in its turn),
// tells that the node answers, and is taken in for the calls that still
// wait.
func (l *Locker) send(n *node, batch []request, deadline time.Time) {
	ctx, cancel := context.WithDeadline(context.Background(), l.replyWait(n, deadline))
	defer cancel()
	// Whether the node may evict, as the calls leave: a reply counts only
	// when the node did not evict before the calls nor after them. Read
	// after the reply alone, the flag could already be cleared by a
	// watcher that found the eviction (and deleted the marker) after the
	// script had run with the marker still there.
	evicts := n.evicts.Load()
	sent := time.Now()
	var ref any = "" // the reference clock's lower bound, when known
	if ms, ok := l.clock.ref(l.since(sent)); ok {
		ref = ms
	}
	cmds, args := l.appendCalls(ctx, n, n.cmds[:0], n.args[:0], batch, ref)
	n.exec(ctx, cmds)
	n.settle(cmds[0].Err(), time.Since(sent), l.cfg.NodeTimeout)
	againWithEval(ctx, n, cmds)
	l.completeBatch(n, batch, cmds, sent, time.Now(), evicts)
	clear(cmds)
	clear(args)
	n.cmds, n.args = cmds[:0], args[:0]
}

// replyWait returns until when a batch sent to n now waits for its reply:
// until deadline, or NodeTimeout from now if that is later; keepTimeout
// while the node has not answered since it last failed to, since the batch
// may then dial and shake hands first.
func (l *Locker) replyWait(n *node, deadline time.Time) time.Time {
	wait := time.Now().Add(l.cfg.NodeTimeout)
	if !n.reachable.Load() {
		// It may dial and shake hands first, as the keeper's does.
		wait = time.Now().Add(l.keepTimeout())
	}
	if deadline.After(wait) {
		wait = deadline
	}
	return wait
}

// appendCalls appends to cmds the opsScript calls that run batch on n, at
// most maxOps operations each, and to args their arguments (ref: see
// appendOpsArgs); it returns both.
func (l *Locker) appendCalls(ctx context.Context, n *node, cmds []redis.Cmder, args []any, batch []request, ref any) ([]redis.Cmder, []any) {
	for i := 0; i < len(batch); {
		// At most maxOps operations per call; a group is never split.
		j, ops := i, 0
		for j < len(batch) && (j == i || ops+batch[j].r.width() <= maxOps) {
			ops += batch[j].r.width()
			j++
		}
		from := len(args)
		args = l.appendOpsArgs(n, args, batch[i:j], ref)
		cmds = append(cmds, redis.NewCmd(ctx, args[from:len(args):len(args)]...))
		i = j
	}
	return cmds, args
}

// againWithEval runs the calls of cmds that found the script missing
// again with EVAL, which also caches it: a node that restarted (or ran
// SCRIPT FLUSH) has forgotten the script.
func againWithEval(ctx context.Context, n *node, cmds []redis.Cmder) {
	var again []redis.Cmder
	for i := range cmds {
		if isNoScript(cmds[i].Err()) {
			args := slices.Clone(cmds[i].Args())
			args[0], args[1] = "eval", opsScript.src
			cmds[i] = redis.NewCmd(ctx, args...)
			again = append(again, cmds[i])
		}
	}
	if len(again) > 0 {
		n.exec(ctx, again)
	}
}

// completeBatch completes every request of batch with its reply from
// cmds, the calls sent to n at sent and read at read, with the clock
// reading of its call (judged once per call) and evicts: see send.
func (l *Locker) completeBatch(n *node, batch []request, cmds []redis.Cmder, sent, read time.Time, evicts bool) {
	var (
		rd       clockReading
		hasClock bool
		clock    int8
		c        *redis.Cmd
		call     = -1 // the index of c in cmds
		at, ops  int  // the request's position in c, and c's operations
	)
	for _, req := range batch {
		if at == ops {
			call++
			c, at = cmds[call].(*redis.Cmd), 0
			ops = c.Args()[2].(int) - 3
			// One clock reading per call, judged once.
			rd, hasClock = callClock(c)
			rd.sent, rd.read = l.since(sent), l.since(read)
			clock = clockUnjudged
			if hasClock {
				clock = l.clock.judge(n.index, rd)
				n.checkClock(rd.at/int64(time.Millisecond)+rd.offset, sent, read)
			}
		}
		rep := opReply(req.r.op, c, at)
		at += req.r.width()
		rep.at, rep.window = read, read.Sub(sent)
		if req.r.op == opTime && rep.err == nil {
			n.takeReading(rep, l.cfg.NodeTimeout)
		}
		if rep.err == nil {
			rep.hasClock, rep.rd, rep.clock = hasClock, rd, clock
		}
		l.complete(n, req, rep, evicts)
	}
}

// observeReq is observe for n's request req: a failure is counted once per
// request (see round.counted).
func (l *Locker) observeReq(n *node, req request, err error) {
	if err == nil || req.r.counted[req.i].CompareAndSwap(false, true) {
		l.observe(req.r.ctx, n, err)
	}
}

// complete records rep as n's answer to req. evicts is whether the node
// could evict keys when the request was sent.
func (l *Locker) complete(n *node, req request, rep reply, evicts bool) {
	if rep.err != nil && redis.HasErrorPrefix(rep.err, "LATE") {
		n.redialSoon() // the node's clock may have jumped: read it again
	}
	if rep.err == nil || !req.r.keeper {
		// The keeper's failures repeat the calls' (conn.go): not counted.
		l.observeReq(n, req, rep.err)
	}
	if rep.err == nil {
		l.observeState(n, rep.state, rep.clock == clockAhead, req.r.start)
		rep.evicts = evicts || n.evicts.Load()
	}
	req.r.complete(req.i, rep)
}

// appendOpsArgs appends to args the opsScript call that runs ops on n,
// with ref the reference clock's lower bound in ms, or "" (see clock.go).
// Each operation's deadline is its request's, on n's clock.
func (l *Locker) appendOpsArgs(n *node, args []any, ops []request, ref any) []any {
	keys := 0
	for _, req := range ops {
		keys += req.r.width()
	}
	args = append(args, "evalsha", opsScript.sha, keys+3)
	for _, req := range ops {
		args = append(args, req.r.key)
		for _, k := range req.r.more {
			args = append(args, k)
		}
	}
	args = append(args, l.fenceArg, l.markerArg, l.recoveryArg)
	for _, req := range ops {
		var deadline int64
		if !req.r.anytime {
			deadline = n.deadlineOn(req.r.deadline)
		}
		args = append(args, req.r.code, req.r.token, req.r.x, req.r.attempt, deadline)
		for range req.r.more {
			args = append(args, codeMember, "", "", "", 0)
		}
	}
	return append(args, l.channelArg, l.clockArg, l.bandArg, ref)
}

// replyTail is the number of elements of an opsScript reply after the
// operations' results: the node's state, then its clock (TIME and offset).
const replyTail = 3

// callClock returns the clock reading that the opsScript call c reported
// after the node's state (see clock.go), without the times of the call.
func callClock(c *redis.Cmd) (clockReading, bool) {
	a, _ := c.Val().([]any)
	if len(a) < replyTail {
		return clockReading{}, false
	}
	now, ok1 := a[len(a)-2].(int64)
	offset, ok2 := a[len(a)-1].(int64)
	if !ok1 || !ok2 {
		return clockReading{}, false
	}
	return clockReading{at: (now - offset) * int64(time.Millisecond), offset: offset}, true
}

// exec sends cmds to n in one pipeline. Every command carries its own
// outcome, so the pipeline's error is not needed.
func (n *node) exec(ctx context.Context, cmds []redis.Cmder) {
	_ = n.pipe.BatchProcess(ctx, cmds...)
	_, _ = n.pipe.Exec(ctx)
}

func isNoScript(err error) bool {
	return err != nil && (errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT"))
}

// opReply returns the result of the i-th operation of the opsScript call c,
// which ran o there, with the node's state that the call reported last.
func opReply(o *op, c *redis.Cmd, i int) reply {
	v, err := c.Result()
	if err != nil {
		return reply{err: err}
	}
	if a, ok := v.([]any); ok && i < len(a)-replyTail {
		state, ok := a[len(a)-replyTail].(int64)
		if !ok || state < stateRecovering || state > stateIntact {
			return reply{err: fmt.Errorf("quorum: %s replied state %v", o.name, a[len(a)-replyTail])}
		}
		rep := reply{state: int8(state)}
		switch x := a[i].(type) {
		case int64:
			rep.val = x
			return rep
		case []any: // handoff: {released, result}; hash records: {aux, result}; group: {status, r_1, ..}; holds and views: more
			if o == opGroup {
				if rep.val, rep.vals, ok = groupReply(x); ok {
					return rep
				}
				break
			}
			if len(x) > 2 {
				rep.val, _ = x[0].(int64)
				rep.arr = x
				return rep
			}
			if len(x) == 2 {
				r, ok1 := x[0].(int64)
				v, ok2 := x[1].(int64)
				if ok1 && ok2 {
					rep.val, rep.released, rep.aux = v, r == 1, r
					return rep
				}
			}
		case error:
			return reply{err: x}
		}
	}
	return reply{err: fmt.Errorf("quorum: %s replied %v, not an array of integers", o.name, v)}
}

// width is the number of opsScript operations r's request takes: 1, or a
// group's size.
func (r *round) width() int { return 1 + len(r.more) }

// groupReply parses a group acquire's {status, r_1, ..}.
func groupReply(x []any) (status int64, vals []int64, ok bool) {
	if len(x) < 2 {
		return 0, nil, false
	}
	vals = make([]int64, len(x)-1)
	for i, e := range x {
		v, ok := e.(int64)
		if !ok {
			return 0, nil, false
		}
		if i == 0 {
			status = v
		} else {
			vals[i-1] = v
		}
	}
	return status, vals, true
}
