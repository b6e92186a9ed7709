package quorum

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// Reentrant holds (Options.Reentrant, Release).
//
// The hold count lives with the lock on the nodes, in the extension of its
// value (scripts.go): "<w><fence>/<attempts>;<holds>.<version>;<holder>:<token>".
// A value without "<holds>.<version>" is one hold. The count is an absolute
// value with a version, never a per-node increment: with 5 nodes, holds
// taken through {1,2,3} and {1,2,4} would leave increments 2,2,1,1,0, and a
// release through {3,4,5} would delete the lock on 3 and 4 while one hold
// remains. Instead every change of the count reads it from the nodes (the
// version that a majority's replies show last), and writes the new count
// with the next version to every node; a node keeps the later version of
// two. A change is done once a majority of the nodes that count stored
// it, and the next change reads a majority, which shares a node with it.
// A node never deletes a lock that stores a count on its own: a release
// reads the count first, and only the release of the last hold deletes
// the lock (everywhere, as Unlock does).
//
// A token is one sequential owner (as a thread is), so two changes of one
// count never run at once. A change that failed (NOQUORUM) may have reached
// a minority of the nodes, and then takes effect or not, like any request
// whose reply was lost; Release with a hold number (HOLD n) makes a resent
// release remove nothing more.
//
// A re-entry keeps the holding's fence. The nodes where the token holds
// the lock reply its stored fence; a node that lacks the holding (it
// missed the grant, or the placement of a lock won while it still showed
// the previous holder has not reached it yet: typically right after a
// waited grant) takes it afresh, with a fence from its own counter,
// larger. The round's fence is then the fence of the latest count's
// holding, not the largest reply (reentryFence); the fresh nodes' counters
// are already past it, so the confirmation holds, and the new count,
// written to every node, carries the fence, which such a node then stores
// (sethold). A later holder still gets a larger fence than any node gave:
// no counter went back. For the latest count's nodes to store the
// holding's fence, a holding taken afresh stores a count too (1 hold,
// version 2, with the fence) unless its round is sure that every node
// holding it stores the fence (sure): a node whose reply was lost, one
// that did not count or a leftover of the call's earlier attempt may
// store a fence of its own, larger than the grant's. The confirmation
// raises the others; a hand-over to a reentrant waiter writes the count
// the same way, and recovery copies the fence of a count's later version
// (merge). The extra round is paid after faults and retries only.
//
// A call's own failed attempts. A reentrant Lock that waits makes several
// attempts; each that fails may leave what it did on some nodes: a
// holding it took afresh where the lock was free, a count it stored
// before it lost its majority. Its cleanup may reach a node after the
// call's next attempt (it was held back by a slow link, a paused node, a
// batch that failed after the retry was queued behind it), or never (the
// recovery of a node that restarted empty copied the leftover from
// another node, and no cleanup was sent to the copy). No attempt counts
// any of it as a hold taken before the call, whatever the order:
//
//   - The attempts of one call have ids "<call>+<k>" (holdCall), and a
//     node reports a holding as fresh (enter's reply) when every attempt
//     that relies on it is the call's: the call took it, in this attempt
//     or an earlier one. A holding taken before the call lists an attempt
//     of the call that took it, and of every later call that re-entered
//     it, none of them this call's. Recovery copies a holding with the
//     attempts of every node it read it from (merge), so a copy of a
//     leftover lists this call's attempts only and reads as fresh too.
//   - From its second attempt on, enter first replaces the call's earlier
//     attempts in the holding's list with its own (takeOver): only a
//     call's last attempt succeeds, so none of the earlier ones relies on
//     the lock, and their cleanups, arriving afterwards, find their ids
//     gone and leave the lock that this attempt may count. A call keeps
//     one id in a list however many attempts it makes, so a list never
//     fills up ('*', which reads as held by earlier calls) with one
//     call's retries.
//   - Counts a failed attempt stored are this call's own writes: the
//     first attempt that won a majority records the count it read
//     (holdCall.base; none when the majority was fresh), and every later
//     attempt counts from that, not from what the nodes show since. The
//     count before the call cannot change meanwhile: the token is one
//     sequential owner, and the call is its only change under way. The
//     later attempt writes a version above every one it saw, its own
//     earlier writes included, so the nodes that stored those take the
//     new count.
//
// Hence a call that took the lock afresh has 1 hold, and a re-entry one
// more than the count before the call, whatever its earlier attempts
// left (TestReentrantRetryOwnLeftover, TestReentrantRetryRecoveredLeftover,
// TestReentrantRetryOwnCount). The ids cost nothing on the plain path:
// only reentrant calls have them, and only a retry takes over.

