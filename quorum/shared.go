package quorum

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"
)

// Shared holdings (RLock) and semaphore permits (Lock with Options.Permits
// above 1) live in a hash at the resource's lock key (hashLua), so that an
// exclusive acquisition, whose fast path reads any key of another type as
// held by someone else, waits for them without a change to that path.
//
// A reader is a holding of its own on a majority, with its own token,
// validity and fence, taken by one round of the hash operation on every
// node, counted, confirmed and cleaned up exactly as an exclusive round is:
// only the node-side rule of what may be held at once differs. On a node,
// readers exclude the writer and the writer excludes readers, so by the
// same intersection argument as the plain lock no reader holds on a
// majority while a writer does.
//
// Writer intent, and the bound on a writer's wait. A writer that waits for
// readers records its intent in the record on every node it reaches, each
// time its waiting attempt runs there (at least every RetryMax, or at a
// release notification): the field "i" with an expiry of the writer's ttl
// from then, and a waiter's mark, so that the readers' releases are
// published. While the intent lives, a node refuses new readers (a reader
// already holding may refresh, extend and release). Once the intent is on a
// majority, no new reader can get a majority, so the writer gets the lock
// as soon as the readers that held then have released or expired: with
// readers that do not extend, a writer at the head of its Locker's queue
// waits at most RetryMax + a round + the longest reader ttl for its intent
// to land and for those readers to end (the test: TestWriterIntentBound).
// A writer that stops waiting keeps new readers off for at most its ttl,
// as long as a lock it had taken would have. An intent lives in the record
// only while something is held there: a writer that finds the record empty
// takes the lock.

// Mode codes, as the node operations report another mode: the first
// element of a {code, 0} reply (hashLua).
const (
	modeExclusive = -1 // held exclusively (to a semaphore request)
	modeShared    = -2 // held shared (to a semaphore request)
	modeDeadlock  = -3 // the token holds it in the other of exclusive and shared
	// A code k > 1 is a semaphore of k permits.
)

// modeVotes counts, per mode code, the counting nodes that reported it.
type modeVotes []struct {
	code int64
	n    int
}

func (m *modeVotes) add(code int64) { *m = m.with(code) }

// with returns m with one more node that reported code. Unlike add, it
// stores through no pointer, so that a caller's votes can stay on its
// stack (roundVotes).
func (m modeVotes) with(code int64) modeVotes {
	for i := range m {
		if m[i].code == code {
			m[i].n++
			return m
		}
	}
	return append(m, struct {
		code int64
		n    int
	}{code, 1})
}

// err returns the mode error that a majority (quorum) of counting nodes
// decided for a request of kind (modeExclusive, modeShared, or k > 1 for
// a semaphore), -LOCKMODE before -DEADLOCK, or nil. Another mode seen on
// fewer nodes counts as held by another owner.
func (m modeVotes) err(quorum int, kind int64) error {
	total, best, bestN, deadlock := 0, int64(0), 0, 0
	for _, v := range m {
		if v.code == modeDeadlock {
			deadlock = v.n
			continue
		}
		total += v.n
		if v.n > bestN {
			best, bestN = v.code, v.n
		}
	}
	switch {
	case total >= quorum:
		return &ModeError{Held: heldAs(best)}
	case deadlock >= quorum && kind == modeShared:
		return &DeadlockError{Why: "this token holds the write lock of the resource"}
	case deadlock >= quorum:
		return &DeadlockError{Why: "this token holds a read lock of the resource; release it before taking the write lock"}
	}
	return nil
}

// isModeErr reports whether err is a *ModeError.
func isModeErr(err error) bool {
	var me *ModeError
	return errors.As(err, &me)
}

// heldAs says what holds a resource in mode code.
func heldAs(code int64) string {
	switch code {
	case modeExclusive:
		return "held exclusively"
	case modeShared:
		return "held shared"
	}
	return "held as a semaphore of " + strconv.FormatInt(code, 10) + " permits"
}

