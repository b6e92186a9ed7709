package quorum

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
)

// Options are the optional parts of a Lock call. The zero value makes one
// attempt with a fresh token.
type Options struct {
	// Wait, when positive, queues the call behind earlier waiters for the
	// same resource on this Locker and retries until the lock is acquired or
	// Wait has passed. Zero (or negative) makes one attempt, which fails at
	// once, without asking the nodes, when local waiters are queued (unless
	// Token is set), so it never jumps the queue.
	Wait time.Duration

	// Token, when set, is used instead of a fresh random one (a UUID v4, 122
	// random bits). Locking again with the token of the current holder
	// succeeds, refreshes the ttl and returns the same fence: an idempotent
	// retry after a lost reply.
	Token string

	// Permits, when above 1, takes one of Permits permits of a semaphore
	// instead of the exclusive lock (see semaphore.go); the Lock's Slot
	// says which. 0 and 1 take the exclusive lock.
	Permits int

	shared bool // RLock: a shared holding (shared.go)

	// Reentrant makes the holding count holds (see Release): taken afresh
	// it has 1; with the Token of the current holder (taken with or
	// without Reentrant) it gets one more hold, its ttl is reset and its
	// fence stays. Lock.Holds is the count after the call. Not with
	// Permits above 1 or a shared holding.
	Reentrant bool

	// Holder describes who acquires, for LOCKINFO (Info): stored with a
	// fresh holding on the nodes, never a secret. The zero Holder names
	// nobody.
	Holder Holder
}

// Lock describes an acquired lock.
type Lock struct {
	// Token proves ownership to Unlock and Extend.
	Token string
	// Validity is how long, from Lock's return, the lock is guaranteed:
	// ttl - elapsed - (ttl*DriftFactor + 2ms) - ClockTolerance. It is
	// always positive.
	Validity time.Duration
	// Expires is when the validity runs out, on this process's monotonic
	// clock (time.Now's). A caller that passes the lock on later (a proxy
	// writing its reply) takes time.Until(Expires) as the validity then,
	// so that time spent stalled is not promised to anyone.
	Expires time.Time
	// Fence grows strictly for successive holders of the resource, while a
	// majority of nodes keeps its data; see Locker.Lock. For a semaphore,
	// per slot.
	Fence int64
	// Slot is a semaphore permit's number, from 0 to Permits-1; 0 otherwise.
	Slot int
	// Holds is the hold count after a reentrant Lock (Options.Reentrant),
	// 0 after any other.
	Holds int64
}

// Lock acquires resource for ttl (at least 1ms, whole milliseconds) on a
// majority of the nodes.
//
// It returns ErrNotAcquired when another owner holds the resource (after
// Options.Wait ran out, if set), a *NoQuorumError when fewer than a majority
// of nodes answered the last attempt, and an error wrapping ctx.Err() when
// ctx ends first. Every failed attempt releases what it got on every node
// that granted it or did not answer. ctx bounds the whole call, waiting
// included; if ctx ends while a lock is being acquired, the lock is released
// and the context's error returned.
//
// Fencing. Each node has one counter. A fresh holding on a node advances the
// node's counter and stores the value with the lock; the Lock's fence F is
// the maximum over the majority that granted it. Nodes of that majority that
// stored less are raised to F (counter = max(counter, F)) while the token
// still owns the lock there, and the Lock is granted only if a majority of
// nodes then has counter >= F. A later holder's majority shares at least one
// node with that majority; on it, the earlier lock ended (deleted or
// expired) before the later one was granted, so the later increment starts
// from a counter >= F and the later fence is > F. Counters never decrease
// unless a node loses its data, which is why the order holds only while a
// majority keeps it, as Redlock's exclusion itself does.
func (l *Locker) Lock(ctx context.Context, resource string, ttl time.Duration, opt Options) (Lock, error) {
	lk, err := l.lock(ctx, resource, ttl, opt)
	if err != nil {
		return lk, err
	}
	// The validity counts from here. A Locker stalled since the grant (a
	// stopped process, CPU starvation, a waiter scheduled late after a
	// handoff) may have spent it all: then the lock is given back.
	lk.Validity = time.Until(lk.Expires)
	if lk.Validity <= 0 {
		l.giveBack(context.WithoutCancel(ctx), resource, lk.Token)
		return Lock{}, ErrNotAcquired
	}
	return lk, nil
}

