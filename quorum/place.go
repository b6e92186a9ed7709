package quorum

import (
	"context"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"
)

// A lock that won a majority while some nodes still showed the previous
// holder rests on a bare majority, and one more failed node would cost it.
// That is common under contention: a woken waiter's acquisition reaches one
// node before the previous holder's release does. A placement puts the lock
// on those nodes once they are free: when the node publishes the release
// (the waiter's attempt marked the lock there, so its release is
// published), or when the previous holder's ttl there has run out, whichever
// comes first. Placing is the "place" operation of opsScript: take the lock
// only if it is free, with the holder's fence and the ttl it has left. It
// never counts towards anything; it only adds redundancy. Unlock through
// this Locker cancels a pending placement; an Unlock through another Locker
// can race with one and leave the lock on that node until its ttl runs out,
// which costs that node's vote for the resource, never exclusion.
//
// Readers and permits (shared.go) are placed the same way, with the place
// operation of hashLua (qp), which takes the holding only where the node
// can hold it at once with what it holds (its slot free, no writer, no
// waiting writer's intent). Their placement also keeps the nodes that did
// not answer: the node's keeper runs it there again each time it reaches
// the node (retryPlacements), until the holding's ttl ends. An exclusive
// lock left off such a node is healed by its next Extend, but readers and
// permits often never extend. Nothing polls a node that is down, and a
// node that refuses a reader or a permit is asked again after the time it
// said the refusal may last (a waiting writer's intent: the time the
// intent has left), or after a delay that grows while it keeps refusing,
// whichever is longer (placeDelay). A reader's or permit's placement
// already on its way when an Unlock through this Locker cancels it is
// undone where it was sent (by its attempt: a later holding of the token
// stays), so the released holding does not stay on that node until its
// ttl runs out.

// placement is a lock still to be placed on some nodes.
type placement struct {
	resource, token string
	attempt         string // the attempt that won the lock
	fence           int64
	ext             string       // the holding's extension (reentrant.go)
	form            *holdingForm // a reader or a permit (shared.go); nil: exclusive
	end             time.Time    // the lock's ttl runs out on the nodes
	nodes           []*node      // where it is still to be placed
	timer           *time.Timer
	backoff         time.Duration // after a refusal: the delay's bound (placeDelay)
	// dropped: unregistered (dropPlacement, cancelPlacement,
	// stopPlacements), under Locker.mu, so that pending is one read and
	// not a search: a node's keeper list is pruned with it at the cap
	// (deferPlacement). released: dropped by an Unlock of the token
	// (cancelPlacement).
	dropped, released bool
}

// schedulePlacement places resource's lock of token on nodes once they are
// free: at a release notification from one of them, or after hint (the
// longest time another holder may keep it there).
func (l *Locker) schedulePlacement(resource, token, attempt string, fence int64, end time.Time, nodes []*node, hint time.Duration, ext string) {
	l.addPlacement(&placement{resource: resource, token: token, attempt: attempt, fence: fence, ext: ext, end: end, nodes: nodes}, hint)
}

// addPlacement registers p and runs it after hint, at the latest after a
// NodeTimeout.
func (l *Locker) addPlacement(p *placement, hint time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.bgClosed {
		return
	}
	l.register(p)
	// The typical case is a release that was on its way: it lands within
	// a node call's timeout. Later on, the place operation says how long
	// the holder there may keep it.
	p.timer = time.AfterFunc(min(hint, l.cfg.NodeTimeout)+time.Millisecond, func() { l.retryPlacement(p) })
}

// scheduleHashPlacement is schedulePlacement for a reader or a permit
// (form). Unlike an exclusive placement, it also keeps the nodes that did
// not answer, for their keepers to try again (until end), so that a
// holding granted while a node was unreachable reaches it once it is back:
// readers and permits have no other way there than an Extend.
func (l *Locker) scheduleHashPlacement(resource, token, attempt string, fence int64, end time.Time, nodes []*node, hint time.Duration, form holdingForm) {
	l.addPlacement(&placement{resource: resource, token: token, attempt: attempt, fence: fence, form: &form, end: end, nodes: nodes}, hint)
}

// placeOn runs the placements of resource that wait for n, after n
// published a release of resource.
func (l *Locker) placeOn(n *node, resource string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, ps := range l.placing[resource] {
		for _, p := range ps {
			if slices.Contains(p.nodes, n) {
				l.startPlacement(p, []*node{n})
			}
		}
	}
}

// retryPlacement runs p on every node it still waits for.
func (l *Locker) retryPlacement(p *placement) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.bgClosed || !l.pending(p) {
		return
	}
	if time.Until(p.end) <= 0 {
		l.dropPlacement(p)
		return
	}
	l.startPlacement(p, p.nodes)
}