// attemptFunc is one attempt of a waiting Lock: the Lock, or how long the
// holder may still hold (0 when unknown) and why not.
type attemptFunc func(ctx context.Context) (Lock, time.Duration, error)

// RLock acquires a shared holding of resource for ttl: any number of them
// at once, never at the same time as an exclusive Lock of resource. Each
// has its own token, validity and fence (the fence rule is Lock's: larger
// than the fence of every holding of resource that ended before the
// call). Options are as for Lock (Permits is ignored); RLock with the
// token of a current reader refreshes that holding. It returns what Lock
// returns, and a *DeadlockError when opt.Token holds resource exclusively,
// a *ModeError when a semaphore holds it. ctx bounds the call as for Lock.
func (l *Locker) RLock(ctx context.Context, resource string, ttl time.Duration, opt Options) (Lock, error) {
	opt.shared, opt.Permits = true, 0
	return l.Lock(ctx, resource, ttl, opt)
}

// lockHash is lock for a shared holding or a semaphore permit.
func (l *Locker) lockHash(ctx context.Context, start time.Time, resource string, ttl time.Duration, token string, opt Options) (Lock, error) {
	k := opt.Permits
	if opt.shared {
		k = 0
	}
	if k > MaxPermits {
		return Lock{}, fmt.Errorf("quorum: Permits must be at most %d, got %d", MaxPermits, k)
	}
	try := func(refresh, waits bool) attemptFunc {
		code := codeShared
		switch {
		case refresh:
			code = codeSharedRefresh
		case waits:
			code = codeSharedWait
		}
		return func(ctx context.Context) (Lock, time.Duration, error) {
			return l.hashAttempt(ctx, resource, ttl, token, k, code)
		}
	}
	queued := l.queued(resource)
	if queued && opt.Token != "" {
		// A refresh of the token's holding never queues; anything else
		// does not jump the queue.
		lk, _, err := try(true, false)(ctx)
		if err == nil || opt.Wait <= 0 || !retryable(err) {
			return lk, err
		}
	} else if opt.Wait <= 0 {
		if queued {
			return Lock{}, ErrNotAcquired
		}
		lk, _, err := try(false, false)(ctx)
		return lk, err
	} else if queued {
		// -LOCKMODE comes at once, not after the queue: a refresh-only
		// round of a fresh token takes nothing and reports the mode.
		if _, _, err := try(true, false)(ctx); isModeErr(err) {
			return Lock{}, err
		}
	}
	return l.wait(ctx, waitCall{start: start, resource: resource, ttl: ttl, token: token, wait: opt.Wait, try: try(false, true), reader: k == 0})
}

// MaxPermits is the largest Options.Permits: the nodes report a permit's
// k and slot in one integer (holdingForm).
const MaxPermits = 1 << 20

// maxSlotRounds is the most rounds one semaphore attempt spends proposing
// slots: the first and the nodes' suggestions after it.
const maxSlotRounds = 3

// hashAttempt is attempt for a shared holding (k 0) or a permit of k. A
// semaphore round proposes one slot; when it loses, the next round proposes
// the slot that the token already holds somewhere, or the one most nodes
// reported free.
func (l *Locker) hashAttempt(ctx context.Context, resource string, ttl time.Duration, token string, k int, code any) (Lock, time.Duration, error) {
	slot := 0
	if k > 0 {
		slot = rand.IntN(k)
	}
	var (
		lk    Lock
		hint  time.Duration
		err   error
		again bool
	)
	for round := 0; round < maxSlotRounds; round++ {
		next := -1
		lk, hint, next, again, err = l.hashRound(ctx, resource, ttl, token, k, slot, code)
		switch {
		case again:
			continue // the deployment's markers were being created
		case !errors.Is(err, ErrNotAcquired) || next < 0:
			return lk, hint, err
		}
		slot = next
	}
	return lk, hint, err
}