// lock is Lock before the validity is taken at its return.
func (l *Locker) lock(ctx context.Context, resource string, ttl time.Duration, opt Options) (Lock, error) {
	start := time.Now()
	ttl, err := l.checkTTL(ttl)
	if err != nil {
		return Lock{}, err
	}
	if l.isClosed() {
		return Lock{}, errClosed
	}
	token := opt.Token
	if token == "" {
		token = uuid.NewString()
	}
	if opt.shared || opt.Permits > 1 {
		return l.lockHash(ctx, start, resource, ttl, token, opt)
	}
	f := l.callForm(newForm(opt))
	queued := l.queued(resource)
	if queued && opt.Token != "" {
		// The holder refreshing its lock must not queue behind waiters
		// that wait for it to let go; anyone else must not jump the queue,
		// so this attempt only refreshes an existing holding.
		lk, _, err := l.attempt(ctx, resource, ttl, token, true, opt.Wait > 0, f)
		if err == nil && opt.Wait > 0 {
			l.waitSeconds.Observe(sinceSeconds(start))
		}
		if err == nil || opt.Wait <= 0 || !retryable(err) {
			return lk, err
		}
		return l.wait(ctx, waitCall{start: start, resource: resource, ttl: ttl, token: token, wait: opt.Wait, f: f})
	}
	if opt.Wait <= 0 {
		if queued {
			return Lock{}, ErrNotAcquired
		}
		lk, _, err := l.attempt(ctx, resource, ttl, token, false, false, f)
		return lk, err
	}
	if queued && l.queuedHash(resource) {
		// -LOCKMODE comes at once, not after the queue of shared or
		// semaphore waiters: a refresh-only round of a fresh token takes
		// nothing and reports the mode. (Behind exclusive waiters only, the
		// resource is not a semaphore, or the head learns it at once.)
		if _, _, err := l.attempt(ctx, resource, ttl, token, true, false, f); isModeErr(err) {
			return Lock{}, err
		}
	}
	return l.wait(ctx, waitCall{start: start, resource: resource, ttl: ttl, token: token, wait: opt.Wait, f: f})
}

// waitCall is what a waiting Lock call keeps fixed from its start to its
// return.
type waitCall struct {
	start    time.Time // when Lock was called, for the wait histogram
	resource string
	ttl      time.Duration
	token    string
	wait     time.Duration // Options.Wait
	f        *form         // what the holding stores (reentrant.go)
	// try, when set, is the attempt of a shared or semaphore holding
	// (shared.go), which is never handed a lock by an Unlock; nil attempts
	// the exclusive lock.
	try attemptFunc
	// reader is set for a shared holding: readers queued together are
	// admitted together (shared_group.go).
	reader bool
}

// wait queues for c's resource and, once at the head, attempts until
// acquired, the wait runs out, ctx ends or the Locker closes. Between
// attempts the head sleeps until whichever comes first: a release
// notification, the holder's remaining ttl, or a random delay in
// [RetryMin, RetryMax] (betweenAttempts).
func (l *Locker) wait(ctx context.Context, c waitCall) (Lock, error) {
	deadline := time.NewTimer(c.wait)
	defer deadline.Stop()
	var readerCtx context.Context
	if c.reader {
		readerCtx = ctx
	}
	w := l.enqueue(c.resource, c.token, c.ttl, c.f, c.try != nil, readerCtx)
	try := c.try
	if c.reader {
		try = l.withRiders(c.resource, w, try)
	}
	defer l.leave(c.resource, w)
	if lk, done, err := l.awaitTurn(ctx, &c, w, deadline); done {
		return lk, err
	}
	return l.attemptAsHead(ctx, &c, w, deadline, try)
}

// awaitTurn waits in the queue until w is its head, or returns the call's
// outcome (done) when a reader ahead took it along (shared_group.go) or the
// wait stops: it ran out, ctx ended or the Locker closed.
func (l *Locker) awaitTurn(ctx context.Context, c *waitCall, w *waiter, deadline *time.Timer) (lk Lock, done bool, err error) {
	for turn := false; !turn; {
		var stop error // why to stop waiting, unless a reader ahead admitted it
		select {
		case <-w.turn:
			turn = true
		case h := <-w.handed:
			// A reader ahead took this reader along (shared_group.go);
			// when it was not granted, it waits for its turn as before.
			if h.ok {
				lk, err = l.takeHandoff(ctx, c.resource, c.token, c.start, h, nil)
				return lk, true, err
			}
			continue
		case <-deadline.C:
			stop = ErrNotAcquired
		case <-ctx.Done():
			stop = fmt.Errorf("lock %q: %w", c.resource, ctx.Err())
		case <-l.done:
			stop = errClosed
		}
		if l.activate(w, stop != nil) {
			// Taken along meanwhile: its outcome decides.
			if h := <-w.handed; h.ok {
				lk, err = l.takeHandoff(ctx, c.resource, c.token, c.start, h, stop)
				return lk, true, err
			}
		}
		if stop != nil {
			return Lock{}, true, stop
		}
	}
	return Lock{}, false, nil
}