// startPlacement places p on nodes in a goroutine that Close waits for.
// l.mu is held.
func (l *Locker) startPlacement(p *placement, nodes []*node) {
	if l.bgClosed {
		return
	}
	nodes = append([]*node(nil), nodes...)
	l.bg.Add(1)
	go func() {
		defer l.bg.Done()
		var held, failed map[*node]bool
		var wait time.Duration
		var reach []*node // the nodes asked, for a reader or a permit
		if p.form == nil {
			held, wait = l.place(l.subCtx, nodes, p.resource, p.token, p.attempt, p.fence, p.end, p.ext)
		} else {
			// A node known to be unreachable is not asked until its
			// keeper reaches it again: it counts as failed meanwhile.
			unreached := make(map[*node]bool)
			for _, m := range nodes {
				if m.reachable.Load() {
					reach = append(reach, m)
				} else {
					unreached[m] = true
				}
			}
			held, failed, wait = l.placeHash(l.subCtx, *p.form, reach, p.resource, p.token, p.attempt, p.fence, p.end)
			if failed == nil {
				failed = unreached
			} else {
				maps.Copy(failed, unreached)
			}
		}
		l.mu.Lock()
		if !l.pending(p) {
			released := p.released
			l.mu.Unlock()
			if left := time.Until(p.end); released && left > 0 {
				// An Unlock released the holding while this placement
				// was on its way: where it may have landed after the
				// release, it is undone (by its attempt, so a later
				// holding of the token stays).
				// A node that did not answer in time may have run it:
				// its cleanup waits for its keeper if need be.
				placed := slices.DeleteFunc(reach, func(m *node) bool { return held[m] })
				l.cleanup(l.subCtx, placed, p.resource, p.token, p.attempt, left, true)
			}
			return
		}
		defer l.mu.Unlock()
		// Keep waiting for the nodes still held by another token; a node
		// that placed the lock is done, and one that failed is left to
		// Extend, which heals (an exclusive lock), or to its keeper, which
		// runs the placement there again once it reaches the node (a
		// reader or a permit).
		keep := p.nodes[:0]
		for _, m := range p.nodes {
			if held[m] || failed[m] || !slices.Contains(nodes, m) {
				keep = append(keep, m)
			}
			if failed[m] {
				m.deferPlacement(p, l.pending)
			}
		}
		p.nodes = keep
		if wait == 0 {
			p.backoff = 0 // no node refused it: the next refusal starts over
		}
		switch {
		case len(keep) == 0 || time.Until(p.end) <= 0:
			l.dropPlacement(p)
		case wait > 0:
			p.timer.Reset(l.placeDelay(p, wait) + time.Millisecond)
		case len(failed) > 0:
			// Only the keepers try those nodes again; the timer drops
			// the placement when the holding's ttl ends.
			p.timer.Reset(time.Until(p.end) + time.Millisecond)
		}
	}()
}

// maxPlaceBackoff bounds the delay between two runs of a reader's or a
// permit's placement that a node keeps refusing (placeDelay).
const maxPlaceBackoff = 250 * time.Millisecond

// placeDelay returns how long p waits before it runs again after a node
// refused it, wait being the longest time the refusing nodes said that
// may last. An exclusive lock's refusal says the holder's ttl there, after
// which the node is free: that is the delay. A reader's or a permit's
// often says little that helps: a waiting writer's intent refuses new
// readers until it ends with the writer's ttl (the node's answer: the
// intent's remaining time), but a writer that still waits renews it with
// each of its attempts, and a slot of a semaphore is free when the first
// holding there expires (the answer) only if no other permit takes it. So
// its delay backs off: the bound doubles from RetryMin up to
// maxPlaceBackoff, or a quarter of the holding's ttl left if less (a
// holding placed late keeps most of what is left), and the delay is drawn
// from the bound's upper half (at least RetryMin), so that the placements
// of many holdings and Lockers do not run in step. It is never shorter
// than wait. A run that no node refuses starts the bound over. l.mu is
// held.
func (l *Locker) placeDelay(p *placement, wait time.Duration) time.Duration {
	if p.form == nil {
		return wait
	}
	limit := max(min(maxPlaceBackoff, time.Until(p.end)/4), l.cfg.RetryMin)
	p.backoff = min(max(2*p.backoff, l.cfg.RetryMin), limit)
	d := max(p.backoff/2+rand.N(p.backoff/2+1), l.cfg.RetryMin)
	return max(wait, d)
}

// maxPendingPlacements bounds the placements a node keeps for its keeper
// to run again; beyond it, a holding stays off that node until an Extend.
const maxPendingPlacements = 4096

