package quorum

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"
)

// All or nothing over several resources (MLOCK).
//
// Each node takes the whole set in one opsScript call, as one group
// operation (code m, see opsScript): it reads every key first and sets
// them only when every one is free or already the token's, so a node
// grants all of the set or none of it. The call is a Redlock round like
// Lock's: the set is acquired when a majority of the nodes that count
// granted all of it; each resource's fence is the largest that those nodes
// stored for it, and the nodes that stored less are raised to it (confirm,
// per resource). On every node each key gets exactly the value a Lock of
// that resource by the token would write (same token, same attempt id), so
// Unlock, Extend, the cleanup of late attempts (late.go), recovery by copy
// and healing see ordinary locks, one per resource.
//
// A failed group attempt is undone per key with the attempt's cleanup: a
// node that granted, or did not answer, gets the cleanup of every key of
// the set. A group request arriving on a node after the cleanup of any of
// its keys finds that key's tombstone and does nothing at all, so a late
// group never takes part of a set.
//
// Waiting. A waiting MLock holds none of its resources: it queues on this
// Locker behind the earlier waiters of every one of its resources, joining
// all those queues in one step, so that queued waiters are ordered by
// arrival in every queue they share and no two of them wait for each
// other. At the head of all of them it attempts the whole set, and between
// attempts it sleeps until a release of any of its resources (local or
// published by a node it marked), the longest time another holder may
// keep one, or a random retry delay.

// MaxResources is the most resources one MLock takes: the group must fit
// in one opsScript call.
const MaxResources = maxOps

const maxGroup = MaxResources

// MLock describes the resources that one MLock call acquired.
type MLock struct {
	// Token owns every resource; Unlock and Extend take it per resource.
	Token string
	// Validity and Expires are as in Lock, for all of the resources.
	Validity time.Duration
	Expires  time.Time
	// Fences are the resources' fences, in the order of the call. Each
	// follows Lock's rule for its resource.
	Fences []int64
}

// errPartial is the reason of the DeadlockError for an MLock of a set that
// its token holds in part.
const errPartial = "the token holds some but not all of the resources"

// MLock acquires every one of resources for ttl on a majority of the
// nodes, or none of them: it returns ErrNotAcquired when another owner
// holds any of them (after Options.Wait ran out, if set), and leaves
// nothing locked. resources must be 1 to 128 distinct names. An MLock
// with the token of the holder of the whole set is an idempotent refresh,
// as Lock's, keeping the fences; with a token that holds some but not all
// of the set (on a majority of the nodes that count) it returns a
// *DeadlockError at once and changes nothing. With Options.Wait it holds
// none of the resources while it waits, so MLocks of overlapping sets never
// deadlock.
//
// The other errors, ctx and the release of whatever a failed attempt got
// are as for Lock. It is safe for concurrent use.
func (l *Locker) MLock(ctx context.Context, resources []string, ttl time.Duration, opt Options) (MLock, error) {
	ml, err := l.mlock(ctx, resources, ttl, opt)
	if err != nil {
		return ml, err
	}
	// As in Lock: the validity counts from here.
	ml.Validity = time.Until(ml.Expires)
	if ml.Validity <= 0 {
		l.releaseAll(context.WithoutCancel(ctx), resources, ml.Token)
		return MLock{}, ErrNotAcquired
	}
	return ml, nil
}

// checkGroup reports whether resources can be one group.
func checkGroup(resources []string) error {
	if len(resources) == 0 || len(resources) > maxGroup {
		return fmt.Errorf("quorum: an MLock takes 1 to %d resources, got %d", maxGroup, len(resources))
	}
	seen := make(map[string]struct{}, len(resources))
	for _, r := range resources {
		if _, ok := seen[r]; ok {
			return fmt.Errorf("quorum: resource %q is named twice", r)
		}
		seen[r] = struct{}{}
	}
	return nil
}