// attemptAsHead attempts, as the head of the queue, until acquired or the
// wait stops; try is the attempt (nil: the exclusive lock's).
func (l *Locker) attemptAsHead(ctx context.Context, c *waitCall, w *waiter, deadline *time.Timer, try attemptFunc) (Lock, error) {
	var woken time.Time // when a release notification woke this attempt
	// An exclusive waiter that becomes the head right after an Unlock
	// through this Locker handed the lock to the waiter ahead of it knows
	// the lock held: it skips its first attempt, which could only fail,
	// and waits between attempts at once, ready to be handed the lock in
	// turn. The handing kept the waiters' mark on the nodes, so a release
	// through another Locker is still published; a release observed
	// meanwhile (notify) cancels the skip.
	skip := c.try == nil
	for {
		wake := l.wakeChan(c.resource) // before the attempt: a release during it counts
		var (
			lk   Lock
			hint time.Duration
			err  error
		)
		if skip {
			hint = l.handedFor(c.resource)
			skip = false
		}
		switch {
		case hint > 0:
			err = ErrNotAcquired
		case try != nil:
			lk, hint, err = try(ctx)
		default:
			lk, hint, err = l.attempt(ctx, c.resource, c.ttl, c.token, false, true, c.f)
		}
		if err == nil {
			l.waitSeconds.Observe(sinceSeconds(c.start))
			if !woken.IsZero() {
				l.handoffSeconds.Observe(sinceSeconds(woken))
			}
			return lk, nil
		}
		if !retryable(err) {
			return lk, err
		}
		select {
		case <-deadline.C:
			return Lock{}, err
		default:
		}
		delay := l.retryDelay()
		if hint > 0 {
			delay = min(delay, hint)
		}
		h, handed, woke, stop := l.betweenAttempts(ctx, c.resource, w, deadline, wake, delay, err)
		woken = woke
		if handed && h.ok {
			return l.takeHandoff(ctx, c.resource, c.token, c.start, h, stop)
		}
		if stop != nil {
			return Lock{}, stop
		}
	}
}

// betweenAttempts is the head's sleep of at most delay after a failed
// attempt (err). It ends when an Unlock of the holder hands the waiter the
// lock in its own round (handed, h: see handOver), when a release
// notification arrives on wake (woken: when), when the delay is over, or
// when the wait stops (stop: why; err once the wait ran out).
func (l *Locker) betweenAttempts(ctx context.Context, resource string, w *waiter, deadline *time.Timer, wake <-chan struct{}, delay time.Duration, err error) (h handoff, handed bool, woken time.Time, stop error) {
	l.setIdle(w, true)
	t := time.NewTimer(delay)
	select {
	case h = <-w.handed:
		handed = true
	case <-wake:
		woken = time.Now()
	case <-t.C:
	case <-deadline.C:
		stop = err
	case <-ctx.Done():
		stop = fmt.Errorf("lock %q: %w", resource, ctx.Err())
	case <-l.done:
		stop = errClosed
	}
	t.Stop()
	if !handed && l.setIdle(w, false) {
		h, handed = <-w.handed, true // a handoff under way: its outcome decides
	}
	return h, handed, woken, stop
}

// takeHandoff returns the lock that a waiter for resource with token,
// waiting since start, was handed (h.ok), or gives it back at once when the
// caller is gone or the Locker closes (stop: why the waiter was stopping).
func (l *Locker) takeHandoff(ctx context.Context, resource, token string, start time.Time, h handoff, stop error) (Lock, error) {
	if cerr := ctxErr(ctx); cerr != nil || errors.Is(stop, errClosed) {
		// The caller is gone: hand the lock on at once.
		l.giveBack(context.WithoutCancel(ctx), resource, token)
		if cerr == nil {
			return Lock{}, errClosed
		}
		return Lock{}, fmt.Errorf("lock %q: %w", resource, cerr)
	}
	l.waitSeconds.Observe(sinceSeconds(start))
	l.handoffSeconds.Observe(sinceSeconds(h.start))
	return h.lk, nil
}

