package quorum

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// Every node has a keeper goroutine (owned by the Locker: started in New,
// stopped and waited for in Close). It does two things with one reading
// of the node's clock (nodeTime), every keepInterval ProbeIntervals and
// whenever a call found the node unreachable or a reply was LATE:
//
//   - It keeps a connection to the node warm. A call that finds no idle
//     connection dials one, and dialing, go-redis's handshake and the call
//     itself take three or four round trips, which a node behind a link
//     whose latency is a good part of NodeTimeout never answers in time: the
//     call fails, its connection is dropped, and the next call starts over.
//     While the node does not answer, the keeper's request (like every
//     batch then, see send) is bounded by keepTimeout, not by NodeTimeout,
//     so it establishes a connection (through the batcher, which the
//     calls' requests use too) and leaves it in the pool of the batcher's
//     own client, where the next batch finds it and needs one round trip;
//     no other command takes it (New).
//     A call that fails for want of an answer (a timeout, a refused or
//     broken connection) marks the node unreachable and wakes the keeper;
//     until the keeper's request (or a call's) gets an answer, the batcher
//     fails at once (errReconnecting) the node's requests that could not
//     dial, shake hands and get an answer in the time they have left
//     (three of the node's round trips): a node behind a slow link does
//     not lose every call to a handshake, while over a fast link the next
//     call tries the node itself, unless the node is known to be down:
//     when the failure was a dial that the node's host refused (nothing
//     listens: a node killed or shut down), every call's request fails at
//     once, before it is queued (node.skips), and only the keeper dials,
//     so that a minority of nodes down costs a call neither a dial nor a
//     connection's buffers, and a node skipped is a node that did not
//     grant (a request never sent needs no cleanup; the cleanups that
//     calls keep for it go out with the keeper's next try, see
//     retryCleanups). The batch that gets the keeper's answer
//     marks the node reachable before the batcher looks at the requests
//     that queued behind it, so those go out at once. After its own
//     failures the keeper backs off (NodeTimeout/2 doubling, at most
//     maxKeepBackoff, counted from the start of the try that failed: a
//     dial that timed out has waited long enough), so a node that answers
//     again is used within maxKeepBackoff when it had refused, and within
//     DialTimeout/5 when its link dropped packets (a dial in flight when
//     the link healed: its dropped SYN is sent again only after a second,
//     but the dials race, see raceDial) + the reconnection's round trips
//     (connecting, HELLO and the call: New turns off go-redis's CLIENT
//     SETINFO, one round trip more).
//   - It reads the node's clock, for the deadlines that requests carry (see
//     late.go): the node's time as the script read it and the local
//     (monotonic) time when the batcher read the reply. The time was read
//     before the reply arrived, so node time + time elapsed locally since
//     the reply is never later than the node's clock, drift aside: a
//     deadline computed from it passes on the node no later than the
//     request's own deadline does here. It is earlier by the time the reply
//     took to be read after the script ran, at most the reading's window
//     (from sending the call to reading its reply). The batcher takes the
//     reading in (takeReading) and reads the clock itself before the first
//     request that needs a deadline when the node's clock was never read
//     (firstReading), so that no request is sent without one.

// maxKeepBackoff is the longest a keeper waits between two attempts to
// reach a node that does not answer.
const maxKeepBackoff = 100 * time.Millisecond

// keepInterval is how many ProbeIntervals a keeper waits between two
// readings of a node that answers. Failed calls and LATE replies (a clock
// that jumped) wake it at once.
const keepInterval = 10

// nodeClock is one reading of a node's clock.
type nodeClock struct {
	ms int64     // the node's time, Unix ms
	at time.Time // local time (monotonic) when the reading arrived
}

// keepTimeout bounds one keeper request: a dial, the handshake and the
// script call, each at most a NodeTimeout.
func (l *Locker) keepTimeout() time.Duration { return 3 * l.cfg.NodeTimeout }