// mlock is MLock before the validity is taken at its return; its shape is
// lock's.
func (l *Locker) mlock(ctx context.Context, resources []string, ttl time.Duration, opt Options) (MLock, error) {
	start := time.Now()
	ttl, err := l.checkTTL(ttl)
	if err != nil {
		return MLock{}, err
	}
	if err := checkGroup(resources); err != nil {
		return MLock{}, err
	}
	if l.isClosed() {
		return MLock{}, errClosed
	}
	token := opt.Token
	if token == "" {
		token = uuid.NewString()
	}
	g := &group{resources: resources, keys: make([]string, len(resources)), ttl: ttl, token: token,
		ext: newForm(Options{Holder: opt.Holder}).extArg()}
	for i, r := range resources {
		g.keys[i] = l.lockPrefix + r
	}
	queued := l.queuedAny(resources)
	if queued && opt.Token != "" {
		// As in lock: the holder refreshing does not queue, anyone else
		// does not jump the queue.
		ml, _, err := l.groupAttempt(ctx, g, true, opt.Wait > 0)
		if err == nil && opt.Wait > 0 {
			l.waitSeconds.Observe(sinceSeconds(start))
		}
		if err == nil || opt.Wait <= 0 || !retryable(err) {
			return ml, err
		}
		return l.groupWait(ctx, start, g, opt.Wait)
	}
	if opt.Wait <= 0 {
		if queued {
			return MLock{}, ErrNotAcquired
		}
		ml, _, err := l.groupAttempt(ctx, g, false, false)
		return ml, err
	}
	return l.groupWait(ctx, start, g, opt.Wait)
}

// group is what the attempts of one MLock call share.
type group struct {
	resources []string
	keys      []string // the lock keys, in the order of resources
	ttl       time.Duration
	token     string
	ext       string // what each resource's value stores beyond a plain lock: the holder (reentrant.go)
}

// arg is the group operation's x: "<ttl>[;<extension>]:<size>" (the
// extension has no ':').
func (g *group) arg() string {
	return strconv.FormatInt(g.ttl.Milliseconds(), 10) + g.ext + ":" + strconv.Itoa(len(g.keys))
}

// groupWait is wait for a group: it joins the queues of all the group's
// resources and, once at the head of every one, attempts until acquired,
// the wait runs out, ctx ends or the Locker closes. A group is never handed
// a lock by an Unlock (handOver takes one resource): it wakes at a release
// of any of its resources and attempts the whole set.
func (l *Locker) groupWait(ctx context.Context, start time.Time, g *group, wait time.Duration) (MLock, error) {
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	w := l.enqueueAll(g.resources, g.token, g.ttl)
	defer l.leaveAll(g.resources, w)

	select {
	case <-w.turn:
	case <-deadline.C:
		return MLock{}, ErrNotAcquired
	case <-ctx.Done():
		return MLock{}, fmt.Errorf("mlock: %w", ctx.Err())
	case <-l.done:
		return MLock{}, errClosed
	}
	// The cases of the select between attempts: one per resource's wake
	// channel, then the retry timer, the wait's deadline, ctx and Close.
	cases := make([]reflect.SelectCase, len(g.resources)+4)
	fixed := len(g.resources)
	cases[fixed+1] = reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(deadline.C)}
	cases[fixed+2] = reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ctx.Done())}
	cases[fixed+3] = reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(l.done)}
	for {
		l.wakeChans(g.resources, cases[:fixed]) // before the attempt: a release during it counts
		ml, hint, err := l.groupAttempt(ctx, g, false, true)
		if err == nil {
			l.waitSeconds.Observe(sinceSeconds(start))
			return ml, nil
		}
		if !retryable(err) {
			return ml, err
		}
		select {
		case <-deadline.C:
			return MLock{}, err
		default:
		}
		delay := l.retryDelay()
		if hint > 0 {
			delay = min(delay, hint)
		}
		t := time.NewTimer(delay)
		cases[fixed] = reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(t.C)}
		chosen, _, _ := reflect.Select(cases)
		t.Stop()
		switch chosen {
		case fixed + 1:
			return MLock{}, err
		case fixed + 2:
			return MLock{}, fmt.Errorf("mlock: %w", ctx.Err())
		case fixed + 3:
			return MLock{}, errClosed
		}
	}
}