// attempt runs one Redlock round. On failure it also returns how long the
// holder's lock may still live on the nodes that reported it (0 when no node
// did). With waits, the nodes where another token holds the lock mark it,
// so that its release wakes the caller (see opsScript).
func (l *Locker) attempt(ctx context.Context, resource string, ttl time.Duration, token string, refreshOnly, waits bool, f *form) (Lock, time.Duration, error) {
	lk, hint, again, err := l.attemptOnce(ctx, resource, ttl, token, refreshOnly, waits, f)
	if again {
		lk, hint, _, err = l.attemptOnce(ctx, resource, ttl, token, refreshOnly, waits, f)
	}
	return lk, hint, err
}

// attemptOnce is one Redlock round of attempt. again reports a round that
// failed for want of votes while the Locker learned that the deployment is
// in use (a fresh deployment's markers were being created): the nodes
// without a marker that did not count then have one now, and one more
// round decides.
func (l *Locker) attemptOnce(ctx context.Context, resource string, ttl time.Duration, token string, refreshOnly, waits bool, f *form) (lk Lock, hint time.Duration, again bool, err error) {
	key := l.lockPrefix + resource
	start := time.Now() // monotonic
	var (
		v          roundVotes
		grantedBuf [smallRound]grant
		ownedBuf   [smallRound]*node
		heldBuf    [smallRound]*node
		held       = heldBuf[:0] // nodes where another token holds it
	)
	v.granted, v.owned = grantedBuf[:0], ownedBuf[:0]
	code := codeAcquire
	switch {
	case refreshOnly && waits:
		code = codeRefreshWait
	case refreshOnly:
		code = codeRefresh
	case waits:
		code = codeAcquireWait
	}
	var x any = ttl.Milliseconds()
	if f != nil {
		code, x = f.code(code), acquireArg(ttl, f)
	}
	if f.reentrant() {
		l.cleanupsFirst(resource, token)
	}
	attempt := f.attemptID(l)
	r := l.call(ctx, opAcquire, len(l.nodes), key, code, token, attempt, x)
	l.countRound(ctx, r, start, func(res []reply, fresh bool) {
		for i, r := range res {
			l.tally(&v.answered, r, fresh, start)
			switch {
			case r.err != nil && r.unsent: // it never left: nothing to undo
			case r.err != nil:
				v.owned = append(v.owned, l.nodes[i]) // it may have run the script
			case r.val > 0:
				hold, _ := holdOf(r)
				v = v.grant(l.nodes[i], r, fresh, hold)
			case r.val == 0: // a hash record in another mode (shared.go)
				held = append(held, l.nodes[i])
				v = v.mode(r, fresh)
			default:
				// -1-pttl: PTTL is truncated to the millisecond and a key
				// with 0 left is still alive, so the lock is free at the
				// latest pttl+1 ms from now.
				held = append(held, l.nodes[i])
				hint = max(hint, time.Duration(-r.val)*time.Millisecond)
			}
		}
	})
	fail := func(err error) (Lock, time.Duration, bool, error) {
		again, err := l.failed(ctx, v.owned, resource, token, attempt, ttl, v.abstained, start, err)
		return Lock{}, hint, again, err
	}
	if f.reentrant() {
		v.fence = reentryFence(v.granted, v.fence, l.quorum, f.call) // a re-entry keeps its fence
	}
	if err := l.decide(ctx, &v, key, token, attempt, start, modeExclusive); err != nil {
		return fail(err)
	}
	var hs holdState
	if f.reentrant() {
		if hs, err = l.settleHolds(ctx, key, token, attempt, v.granted, f.call, v.fence, len(v.owned)); err != nil {
			if errors.Is(err, ErrNotHeld) {
				err = ErrNotAcquired // the lock lost its majority meanwhile
			}
			return fail(err)
		}
	}
	now := time.Now() // Expires counts from the validity's measurement
	valid := l.validity(ttl, now.Sub(start))
	if valid <= 0 {
		return fail(ErrNotAcquired)
	}
	if err := ctxErr(ctx); err != nil {
		// The caller is gone: hand the lock on at once.
		l.cleanup(context.WithoutCancel(ctx), l.nodes, resource, token, attempt, ttl, true)
		return Lock{}, 0, false, fmt.Errorf("lock %q: %w", resource, err)
	}
	if len(held) > 0 {
		// The lock won a majority while these nodes still showed another
		// holder, typically the one whose release woke this waiter and has
		// not reached them yet: place it there once they are free, so that
		// it does not rest on a bare majority.
		l.schedulePlacement(resource, token, attempt, v.fence, start.Add(ttl), held, hint, f.extWith(hs))
	}
	return Lock{Token: token, Validity: valid, Expires: now.Add(valid), Fence: v.fence, Holds: hs.holds}, 0, false, nil
}

