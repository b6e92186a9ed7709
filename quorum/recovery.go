package quorum

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// Data loss on a lock node, and how a node comes back from it.
//
// Redlock's exclusion rests on one invariant: every live lock is known to a
// majority of the nodes. A node that restarts without persistence, is
// flushed, or is replaced by an empty server forgets the locks it granted,
// and if a lock was known to a bare majority including that node, a second
// holder could win the forgetful node and the nodes that never had the lock.
// The Locker prevents that from evidence kept on the nodes themselves, so
// that every Locker, including one started after the loss, decides alike:
//
//   - The marker. Every node of a deployment in use holds "<prefix>intact",
//     a key without expiry, written once when the deployment is first used
//     (every node answered without a marker or a recovery, and the Locker
//     never saw one: a fresh deployment, usable at once) or when a node's
//     recovery ends. A node that missed that first round is brought in as a
//     node that lost its data. opsScript reports, in the same atomic call as the
//     operations, whether the marker exists, so there is no window between a
//     loss and its detection: a node that lost its data answers its very
//     next call without the marker. A node whose data survived a restart
//     (AOF or RDB) still has it.
//
//   - Counting. A reply from a node without the marker does not count
//     towards a grant: its "granted" and "extended" are ignored, while its
//     "held by another" still counts against the grant (it can only make a
//     grant less likely). It keeps receiving every write, so that it holds
//     the locks granted meanwhile once it counts again. Hence every lock
//     granted or extended while a node recovers is known to a majority of
//     nodes that kept their data, without that node.
//
//   - Recovery by copy. The watcher registers the loss on the node
//     ("<prefix>recovery": an id, when the loss was first seen and a
//     deadline, in the node's own clock), waits until every Lock or Extend
//     that could have counted on the node before the loss has finished
//     (2*NodeTimeout after the loss was first seen: an acquisition is at
//     most two rounds), reads the live locks (key, value, pttl) and the fence
//     counter of the other nodes, and needs N-Q+1 of them to have the marker
//     and answer every read. Each lock the node may have forgotten was on at
//     least Q-1 nodes other than it when it was lost, and any Q-1 and any
//     N-Q+1 of the other N-1 nodes share one, so the copy sees every such
//     lock. The copy is written with the pttl read (at least the holder's
//     remaining validity), the counter is raised to the largest counter read,
//     and the marker is created only if the node's recovery still has the id
//     the copy began with (a node that restarted again during the copy
//     starts over).
//
//   - Recovery by deadline. When too few intact nodes can be read, the node
//     counts again once MaxTTL (plus 2*NodeTimeout) has passed on its own
//     clock since the loss was first seen: every lock it may have held has
//     expired by then. The counter is raised to the largest one among the
//     intact nodes that can be read.
//
// The races, one by one:
//
//   - A grant by another Locker while the copy runs. It counted only nodes
//     with the marker, so it is known to a majority without the recovering
//     node; whether the copy sees it does not matter.
//   - A key written on the recovering node by an attempt that then fails and
//     releases. That attempt's "granted" there never counted, so the copy may
//     overwrite it, and the attempt's compare-and-delete then leaves the
//     copied lock alone. If the copy is written first and the attempt's key
//     after, the attempt's key is the one that goes (either order leaves the
//     copied lock or a lock that never counted).
//   - An UNLOCK between reading a source and writing the copy. The copy then
//     writes a lock its holder already gave up: the node says "held" for it
//     until its ttl runs out, which costs that node's vote for that resource
//     for a while, never exclusion.
//   - An EXTEND between the read and the write. It also ran on the
//     recovering node: there it extended the lock, or, where the node lacked
//     it, placed it (Extend heals), and the copy of a lock of the same token
//     keeps the longer ttl. An EXTEND that did not reach the recovering node
//     counted only nodes with the marker, so the extended lock does not
//     depend on the recovering node.
//   - An acquisition in flight while the copy reads: its key on a source is
//     a leftover if it fails, or a lock that counted only nodes with the
//     marker if it succeeds; either way nothing depends on the recovering
//     node having it. Each source's counter is taken at its first read, and
//     a lock stored with a larger fence (written since) is left out. Every
//     lock the node may have granted before its loss was stored before
//     that read with a fence no larger than the counter then.
//   - Sources that still disagree on a lock's owner (one has the holder,
//     another the key of an attempt that was in flight at the first read).
//     The key is read again once such rounds have ended, when the attempt's
//     leftover is gone. If they still disagree (a leftover whose release
//     did not reach its node), the copy writes a value that no token owns,
//     with the longest pttl read, so the node refuses everyone for that
//     resource until every candidate expired.
//
// Fences. A fence F was confirmed on a majority S of nodes (counter >= F).
// A later grant counts a majority M of nodes with the marker, which shares
// a node with S. If that node kept its data, its counter is still >= F. If
// it lost its data and came back by copy, the copy raised its counter to the
// largest among N-Q+1 of the others, which share a node with the rest of S.
// Either way the later fence is larger. After a recovery by deadline the
// counter is raised only from the intact nodes that could be read, so the
// order holds only if those include one of S.
//
// A clock jump is a loss too. A node whose wall clock jumped forward has
// expired its locks early, exactly as if it had forgotten them. clock.go
// finds such a node from the clock reading that every opsScript call
// returns with the node's state (so, as for the marker, in the same atomic
// call as the vote), compared with the other nodes: its vote does not
// count, the watcher deletes its marker, and from then on everything above
// applies unchanged. The marker's deletion also writes the node's new
// clock offset (lossScript), so that it reads in line from then on. A jump
// forward during the recovery would expire the copied locks early and
// bring the deadline early, so the recovery's end (finishScript) checks, in
// the same call, that the node still reads in line with the reference; if
// not, it moves the deadline out by the jump, takes a new offset and starts
// the copy over. A jump back only delays the deadline.
//
// What is not covered: every node losing its data at once (or a majority, as
// seen by a Locker started afterwards that never saw a marker), which looks
// exactly like a fresh deployment.