// deferPlacement keeps p, a reader's or a permit's placement that n did not
// answer, for n's keeper to run again when it reaches n (retryPlacements).
// When n keeps the most already, those no longer pending (l.mu is held:
// pending is Locker.pending) make room.
func (n *node) deferPlacement(p *placement, pending func(*placement) bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if slices.Contains(n.placements, p) {
		return
	}
	if len(n.placements) >= maxPendingPlacements {
		n.placements = slices.DeleteFunc(n.placements, func(q *placement) bool { return !pending(q) })
	}
	if len(n.placements) < maxPendingPlacements {
		n.placements = append(n.placements, p)
	}
}

// retryPlacements runs on n the placements that n did not answer and that
// still wait for it. n's keeper calls it each time it reaches n, so a
// reader or a permit granted while n was unreachable reaches n soon after
// n is back, within the holding's ttl. Unlike the cleanups that n keeps
// (retryCleanups), they are not the keeper's requests and the keeper does
// not wait for them: each runs as a placement (startPlacement), under
// l.mu since an Unlock may have dropped it meanwhile, and is kept again
// by that run if n does not answer.
func (l *Locker) retryPlacements(n *node) {
	ps := takeAll(n, &n.placements)
	if len(ps) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, p := range ps {
		if l.pending(p) && slices.Contains(p.nodes, n) && time.Until(p.end) > 0 {
			l.startPlacement(p, []*node{n})
		}
	}
}

// pending reports whether p is still registered. l.mu is held.
func (l *Locker) pending(p *placement) bool {
	return !p.dropped
}

// register indexes p by its resource and token, so that an Unlock finds
// the token's placements without a look at the resource's others (a
// resource may have thousands of readers placed while a node is down).
// l.mu is held.
func (l *Locker) register(p *placement) {
	byToken := l.placing[p.resource]
	if byToken == nil {
		byToken = make(map[string][]*placement, 1)
		l.placing[p.resource] = byToken
	}
	byToken[p.token] = append(byToken[p.token], p)
}

// stop marks p dropped and stops its timer. l.mu is held.
func (p *placement) stop() {
	if p.timer != nil { // nil: held for a handing round's late replies (handearly.go)
		p.timer.Stop()
	}
	p.dropped = true
}

// dropPlacement unregisters p. l.mu is held.
func (l *Locker) dropPlacement(p *placement) {
	p.stop()
	byToken := l.placing[p.resource]
	ps := slices.DeleteFunc(byToken[p.token], func(q *placement) bool { return q == p })
	if len(ps) > 0 {
		byToken[p.token] = ps
		return
	}
	delete(byToken, p.token)
	if len(byToken) == 0 {
		delete(l.placing, p.resource)
	}
}

// cancelPlacement drops the placements of resource's lock of token: those
// of the token alone, whatever the resource's other placements.
func (l *Locker) cancelPlacement(resource, token string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	byToken := l.placing[resource]
	ps, ok := byToken[token]
	if !ok {
		return
	}
	for _, p := range ps {
		p.released = true
		p.stop()
	}
	delete(byToken, token)
	if len(byToken) == 0 {
		delete(l.placing, resource)
	}
}

// stopPlacements drops every placement and waits for those running.
func (l *Locker) stopPlacements() {
	l.mu.Lock()
	l.bgClosed = true
	for _, byToken := range l.placing {
		for _, ps := range byToken {
			for _, p := range ps {
				p.stop()
			}
		}
	}
	clear(l.placing)
	l.mu.Unlock()
	l.bg.Wait()
}

// place takes resource's lock for token, with fence, ext (the extension of
// its value: hold count, holder) and as attempt, on every node of nodes
// where it is free, until end. It returns the nodes
// where another token still holds it, and the longest time that holder may
// keep it.
func (l *Locker) place(ctx context.Context, nodes []*node, resource, token, attempt string, fence int64, end time.Time, ext string) (held map[*node]bool, wait time.Duration) {
	left := time.Until(end).Milliseconds()
	if left < 1 {
		return nil, 0
	}
	x := strconv.FormatInt(left, 10) + ":" + strconv.FormatInt(fence, 10) + ext
	held = make(map[*node]bool)
	r := l.call(ctx, opPlace, len(nodes), l.lockPrefix+resource, codePlace, token, attempt, x)
	l.fanout(nodes, r, func(res []reply) {
		for i, r := range res {
			if r.err == nil && r.val < 0 {
				held[nodes[i]] = true
				wait = max(wait, time.Duration(-r.val)*time.Millisecond)
			}
		}
	})
	return held, wait
}