// ErrNotReentrant is returned by Release with a hold number for a lock
// that was taken without Options.Reentrant and never re-entered: it has no
// hold count to compare the number with.
var ErrNotReentrant = errors.New("quorum: lock has no hold count")

// holdState is a token's holding on one node, as enter, query, release and
// extend report it: {g, holds, version, fresh, fence}.
type holdState struct {
	holds, version, fence int64
	fresh                 bool
}

// holdOf returns the holding that r reports, if it reports one (extend's
// reply has the extension after it).
func holdOf(r reply) (holdState, bool) {
	if len(r.arr) != 5 && len(r.arr) != 6 {
		return holdState{}, false
	}
	var v [5]int64
	for i, x := range r.arr[:5] {
		n, ok := x.(int64)
		if !ok {
			return holdState{}, false
		}
		v[i] = n
	}
	return holdState{holds: v[1], version: v[2], fresh: v[3] == 1, fence: v[4]}, true
}

// later returns the holding that stores the later version; a zero a is
// none yet.
func later(a, b holdState) holdState {
	if a.holds == 0 || b.version > a.version {
		return b
	}
	return a
}

// acquireArg is the x of an acquisition: the ttl in ms, with the holding's
// extension after it when it has one.
func acquireArg(ttl time.Duration, f *form) any {
	ext := f.extArg()
	if ext == "" {
		return ttl.Milliseconds()
	}
	return strconv.FormatInt(ttl.Milliseconds(), 10) + ext
}

// parseExt returns the hold count, its version and the holder that a lock
// value's header (the value up to its token) stores; holds is 1 and
// version 0 for a value without a count.
func parseExt(header string) (holds, version int64, holder string) {
	holds = 1
	_, ext, ok := strings.Cut(header, ";")
	if !ok {
		return holds, 0, ""
	}
	count, esc, _ := strings.Cut(ext, ";")
	if h, v, ok := strings.Cut(count, "."); ok {
		holds, _ = strconv.ParseInt(h, 10, 64)
		version, _ = strconv.ParseInt(v, 10, 64)
	}
	holder, _ = url.QueryUnescape(esc)
	return holds, version, holder
}

// laterExt returns the extension of whichever of two values of one token's
// holding stores the later version of the hold count (on a tie a's, unless
// a has none), with its leading ';', or "".
func laterExt(a, b string) string {
	ea, eb := valueExt(a), valueExt(b)
	_, va, _ := parseExt(ea)
	_, vb, _ := parseExt(eb)
	if vb > va || (vb == va && ea == "") {
		return eb
	}
	return ea
}

// valueExt returns the extension of a lock value that a token owns.
func valueExt(v string) string {
	h, _, _ := strings.Cut(v, ":")
	if i := strings.IndexByte(h, ';'); i >= 0 {
		return h[i:]
	}
	return ""
}