// keep runs n's keeper until Close.
func (l *Locker) keep(n *node) {
	defer l.keepWG.Done()
	t := time.NewTimer(0)
	defer t.Stop()
	var backoff time.Duration // after a failure, until the next try
	for {
		select {
		case <-l.done:
			return
		case <-t.C:
		case <-n.redial:
			if backoff > 0 {
				continue // the timer is set for after the backoff
			}
			t.Stop()
		}
		start := time.Now()
		rep := l.nodeTime(n) // the batcher takes the reading in (takeReading)
		next := keepInterval * l.cfg.ProbeInterval
		if rep.err == nil {
			backoff = 0
			l.retryCleanups(n)
			l.retryPlacements(n)
		} else {
			if isTimeout(rep.err) {
				l.retryCleanups(n)
			}
			// The backoff counts from the try's start: a try that waited
			// for its dial to time out (a link that drops packets) has
			// waited enough, and the next one dials at once, so that a
			// link that heals is found within a dial timeout.
			backoff = min(max(2*backoff, l.cfg.NodeTimeout/2), maxKeepBackoff)
			next = min(next, max(backoff-time.Since(start), 0))
		}
		select {
		case <-n.redial: // a failure that this round already answers
		default:
		}
		t.Reset(next)
	}
}

// takeReading takes in rep, n's reply to a time request, as a reading of
// n's clock (see nodeClock), and reports whether it replaced the one in use.
// The reading lies at most rep's window before the moment the reply was
// read; but all that it may lie early is the time the reply took back, since
// the node read its clock after everything else in the window (a dial, the
// handshake, the request's way there). Every reading is a lower bound, so it
// replaces the one in use when there is none, when its window is short (so
// that readings follow the node's clock as it drifts), or when it bounds the
// node's clock more tightly at rep.at; a slow reply of a node whose clock
// was read precisely before is not used. A reading that lies early only
// makes deadlines pass early on the node: LATE replies, which wake the
// keeper to read again.
func (n *node) takeReading(rep reply, nodeTimeout time.Duration) bool {
	c := &nodeClock{ms: rep.val, at: rep.at}
	old := n.clock.Load()
	if old != nil && rep.window > nodeTimeout/2 && c.ms < old.ms+c.at.Sub(old.at).Milliseconds() {
		return false
	}
	return n.clock.CompareAndSwap(old, c)
}

// errReconnecting fails at once a call to a node that did not answer the
// last call: until its keeper reaches it again, the call would only spend
// its NodeTimeout on a dial and a handshake that do not finish in time.
var errReconnecting = errors.New("quorum: lock node did not answer; reconnecting in the background")

// dialer wraps a node's Dialer so that a failed dial reaches go-redis as a
// connection whose first read or write fails with the dial's error. The
// call that needed the connection fails with that error all the same, but
// go-redis's pool never counts a failed dial: after PoolSize of them it
// stops dialing and probes the node once a second in the background, so a
// node that came back would stay unused for up to a second (and the
// failures never reset while the node stays up). The dial itself is
// bounded by DialTimeout, which New sets to at most NodeTimeout. A
// connection made closes with SO_LINGER 0 (see abortOnClose), and, for the
// batcher's client (n not nil), the time its dial took is kept on n (see
// settle), as is when a dial failed other than by a timeout or a
// cancellation (refusedAt),
// and the dial is a race of several (see raceDial), so that the keeper's
// dial in flight when a link that dropped packets heals does not wait out
// its DialTimeout.
func dialer(opt *redis.Options, n *node) func(ctx context.Context, network, addr string) (net.Conn, error) {
	dial := opt.Dialer
	if dial == nil {
		dial = redis.NewDialer(opt)
	}
	step := max(opt.DialTimeout/dialsPerTimeout, time.Millisecond)
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		start := time.Now()
		var c net.Conn
		var err error
		if n != nil {
			c, err = raceDial(ctx, dial, network, addr, step)
		} else {
			c, err = dial(ctx, network, addr)
		}
		if err != nil {
			if n != nil && !isTimeout(err) && !errors.Is(err, context.Canceled) {
				n.refusedAt.Store(int64(time.Since(dialClock)))
			}
			return failedConn{err: err, addr: addr}, nil
		}
		if n != nil {
			n.dialTook.Store(int64(time.Since(start)))
			n.dialed.Store(int64(time.Since(dialClock)))
		}
		abortOnClose(c)
		return c, nil
	}
}

// dialClock is the origin of node.dialed.
var dialClock = time.Now()

// dialsPerTimeout is how many dials raceDial starts at most, one every
// DialTimeout/dialsPerTimeout.
const dialsPerTimeout = 5