// hashRound is one round of hashAttempt, proposing slot. next is the slot
// to propose in another round, or -1 when none is free; again is as for
// attemptOnce.
func (l *Locker) hashRound(ctx context.Context, resource string, ttl time.Duration, token string, k, slot int, code any) (lk Lock, hint time.Duration, next int, again bool, err error) {
	t := l.newHashTry(ctx, resource, ttl, token, k, slot, code)
	l.countRound(ctx, t.r, t.start, t.count)
	return t.finish()
}

// hashTry is one round of a shared holding or a permit: made by
// newHashTry, its round run by countRound (or, for readers admitted
// together, countRounds), its replies taken in by count, and decided by
// finish.
type hashTry struct {
	l        *Locker
	ctx      context.Context
	resource string
	key      string
	ttl      time.Duration
	token    string
	k, slot  int
	code     any
	attempt  string
	start    time.Time
	r        *round // nil once run

	roundVotes             // granted: the nodes that granted the proposed slot
	missing    []*node     // nodes that did not grant: placed on after a grant
	mine       int         // a slot the token holds on some node, or -1
	free       map[int]int // free slots, by the nodes reporting them
	hint       time.Duration

	grantedBuf [smallRound]grant
	ownedBuf   [smallRound]*node
}

// newHashTry prepares a round of the hash operation code for token's
// holding of resource (k 0: a reader; else a permit of k, proposing slot).
func (l *Locker) newHashTry(ctx context.Context, resource string, ttl time.Duration, token string, k, slot int, code any) *hashTry {
	t := &hashTry{l: l, ctx: ctx, resource: resource, key: l.lockPrefix + resource, ttl: ttl, token: token, k: k, slot: slot, code: code, mine: -1, free: map[int]int{}}
	t.granted, t.owned = t.grantedBuf[:0], t.ownedBuf[:0]
	t.start = time.Now()
	t.attempt = l.newAttempt()
	x := strconv.FormatInt(ttl.Milliseconds(), 10) + ":" + strconv.Itoa(k) + ":" + strconv.Itoa(slot)
	t.r = l.call(ctx, opAcquire, len(l.nodes), t.key, code, token, t.attempt, x)
	return t
}

// count takes in the round's replies.
func (t *hashTry) count(res []reply, fresh bool) {
	l := t.l
	for i, r := range res {
		l.tally(&t.answered, r, fresh, t.start)
		switch {
		case r.err != nil:
			t.owned = append(t.owned, l.nodes[i]) // it may have run the script
			t.missing = append(t.missing, l.nodes[i])
			continue
		case r.val > 0 && int(r.aux) != t.slot:
			t.owned = append(t.owned, l.nodes[i]) // the token's own permit, refreshed
			t.mine = int(r.aux)
		case r.val > 0:
			t.roundVotes = t.grant(l.nodes[i], r, fresh, holdState{})
			continue
		case r.val == 0:
			t.roundVotes = t.mode(r, fresh)
		case r.val == -1 && t.code == codeSharedRefresh:
		default:
			t.hint = max(t.hint, time.Duration(-r.val)*time.Millisecond)
			if r.aux >= 0 {
				t.free[int(r.aux)]++
			}
		}
		t.missing = append(t.missing, l.nodes[i])
	}
}