// roundVotes is what the replies of one acquisition round (attemptOnce,
// hashTry) granted: the counting itself, whichever the holding's form. The
// replies' other outcomes (another holder, a semaphore's slots) are the
// caller's.
type roundVotes struct {
	answered  tally     // the nodes that gave a usable reply
	abstained int       // of those, nodes that granted without a marker: no vote
	granted   []grant   // every node that granted the holding
	owned     []*node   // nodes where the token may hold it
	votes     int       // granted nodes that count
	fence     int64     // the largest fence of those
	modes     modeVotes // counting nodes that found another mode
}

// grant returns v with node n's grant r taken in (hold: a reentrant
// acquisition's count, reentrant.go): a vote when n counts, otherwise an
// abstention. It takes and returns v by value so that a round's grants
// can stay in buffers on its caller's stack (attemptOnce): an append
// stored through a pointer would move them to the heap.
func (v roundVotes) grant(n *node, r reply, fresh bool, hold holdState) roundVotes {
	c := counts(r, fresh)
	v.owned = append(v.owned, n)
	v.granted = append(v.granted, grant{node: n, fence: r.val, counts: c, hold: hold})
	if c {
		v.votes++
		v.fence = max(v.fence, r.val)
	} else {
		v.abstained++
	}
	return v
}

// mode returns v with r, a node's report of another mode (shared.go),
// taken in when the node counts; by value, as grant.
func (v roundVotes) mode(r reply, fresh bool) roundVotes {
	if counts(r, fresh) {
		v.modes = v.modes.with(r.aux)
	}
	return v
}

// decide returns nil when v's round won the holding of key for token:
// enough nodes that count answered, no mode error for a request of kind
// (modeVotes.err), a majority granted and their fences are confirmed.
// Otherwise it returns why not: a *NoQuorumError, the mode error, or
// ErrNotAcquired.
func (l *Locker) decide(ctx context.Context, v *roundVotes, key, token, attempt string, start time.Time, kind int64) error {
	if v.answered.nodes-v.abstained < l.quorum {
		return v.answered.noQuorum(len(l.nodes))
	}
	if err := v.modes.err(l.quorum, kind); err != nil {
		return err
	}
	if v.votes < l.quorum || !l.confirm(ctx, key, token, attempt, v.granted, v.fence, start) {
		return ErrNotAcquired
	}
	return nil
}

// failed undoes a failed round of attempt on the nodes where token may
// hold the lock (owned), and returns whether one more round decides (see
// attemptOnce) and the error to report.
func (l *Locker) failed(ctx context.Context, owned []*node, resource, token, attempt string, ttl time.Duration, abstained int, start time.Time, err error) (bool, error) {
	l.cleanup(context.WithoutCancel(ctx), owned, resource, token, attempt, ttl, false)
	if cerr := ctxErr(ctx); cerr != nil {
		return false, fmt.Errorf("lock %q: %w", resource, cerr)
	}
	if abstained > 0 {
		// Nodes without a marker granted: the markers of a fresh
		// deployment may be on their way. Once they are, one more
		// round decides.
		l.awaitInit(ctx)
	}
	return abstained > 0 && l.seenSince(start), err
}

// confirm makes sure that a majority of the nodes that count has a fence
// counter of at least fence, the largest that a counting node granted:
// granting nodes that stored a smaller fence are raised to it (nodes
// without the marker too, so that they store the fence of the holding they
// have). It reports whether the majority was reached within maxRounds of
// start, when the granting round began. The grants of the nodes it raised
// show fence afterwards.
//
// The bound matters for fences, not for exclusion (validity covers that).
// A node's grant counts as proof that its counter reached its fence; if
// the proxy stalled between the rounds long enough for that node to lose
// its data and be recovered (which waits settle after the loss), the proof
// would be stale and a later fence could be smaller. Recovery reads no
// earlier than settle after a loss, so a grant whose rounds all ended
// within maxRounds of their start is never stale there.
func (l *Locker) confirm(ctx context.Context, key, token, attempt string, granted []grant, fence int64, start time.Time) bool {
	confirmed := 0 // counting nodes whose counter is known to be >= fence
	var behind []*node
	var behindAt []int // their grants' positions in granted
	for i, g := range granted {
		switch {
		case g.fence != fence:
			behind = append(behind, g.node)
			behindAt = append(behindAt, i)
		case g.counts:
			confirmed++
		}
	}
	if len(behind) > 0 {
		r := l.call(ctx, opRaise, len(behind), key, codeRaise, token, attempt, fence)
		l.fanout(behind, r, func(res []reply) {
			for i, r := range res {
				g := &granted[behindAt[i]]
				if r.err == nil && r.val == 1 && g.fence < fence {
					g.fence = fence // raised: the node stores fence now
				}
				if r.err == nil && r.val == 1 && g.counts {
					confirmed++
				}
			}
		})
	}
	return confirmed >= l.quorum && time.Since(start) <= l.maxRounds()
}