// enqueueAll appends w, a waiter for all of resources, to each of their
// queues in one step under l.mu: two such waiters are then in the same
// order in every queue they share. w's turn comes when it is the head of
// every queue.
func (l *Locker) enqueueAll(resources []string, token string, ttl time.Duration) *waiter {
	w := &waiter{turn: make(chan struct{}), token: token, ttl: ttl, handed: make(chan handoff, 1)}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, resource := range resources {
		q := l.queues[resource]
		if q == nil {
			q = &waitQueue{wake: make(chan struct{})}
			l.queues[resource] = q
		}
		q.waiters = append(q.waiters, w)
		if len(q.waiters) > 1 {
			w.behind++
		}
	}
	if w.behind == 0 {
		close(w.turn)
	}
	return w
}

// leaveAll removes w from the queues of resources.
func (l *Locker) leaveAll(resources []string, w *waiter) {
	for _, resource := range resources {
		l.leave(resource, w)
	}
}

// promote tells w that it became the head of one more queue; its turn
// comes with the last. l.mu is held.
func (w *waiter) promote() {
	if w.behind > 1 {
		w.behind--
		return
	}
	w.behind = 0
	close(w.turn)
}

// queuedAny reports whether local waiters are queued for any of resources.
func (l *Locker) queuedAny(resources []string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range resources {
		if l.queues[r] != nil {
			return true
		}
	}
	return false
}

// wakeChans sets cases[i] to the receive from the channel that the next
// release of resources[i] closes (nil, never ready, when nobody waits for
// it).
func (l *Locker) wakeChans(resources []string, cases []reflect.SelectCase) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, r := range resources {
		var c chan struct{}
		if q := l.queues[r]; q != nil {
			c = q.wake
		}
		cases[i] = reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(c)}
	}
}

// groupAttempt is attempt for a group.
func (l *Locker) groupAttempt(ctx context.Context, g *group, refreshOnly, waits bool) (MLock, time.Duration, error) {
	ml, hint, again, err := l.groupAttemptOnce(ctx, g, refreshOnly, waits)
	if again {
		ml, hint, _, err = l.groupAttemptOnce(ctx, g, refreshOnly, waits)
	}
	return ml, hint, err
}

// groupAttemptOnce is one Redlock round over the whole group: one group
// operation per node. Its counting is attemptOnce's, with one fence per
// resource.
func (l *Locker) groupAttemptOnce(ctx context.Context, g *group, refreshOnly, waits bool) (ml MLock, hint time.Duration, again bool, err error) {
	start := time.Now() // monotonic
	n := len(g.keys)
	v := groupVotes{granted: make([][]grant, n), fences: make([]int64, n)}
	var (
		// ownedBefore[j]: counting nodes where the token held resource j
		// as the round began.
		ownedBefore = make([]int, n)
		// modes[j]: the mode codes counting nodes gave for resource j,
		// held in another mode or read-held by the token (shared.go).
		modes = make([]modeVotes, n)
	)
	attempt := l.newAttempt()
	r := l.call(ctx, opGroup, len(l.nodes), g.keys[0], groupCode(refreshOnly, waits), g.token, attempt, g.arg())
	r.more = g.keys[1:]
	l.countRound(ctx, r, start, func(res []reply, fresh bool) {
		for i, r := range res {
			l.tally(&v.answered, r, fresh, start)
			l.addGroupReply(&v, l.nodes[i], r, fresh, ownedBefore, modes)
		}
	})
	fail := func(err error) (MLock, time.Duration, bool, error) {
		l.cleanupAll(context.WithoutCancel(ctx), v.owned, g, attempt, false)
		if cerr := ctxErr(ctx); cerr != nil {
			return MLock{}, v.hint, false, fmt.Errorf("mlock: %w", cerr)
		}
		if v.abstained > 0 {
			l.awaitInit(ctx)
		}
		return MLock{}, v.hint, v.abstained > 0 && l.seenSince(start), err
	}
	heldBefore, err := l.groupRefusal(&v, ownedBefore, modes)
	if err != nil {
		return fail(err)
	}
	if v.votes < l.quorum && heldBefore == n && len(v.partial) > 0 {
		// The token holds every resource, but not all of them on the same
		// majority (nodes failed since it took them): the refresh takes
		// the free keys on the nodes that hold the set in part too.
		v.owned = append(v.owned, v.partial...)
		v.votes += l.groupTakeRest(ctx, g, attempt, v.partial, v.granted, v.fences)
	}
	if v.votes < l.quorum || !l.groupConfirm(ctx, g, attempt, v.granted, v.fences, start) {
		return fail(ErrNotAcquired)
	}
	now := time.Now() // Expires counts from the validity's measurement
	valid := l.validity(g.ttl, now.Sub(start))
	if valid <= 0 {
		return fail(ErrNotAcquired)
	}
	if err := ctxErr(ctx); err != nil {
		// The caller is gone: hand the locks on at once.
		l.cleanupAll(context.WithoutCancel(ctx), l.nodes, g, attempt, true)
		return MLock{}, 0, false, fmt.Errorf("mlock: %w", err)
	}
	if len(v.held) > 0 {
		// As in attemptOnce: the nodes that refused because another token
		// held some key get each resource once it is free there.
		for j, resource := range g.resources {
			l.schedulePlacement(resource, g.token, attempt, v.fences[j], start.Add(g.ttl), v.held, v.hint, g.ext)
		}
	}
	return MLock{Token: g.token, Validity: valid, Expires: now.Add(valid), Fences: v.fences}, 0, false, nil
}