// finish decides the round once its replies are in: the Lock, or why not
// (with next and again as hashRound returns them). A grant that some nodes
// did not give is placed on them in the background (place.go).
func (t *hashTry) finish() (lk Lock, hint time.Duration, next int, again bool, err error) {
	l, ctx := t.l, t.ctx
	next = t.mine
	if next < 0 {
		n := 0
		for s, c := range t.free {
			if c > n || (c == n && s < next) {
				next, n = s, c
			}
		}
	}
	fail := func(err error) (Lock, time.Duration, int, bool, error) {
		again, err := l.failed(ctx, t.owned, t.resource, t.token, t.attempt, t.ttl, t.abstained, t.start, err)
		return Lock{}, t.hint, next, again, err
	}
	kind := int64(t.k)
	if t.k == 0 {
		kind = modeShared
	}
	if err := l.decide(ctx, &t.roundVotes, t.key, t.token, t.attempt, t.start, kind); err != nil {
		return fail(err)
	}
	now := time.Now()
	v := l.validity(t.ttl, now.Sub(t.start))
	if v <= 0 {
		return fail(ErrNotAcquired)
	}
	if cerr := ctxErr(ctx); cerr != nil {
		// The caller is gone: give the holding back at once.
		l.cleanup(context.WithoutCancel(ctx), l.nodes, t.resource, t.token, t.attempt, t.ttl, true)
		return Lock{}, 0, -1, false, fmt.Errorf("lock %q: %w", t.resource, cerr)
	}
	if len(t.missing) > 0 {
		// As for Lock (attemptOnce): the holding won a majority without
		// these nodes; place it there once they can take it, so that it
		// does not rest on a bare majority until an Extend heals it.
		form := holdingForm{shared: t.k == 0, permit: t.k > 0, k: t.k, slot: t.slot}
		l.scheduleHashPlacement(t.resource, t.token, t.attempt, t.fence, t.start.Add(t.ttl), t.missing, t.hint, form)
	}
	return Lock{Token: t.token, Validity: v, Expires: now.Add(v), Fence: t.fence, Slot: t.slot}, 0, -1, false, nil
}

// holdingForm is what Extend learned of a token's holding from the nodes
// that extended it: a reader, a permit (k and slot), or neither (an
// exclusive lock). The extend operation reports it in its pair (hextend).
type holdingForm struct {
	shared, permit bool
	k, slot        int
}

// note records an extend reply's first element.
func (f *holdingForm) note(aux int64) {
	switch {
	case aux == 2:
		f.shared = true
	case aux <= -10:
		v := -10 - aux
		f.permit, f.k, f.slot = true, int(v>>21), int(v&(1<<21-1))
	}
}

// placeForm heals a holding of form onto nodes that lack it: place for an
// exclusive lock, otherwise the same reader or permit (slot) with fence,
// where the node can hold it, until end.
func (l *Locker) placeForm(ctx context.Context, form holdingForm, nodes []*node, resource, token, attempt string, fence int64, end time.Time, ext string) {
	if !form.shared && !form.permit {
		l.place(ctx, nodes, resource, token, attempt, fence, end, ext)
		return
	}
	l.placeHash(ctx, form, nodes, resource, token, attempt, fence, end)
}

// placeHash is place for a reader or a permit (form): the place operation
// of hashLua (qp) on nodes. It returns the nodes where the holding cannot
// be placed yet (the slot or, for a reader, the resource held by others,
// or a waiting writer's intent) with the longest time that may last, and
// the nodes that did not answer.
func (l *Locker) placeHash(ctx context.Context, form holdingForm, nodes []*node, resource, token, attempt string, fence int64, end time.Time) (held, failed map[*node]bool, wait time.Duration) {
	left := time.Until(end).Milliseconds()
	if left < 1 {
		return nil, nil, 0
	}
	x := strconv.FormatInt(left, 10) + ":" + strconv.Itoa(form.k) + ":" + strconv.Itoa(form.slot) + ":" + strconv.FormatInt(fence, 10)
	held, failed = make(map[*node]bool), make(map[*node]bool)
	r := l.call(ctx, opPlace, len(nodes), l.lockPrefix+resource, codeSharedPlace, token, attempt, x)
	l.fanout(nodes, r, func(res []reply) {
		for i, r := range res {
			switch {
			case r.err != nil:
				failed[nodes[i]] = true
			case r.val < 0:
				held[nodes[i]] = true
				wait = max(wait, time.Duration(-r.val)*time.Millisecond)
			}
			// Another mode there (a reply of 0): the holding stays off
			// that node, as where another token took it.
		}
	})
	// A waiting writer's intent refuses a reader for the time it has left,
	// which a writer still waiting renews: the placement backs off
	// (placeDelay), never for less than that time.
	return held, failed, wait
}