// health is what the Locker knows about whether a node kept its data. Its
// methods are safe for concurrent use.
type health struct {
	lost atomic.Bool // the last reply had no marker
	// pristineSince is when the node was first seen with neither marker
	// nor recovery (ns since the Locker's birth), 0 otherwise. Every reply
	// reads it, so it is an atomic rather than under mu.
	pristineSince atomic.Int64

	mu        sync.Mutex
	lastErr   string    // down: the error of the call that found it down
	deadline  time.Time // recovering: counts again by then at the latest
	waitsCopy bool      // recovering: too few intact nodes to copy from
	losses    uint64    // losses noticed
	byCopy    uint64    // recoveries ended by a copy, by any Locker
	byExpiry  uint64    // recoveries ended by the deadline, by any Locker
}

// observeState tracks whether n kept its data from the state one of its
// replies, to a round made at start, reported, and warns once per change.
// A node without a marker in a deployment that may be fresh is not counted
// as lost.
//
// ahead reports that the reply showed the node's clock ahead of the
// reference (clock.go): a node with its marker is then taken for one that
// lost its data until the watcher has deleted the marker.
func (l *Locker) observeState(n *node, state int8, ahead bool, start time.Time) {
	if state != statePristine && !l.initing() {
		// While this Locker creates a fresh deployment's markers, the
		// first marker it sees is its own: the nodes its init has not
		// reached yet are no lost ones. initFresh marks the deployment
		// seen when it ends.
		l.markSeen()
	}
	if ahead && state == stateIntact {
		l.jumped(n)
	}
	lost := l.lostState(reply{state: state}, start) || n.jumped.Load()
	switch p := &n.health.pristineSince; {
	case state == statePristine && p.Load() == 0:
		p.CompareAndSwap(0, max(int64(time.Since(l.born)), 1))
	case state == stateIntact && p.Load() != 0:
		p.Store(0)
	}
	if n.health.lost.Load() == lost || !n.health.lost.CompareAndSwap(!lost, lost) {
		return
	}
	if lost {
		n.health.mu.Lock()
		n.health.losses++
		n.health.mu.Unlock()
		l.logger.Warn("lock node has lost its data (or was never used): it does not count towards grants until it recovers",
			zap.Int("node", n.index), zap.String("addr", n.addr))
		l.wakeWatcher()
		return
	}
	l.logger.Warn("lock node recovered: it counts towards grants again", zap.Int("node", n.index), zap.String("addr", n.addr))
}

// wakeWatcher makes the watcher look at the nodes at once.
func (l *Locker) wakeWatcher() {
	select {
	case l.poke <- struct{}{}:
	default:
	}
}