// raceDial dials addr with dial, and dials again every step while no dial
// connected, at most dialsPerTimeout times, until ctx ends; it returns the
// first connection made and closes the others. Over a link that drops
// packets a dial's SYN is lost, and the kernel sends it again only after a
// second: a single dial in flight when the link heals would wait out its
// whole timeout (DialTimeout, up to NodeTimeout), while one of the later
// dials' SYNs gets through within step of the heal. A dial that fails for
// another reason than a timeout (a refused connection: the node is down,
// its host up) ends the race with its error at once.
func raceDial(ctx context.Context, dial func(context.Context, string, string) (net.Conn, error), network, addr string, step time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		c   net.Conn
		err error
	}
	res := make(chan result, dialsPerTimeout)
	started, ended := 0, 0
	start := func() {
		started++
		go func() {
			c, err := dial(ctx, network, addr)
			res <- result{c, err}
		}()
	}
	start()
	t := time.NewTimer(step)
	defer t.Stop()
	var won net.Conn
	var err, last error
	for won == nil && err == nil {
		select {
		case <-t.C:
			if ctx.Err() == nil && started < dialsPerTimeout {
				start()
				t.Reset(step)
			} else if ended == started {
				err = last // every dial failed, and no more start
			}
		case r := <-res:
			ended++
			switch {
			case r.err == nil:
				won = r.c
			case !isTimeout(r.err) && ctx.Err() == nil, ended == started && (started == dialsPerTimeout || ctx.Err() != nil):
				err = r.err
			default:
				last = r.err
			}
		}
	}
	cancel()
	for ; ended < started; ended++ { // the others end with the context
		if r := <-res; r.err == nil {
			r.c.Close()
		}
	}
	return won, err
}

// failedConn is a connection that was never made: every read and write
// returns the dial's error. go-redis dials in the background and puts a
// connection whose caller gave up meanwhile in the idle pool; taken from
// there, a failedConn fails its health check (SyscallConn returns the
// dial's error) and is dropped, instead of failing the next batch at once
// with the error of a dial long over.
type failedConn struct {
	err  error
	addr string
}

func (c failedConn) SyscallConn() (syscall.RawConn, error) { return nil, c.err }

func (c failedConn) Read([]byte) (int, error)         { return 0, c.err }
func (c failedConn) Write([]byte) (int, error)        { return 0, c.err }
func (c failedConn) Close() error                     { return nil }
func (c failedConn) LocalAddr() net.Addr              { return failedAddr("") }
func (c failedConn) RemoteAddr() net.Addr             { return failedAddr(c.addr) }
func (c failedConn) SetDeadline(time.Time) error      { return nil }
func (c failedConn) SetReadDeadline(time.Time) error  { return nil }
func (c failedConn) SetWriteDeadline(time.Time) error { return nil }

type failedAddr string

func (a failedAddr) Network() string { return "tcp" }
func (a failedAddr) String() string  { return string(a) }

// settle takes in the outcome of a batch that n's batcher sent and that
// took took: its error err (of the first call; the calls of one pipeline
// share the connection's fate) and, on an answer, the round trip. A batch
// that got no answer (it waited at least NodeTimeout, see send) marks the
// node unreachable and wakes the keeper.
//
// The round trip follows a faster sample at once and a slower one by 1/8.
// A node that did not answer is tried by a call only when three round trips
// fit, a queued request only when one does, and one slow batch (a pause)
// must not keep it from being tried. A batch that dialed took the dial,
// the handshake (HELLO) and the call: two round trips after the dial. The
// first answer after the node did not answer starts the estimate over:
// the link may have become slower (a low estimate would send requests that
// cannot be answered in their time), but at most NodeTimeout/2, since a
// node that was paused answers when it resumes, and that wait is no round
// trip (an estimate that high would keep every call's request from being
// sent, and so from correcting it). The node is marked reachable here,
// before the batcher looks at the requests that queued behind the batch.
func (n *node) settle(err error, took, nodeTimeout time.Duration) {
	if err != nil && !isErrorReply(err) {
		// A dial of the batch failed without a timeout: the node's host
		// refused the connection (nothing listens on the port, or the
		// socket file is gone). The node is down, not slow, and a call
		// that dials it only fails the same way after paying for the
		// dial (see node.skips). A dial that timed out (a link that
		// drops packets, a host gone) does not tell: the node may be
		// behind a slow link.
		n.refused.Store(time.Duration(n.refusedAt.Load()) > time.Since(dialClock)-took)
		n.reachable.Store(false)
		n.redialSoon()
		return
	}
	n.refused.Store(false)
	if dialed := time.Duration(n.dialed.Load()); dialed > time.Since(dialClock)-took {
		took = (took - time.Duration(n.dialTook.Load())) / 2
	}
	t := int64(took)
	if !n.reachable.Load() {
		n.rttLow.Store(int64(min(took, nodeTimeout/2)))
		n.reachable.Store(true)
		return
	}
	if old := n.rttLow.Load(); t < old || old == 0 {
		n.rttLow.Store(t)
	} else {
		n.rttLow.Store(old + (t-old)/8)
	}
}