// grant is one node's grant in an attempt.
type grant struct {
	node   *node
	fence  int64
	counts bool      // the node had the marker (or the deployment is fresh)
	hold   holdState // a reentrant acquisition's (reentrant.go)
}

// release runs the compare-and-delete script on nodes and reports on how
// many it deleted and how many answered: it ends token's holding, whatever
// attempt took it. With publish, deleting nodes announce the release if a
// waiter marked the lock there, and local waiters are woken.
func (l *Locker) release(ctx context.Context, nodes []*node, resource, token string, publish bool) (deleted, answered int, counted []reply) {
	if len(nodes) == 0 {
		return 0, 0, nil
	}
	code := codeRelease
	if publish {
		code = codeReleasePub
	}
	start := time.Now()
	r := l.call(ctx, opRelease, len(nodes), l.lockPrefix+resource, code, token, "", resource)
	l.fanout(nodes, r, func(res []reply) {
		l.settleClock(nodes, res, start) // counted replies are weighed by counts
		for _, r := range res {
			if r.err == nil {
				answered++
				if r.val == 1 {
					deleted++
				}
				if r.arr != nil {
					counted = append(counted, r) // a count of holds: kept
				}
			}
		}
	})
	if publish && deleted > 0 {
		l.notify(resource)
	}
	return deleted, answered, counted
}

// cleanup undoes a failed (or abandoned) attempt on nodes: each deletes the
// lock if the attempt alone holds it, and leaves a tombstone of the
// attempt for ttl where the lock is free, so that the attempt's request,
// if it reaches the node later, does nothing (see late.go). With publish,
// deleting nodes announce the release if a waiter marked the lock there,
// and local waiters are woken. Cleanup of a failed attempt does not
// publish: the waiters of other Lockers then retry after their random
// delay instead of all at once, which would split the votes again.
func (l *Locker) cleanup(ctx context.Context, nodes []*node, resource, token, attempt string, ttl time.Duration, publish bool) {
	if hook := testHookCleanup.Load(); hook != nil {
		nodes = (*hook)(resource, token, attempt, nodes)
	}
	if len(nodes) == 0 {
		return
	}
	code := codeCleanup
	if publish {
		code = codeCleanupPub
	}
	until := time.Now().Add(ttl)
	x := strconv.FormatInt(ttl.Milliseconds(), 10) + ":" + resource
	deleted := 0
	r := l.call(ctx, opCleanup, len(nodes), l.lockPrefix+resource, code, token, attempt, x)
	r.anytime = true
	l.fanout(nodes, r, func(res []reply) {
		for i, r := range res {
			switch {
			case r.err == nil && r.val == 1:
				deleted++
			case r.err != nil && !isErrorReply(r.err):
				// No answer: the attempt may still have run there, or run
				// later. The keeper sends the cleanup again once the node
				// answers (conn.go).
				nodes[i].deferCleanup(pendingCleanup{resource: resource, token: token, attempt: attempt, until: until})
			}
		}
	})
	if publish && deleted > 0 {
		l.notify(resource)
	}
}