// markSeen records that the deployment is in use: some node had a marker
// or a recovery.
func (l *Locker) markSeen() {
	if l.seenAt.Load() == 0 {
		l.seenAt.CompareAndSwap(0, max(int64(time.Since(l.born)), 1))
	}
}

// seen reports whether the deployment is known to be in use.
func (l *Locker) seen() bool { return l.seenAt.Load() != 0 }

// seenSince reports whether the Locker learned that the deployment is in
// use after start: a round that began before may have found nodes
// without a marker that an init, in flight then, has reached since.
func (l *Locker) seenSince(start time.Time) bool {
	return l.seenAt.Load() > int64(start.Sub(l.born))
}

// counts reports whether a node's reply counts towards a grant or an
// extension. fresh is true while the deployment looks unused (see fresh).
// A node that may evict keys never counts, nor does a reply whose clock
// reading was not judged good (clock.go).
func counts(rep reply, fresh bool) bool {
	return !rep.evicts && rep.clock == clockGood && (rep.state == stateIntact || (fresh && rep.state == statePristine))
}

// checkEviction reads n's memory settings and eviction count (INFO memory
// and stats) at every check of the watcher. A node with a memory limit and
// a policy other than noeviction may evict a lock key while its marker
// survives (volatile policies never pick a key without a ttl): it is marked
// as evicting, its grants do not count, and the Locker warns once per
// change. A node that did evict keys lost data: evictedScript removes its
// marker (once per eviction, for every Locker, through a count kept on the
// node), so that it is brought back like any node that lost its data.
func (l *Locker) checkEviction(ctx context.Context, n *node) {
	ctx, cancel := context.WithTimeout(ctx, l.cfg.NodeTimeout)
	defer cancel()
	info, err := n.client.Info(ctx, "memory", "stats").Result()
	if err != nil {
		return
	}
	var maxmemory, policy, evicted string
	for _, line := range strings.Split(info, "\n") {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		switch k {
		case "maxmemory":
			maxmemory = v
		case "maxmemory_policy":
			policy = v
		case "evicted_keys":
			evicted = v
		}
	}
	if evicted != "" && evicted != "0" {
		v, err := l.run(ctx, n, evictedScript, []string{l.markerArg.(string), l.evictedArg}, evicted)
		if err == nil && v == int64(1) {
			l.logger.Warn("lock node evicted keys: taken for a node that lost its data; set maxmemory-policy noeviction",
				zap.Int("node", n.index), zap.String("addr", n.addr), zap.String("evicted_keys", evicted))
		}
	}
	evicts := maxmemory != "" && maxmemory != "0" && policy != "" && policy != "noeviction"
	if n.evicts.Swap(evicts) == evicts {
		return
	}
	if evicts {
		l.logger.Warn("lock node may evict lock keys: it does not count towards grants; set maxmemory-policy noeviction",
			zap.Int("node", n.index), zap.String("addr", n.addr), zap.String("maxmemory", maxmemory), zap.String("maxmemory_policy", policy))
	} else {
		l.logger.Warn("lock node no longer evicts keys: it counts towards grants again", zap.Int("node", n.index), zap.String("addr", n.addr))
	}
}

// tally counts the nodes that answered a round, and why those that cannot
// count do not, for a NoQuorumError.
type tally struct {
	nodes, recovering, unmarked, evicting, unplaced int
}

// tally adds r, one node's reply to a round begun at start, to t.
func (l *Locker) tally(t *tally, r reply, fresh bool, start time.Time) {
	if r.err != nil {
		return
	}
	t.nodes++
	switch {
	case r.evicts:
		t.evicting++
	case l.lostState(r, start) || r.clock == clockAhead:
		t.recovering++
	case r.clock != clockGood:
		t.unplaced++
	case !counts(r, fresh):
		t.unmarked++
	}
}

// noQuorum is the error for a round that t's nodes could not decide.
func (t tally) noQuorum(total int) *NoQuorumError {
	return &NoQuorumError{Answered: t.nodes, Total: total, Recovering: t.recovering, Unmarked: t.unmarked, Evicting: t.evicting, Unplaced: t.unplaced}
}