// settleHolds ends a reentrant acquisition that won a majority: it decides
// from the grants whether the token took the lock afresh or re-entered its
// holding, and writes the new count (the latest version plus one hold) to
// every node. It returns the count after the call.
//
// fence is the round's fence (the holding's, for a re-entry:
// reentryFence) and owned the number of nodes where the round may have
// taken the lock, grants or not. The new count is written with fence, so
// that every node that stores it stores the holding's fence. A holding
// taken afresh is written too (1 hold, version 2) unless every node where
// it may be is a counting grant that stores fence and the call made no
// earlier attempt: otherwise a node may keep another fence (one whose
// reply was lost, one that did not count, a leftover of an earlier
// attempt) that a later re-entry could take for the holding's.
//
// call is the Lock call's state across its attempts (nil: none). The
// first of its attempts to get here records the count before the call
// (none when the majority took the lock afresh), and every later one
// takes that as the latest old count: the nodes may since show counts
// that this call's own failed attempts wrote, which it must not count
// again.
func (l *Locker) settleHolds(ctx context.Context, key, token, attempt string, granted []grant, call *holdCall, fence int64, owned int) (holdState, error) {
	var (
		fresh, counted int
		last, all      holdState // the latest version among counting old holdings, among all
	)
	for _, g := range granted {
		all = later(all, g.hold)
		if !g.counts {
			continue
		}
		counted++
		if g.hold.fresh {
			fresh++
		} else {
			last = later(last, g.hold)
		}
	}
	old := last.holds > 0
	if call != nil {
		switch {
		case !call.based:
			call.based = true
			if old && fresh < l.quorum {
				call.base = last
			}
		case call.base.holds == 0:
			old = false // what looks old is this call's own writes, or gone
		default:
			last = call.base
		}
	}
	next := holdState{holds: 1, version: all.version + 1, fence: fence}
	switch {
	case !old && all.version <= 1 && sure(granted, call, fence, owned):
		return holdState{holds: 1, version: 1}, nil // taken afresh everywhere: every node stores 1.1 and fence
	case old && fresh < l.quorum:
		// A majority shares a node with the one that stored the last
		// change of the count: the token held the lock, this is one
		// more hold (fence is the holding's).
		next.holds = last.holds + 1
	}
	if err := l.writeHolds(ctx, key, token, attempt, next); err != nil {
		return holdState{}, err
	}
	return next, nil
}

// sure reports whether a holding taken afresh by a round with granted,
// fence and owned is on no node but its counting grants, each storing
// fence, and its call (nil: none) made no earlier attempt.
func sure(granted []grant, call *holdCall, fence int64, owned int) bool {
	if owned != len(granted) || (call != nil && call.n.Load() > 1) {
		return false
	}
	for _, g := range granted {
		if !g.counts || g.fence != fence {
			return false
		}
	}
	return true
}

// reentryFence returns the fence of a reentrant round whose grants are
// granted and whose largest counting fence is fence: for a re-entry (the
// counting grants show the token's holding from before the call, fewer
// than a majority of them took it afresh, and the call did not find it
// gone before, as settleHolds decides) the holding's fence, otherwise
// fence. The holding's fence is what its latest count's nodes store (a
// node that took the lock afresh in the re-entry stores a larger one from
// its counter until the new count lowers it; one that missed a count may
// store an older one).
func reentryFence(granted []grant, fence int64, quorum int, call *holdCall) int64 {
	var (
		fresh int
		last  holdState // the latest version among the counting old holdings
		held  int64     // the largest fence of those with that version
	)
	for _, g := range granted {
		switch {
		case !g.counts:
		case g.hold.fresh:
			fresh++
		case last.holds == 0 || g.hold.version > last.version:
			last, held = g.hold, g.fence
		case g.hold.version == last.version:
			held = max(held, g.fence)
		}
	}
	if last.holds == 0 || fresh >= quorum || (call != nil && call.based && call.base.holds == 0) {
		return fence
	}
	return held
}

// writeHolds stores s as the hold count of token's holding on every node
// (with its fence, when s has one) and reports an error unless a
// majority of the nodes that count stored it.
func (l *Locker) writeHolds(ctx context.Context, key, token, attempt string, s holdState) error {
	x := strconv.FormatInt(s.holds, 10) + "." + strconv.FormatInt(s.version, 10)
	if s.fence > 0 {
		x += ":" + strconv.FormatInt(s.fence, 10)
	}
	stored, answered := 0, 0 // of the nodes that count
	r := l.call(ctx, opSetHold, len(l.nodes), key, codeSetHold, token, attempt, x)
	l.fanoutSettled(r, func(res []reply) {
		for _, r := range res {
			if r.err != nil || !counts(r, false) {
				continue
			}
			answered++
			if r.val == 1 {
				stored++
			}
		}
	})
	switch {
	case stored >= l.quorum:
		return nil
	case ctxErr(ctx) != nil:
		return fmt.Errorf("hold %q: %w", key, ctxErr(ctx))
	case answered < l.quorum:
		return &NoQuorumError{Answered: answered, Total: len(l.nodes)}
	}
	return ErrNotHeld
}