// groupCode is the code of a group acquisition (scripts.go): m, or mr to
// only refresh, mw and mrw to mark the keys that another token holds.
func groupCode(refreshOnly, waits bool) any {
	switch {
	case refreshOnly && waits:
		return codeGroupRefreshWait
	case refreshOnly:
		return codeGroupRefresh
	case waits:
		return codeGroupWait
	}
	return codeGroup
}

// groupVotes is what the replies of one group round (groupAttemptOnce)
// said, as roundVotes is for one resource.
type groupVotes struct {
	answered  tally         // the nodes that gave a usable reply
	abstained int           // of those, nodes that granted without a marker: no vote
	votes     int           // granted nodes that count
	granted   [][]grant     // granted[j]: every node that granted resource j
	fences    []int64       // fences[j]: the largest fence of resource j that counts
	owned     []*node       // nodes where the token may hold some of the keys
	held      []*node       // nodes where another token holds some key
	partial   []*node       // nodes where the token holds part of the set
	hint      time.Duration // when the keys another token holds are free at the latest
}

// addGroupReply takes r, node nd's reply to a group, in v, and counts in
// ownedBefore and modes (see groupAttemptOnce) what it says of each
// resource when nd counts (fresh: see counts).
func (l *Locker) addGroupReply(v *groupVotes, nd *node, r reply, fresh bool, ownedBefore []int, modes []modeVotes) {
	if r.err == nil && len(r.vals) != len(v.granted) {
		r.err = errors.New("quorum: mlock replied the wrong number of results")
	}
	if r.err == nil && counts(r, fresh) {
		for j, x := range r.vals {
			if r.val == 3 || (r.val != 1 && x > 0) {
				ownedBefore[j]++
			}
		}
	}
	switch {
	case r.err != nil:
		v.owned = append(v.owned, nd) // it may have run the script
	case r.val == 1 || r.val == 3:
		v.owned = append(v.owned, nd)
		if l.addGroupGrant(r, counts(r, fresh), nd, v.granted, v.fences) {
			v.votes++
		} else {
			v.abstained++
		}
	case r.val == 2:
		v.partial = append(v.partial, nd)
	case r.val == 4:
		v.held = append(v.held, nd)
		if counts(r, fresh) {
			for j, x := range r.vals {
				if x != 0 {
					modes[j].add(x)
				}
			}
		}
	case r.val == 0:
		v.held = append(v.held, nd)
		for _, x := range r.vals {
			if x < 0 {
				v.hint = max(v.hint, time.Duration(-x)*time.Millisecond)
			}
		}
	}
}