// handOver releases resource's lock of token and, in the same round, takes
// it for w, the head of the local waiters, which was between attempts: on
// each node the handoff operation releases the lock if token owns it and
// takes it for w's token if it is then free. That is a Redlock acquisition
// of its own (a majority of counting nodes, the fences confirmed, validity
// measured from the start of the round), so the lock changes hands in one
// round trip instead of a release, a notification and an acquisition.
// Whatever the outcome, w gets it on w.handed; when w did not get a
// majority, what it got is released first, and w attempts as before. It
// returns, like release, on how many nodes token's lock was deleted and how
// many answered. Waiters of other Lockers are not notified of a lock that
// was handed on; they find it free once this Locker has no waiter left.
func (l *Locker) handOver(ctx context.Context, resource, token string, w *waiter) (deleted, answered int, counted []reply) {
	start := time.Now()
	key := l.lockPrefix + resource
	x := strconv.FormatInt(w.ttl.Milliseconds(), 10) + w.form.extArg() + ":" + w.token
	attempt := w.form.attemptID(l) // one of the waiter's call (reentrant.go)
	r := l.call(ctx, opHandoff, len(l.nodes), key, codeHandoff, token, attempt, x)
	var t handTally
	tally := func(res []reply) {
		l.settleClock(l.nodes, res, start)
		for i, r := range res {
			t.add(l.nodes[i], r)
		}
	}
	hooked := false
	if l.handsEarly(w) {
		// Decided at a majority when it can be (handearly.go).
		var handed bool
		var out *releaseResult
		if handed, hooked, out = l.handOverEarly(r, resource, attempt, start, w, tally); handed {
			if out != nil {
				return out.deleted, out.answered, nil
			}
			return t.deleted, t.answered, t.counted
		}
	} else {
		l.fanout(l.nodes, r, tally)
	}
	votes, fence, granted, owned, held, hint := t.votes, t.fence, t.granted, t.owned, t.held, t.hint
	deleted, answered, counted = t.deleted, t.answered, t.counted
	if hook := testHookHandOver.Load(); hook != nil && !hooked {
		(*hook)()
	}
	bg := context.WithoutCancel(ctx)
	h := handoff{start: start}
	if votes >= l.quorum && l.confirm(bg, key, w.token, attempt, granted, fence, start) {
		ok := true
		if w.form.reentrant() && !sure(granted, w.form.call, fence, len(owned)) {
			// A node may keep another fence: the count carries the
			// holding's (settleHolds).
			ok = l.writeHolds(bg, key, w.token, attempt, holdState{holds: 1, version: 2, fence: fence}) == nil
		}
		now := time.Now()
		if v := l.validity(w.ttl, now.Sub(start)); ok && v > 0 {
			h.lk, h.ok = Lock{Token: w.token, Validity: v, Expires: now.Add(v), Fence: fence, Holds: w.form.freshHolds()}, true
		}
	}
	if h.ok && len(held) > 0 {
		l.schedulePlacement(resource, w.token, attempt, fence, start.Add(w.ttl), held, hint, w.form.extArg())
	}
	if h.ok {
		l.noteHanded(resource, h.lk.Expires) // before w leaves the queue
	}
	if !h.ok {
		// The holder's lock is gone where it was handed: a release like
		// any other, published where a waiter marked it (the mark was
		// carried over), so that waiters of other Lockers wake too.
		l.cleanup(bg, owned, resource, w.token, attempt, w.ttl, true)
		l.notify(resource)
	}
	l.deliver(w, h)
	if h.ok {
		// The waiter's caller answers its client next, before this Unlock
		// returns: a contended lock's next cycle waits for that answer, not
		// for the holder's (on one thread, the rest of the Unlock and its
		// reply would otherwise run first, about 35µs of each handoff gap).
		runtime.Gosched()
	}
	return deleted, answered, counted
}

// testHookCleanup, when set, returns the nodes that a cleanup is sent to
// now: tests hold cleanups back and deliver them later.
var testHookCleanup atomic.Pointer[func(resource, token, attempt string, nodes []*node) []*node]

// testHookHandOver, when set, runs in handOver after the handing round and
// before its outcome is delivered.
var testHookHandOver atomic.Pointer[context.CancelFunc]

// Unlock releases resource on every node where token owns it; a lock with a
// count of holds (Options.Reentrant) loses one hold, as Release(ctx,
// resource, token, 0) does. It returns
// nil when the lock was deleted on a majority, ErrNotHeld when token does
// not own it on a majority, a *NoQuorumError when fewer than a majority
// answered, or an error wrapping ctx.Err() when ctx ended first. ctx bounds
// the call; each node gets at most NodeTimeout. Waiters on every Locker
// sharing the nodes are notified. An Unlock that hands the lock to a
// plain waiter of this Locker may return as soon as a majority released
// it and granted it to the waiter; the other nodes' answers are then dealt
// with in the background (handearly.go).
func (l *Locker) Unlock(ctx context.Context, resource, token string) error {
	if l.isClosed() {
		return errClosed
	}
	if token == "" {
		return ErrNotHeld
	}
	_, err := l.releaseHold(ctx, resource, token, 0)
	return err
}