// Release removes holds of resource's lock of token and returns how many
// are left; 0 means that the lock was released on a majority of the
// nodes (and waiters notified, as by Unlock).
//
// With hold 0 it removes one hold: a lock without a count (taken without
// Options.Reentrant and never re-entered) is released as Unlock releases
// it. With hold n > 0, n being Lock.Holds of the acquisition whose hold
// this gives back, the count becomes min(count, n-1): the same call sent
// twice removes one hold. It then returns ErrNotReentrant, changing
// nothing, for a lock without a count.
//
// Errors are Unlock's: ErrNotHeld when token does not own the lock on a
// majority, a *NoQuorumError when fewer than a majority answered, an
// error wrapping ctx.Err() when ctx ended first. ctx bounds the call.
func (l *Locker) Release(ctx context.Context, resource, token string, hold int64) (int64, error) {
	if l.isClosed() {
		return 0, errClosed
	}
	if token == "" || hold < 0 {
		return 0, ErrNotHeld
	}
	return l.releaseHold(ctx, resource, token, hold)
}

// releaseHold is Release on a Locker that may be closed (the give-back of
// a lock whose caller is gone).
func (l *Locker) releaseHold(ctx context.Context, resource, token string, hold int64) (int64, error) {
	l.cancelPlacement(resource, token)
	var (
		deleted, answered int
		seen              []reply
	)
	if hold == 1 {
		// The count becomes 0 whatever it is: one round, unless the lock
		// has no count (then nothing is deleted).
		deleted, answered, seen = l.releaseWith(ctx, resource, token, codeReleaseLast)
		switch {
		case deleted >= l.quorum:
			return 0, nil
		case deleted == 0 && len(seen) > 0:
			return 0, ErrNotReentrant
		case len(seen) > 0:
			// Nodes that missed the count: they release too.
			all, _, _ := l.releaseWith(ctx, resource, token, codeReleaseAll)
			deleted, seen = deleted+all, nil
		}
	} else if hold > 0 {
		seen, answered = l.queryHolds(ctx, resource, token)
	} else if w := l.claimHandoff(resource, token); w != nil {
		deleted, answered, seen = l.handOver(ctx, resource, token, w)
	} else {
		deleted, answered, seen = l.release(ctx, l.nodes, resource, token, true)
	}
	if len(seen) == 0 {
		switch {
		case deleted >= l.quorum:
			return 0, nil
		case hold > 0 && answered >= l.quorum:
			return 0, ErrNotHeld
		case ctxErr(ctx) != nil:
			return 0, fmt.Errorf("unlock %q: %w", resource, ctxErr(ctx))
		case answered < l.quorum:
			return 0, &NoQuorumError{Answered: answered, Total: len(l.nodes)}
		default:
			return 0, ErrNotHeld
		}
	}
	// The token owns a holding with a count (or, for hold n, any holding):
	// the count of the latest version decides.
	owners, uncounted := deleted, 0
	var last holdState
	for _, r := range seen {
		h, _ := holdOf(r)
		last = later(last, h)
		if counts(r, false) {
			owners++
		} else {
			uncounted++ // a node that does not count yet (clock, data)
		}
	}
	switch {
	case owners < l.quorum && ctxErr(ctx) != nil:
		return 0, fmt.Errorf("unlock %q: %w", resource, ctxErr(ctx))
	case owners < l.quorum && (answered-uncounted < l.quorum || owners+uncounted >= l.quorum):
		return 0, &NoQuorumError{Answered: answered, Total: len(l.nodes)}
	case owners < l.quorum:
		return 0, ErrNotHeld
	case hold > 0 && last.version == 0:
		return 0, ErrNotReentrant
	}
	next := holdState{holds: last.holds - 1, version: last.version + 1}
	if hold > 0 {
		next.holds = min(last.holds, hold-1)
		if next.holds == last.holds {
			return last.holds, nil // sent again: removes nothing more
		}
	}
	if next.holds > 0 {
		if err := l.writeHolds(ctx, l.lockPrefix+resource, token, "", next); err != nil {
			return 0, err
		}
		return next.holds, nil
	}
	// The last hold: release it everywhere.
	all, answered, _ := l.releaseWith(ctx, resource, token, codeReleaseAll)
	deleted += all
	switch {
	case deleted >= l.quorum:
		return 0, nil
	case ctxErr(ctx) != nil:
		return 0, fmt.Errorf("unlock %q: %w", resource, ctxErr(ctx))
	case answered < l.quorum:
		return 0, &NoQuorumError{Answered: answered, Total: len(l.nodes)}
	}
	return 0, ErrNotHeld
}