// groupRefusal returns why v's round cannot hold the group whatever its
// votes, each decided by a majority of the nodes that count: too few of
// them answered, -LOCKMODE for a resource held as a semaphore, then
// -DEADLOCK for one read-held by the token (modes) or for the set held in
// part (ownedBefore). heldBefore is how many of the resources the token
// held as the round began.
func (l *Locker) groupRefusal(v *groupVotes, ownedBefore []int, modes []modeVotes) (heldBefore int, err error) {
	if v.answered.nodes-v.abstained < l.quorum {
		return 0, v.answered.noQuorum(len(l.nodes))
	}
	var deadlock error
	for _, m := range modes {
		if err := m.err(l.quorum, modeExclusive); isModeErr(err) {
			return 0, err
		} else if err != nil && deadlock == nil {
			deadlock = err
		}
	}
	if deadlock != nil {
		return 0, deadlock
	}
	// The token held resource j when a majority of the nodes that count
	// said so. Holding some of the set but not all is a deadlock.
	for _, c := range ownedBefore {
		if c >= l.quorum {
			heldBefore++
		}
	}
	if heldBefore > 0 && heldBefore < len(ownedBefore) {
		return heldBefore, &DeadlockError{Why: errPartial}
	}
	return heldBefore, nil
}

// groupConfirm confirms the fence of every resource of the group, as
// attemptOnce confirms one (confirm), and reports whether all held.
func (l *Locker) groupConfirm(ctx context.Context, g *group, attempt string, granted [][]grant, fences []int64, start time.Time) bool {
	n := len(g.keys)
	confirmed := make([]bool, n)
	forEach(n, func(j int) {
		confirmed[j] = l.confirm(ctx, g.keys[j], g.token, attempt, granted[j], fences[j], start)
	})
	for _, ok := range confirmed {
		if !ok {
			return false
		}
	}
	return true
}

// addGroupGrant records n's grant of a group, r, in granted and, when it
// counts, in fences; it reports whether it counts.
func (l *Locker) addGroupGrant(r reply, counts bool, n *node, granted [][]grant, fences []int64) bool {
	for j, f := range r.vals {
		granted[j] = append(granted[j], grant{node: n, fence: f, counts: counts})
		if counts {
			fences[j] = max(fences[j], f)
		}
	}
	return counts
}

// groupTakeRest runs the group with code mp on nodes, where the token
// holds part of the set, as part of attempt: it records their grants and
// returns how many of them count.
func (l *Locker) groupTakeRest(ctx context.Context, g *group, attempt string, nodes []*node, granted [][]grant, fences []int64) (votes int) {
	x := g.arg()
	r := l.call(ctx, opGroup, len(nodes), g.keys[0], codeGroupAnyPart, g.token, attempt, x)
	r.more = g.keys[1:]
	l.fanout(nodes, r, func(res []reply) {
		for i, r := range res {
			if r.err == nil && (r.val == 1 || r.val == 3) && len(r.vals) == len(g.keys) &&
				l.addGroupGrant(r, counts(r, false), nodes[i], granted, fences) {
				votes++
			}
		}
	})
	return votes
}

// cleanupAll undoes a group attempt on nodes: cleanup of every key, the
// rounds of all the keys at once (they share the nodes' batches).
func (l *Locker) cleanupAll(ctx context.Context, nodes []*node, g *group, attempt string, publish bool) {
	if len(nodes) == 0 {
		return
	}
	forEach(len(g.resources), func(j int) {
		l.cleanup(ctx, nodes, g.resources[j], g.token, attempt, g.ttl, publish)
	})
}

// releaseAll releases every one of resources of token on every node, all
// at once, publishing as Unlock does.
func (l *Locker) releaseAll(ctx context.Context, resources []string, token string) {
	forEach(len(resources), func(j int) {
		l.release(ctx, l.nodes, resources[j], token, true)
	})
}

// forEach calls f(0) .. f(n-1) concurrently and waits for them: rounds
// started together share their nodes' batches, so n rounds cost about one
// round trip.
func forEach(n int, f func(j int)) {
	if n == 1 {
		f(0)
		return
	}
	var wg sync.WaitGroup
	for j := range n {
		wg.Go(func() { f(j) })
	}
	wg.Wait()
}
