package quorum

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Info is what the lock nodes report of one resource, for LOCKINFO. It
// never holds a token.
type Info struct {
	// Mode is "none", "exclusive", "shared" or "semaphore": how a
	// majority of the nodes that count hold the resource.
	Mode string
	// Holders is the number of owners holding it: 0, 1 (exclusive), the
	// readers, or the permits in use.
	Holders int64
	// Permits is 1 when exclusive, the semaphore's k, 0 when none or
	// shared.
	Permits int64
	// Holds is an exclusive holding's hold count (1 without a count), 0
	// when none.
	Holds int64
	// Fence is the largest fence of the current holding, -1 when none.
	Fence int64
	// Validity is how long, from Info's return, a majority of the nodes
	// still keep the holding: the remaining time ranked at the majority
	// size among the nodes, less the round's time and the drift over it
	// (as Lock's validity). -1 when none.
	Validity time.Duration
	// Waiters is the number of Lock calls waiting for the resource on
	// this Locker.
	Waiters int
	// Owned reports whether the token given to Info owns the current
	// exclusive holding on a majority of the nodes that count (shared and
	// semaphore holdings: false; the caller knows its own).
	Owned bool
	// Holder is Options.Holder of the acquisition that took the holding,
	// "" when none was given (or it is unknown).
	Holder string
	// Nodes is the number of lock nodes that answered.
	Nodes int
}

// nodeView is one node's view of a resource (the view operation).
type nodeView struct {
	kind   string // "none", "exclusive", "other"
	pttl   int64  // ms; -2 when there is no key
	header string // an exclusive value up to its token
	mine   bool   // the asking token owns it
	owner  string // the SHA1 of the owning token, "" for none
	counts bool   // the node counts towards a majority
}

// Info reports what the lock nodes know of resource, changing nothing.
// token, when not empty, is checked for ownership (Info.Owned). It returns
// a *NoQuorumError when fewer than a majority of the nodes answered, or
// an error wrapping ctx.Err() when ctx ended first. ctx bounds the call;
// each node gets at most NodeTimeout.
func (l *Locker) Info(ctx context.Context, resource, token string) (Info, error) {
	if l.isClosed() {
		return Info{}, errClosed
	}
	start := time.Now()
	var (
		answered int
		unplaced int // of those, nodes whose clock reading was not placed
		views    []nodeView
	)
	r := l.call(ctx, opView, len(l.nodes), l.lockPrefix+resource, codeView, token, "", "")
	l.fanoutSettled(r, func(res []reply) {
		for _, r := range res {
			v, ok := viewOf(r)
			if !ok {
				continue
			}
			answered++
			if r.clock == clockUnjudged {
				unplaced++
			}
			views = append(views, v)
		}
	})
	counting := 0
	for _, v := range views {
		if v.counts {
			counting++
		}
	}
	switch {
	case ctxErr(ctx) != nil:
		return Info{}, fmt.Errorf("lockinfo %q: %w", resource, ctxErr(ctx))
	case counting < l.quorum:
		// Too few answered, or nodes that do not count yet (a clock not
		// placed, lost data): what a majority holds is not known.
		return Info{}, &NoQuorumError{Answered: answered, Total: len(l.nodes), Unplaced: unplaced}
	}
	other := 0 // counting nodes with a hash record: shared or semaphore
	for _, v := range views {
		if v.counts && v.kind == "other" {
			other++
		}
	}
	var in Info
	if other >= l.quorum {
		var err error
		if in, err = l.sharedInfo(ctx, resource, start); err != nil {
			return Info{}, err
		}
	} else {
		in = l.summarize(views, time.Since(start))
	}
	in.Nodes = answered
	in.Waiters = l.waiters(resource)
	return in, nil
}

