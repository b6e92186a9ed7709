package quorum

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Listing the locks (LOCKS cursor [MATCH pattern] [COUNT count]).
//
// A resource that a majority of the nodes hold for a whole iteration must
// be returned at least once, and one that is free for the whole iteration
// never. One node is not enough to scan: it may be one of the minority that
// missed the holding (it was down when the lock was taken). Any
// N-majority+1 nodes do: every majority has one of them. So an iteration
// scans that many nodes completely, one after the other, each with SCAN and
// a bounded COUNT (never KEYS): a call does one SCAN step on one node,
// plus a LOCKINFO-like round on every node for each lock key it found,
// which confirms that a majority of the nodes hold it (and drops
// tombstones, expired holdings and the leftovers on a minority). A node
// that does not answer, or does not count (it lost its data, its clock
// jumped, it may evict keys), is skipped for the next one; its part of the
// scan is started again on the next node when it fails halfway.
//
// The cursor is opaque to users; it is a decimal uint64 as SCAN's is:
//
//	bits 0-7    the index of the node being scanned
//	bits 8-15   how many nodes were scanned completely before it
//	bits 16-63  that node's own SCAN cursor
//
// 0 starts an iteration (node 0, none scanned, node cursor 0) and ends
// one; no cursor inside an iteration is 0, since after the first node at
// least one node was scanned. A resource may be returned more than once
// (by each scanned node that holds it, and by a node whose scan restarted);
// the caller may dedupe.

// maxListCount bounds the COUNT given to a node's SCAN, so that a call's
// work stays bounded whatever the client asks.
const maxListCount = 1000

// confirmWidth is the most LOCKINFO rounds a Locks call runs at once.
const confirmWidth = 32

// maxListNodes is the largest number of nodes a cursor can name.
const maxListNodes = 255

// ErrInvalidCursor is returned by Locks for a cursor that no iteration
// over this Locker's nodes returns.
var ErrInvalidCursor = errors.New("quorum: invalid cursor")

// Listed is one resource that Locks returns, with what LOCKINFO reports
// of it (Info.Owned is false: there is no token).
type Listed struct {
	Resource string
	Info     Info
}

// Locks runs one step of an iteration over the resources held on a
// majority of the nodes: it returns the cursor of the next step (0 when the
// iteration is over) and the held resources found in this step whose name
// matches the glob pattern (SCAN's MATCH; "" matches all), with their Info.
// count is the hint given to the node's SCAN (clamped to 1..1000). It
// returns ErrInvalidCursor for a cursor no iteration returns, a
// *NoQuorumError when fewer than a majority of the nodes answer, or an
// error wrapping ctx.Err() when ctx ended first. Each node call is bounded
// by NodeTimeout.
func (l *Locker) Locks(ctx context.Context, cursor uint64, pattern string, count int) (uint64, []Listed, error) {
	return l.locks(ctx, cursor, pattern, count, false)
}

// LocksOnce is Locks for a view of the present, such as a page that
// reads its part of the iteration again and again: a resource is
// returned only by the first node in the nodes' order, among those that
// count now, whose lock key it is found under now. At one instant each
// held resource belongs to exactly one part of the iteration, so pages
// read at once show it once; a full iteration whose nodes change meanwhile
// may miss a resource that Locks would return (one copied onto an earlier
// node after that node's part was read). Use Locks for a listing that must
// not miss one.
func (l *Locker) LocksOnce(ctx context.Context, cursor uint64, pattern string, count int) (uint64, []Listed, error) {
	return l.locks(ctx, cursor, pattern, count, true)
}

func (l *Locker) locks(ctx context.Context, cursor uint64, pattern string, count int, once bool) (uint64, []Listed, error) {
	if l.isClosed() {
		return 0, nil, errClosed
	}
	total := len(l.nodes)
	if total > maxListNodes {
		return 0, nil, fmt.Errorf("quorum: LOCKS supports at most %d lock nodes, got %d", maxListNodes, total)
	}
	need := total - l.quorum + 1 // nodes to scan: one of every majority
	idx := int(cursor & 0xff)
	done := int(cursor >> 8 & 0xff)
	nodeCursor := cursor >> 16
	if idx >= total || done > idx || done >= need {
		return 0, nil, ErrInvalidCursor
	}
	count = min(max(count, 1), maxListCount)
	if pattern == "" {
		pattern = "*"
	}
	match := globEscape(l.lockPrefix) + pattern
	if up := l.countingNodes(); up < l.quorum {
		return 0, nil, &NoQuorumError{Answered: up, Total: total}
	}
	for {
		if ctxErr(ctx) != nil {
			return 0, nil, fmt.Errorf("locks: %w", ctxErr(ctx))
		}
		if total-idx < need-done {
			// Too few nodes left to scan one of every majority.
			return 0, nil, &NoQuorumError{Answered: l.countingNodes(), Total: total}
		}
		n := l.nodes[idx]
		var keys []string
		next, err := uint64(0), error(nil)
		if !l.nodeCounts(n) {
			err = errors.New("does not count")
		} else {
			keys, next, err = l.scanNode(ctx, n, nodeCursor, match, count)
		}
		if err != nil {
			if ctxErr(ctx) != nil {
				return 0, nil, fmt.Errorf("locks: %w", ctxErr(ctx))
			}
			// Scan the next node instead, from its start.
			idx, nodeCursor = idx+1, 0
			continue
		}
		if once && done > 0 {
			keys = l.notBefore(ctx, idx, keys)
		}
		found, err := l.confirmHeld(ctx, keys)
		if err != nil {
			return 0, nil, err
		}
		switch {
		case next != 0:
			nodeCursor = next
		case done+1 == need:
			return 0, found, nil
		default:
			idx, done, nodeCursor = idx+1, done+1, 0
		}
		if nodeCursor >= 1<<48 {
			return 0, nil, fmt.Errorf("quorum: lock node %d returned a SCAN cursor above 2^48", n.index)
		}
		return nodeCursor<<16 | uint64(done)<<8 | uint64(idx), found, nil
	}
}