// lostState reports whether the state in a reply to a round made at start
// shows a node that lost its data, as opposed to one of a deployment that
// may be fresh (or was, when the round was made: its markers were being
// created).
func (l *Locker) lostState(rep reply, start time.Time) bool {
	return rep.state == stateRecovering || (rep.state == statePristine && l.seen() && !l.seenSince(start))
}

// fresh reports whether res, the replies of a round begun at start to
// every node, show a deployment that was never used: every node answered,
// none has a marker or a recovery, and this Locker saw neither before the
// round began. Their nodes then count, so that a new deployment works at
// once; initFresh creates the markers. All nodes must answer: a Locker
// started after a loss that left only a minority with its marker must not
// take the others for a new deployment because that minority was slow to
// answer.
func (l *Locker) fresh(res []reply, start time.Time) bool {
	if l.seen() && !l.seenSince(start) {
		return false
	}
	for _, r := range res {
		if r.err != nil || r.state != statePristine {
			return false
		}
	}
	return len(res) == len(l.nodes)
}

// countRound fans r out to every node and hands f the replies and whether
// they show a new deployment (fresh), whose markers it then creates (see
// initFresh) before it returns.
func (l *Locker) countRound(ctx context.Context, r *round, start time.Time, f func(res []reply, fresh bool)) {
	var res0 []reply // the replies, when fresh
	l.fanout(l.nodes, r, func(res []reply) {
		l.settleClock(l.nodes, res, start)
		fresh := l.fresh(res, start)
		if fresh {
			res0 = slices.Clone(res) // res is the round's, gone after f
		}
		f(res, fresh)
	})
	if res0 != nil {
		l.initFresh(context.WithoutCancel(ctx), res0)
	}
}

// initFresh creates the marker, in one round, on every node that answered
// in res, a round that fresh accepted, so that from then on a node without
// it has lost its data. The round in which the fresh nodes counted thus
// ends only after the markers exist. Another Locker that sees some
// markers while the round runs waits before it takes the other nodes for
// lost (see watch).
//
// A node that the round misses (its call timed out) is tried again while
// other Lockers still give the init time (settle); a node left without its
// marker is then brought in as one that lost its data, which needs enough
// nodes with a marker to copy from.
func (l *Locker) initFresh(ctx context.Context, res []reply) {
	l.beginInit()
	defer l.endInit()
	var nodes []*node
	for i, r := range res {
		if r.err == nil {
			nodes = append(nodes, l.nodes[i])
		}
	}
	until := time.Now().Add(l.cfg.NodeTimeout + l.cfg.NodeTimeout/2)
	for len(nodes) > 0 {
		var missed []*node
		r := l.call(ctx, opInit, len(nodes), l.markerArg.(string), codeInit, "", "", 0)
		l.fanout(nodes, r, func(res []reply) {
			for i, r := range res {
				if r.err != nil {
					missed = append(missed, nodes[i])
				}
			}
		})
		if ctx.Err() != nil || time.Now().After(until) {
			break
		}
		nodes = missed
	}
}

// beginInit and endInit bracket an initFresh; endInit marks the deployment
// seen (after the markers exist) and wakes awaitInit.
func (l *Locker) beginInit() {
	l.initMu.Lock()
	defer l.initMu.Unlock()
	if l.initN == 0 {
		l.initDone = make(chan struct{})
	}
	l.initN++
}

func (l *Locker) endInit() {
	l.initMu.Lock()
	defer l.initMu.Unlock()
	l.initN--
	if l.initN == 0 {
		l.markSeen()
		close(l.initDone)
		l.initDone = nil
	}
}

// initing reports whether an initFresh of this Locker is in flight.
func (l *Locker) initing() bool {
	l.initMu.Lock()
	defer l.initMu.Unlock()
	return l.initN > 0
}

// awaitInit waits, at most until ctx ends, for the initFresh in flight,
// if any (it is bounded by a few NodeTimeouts).
func (l *Locker) awaitInit(ctx context.Context) {
	l.initMu.Lock()
	ch := l.initDone
	l.initMu.Unlock()
	if ch == nil {
		return
	}
	select {
	case <-ch:
	case <-ctx.Done():
	}
}