// nodeTime reads n's clock with the time operation of opsScript, sent
// through n's batcher like any call, so that the keeper and the calls use
// the same connections and never take one from each other. The request is
// the keeper's (see round.keeper): sent while the calls' requests are not,
// and, while n does not answer, bounded by keepTimeout, time to dial and
// shake hands over a slow link. While n answers, by NodeTimeout: a batch in
// flight holds the node's later batches back, and a reading sent just
// before the node paused must not hold the calls back for longer than one
// of theirs would.
func (l *Locker) nodeTime(n *node) reply {
	r := l.call(l.subCtx, opTime, 1, "", codeTime, "", "", 0)
	r.anytime = true // a deadline from a stale reading would refuse it for good
	r.keeper = true
	if !n.reachable.Load() {
		r.deadline = r.start.Add(l.keepTimeout())
	}
	var rep reply
	l.fanout([]*node{n}, r, func(res []reply) { rep = res[0] })
	return rep
}

// maxPendingCleanups bounds the cleanups a node keeps for its keeper to
// send again; beyond it, a leftover lock waits for its ttl.
const maxPendingCleanups = 4096

// pendingCleanup is an attempt's cleanup that a node did not answer.
type pendingCleanup struct {
	resource, token, attempt string
	until                    time.Time // the attempt's ttl ends: nothing to undo after
}

// deferCleanup keeps c for n's keeper to send once n answers again.
func (n *node) deferCleanup(c pendingCleanup) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.cleanups) < maxPendingCleanups {
		n.cleanups = append(n.cleanups, c)
	}
}

// retryCleanups sends the cleanups that n did not answer again, as the
// keeper's requests (bounded by keepTimeout, sent also while the calls'
// requests are not), all at once so that they share batches. The keeper
// calls it when it reached n, and when its request timed out (n may only
// be slow: a link slower than NodeTimeout still carries the cleanup, even
// if the reply comes too late). Those that n does not answer are kept. A
// cleanup is safe whenever it arrives (see late.go), so it carries no
// deadline on the node.
func (l *Locker) retryCleanups(n *node) {
	var wg sync.WaitGroup
	n.resend.Lock() // see node.resend
	for _, c := range takeAll(n, &n.cleanups) {
		if r := l.resentCleanup(n, c); r != nil {
			n.submit(request{r, 0})
			wg.Go(func() { l.awaitCleanup(n, c, r) })
		}
	}
	n.resend.Unlock()
	wg.Wait()
}

// takeAll removes and returns all that n keeps in *kept for its keeper to
// run again (n.cleanups, n.placements). Those left to run again after
// that are kept anew (deferCleanup, deferPlacement).
func takeAll[T any](n *node, kept *[]T) []T {
	n.mu.Lock()
	defer n.mu.Unlock()
	all := *kept
	*kept = nil
	return all
}

// cleanupsFirst queues at each node, ahead of a reentrant attempt of token
// on resource, the cleanups it keeps for the token's earlier attempts
// there. A node runs its requests in order, so the attempt cannot find a
// holding that an earlier attempt of the same call left (its cleanup did
// not reach the node) and count it as a hold taken before the call
// (settleHolds). The attempt does not wait for them: each is awaited in a
// goroutine of its own, which keepTimeout or Close ends.
func (l *Locker) cleanupsFirst(resource, token string) {
	for _, n := range l.nodes {
		n.resend.Lock() // see node.resend
		for _, c := range n.takeCleanups(resource, token) {
			if r := l.resentCleanup(n, c); r != nil {
				n.submit(request{r, 0})
				go l.awaitCleanup(n, c, r)
			}
		}
		n.resend.Unlock()
	}
}