// sharedInfo is Info for a resource that a majority of the nodes hold as
// a hash record (shared or semaphore holdings; SharedInfo). Owned is
// left to the caller, which knows the holdings of its connection.
func (l *Locker) sharedInfo(ctx context.Context, resource string, start time.Time) (Info, error) {
	si, err := l.SharedInfo(ctx, resource)
	if err != nil {
		return Info{}, err
	}
	in := Info{Mode: "none", Fence: -1, Validity: -1}
	if si.Mode == "" || si.Holders == 0 {
		return in, nil
	}
	in.Mode, in.Holders, in.Fence = si.Mode, int64(si.Holders), si.Fence
	if si.Mode == "semaphore" {
		in.Permits = int64(si.K)
	}
	left := make([]int64, len(si.Remaining))
	for i, d := range si.Remaining {
		left[i] = d.Milliseconds()
	}
	in.Validity = l.rankedValidity(left, time.Since(start))
	return in, nil
}

// viewOf returns the node view that r reports.
func viewOf(r reply) (nodeView, bool) {
	if r.err != nil || len(r.arr) != 5 {
		return nodeView{}, false
	}
	kind, ok1 := r.arr[0].(string)
	pttl, ok2 := r.arr[1].(int64)
	header, ok3 := r.arr[2].(string)
	mine, ok4 := r.arr[3].(int64)
	owner, ok5 := r.arr[4].(string)
	if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 {
		return nodeView{}, false
	}
	return nodeView{kind: kind, pttl: pttl, header: header, mine: mine == 1, owner: owner, counts: counts(r, false)}, true
}

// summarize turns the nodes' views into an Info: the holding that a
// majority of the counting nodes report, none otherwise. elapsed is the
// round's time. Other modes (shared, semaphore) add their kinds here.
func (l *Locker) summarize(views []nodeView, elapsed time.Duration) Info {
	none := Info{Mode: "none", Fence: -1, Validity: -1}
	// The exclusive owner that a majority of counting nodes show.
	byOwner := make(map[string]int)
	for _, v := range views {
		if v.counts && v.kind == "exclusive" {
			byOwner[v.kind+"/"+v.owner]++
		}
	}
	var owner string
	for o, n := range byOwner {
		if n >= l.quorum {
			owner = o
		}
	}
	if owner == "" {
		return none
	}
	in := Info{Mode: "exclusive", Holders: 1, Permits: 1, Holds: 1, Fence: -1}
	var version int64 = -1
	left := make([]int64, 0, len(views)) // each node's remaining ms
	mine := 0
	for _, v := range views {
		if v.kind+"/"+v.owner != owner {
			left = append(left, 0)
			continue
		}
		left = append(left, v.pttl)
		if v.counts && v.mine {
			mine++
		}
		if v.header == "" {
			continue // a key of another type: no fence, no holder
		}
		fence, _, _ := strings.Cut(v.header[1:], "/")
		fence, _, _ = strings.Cut(fence, ";")
		if f, err := strconv.ParseInt(fence, 10, 64); err == nil {
			in.Fence = max(in.Fence, f)
		}
		holds, ver, holder := parseExt(v.header)
		if ver > version {
			in.Holds, version = holds, ver
		}
		if in.Holder == "" {
			in.Holder = holder
		}
	}
	in.Owned = mine >= l.quorum
	in.Validity = l.rankedValidity(left, elapsed)
	return in
}

// rankedValidity is the validity of a holding whose nodes have left ms
// remaining each (0 where it is missing, -1 for no expiry): the time
// ranked at the majority size, which a majority still keeps, less elapsed
// and the drift over it, as Lock computes its validity. -1 when nothing
// is left.
func (l *Locker) rankedValidity(left []int64, elapsed time.Duration) time.Duration {
	for i, ms := range left {
		if ms == -1 {
			left[i] = l.cfg.MaxTTL.Milliseconds()
		}
	}
	slices.SortFunc(left, func(a, b int64) int { return int(b - a) })
	for len(left) < l.quorum {
		left = append(left, 0)
	}
	ranked := time.Duration(left[l.quorum-1]) * time.Millisecond
	if ranked <= 0 {
		return -1
	}
	v := l.validity(ranked, elapsed)
	if v <= 0 {
		return -1
	}
	return v.Truncate(time.Millisecond)
}

// waiters returns the number of Lock calls waiting for resource on l.
func (l *Locker) waiters(resource string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if q := l.queues[resource]; q != nil {
		return len(q.waiters)
	}
	return 0
}