// watch runs the watcher until Close: every ProbeInterval, or at once when
// a call saw a node go down or lose its data, it asks every node for its
// state, creates the markers of a fresh deployment, and advances the
// recovery of every node that lost its data.
func (l *Locker) watch() {
	defer l.watchWG.Done()
	ctx := l.subCtx
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-l.done:
			return
		case <-t.C:
		case <-l.poke:
			t.Stop()
		}
		start := time.Now()
		res := l.probe(ctx)
		fresh := l.fresh(res, start)
		if fresh {
			l.initFresh(ctx, res)
		}
		next := l.cfg.ProbeInterval
		for i, n := range l.nodes {
			if res[i].err == nil {
				l.checkEviction(ctx, n)
			}
			if n.jumped.Load() && !l.isClosed() {
				// Its clock jumped forward: its locks may have expired
				// early. Delete its marker and begin its recovery.
				if err := l.clockLoss(ctx, n); err != nil && ctx.Err() == nil {
					l.logger.Debug("lock node recovery step failed", zap.Int("node", n.index), zap.String("addr", n.addr), zap.Error(err))
				}
				next = min(next, 100*time.Millisecond)
				continue
			}
			if res[i].err == nil && res[i].state != stateIntact && !fresh {
				// A recovery to advance (or markers to create): look
				// again soon even if the probes are rare.
				next = min(next, 100*time.Millisecond)
			}
			if res[i].err != nil || res[i].state == stateIntact || !l.seen() || l.isClosed() {
				// Up and intact, unreachable, or in a deployment that may
				// be fresh, whose markers are created once a majority
				// answers.
				continue
			}
			since := l.born.Add(time.Duration(n.health.pristineSince.Load()))
			if res[i].state == statePristine && time.Since(since) < l.settle() {
				// Give another Locker's initFresh in flight time to reach
				// the node before taking it for lost: a recovery once
				// registered stops the init, and a fresh deployment with
				// few markers would wait for its deadline.
				continue
			}
			if err := l.recoverNode(ctx, n); err != nil && ctx.Err() == nil {
				l.logger.Debug("lock node recovery step failed", zap.Int("node", n.index), zap.String("addr", n.addr), zap.Error(err))
			}
		}
		t.Reset(next)
	}
}

// probe asks every node for its state and the time left until its
// recovery's deadline, in parallel, each bounded by NodeTimeout; a node
// known to be down too (the calls do not dial it, see node.skips), so
// that the watcher's checks and Ready find a node that is back.
func (l *Locker) probe(ctx context.Context) []reply {
	out := make([]reply, len(l.nodes))
	start := time.Now()
	r := l.call(ctx, opStatus, len(l.nodes), l.markerArg.(string), codeStatus, "", "", 0)
	r.probe = true // a node known to be down is asked too: it may be back
	l.fanout(l.nodes, r, func(res []reply) { copy(out, res) })
	l.settleClock(l.nodes, out, start)
	for i, n := range l.nodes {
		if out[i].err != nil {
			continue
		}
		n.health.mu.Lock()
		if out[i].state == stateIntact {
			n.health.deadline, n.health.waitsCopy = time.Time{}, false
		} else if out[i].val >= 0 {
			n.health.deadline = time.Now().Add(time.Duration(out[i].val) * time.Millisecond)
		}
		n.health.mu.Unlock()
	}
	return out
}

