package quorum

import (
	"context"
	"math/bits"
	"runtime"
	"sync/atomic"
	"time"
)

// A handing round (handOver) decides at a majority. As soon as a majority
// of the nodes answered, each with a grant for the waiter that counts and
// all with the same fence, the waiter holds the lock: the round's outcome
// cannot change with the other replies (see the argument below), so the
// waiter is answered then and not after the slowest node, which on a
// host where the nodes share CPUs is what a contended lock's handoff
// mostly waited for. The releasing Unlock returns then too when the same
// replies released its lock on a majority (its result is that count, as a
// release's: nil from a majority; what the other nodes answer cannot take
// it back), otherwise it waits for every reply (or its timeout) as before.
// The late replies are dealt with after the round, by a goroutine that
// Close waits for (or by the Unlock, when it waits):
//
//   - a grant with a smaller fence is raised to the waiter's, as confirm
//     raises a node behind;
//   - a grant with a larger fence (its counter was ahead) is undone there
//     by the attempt's cleanup, so that no node shows the holding with
//     another fence than the one its holder got; the holding rests on the
//     majority that granted it until its next Extend;
//   - a node where another token holds the lock gets the placement that
//     handOver would have scheduled; its placeholder is registered before
//     the waiter is answered, so that the new holder's Unlock, which may
//     come first, cancels it;
//   - a node that does not answer is left as handOver leaves it.
//
// Why the outcome is the same. The waiter's grant is a Redlock acquisition
// like any other (doc.go): what makes it safe is a majority of counting
// nodes that each took the lock for the waiter's token in one script call
// (so each held no other holder's lock at that moment), the fence confirmed
// on that majority (every one of them stores it: each counter is at least
// the fence, so the next holder, granted by a majority that intersects
// this one, gets a larger fence), validity measured from the start of the
// round and the round ended within maxRounds of it (confirm's bound, for a
// node that loses its data between the rounds). A decision at the majority
// checks exactly that, on the replies it has, and the test hook of
// handOver runs before it as it does before the full round's decision.
// What the other nodes answer can only add holdings of the waiter's own
// token (a handing call takes the lock for no one else), so it cannot
// make two holders; and the full round, had it waited, would have granted
// the same waiter, with the largest fence among all grants, raised on the
// others: a fence that is only larger is no safer. A node's request that
// is late is covered by late.go as for a full round that timed out on it:
// its deadline and attempt are those of the round. Every node runs its
// requests in the order they were queued, and the handing call was queued
// at every node before the waiter was answered, so the new holder's
// Unlock, a raise, a cleanup or a placement of this round reach each node
// after the handing call itself.
//
// Only a plain exclusive waiter is handed the lock this way; a reentrant
// one's count needs every node's answer (sure, in handOver).

// handTally is what a handing round's replies say, as handOver counts them.
type handTally struct {
	votes    int
	fence    int64
	granted  []grant
	owned    []*node // nodes where the waiter's token may hold the lock
	held     []*node // nodes where another token holds it
	hint     time.Duration
	deleted  int // nodes where the releasing token's lock was released
	answered int
	counted  []reply // the releasing token's holdings with a count of holds
}

// add counts n's reply rep.
func (t *handTally) add(n *node, rep reply) {
	if rep.err != nil {
		t.owned = append(t.owned, n)
		return
	}
	t.answered++
	if rep.released {
		t.deleted++
	}
	if rep.arr != nil {
		// The token's holding has a count of holds: not released, not
		// handed (reentrant.go).
		t.counted = append(t.counted, rep)
		return
	}
	if rep.val > 0 {
		t.owned = append(t.owned, n)
		g := grant{node: n, fence: rep.val, counts: counts(rep, false)}
		t.granted = append(t.granted, g)
		if g.counts {
			t.votes++
			t.fence = max(t.fence, rep.val)
		}
		return
	}
	t.held = append(t.held, n)
	t.hint = max(t.hint, time.Duration(-rep.val)*time.Millisecond)
}

// handsEarly reports whether a handing round to w may decide at a
// majority: w is a plain exclusive waiter, and a majority is fewer than
// all nodes (at most 64, the width of handedAtMajority's set).
func (l *Locker) handsEarly(w *waiter) bool {
	return !w.form.reentrant() && l.quorum < len(l.nodes) && len(l.nodes) <= 64
}