// Extend resets the ttl of resource to ttl on every node where token owns
// it and returns the new validity, computed as for Lock. It returns
// ErrNotHeld when token does not own it on a majority (or no validity would
// be left), a *NoQuorumError when fewer than a majority answered, or an
// error wrapping ctx.Err() when ctx ended first. ctx bounds the call; each
// node gets at most NodeTimeout.
func (l *Locker) Extend(ctx context.Context, resource, token string, ttl time.Duration) (time.Duration, error) {
	ttl, err := l.checkTTL(ttl)
	if err != nil {
		return 0, err
	}
	if l.isClosed() {
		return 0, errClosed
	}
	if token == "" {
		return 0, ErrNotHeld
	}
	start := time.Now()
	var (
		answered  tally   // the nodes that gave a usable reply
		extended  int     // of those, nodes that count and extended it
		abstained int     // of those, nodes that extended without a marker: no vote
		fence     int64   // the largest stored fence of the token
		missing   []*node // nodes where the lock is free
		counted   []reply // replies with a count of holds (reentrant.go)
	)
	var form holdingForm // a reader or a permit: healed as one (shared.go)
	attempt := l.newAttempt()
	r := l.call(ctx, opExtend, len(l.nodes), l.lockPrefix+resource, codeExtend, token, attempt, ttl.Milliseconds())
	l.countRound(ctx, r, start, func(res []reply, fresh bool) {
		for i, r := range res {
			l.tally(&answered, r, fresh, start)
			switch {
			case r.err != nil:
			case r.val > 0 && counts(r, fresh):
				extended++
				fence = max(fence, r.val)
				form.note(r.aux)
				if r.arr != nil {
					counted = append(counted, r)
				}
			case r.val > 0:
				abstained++
			case r.val == -1:
				missing = append(missing, l.nodes[i])
			}
		}
	})
	switch {
	case extended >= l.quorum:
		if len(missing) > 0 && l.validity(ttl, time.Since(start)) > 0 {
			// Heal: the holder keeps a majority; put the lock back on the
			// nodes that lack it, so that one more failed node costs it
			// nothing. Where another token took the node meanwhile, it
			// stays.
			l.placeForm(context.WithoutCancel(ctx), form, missing, resource, token, attempt, fence, start.Add(ttl), healExt(counted))
		}
		// After the placement: the validity counts from Extend's return.
		v := l.validity(ttl, time.Since(start))
		if v <= 0 {
			return 0, ErrNotHeld
		}
		return v, nil
	case ctxErr(ctx) != nil:
		return 0, fmt.Errorf("extend %q: %w", resource, ctxErr(ctx))
	case answered.nodes-abstained < l.quorum:
		return 0, answered.noQuorum(len(l.nodes))
	default:
		return 0, ErrNotHeld
	}
}

// validity is Redlock's guaranteed lock time: ttl minus the time the
// acquisition took minus the clock drift allowance ttl*driftFactor + 2ms.
// Zero or less means the lock is not usable.
func validity(ttl, elapsed time.Duration, driftFactor float64) time.Duration {
	drift := time.Duration(float64(ttl)*driftFactor) + 2*time.Millisecond
	return ttl - elapsed - drift
}

// validity is validity less ClockTolerance: a clock jump on a node that
// small may go unnoticed and shorten the lock there by as much (clock.go).
func (l *Locker) validity(ttl, elapsed time.Duration) time.Duration {
	return validity(ttl, elapsed, l.cfg.DriftFactor) - l.cfg.ClockTolerance
}

// checkTTL is checkTTL with the Locker's MaxTTL as the upper bound.
func (l *Locker) checkTTL(ttl time.Duration) (time.Duration, error) {
	if ttl > l.cfg.MaxTTL {
		return 0, fmt.Errorf("quorum: ttl must be at most MaxTTL (%v), got %v", l.cfg.MaxTTL, ttl)
	}
	return checkTTL(ttl)
}

// checkTTL truncates ttl to whole milliseconds, the nodes' resolution.
func checkTTL(ttl time.Duration) (time.Duration, error) {
	if ttl < time.Millisecond {
		return 0, errors.New("quorum: ttl must be at least 1ms, got " + ttl.String())
	}
	return ttl.Truncate(time.Millisecond), nil
}

// retryable reports whether a waiting Lock should try again after err.
func retryable(err error) bool {
	var nq *NoQuorumError
	return errors.Is(err, ErrNotAcquired) || errors.As(err, &nq)
}

func (l *Locker) retryDelay() time.Duration {
	return l.cfg.RetryMin + rand.N(l.cfg.RetryMax-l.cfg.RetryMin+1)
}

// ctxErr is ctx.Err(), except that a deadline counts as exceeded as soon as
// it has passed. A node call bounded by that deadline fails with a socket
// timeout that can arrive before the context's own timer has marked it
// done, and the caller must not get a lock it can no longer use.
func ctxErr(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		return context.DeadlineExceeded
	}
	return nil
}

func (l *Locker) isClosed() bool {
	select {
	case <-l.done:
		return true
	default:
		return false
	}
}