// recoverNode advances n's recovery by one step: register it, then copy the
// live locks from the other nodes once it is safe to read them, or end it
// by the deadline.
func (l *Locker) recoverNode(ctx context.Context, n *node) error {
	wait := l.cfg.MaxTTL + l.settle()
	v, err := l.run(ctx, n, beginScript, []string{l.markerArg.(string), l.recoveryArg.(string)}, uuid.NewString(), wait.Milliseconds())
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	a, _ := v.([]any)
	if len(a) == 1 {
		return nil // another Locker ended it, or it never lost anything
	}
	if len(a) != 4 {
		return fmt.Errorf("begin replied %v", v)
	}
	id, _ := a[1].(string)
	age, _ := a[2].(int64)
	left, _ := a[3].(int64)
	n.health.mu.Lock()
	n.health.deadline = time.Now().Add(time.Duration(left) * time.Millisecond)
	n.health.mu.Unlock()

	if left == 0 {
		return l.finish(ctx, n, id, l.readCounters(ctx, n), true)
	}
	if wait := l.settle() - time.Duration(age)*time.Millisecond; wait > 0 {
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
	locks, floor, sources := l.readLocks(ctx, n)
	if need := len(l.nodes) - l.quorum + 1; sources < need {
		n.health.mu.Lock()
		n.health.waitsCopy = true
		n.health.mu.Unlock()
		return fmt.Errorf("%d of the other nodes could be read with their data, %d needed", sources, need)
	}
	if err := l.restore(ctx, n, id, locks, floor); err != nil {
		return err
	}
	return l.finish(ctx, n, id, floor, false)
}

// settle is how long after a loss was first seen the watcher waits before
// reading the other nodes: every acquisition (two rounds) or extension
// that could have counted on the node before its loss has finished by then,
// so its writes are on the other nodes.
func (l *Locker) settle() time.Duration {
	return l.maxRounds() + 10*time.Millisecond
}

// maxRounds is the longest an acquisition may take, from the start of its
// granting round to the end of its fence confirmation, and still be
// granted: two node calls. confirm refuses a slower one; settle waits it
// out.
func (l *Locker) maxRounds() time.Duration { return 2 * l.cfg.NodeTimeout }

// copied is one lock as read from the nodes that kept their data.
type copied struct {
	value string // "<w><fence>/<attempt>:<token>", or "<w><fence>" for no owner
	pttl  int64  // -1: no expiry
}

// readLocks reads the live locks and the fence counters of every node but
// n that has the marker, and merges them. It returns the locks, the largest
// counter, and how many nodes were read completely.
//
// Only locks that n may have granted before its loss matter, and those
// were written before the read began (the watcher waited for every round
// that could have counted n). So each source's counter is taken at its
// first read, and a lock stored with a larger fence, written since by an
// acquisition that never counted n, is left out. A key whose readings still
// name different owners is read again after the rounds in flight at the
// first read have ended (an attempt's leftover is gone by then); one still
// disputed after that becomes a lock no token owns.
func (l *Locker) readLocks(ctx context.Context, n *node) (map[string]copied, int64, int) {
	var floor int64
	var read []source
	pattern := globEscape(l.lockPrefix) + "*"
	for _, src := range l.nodes {
		if src == n {
			continue
		}
		got, counter, err := l.dump(ctx, src, pattern)
		if err != nil {
			continue
		}
		floor = max(floor, counter)
		read = append(read, source{src, counter, got})
	}
	locks := make(map[string]copied)
	var disputed []string
	for _, s := range read {
		for k, c := range s.locks {
			locks[k] = merge(locks[k], c)
		}
	}
	for k, c := range locks {
		if !undisputed(c.value) {
			disputed = append(disputed, k)
		}
	}
	for try := 0; try < 2 && len(disputed) > 0; try++ {
		t := time.NewTimer(l.settle())
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return locks, floor, len(read)
		}
		again := make(map[string]copied, len(disputed))
		for _, s := range read {
			got, err := l.peek(ctx, s, disputed)
			if err != nil {
				return locks, floor, 0 // no longer intact: start over
			}
			for k, c := range got {
				again[k] = merge(again[k], c)
			}
		}
		disputed = disputed[:0]
		for k := range locks {
			if undisputed(locks[k].value) {
				continue
			}
			c, found := again[k]
			switch {
			case !found:
				delete(locks, k) // gone everywhere: released or expired
			default:
				locks[k] = c
				if !undisputed(c.value) {
					disputed = append(disputed, k)
				}
			}
		}
	}
	return locks, floor, len(read)
}

// source is one node that kept its data, as readLocks read it.
type source struct {
	node    *node
	counter int64 // its fence counter at the first read
	locks   map[string]copied
}

// dump reads every live lock of src that was stored with a fence no larger
// than src's counter at the first step, and that counter, failing if src
// has no marker at any step.
func (l *Locker) dump(ctx context.Context, src *node, pattern string) (map[string]copied, int64, error) {
	out := make(map[string]copied)
	counter := int64(-1)
	cursor := "0"
	keys := []string{l.markerArg.(string), l.fenceArg.(string)}
	for {
		v, err := l.run(ctx, src, dumpScript, keys, cursor, pattern, 1000)
		if err != nil {
			return nil, 0, err
		}
		a, _ := v.([]any)
		if len(a) < 3 || (len(a)-3)%3 != 0 {
			return nil, 0, fmt.Errorf("no marker (%v)", v)
		}
		cursor, _ = a[1].(string)
		if counter < 0 {
			c, _ := a[2].(string)
			if counter, err = strconv.ParseInt(c, 10, 64); err != nil {
				return nil, 0, fmt.Errorf("fence counter %q: %w", c, err)
			}
		}
		for i := 3; i < len(a); i += 3 {
			k, _ := a[i].(string)
			val, _ := a[i+1].(string)
			p, _ := a[i+2].(int64)
			if c, ok := reading(val, p, counter); ok {
				out[k] = merge(out[k], c)
			}
		}
		if cursor == "0" {
			return out, counter, nil
		}
	}
}