// notBefore returns, of resources, those whose lock key none of the nodes
// before index idx that count now holds (a node that does not answer
// holds none).
func (l *Locker) notBefore(ctx context.Context, idx int, resources []string) []string {
	if len(resources) == 0 {
		return resources
	}
	ctx, cancel := context.WithTimeout(ctx, l.cfg.NodeTimeout)
	defer cancel()
	present := make([]bool, len(resources))
	var wg sync.WaitGroup
	var mu sync.Mutex
	for _, n := range l.nodes[:idx] {
		if !l.nodeCounts(n) {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmds, err := n.client.Pipelined(ctx, func(p redis.Pipeliner) error {
				for _, r := range resources {
					p.Exists(ctx, l.lockPrefix+r)
				}
				return nil
			})
			if err != nil {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			for i, c := range cmds {
				if c.(*redis.IntCmd).Val() == 1 {
					present[i] = true
				}
			}
		}()
	}
	wg.Wait()
	out := resources[:0]
	for i, r := range resources {
		if !present[i] {
			out = append(out, r)
		}
	}
	return out
}

// countingNodes returns the number of nodes that count towards a
// majority as the last calls and the watcher's last check saw them.
func (l *Locker) countingNodes() int {
	up := 0
	for _, n := range l.nodes {
		if l.nodeCounts(n) {
			up++
		}
	}
	return up
}

// nodeCounts reports whether n answered its last call and counts towards
// a majority (kept its data, a clock in line, no eviction).
func (l *Locker) nodeCounts(n *node) bool {
	return !n.down.Load() && !n.evicts.Load() && !n.health.lost.Load() && !n.jumped.Load()
}

// scanNode runs one SCAN step on n and returns the lock keys' resources.
func (l *Locker) scanNode(ctx context.Context, n *node, cursor uint64, match string, count int) ([]string, uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, l.cfg.NodeTimeout)
	defer cancel()
	keys, next, err := n.client.Scan(ctx, cursor, match, int64(count)).Result()
	l.observe(ctx, n, err)
	if err != nil {
		return nil, 0, err
	}
	out := keys[:0]
	for _, k := range keys {
		if r, ok := strings.CutPrefix(k, l.lockPrefix); ok {
			out = append(out, r)
		}
	}
	return out, next, nil
}

// confirmHeld returns, of resources, those held on a majority of the nodes,
// with their Info, in the order given and without repeats. The rounds run
// at once (the batchers send them together).
func (l *Locker) confirmHeld(ctx context.Context, resources []string) ([]Listed, error) {
	seen := make(map[string]bool, len(resources))
	uniq := resources[:0]
	for _, r := range resources {
		if !seen[r] {
			seen[r] = true
			uniq = append(uniq, r)
		}
	}
	infos := make([]Info, len(uniq))
	errs := make([]error, len(uniq))
	// At most confirmWidth rounds at once: the batchers join them into a
	// few calls per node, small enough to stay quick (a slow call's clock
	// reading does not count).
	var wg sync.WaitGroup
	sem := make(chan struct{}, confirmWidth)
	for i, r := range uniq {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			infos[i], errs[i] = l.confirmOne(ctx, r)
		}()
	}
	wg.Wait()
	out := make([]Listed, 0, len(uniq))
	for i, r := range uniq {
		if errs[i] != nil {
			return nil, errs[i]
		}
		if infos[i].Mode != "none" {
			out = append(out, Listed{Resource: r, Info: infos[i]})
		}
	}
	return out, nil
}

// confirmOne is Info for resource, asked again (twice at most) when a
// majority of the nodes answered but too few of the replies counted: a
// reply whose clock reading was not placed (a slow round on a loaded
// machine) does not count, and one resource's slow round should not fail
// a whole listing.
func (l *Locker) confirmOne(ctx context.Context, resource string) (Info, error) {
	for try := 0; ; try++ {
		in, err := l.Info(ctx, resource, "")
		var nq *NoQuorumError
		if try == 2 || !errors.As(err, &nq) || nq.Answered < l.quorum {
			return in, err
		}
	}
}

// NodeView is a lock node's state for an operator: Status with whether its
// clock is suspect and its round-trip time.
type NodeView struct {
	NodeStatus
	// ClockSuspect is set while a reply showed the node's clock ahead of
	// the others (it jumped forward): it is treated as a node that lost
	// its data until its locks are copied back.
	ClockSuspect bool
	// RTT is the round trip of the node's recent batches (quick to fall,
	// slow to rise); 0 before the first.
	RTT time.Duration
}

// NodeViews returns the state of every node, in the order of New's nodes. It
// is safe for concurrent use.
func (l *Locker) NodeViews() []NodeView {
	st := l.Status()
	out := make([]NodeView, len(st))
	for i, n := range l.nodes {
		out[i] = NodeView{NodeStatus: st[i], ClockSuspect: n.jumped.Load()}
		if n.reachable.Load() {
			out[i].RTT = time.Duration(n.rttLow.Load())
		}
	}
	return out
}