// handedAtMajority reports whether the replies of r that are in make a
// majority of counting grants with one fence, and nothing else: then it
// returns the fence and the set of those nodes (bit i for the i-th). A
// reply of any other kind among them leaves the decision to the full
// round.
func (l *Locker) handedAtMajority(r *round) (fence int64, in uint64, ok bool) {
	n := 0
	for i := range r.res {
		if !r.fin[i].Load() {
			continue
		}
		rep := &r.res[i]
		if rep.err != nil || rep.arr != nil || rep.val <= 0 || !counts(*rep, false) {
			return 0, 0, false
		}
		if fence != 0 && rep.val != fence {
			return 0, 0, false
		}
		fence = rep.val
		in |= 1 << i
		n++
	}
	return fence, in, n >= l.quorum
}

// handOverEarly runs the handing round r (handOver's, to w) and delivers
// w's grant as soon as a majority decided it (handed). The releasing
// holder's result is then out: its lock was released on a majority of
// nodes in the same calls (the Unlock returns while the rest of the round
// is dealt with in the background), or nil when the Unlock waits for the
// rest (tally then counted every reply). Otherwise, when the round ended
// without that decision, tally has counted its replies and handOver
// decides as for a full round; hooked reports whether the test hook of
// handOver ran already.
func (l *Locker) handOverEarly(r *round, resource, attempt string, start time.Time, w *waiter, tally func([]reply)) (handed, hooked bool, out *releaseResult) {
	if r.each == nil {
		r.each = make(chan struct{}, 1)
	}
	r.early = true
	// The round outlives its caller once decided (handRest): its requests
	// are not dropped when the caller's context ends (a session cancels
	// its shared command context when it makes the next one). Its
	// deadline is still the earlier of the caller's and NodeTimeout, and
	// the caller's context still ends the wait for a decision.
	caller := r.ctx
	r.ctx = context.WithoutCancel(caller)
	l.submitRound(l.nodes, r)
	for {
		var gone error
		select {
		case <-r.done:
		case <-r.each:
			fence, in, ok := l.handedAtMajority(r)
			if !ok {
				continue
			}
			handed, out = l.handEarly(r, caller, resource, attempt, start, w, fence, in, tally)
			return handed, true, out
		case <-caller.Done():
			gone = caller.Err()
		case <-r.timer.C:
			gone = context.DeadlineExceeded
		}
		l.awaitEnd(l.nodes, r, gone, tally)
		return false, false, nil
	}
}

// releaseResult is what a release reports: on how many nodes the token's
// lock was released, and how many answered.
type releaseResult struct{ deleted, answered int }

// handEarly delivers w's grant of fence, decided by the nodes in in, unless
// the round took too long for it (then it reports false after the rest
// of the round, which tally counted). The rest of the round is then dealt
// with (handRest): in the background when the releasing token's lock was
// released on a majority of the nodes in in (out says so), otherwise
// before handEarly returns, tally counting every reply.
func (l *Locker) handEarly(r *round, caller context.Context, resource, attempt string, start time.Time, w *waiter, fence int64, in uint64, tally func([]reply)) (handed bool, out *releaseResult) {
	if hook := testHookHandOver.Load(); hook != nil {
		(*hook)()
	}
	now := time.Now()
	v := l.validity(w.ttl, now.Sub(start))
	if now.Sub(start) > l.maxRounds() || v <= 0 {
		// As confirm refuses it: the full round's decision is the same.
		l.awaitEnd(l.nodes, r, r.waitOr(caller), tally)
		return false, nil
	}
	h := handoff{start: start, ok: true,
		lk: Lock{Token: w.token, Validity: v, Expires: now.Add(v), Fence: fence, Holds: w.form.freshHolds()}}
	p := l.holdPlacement(resource, w.token, attempt, fence, start.Add(w.ttl), w.form.extArg())
	released := 0
	for i := range r.res {
		if in&(1<<i) != 0 && r.res[i].released {
			released++
		}
	}
	l.noteHanded(resource, h.lk.Expires) // before w leaves the queue
	l.deliver(w, h)
	if hook := testHookHandedEarly.Load(); hook != nil {
		(*hook)()
	}
	runtime.Gosched() // as in handOver: the waiter's caller answers first
	rest := handRest{r: r, resource: resource, attempt: attempt, start: start, token: w.token, ttl: w.ttl, fence: fence, in: in, p: p}
	if released >= l.quorum && l.inBackground(func() { l.handRest(rest, nil, nil) }) {
		// The releasing holder's caller answers its client too; the late
		// replies are the background's.
		return true, &releaseResult{deleted: released, answered: bits.OnesCount64(in)}
	}
	l.handRest(rest, caller, tally)
	return true, nil
}