// peek reads keys of s again, as dump does.
func (l *Locker) peek(ctx context.Context, s source, keys []string) (map[string]copied, error) {
	v, err := l.run(ctx, s.node, peekScript, append([]string{l.markerArg.(string)}, keys...))
	if err != nil {
		return nil, err
	}
	a, _ := v.([]any)
	if len(a) != 1+2*len(keys) {
		return nil, fmt.Errorf("no marker (%v)", v)
	}
	out := make(map[string]copied, len(keys))
	for i, k := range keys {
		val, _ := a[1+2*i].(string)
		p, _ := a[2+2*i].(int64)
		if p == -2 {
			continue
		}
		if c, ok := reading(val, p, s.counter); ok {
			out[k] = c
		}
	}
	return out, nil
}

// reading is one lock value read from a source whose counter was counter
// at the first read: ok is false for a lock stored since with a larger
// fence. A key of another type (an empty value) is held, by no token.
func reading(val string, pttl, counter int64) (copied, bool) {
	if val == "" {
		return copied{value: "0", pttl: pttl}, true
	}
	if isHashCopy(val) {
		return readingHash(val, pttl, counter)
	}
	if _, fence, _ := splitLock(val); fence > counter {
		return copied{}, false
	}
	return copied{value: val, pttl: pttl}, true
}

// merge combines two readings of one lock. The same owner keeps the larger
// fence and the longer ttl; different owners give a lock that no token owns
// with the longer ttl, so that the node refuses everyone while either may
// still hold it.
func merge(a, b copied) copied {
	if a.value == "" {
		return b
	}
	if isHashCopy(a.value) || isHashCopy(b.value) {
		return mergeHash(a, b)
	}
	ta, fa, oka := splitLock(a.value)
	tb, fb, okb := splitLock(b.value)
	p := longer(a.pttl, b.pttl)
	switch {
	case oka && okb && ta == tb:
		// The attempts of both: a cleanup of either's attempt must not
		// delete the copy while the other's relies on it (see late.go).
		mark := a.value[:1]
		if b.value[0] == '1' {
			mark = "1"
		}
		att := unionAttempts(lockAttempts(a.value), lockAttempts(b.value))
		// The larger fence, unless the readings store different versions
		// of a count of holds: the later one's fence is the holding's
		// (reentrant.go).
		f := max(fa, fb)
		_, va, _ := parseExt(valueExt(a.value))
		_, vb, _ := parseExt(valueExt(b.value))
		switch {
		case va > vb:
			f = fa
		case vb > va:
			f = fb
		}
		return copied{value: mark + strconv.FormatInt(f, 10) + "/" + att + laterExt(a.value, b.value) + ":" + ta, pttl: p}
	default:
		return copied{value: "0" + strconv.FormatInt(max(fa, fb), 10), pttl: p}
	}
}

// splitLock returns the token and fence of a lock value; ok is false for a
// value that no token owns.
func splitLock(v string) (token string, fence int64, ok bool) {
	if len(v) < 1 {
		return "", 0, false
	}
	f, token, ok := strings.Cut(v[1:], ":")
	f, _, _ = strings.Cut(f, "/") // the attempt, if any, follows the fence
	fence, _ = strconv.ParseInt(f, 10, 64)
	return token, fence, ok
}

// lockAttempts returns the attempt list of a lock value that a token
// owns, "" for the previous layout's.
func lockAttempts(v string) string {
	h, _, _ := strings.Cut(v[1:], ":")
	h, _, _ = strings.Cut(h, ";") // the extension (reentrant.go)
	_, att, _ := strings.Cut(h, "/")
	return att
}