// releaseWith runs the release operation code (up, uf, ul) on every node
// and notifies the waiters when it deleted the lock somewhere. It returns
// as release does.
func (l *Locker) releaseWith(ctx context.Context, resource, token string, code any) (deleted, answered int, counted []reply) {
	r := l.call(ctx, opRelease, len(l.nodes), l.lockPrefix+resource, code, token, "", resource)
	l.fanoutSettled(r, func(res []reply) {
		for _, r := range res {
			if r.err != nil {
				continue
			}
			answered++
			if r.val == 1 {
				deleted++
			}
			if r.arr != nil {
				counted = append(counted, r)
			}
		}
	})
	if deleted > 0 {
		l.notify(resource)
	}
	return deleted, answered, counted
}

// queryHolds reads token's holding of resource on every node, changing
// nothing: the replies of the nodes where token owns it, and how many
// nodes answered.
func (l *Locker) queryHolds(ctx context.Context, resource, token string) (seen []reply, answered int) {
	r := l.call(ctx, opQuery, len(l.nodes), l.lockPrefix+resource, codeQuery, token, "", "")
	l.fanoutSettled(r, func(res []reply) {
		for _, r := range res {
			if r.err != nil {
				continue
			}
			answered++
			if _, ok := holdOf(r); ok {
				seen = append(seen, r)
			}
		}
	})
	return seen, answered
}

// holdCall is a reentrant Lock call's state across its attempts. Its
// attempts have ids "<id>+<k>", k = 1, 2, .. in base 36, where id is an
// attempt id of its own (unique among every Locker's): the nodes tell
// the call's holdings from others' by it (enter, in opsScript).
type holdCall struct {
	id string        // "<attempt id>+"
	n  atomic.Uint64 // the call's attempts so far
	// base is the count of the token's holding before the call, as the
	// call's first settled attempt read it from a majority (settleHolds);
	// holds 0 for none. based reports that it was read. Used by the
	// call's attempts only, which run one after the other.
	base  holdState
	based bool
}

// callForm returns the form of one Lock call with the form f: for a
// reentrant one, a copy with a holdCall of its own; f itself otherwise.
func (l *Locker) callForm(f *form) *form {
	if !f.reentrant() {
		return f
	}
	c := *f
	c.call = &holdCall{id: l.newAttempt() + "+"}
	return &c
}

// attemptID returns the id of a new attempt of an acquisition in form f:
// the next of its call's, or a fresh one.
func (f *form) attemptID(l *Locker) string {
	if f == nil || f.call == nil {
		return l.newAttempt()
	}
	return f.call.id + strconv.FormatUint(f.call.n.Add(1), 36)
}

// Holder names who acquires (Options.Holder), as LOCKINFO shows it. Make
// one with NewHolder once per client and give it to every Lock: the work
// of storing it is done there, not per call. The zero Holder names nobody.
// A Holder is safe for concurrent use.
type Holder struct {
	forms *[2]form // a plain and a reentrant acquisition's
}

// NewHolder returns the Holder named name; "" is the zero Holder.
func NewHolder(name string) Holder {
	if name == "" {
		return Holder{}
	}
	esc := url.QueryEscape(name) // no ':' or ';' left
	return Holder{forms: &[2]form{newFormOf(false, esc), newFormOf(true, esc)}}
}