// takeCleanups removes and returns n's kept cleanups of token on resource.
func (n *node) takeCleanups(resource, token string) []pendingCleanup {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []pendingCleanup
	kept := n.cleanups[:0]
	for _, c := range n.cleanups {
		if c.resource == resource && c.token == token {
			out = append(out, c)
		} else {
			kept = append(kept, c)
		}
	}
	clear(n.cleanups[len(kept):])
	n.cleanups = kept
	return out
}

// resentCleanup returns the keeper's round that sends c again (bounded by
// keepTimeout, sent also while the calls' requests are not), or nil when
// c's attempt ended and there is nothing left to undo.
func (l *Locker) resentCleanup(n *node, c pendingCleanup) *round {
	left := time.Until(c.until).Milliseconds()
	if left < 1 {
		return nil
	}
	x := strconv.FormatInt(left, 10) + ":" + c.resource
	r := l.call(l.subCtx, opCleanup, 1, l.lockPrefix+c.resource, codeCleanup, c.token, c.attempt, x)
	r.anytime, r.keeper = true, true
	r.deadline = r.start.Add(l.keepTimeout())
	r.armTimer()
	return r
}

// awaitCleanup waits for r, c sent again to n, and keeps c once more if n
// did not answer.
func (l *Locker) awaitCleanup(n *node, c pendingCleanup, r *round) {
	l.await([]*node{n}, r, func(res []reply) {
		if err := res[0].err; err != nil && !isErrorReply(err) && l.subCtx.Err() == nil {
			n.deferCleanup(c)
		}
	})
}

// isErrorReply reports whether err is the node's answer (an error reply),
// not the want of one. A function of its own: the target errors.As needs
// escapes, and the callers on the hot path call it only for an error.
func isErrorReply(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr)
}

// redialSoon makes n's keeper reach the node at once, unless it backs off.
func (n *node) redialSoon() {
	select {
	case n.redial <- struct{}{}:
	default:
	}
}

// deadlineOn returns the time on n's clock, in Unix ms, that corresponds
// to local time d, or never later than it (see nodeClock); 0 when n's clock
// was never read.
func (n *node) deadlineOn(d time.Time) int64 {
	c := n.clock.Load()
	if c == nil {
		return 0
	}
	return c.ms + d.Sub(c.at).Milliseconds()
}

// checkClock takes in ms, the node's TIME as a call sent at sent and read
// at read reported it. Unless the node's clock went back, it read at least
// the keeper's reading taken to sent; when it read less, the deadlines
// computed from that reading lie later on the node than the calls' own
// and would let late requests run (late.go): the call's reading, a lower
// bound of the node's clock too, replaces it at once, and the keeper reads
// the clock again.
func (n *node) checkClock(ms int64, sent, read time.Time) {
	c := n.clock.Load()
	if c == nil || ms >= c.ms+sent.Sub(c.at).Milliseconds()-1 {
		return
	}
	n.clock.CompareAndSwap(c, &nodeClock{ms: ms, at: read})
	n.redialSoon()
}

// newAttemptPrefix returns a random prefix for the attempt ids of one
// Locker, so that ids of different Lockers never collide.
func newAttemptPrefix() string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand does not fail on supported platforms
	}
	return hex.EncodeToString(b[:]) + "."
}

// newAttempt returns a fresh attempt id: unique among every Locker's, and
// free of ':' and '/', which delimit it in a lock's value.
func (l *Locker) newAttempt() string {
	return l.attemptPrefix + strconv.FormatUint(l.attemptSeq.Add(1), 36)
}

// lingerAbort makes every node connection close with SO_LINGER 0: closing a
// connection that a call gave up on (go-redis closes it after a timeout)
// drops whatever of it the node did not acknowledge yet, instead of
// retransmitting it after a partition heals. Tests turn it off to show that
// the node scripts alone keep late requests harmless.
var lingerAbort = func() *atomic.Bool { var b atomic.Bool; b.Store(true); return &b }()

// abortOnClose sets SO_LINGER 0 on c's TCP connection, if it has one.
func abortOnClose(c net.Conn) {
	if !lingerAbort.Load() {
		return
	}
	for {
		switch x := c.(type) {
		case *net.TCPConn:
			_ = x.SetLinger(0)
			return
		case interface{ NetConn() net.Conn }: // TLS
			c = x.NetConn()
		default:
			return
		}
	}
}