// unionAttempts returns the attempts of both lists, "*" when there are more
// than maxAttempts or either is "*" or the previous layout's "".
func unionAttempts(a, b string) string {
	if a == "" || b == "" || a == "*" || b == "*" {
		return "*"
	}
	out := strings.Split(a, ",")
	for _, x := range strings.Split(b, ",") {
		if !slices.Contains(out, x) {
			out = append(out, x)
		}
	}
	if len(out) > maxAttempts {
		return "*"
	}
	return strings.Join(out, ",")
}

// maxAttempts is the most attempt ids a lock's value lists (opsScript).
const maxAttempts = 8

// longer returns the longer of two pttls, -1 (no expiry) being longest.
func longer(a, b int64) int64 {
	if a == -1 || b == -1 {
		return -1
	}
	return max(a, b)
}

// restore writes locks onto n, in calls of at most 500, and raises its
// counter to floor.
func (l *Locker) restore(ctx context.Context, n *node, id string, locks map[string]copied, floor int64) error {
	const chunk = 500
	keys := []string{l.recoveryArg.(string), l.fenceArg.(string)}
	args := []any{id, floor}
	flush := func() error {
		v, err := l.run(ctx, n, restoreScript, keys, args...)
		if err != nil {
			return fmt.Errorf("restore: %w", err)
		}
		if v != int64(1) {
			return errors.New("restore: the recovery was started over")
		}
		keys, args = keys[:2], args[:2]
		return nil
	}
	for k, c := range locks {
		keys = append(keys, k)
		args = append(args, c.value, c.pttl)
		if len(keys)-2 == chunk {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	return flush() // also when there is nothing to copy: it raises the counter
}

// readCounters returns the largest fence counter among the nodes other
// than n that have the marker and answer.
func (l *Locker) readCounters(ctx context.Context, n *node) int64 {
	var floor int64
	keys := []string{l.markerArg.(string), l.fenceArg.(string)}
	for _, src := range l.nodes {
		if src == n {
			continue
		}
		// A SCAN that matches nothing still reports the marker and counter.
		v, err := l.run(ctx, src, dumpScript, keys, "0", "\x00", 1)
		if a, _ := v.([]any); err == nil && len(a) >= 3 {
			c, _ := a[2].(string)
			if cv, err := strconv.ParseInt(c, 10, 64); err == nil {
				floor = max(floor, cv)
			}
		}
	}
	return floor
}

// finish ends n's recovery with the given id, by copy or (byDeadline) by
// its deadline, and counts it.
func (l *Locker) finish(ctx context.Context, n *node, id string, floor int64, byDeadline bool) error {
	flag := "0"
	if byDeadline {
		flag = "1"
	}
	ref, err := l.clockRef()
	if err != nil {
		return fmt.Errorf("finish: %w", err)
	}
	v, err := l.run(ctx, n, finishScript, []string{l.markerArg.(string), l.recoveryArg.(string), l.fenceArg.(string), l.clockArg.(string)}, id, floor, flag, ref, l.bandArg)
	if err != nil {
		return fmt.Errorf("finish: %w", err)
	}
	if v != int64(1) {
		return errors.New("finish: the recovery was started over")
	}
	n.health.mu.Lock()
	if byDeadline {
		n.health.byExpiry++
	} else {
		n.health.byCopy++
	}
	n.health.deadline, n.health.waitsCopy = time.Time{}, false
	n.health.mu.Unlock()
	l.observeState(n, stateIntact, false, time.Now())
	return nil
}

// run calls script s on n alone, outside the batches, bounded by
// NodeTimeout: EVALSHA, and EVAL when the node does not have it cached.
func (l *Locker) run(ctx context.Context, n *node, s *script, keys []string, args ...any) (any, error) {
	ctx, cancel := context.WithTimeout(ctx, l.cfg.NodeTimeout)
	defer cancel()
	sha := s.sha.(string)
	v, err := n.client.EvalSha(ctx, sha, keys, args...).Result()
	if isNoScript(err) {
		v, err = n.client.Eval(ctx, s.src, keys, args...).Result()
	}
	if errors.Is(err, redis.Nil) {
		err = nil
	}
	l.observe(ctx, n, err)
	return v, err
}

// globEscape escapes the characters that SCAN's MATCH treats as patterns.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch r {
		case '*', '?', '[', ']', '\\':
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}