// form is what an acquisition stores beyond a plain lock: a count of
// holds, a holder. A nil *form is a plain acquisition.
type form struct {
	counted bool      // Options.Reentrant
	holder  string    // escaped Options.Holder
	fresh   string    // the extension of a fresh holding (extArg)
	call    *holdCall // one reentrant call's (callForm), nil in a shared form
}

func newFormOf(counted bool, holder string) form {
	f := form{counted: counted, holder: holder}
	f.fresh = f.extWith(holdState{holds: 1, version: 1})
	return f
}

// reentrantForm is the form of a reentrant acquisition without a holder.
var reentrantForm = func() *form { f := newFormOf(true, ""); return &f }()

// newForm returns the form of an acquisition with opt, nil for a plain one
// without a holder. It does not allocate.
func newForm(opt Options) *form {
	switch {
	case opt.Holder.forms != nil && opt.Reentrant:
		return &opt.Holder.forms[1]
	case opt.Holder.forms != nil:
		return &opt.Holder.forms[0]
	case opt.Reentrant:
		return reentrantForm
	}
	return nil
}

// reentrant reports whether the acquisition counts holds.
func (f *form) reentrant() bool { return f != nil && f.counted }

// code returns the operation that runs the acquisition c (acquire or
// refresh, with or without a waiter's mark) in this form.
func (f *form) code(c any) any {
	if !f.reentrant() {
		return c
	}
	switch c {
	case codeAcquireWait:
		return codeEnterWait
	case codeRefresh:
		return codeReenter
	case codeRefreshWait:
		return codeReenterWait
	}
	return codeEnter
}

// ext returns the extension of the value of a holding in this form with
// the count s (ignored for a form without a count): "" for a plain one.
func (f *form) extWith(s holdState) string {
	switch {
	case f == nil:
		return ""
	case f.counted:
		return ";" + strconv.FormatInt(s.holds, 10) + "." + strconv.FormatInt(s.version, 10) + ";" + f.holder
	}
	return ";;" + f.holder
}

// extArg is the extension of a fresh holding in this form.
func (f *form) extArg() string {
	if f == nil {
		return ""
	}
	return f.fresh
}

// freshHolds is Lock.Holds of a fresh holding in this form.
func (f *form) freshHolds() int64 {
	if f.reentrant() {
		return 1
	}
	return 0
}

// giveBack releases one hold of a lock whose caller is gone (or that has
// no validity left), also while the Locker closes.
func (l *Locker) giveBack(ctx context.Context, resource, token string) {
	_, _ = l.releaseHold(ctx, resource, token, 0)
}

// healExt returns the extension that heals a holding whose nodes reported
// res (Extend's replies): the count of the latest version and the holder,
// "" when none reported either.
func healExt(res []reply) string {
	var (
		last   holdState
		holder string // escaped, as stored
	)
	for _, r := range res {
		if h, ok := holdOf(r); ok && h.holds > 0 {
			last = later(last, h)
		}
		if holder == "" && len(r.arr) == 6 {
			if ext, ok := r.arr[5].(string); ok {
				_, holder = extHolder(ext)
			}
		}
	}
	f := &form{counted: last.holds > 0, holder: holder}
	if !f.counted && holder == "" {
		return ""
	}
	return f.extWith(last)
}

// extHolder splits an extension, ";<holds>.<version>;<holder>", into its
// count and its holder (escaped, as stored).
func extHolder(ext string) (count, holder string) {
	count, holder, _ = strings.Cut(strings.TrimPrefix(ext, ";"), ";")
	return count, holder
}

// fanoutSettled is fanout to every node with the clock verdicts of the
// replies settled (as countRound settles them), so that counts weighs
// them as it weighs an acquisition's.
func (l *Locker) fanoutSettled(r *round, f func([]reply)) {
	start := time.Now()
	l.fanout(l.nodes, r, func(res []reply) {
		l.settleClock(l.nodes, res, start)
		f(res)
	})
}