// handRest is the rest of a handing round decided at a majority: the
// round, the waiter's token, ttl and fence, the nodes that decided it (in)
// and the placement held for the others (p).
type handRest struct {
	r                        *round
	resource, attempt, token string
	start                    time.Time
	ttl                      time.Duration
	fence                    int64
	in                       uint64
	p                        *placement
}

// handRest waits for the replies of h.r that did not decide it (until r's
// deadline, or until caller ends, when not nil: the Unlock's) and deals
// with them (see above); tally, when not nil, counts every reply.
func (l *Locker) handRest(h handRest, caller context.Context, tally func([]reply)) {
	bg := context.WithoutCancel(h.r.ctx)
	var behind, ahead, held []*node
	var hint time.Duration
	l.awaitEnd(l.nodes, h.r, h.r.waitOr(caller), func(res []reply) {
		if tally != nil {
			tally(res)
		} else {
			l.settleClock(l.nodes, res, h.start)
		}
		for i, rep := range res {
			if h.in&(1<<i) != 0 || rep.err != nil || rep.arr != nil {
				continue
			}
			switch n := l.nodes[i]; {
			case rep.val <= 0:
				held = append(held, n)
				hint = max(hint, time.Duration(-rep.val)*time.Millisecond)
			case rep.val < h.fence:
				behind = append(behind, n)
			case rep.val > h.fence:
				ahead = append(ahead, n)
			}
		}
	})
	if len(behind) > 0 {
		key := l.lockPrefix + h.resource
		l.fanout(behind, l.call(bg, opRaise, len(behind), key, codeRaise, h.token, h.attempt, h.fence), func([]reply) {})
	}
	if len(ahead) > 0 {
		l.cleanup(bg, ahead, h.resource, h.token, h.attempt, h.ttl, false)
	}
	l.settlePlacement(h.p, held, hint)
	if hook := testHookHandRest.Load(); hook != nil {
		(*hook)()
	}
}

// inBackground runs f in a goroutine that Close waits for, and reports
// false (f not run) once Close began.
func (l *Locker) inBackground(f func()) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.bgClosed {
		return false
	}
	l.bg.Add(1)
	go func() {
		defer l.bg.Done()
		f()
	}()
	return true
}

// testHookHandedEarly, when set, runs when a handing round delivered its
// grant at a majority, before the rest of the round; testHookHandRest
// when the rest of such a round was dealt with.
var testHookHandedEarly, testHookHandRest atomic.Pointer[func()]

// holdPlacement registers a placement of resource's lock of token on no
// node yet: settlePlacement gives it its nodes, or drops it, once the
// handing round's late replies are in. An Unlock of token before that
// cancels it as any placement.
func (l *Locker) holdPlacement(resource, token, attempt string, fence int64, end time.Time, ext string) *placement {
	p := &placement{resource: resource, token: token, attempt: attempt, fence: fence, ext: ext, end: end}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.bgClosed {
		p.dropped = true
		return p
	}
	l.register(p)
	return p
}

// settlePlacement schedules p on held after hint (as schedulePlacement),
// or drops it when held is empty; a placement cancelled meanwhile stays
// dropped.
func (l *Locker) settlePlacement(p *placement, held []*node, hint time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case p.dropped:
	case len(held) == 0 || l.bgClosed:
		l.dropPlacement(p)
	default:
		p.nodes = held
		p.timer = time.AfterFunc(min(hint, l.cfg.NodeTimeout)+time.Millisecond, func() { l.retryPlacement(p) })
	}
}

// waitOr is wait for a round whose caller's context is not r.ctx: the
// end of caller (nil: none) ends the wait too, with its error.
func (r *round) waitOr(caller context.Context) error {
	var stop <-chan struct{}
	if caller != nil {
		stop = caller.Done()
	}
	select {
	case <-r.done:
		return nil
	case <-stop:
		return caller.Err()
	case <-r.timer.C:
		return context.DeadlineExceeded
	}
}
