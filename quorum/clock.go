package quorum

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"
)

// Clock jumps on a lock node, and why they are data loss.
//
// A node expires locks with its own wall clock. When that clock jumps
// forward by J, every lock on the node expires J early: to Redlock, the
// node has forgotten the locks, exactly as a node that lost its data. So a
// node whose clock jumped forward is handled as one that lost its data
// (recovery.go): its grants and extensions do not count, it keeps receiving
// writes, and it counts again once the live locks were copied back to it
// (or MaxTTL has passed). A jump backward only makes locks live longer.
//
// Redis shows Lua no monotonic clock (TIME is the wall clock), so a node
// cannot see its own jump. The nodes are compared with each other instead:
//
//   - The offset. Each node keeps "<prefix>clock", its offset in ms against
//     the deployment's reference clock, so that TIME - offset is the node's
//     reading of the reference. A node without the key has offset 0: a
//     new deployment's reference is the nodes' wall clocks. The offset is
//     written when the node is known good: when its recovery ends (to the
//     reference as the recovering Locker knows it), and when it is behind
//     (below).
//
//   - The reading. Every opsScript call reports, after the node's state,
//     the node's TIME and its offset, read in the same atomic call as the
//     operations. The Locker maps each reply onto its own monotonic clock:
//     the reading was taken between the moment the call was sent and the
//     moment its reply was read.
//
//   - The reference. A Locker keeps, per node, a reading it judged good:
//     the last one, unless an earlier one still bounds the node more
//     tightly (a fast reply, when the last came slowly). A reading x taken
//     between s (sent) and r (read) says that at a later time t the node
//     reads at least x + (t - r) and at most x + (t - s),
//     widened by DriftFactor of t - r (or t - s) for the rates of the
//     clocks. The Locker's lower bound of the reference at t is the lower
//     median of those lower bounds over the nodes, its upper bound the upper
//     median of the upper bounds. A majority of nodes with readings is
//     needed; with one node of a majority lying, the median is still one
//     an honest node bounds. The bounds widen with time, so a reference
//     whose bounds lie more than the band (ClockTolerance/2) apart is
//     dropped, and rebuilt from the next round.
//
//   - Judging a reply of node i, sent at s and read at r, with reading x,
//     against the other nodes' readings (a majority less one of the nodes,
//     at least one, must have a good one; else, a single node, against the
//     reference's bounds): it is good when x lies within
//     the band of lo, the tightest of their lower bounds at s; then its
//     vote may count and x becomes the node's last good reading. It is
//     ahead when x exceeds by more than the band the loosest of their
//     upper bounds at r, or the upper bound of the whole reference at r:
//     the node read a time that no honest clock could have shown by then,
//     so its clock jumped forward, and it is taken for a node that lost
//     its data. The others' bounds, not the reference's medians: when i is
//     the node that lies, the others are honest and each of their bounds
//     holds, so the tightest one is a true lower bound; when i is honest,
//     counting it is no risk (a jump of i's clock is what the verdict
//     guards against). And the tightest, because a median over every
//     node's reading lags by the slowest readings it takes in: with one
//     node cut off, the reference rests on the slow node's own readings,
//     whose lower bounds lag by their way back, and a slow node judged
//     against them needed its whole round trip within the band. So an
//     honest node's reply counts when its way there (plus how far the
//     other nodes' tightest lower bound lags, about their readings' way
//     back) lies within ClockTolerance/2: over a symmetric link, a round
//     trip up to about ClockTolerance, NodeTimeout by default (for
//     NodeTimeout up to 100ms), and that without the validity losing more
//     than ClockTolerance.
//     Anything else (a slow reply that cannot be placed precisely, or a
//     node behind) does not count and changes nothing.
//
//   - Behind. A call carries the Locker's lower bound at the moment it is
//     sent, and the script moves the offset of a node with its marker that
//     reads more than the band below it up to it, in the same call, before
//     it reports the reading (so the reply is judged good). A node whose
//     clock went back would otherwise hide a later forward jump of the same
//     size. A call that arrives late only makes the node look further
//     ahead, never behind, so a late call never moves an offset.
//
//   - A Locker without a reference (new, idle for long, or whose nodes
//     disagree) builds one from a round: the readings of one round, taken
//     to a common instant, that agree within the band, when there are a
//     majority of them. The round's replies are judged against it before
//     they count. Every Locker thus judges a node by the same evidence on
//     the nodes, including a Locker started after the jump: the jumped
//     node reads ahead of the majority by what it jumped.
//
//   - The verdict. When a reply of a node with its marker is ahead, the
//     Locker's watcher deletes the node's marker and starts its recovery
//     (recovery.go); until then every reply of that node is ahead again
//     (the offset still says so), for every Locker. The recovery ends by
//     writing the new offset, so the node then reads in line.
//
// The races, and what the tolerance buys:
//
//   - A jump between a grant on the node and the next call to it expires
//     the lock early, and the next call (a competitor's acquisition
//     included) reads TIME in the same atomic call as its SET NX, so it
//     finds the node ahead and its grant does not count.
//   - An undetected jump. A good reading x lies at most the band above the
//     lower bound at s, and the reference read at least that when the node
//     read x: the node was at most the band ahead. The node's reading
//     before was at least the band below that bound, and that bound lay
//     below the reference by at most the reading's way there and the
//     bound's lag: so a jump that no call notices is at most 2*band =
//     ClockTolerance, plus the way there and the lag of the reading before
//     it (under a millisecond on a LAN; it only comes into play for a node
//     that read behind the reference by as much). Such a jump shortens a
//     lock on that node by as much, so every validity subtracts
//     ClockTolerance on top of the drift allowance.
//   - A jump forward and back between two calls to the node (forward
//     J, the node's locks expire, back J before anyone calls it) leaves no
//     trace on its clock and is not detected. Neither is a majority of the
//     nodes jumping together: the majority is the reference.
//   - A slow reply. When its way there exceeds the band, its reading
//     cannot be placed and its vote does not count; the node is not taken
//     for lost. A reply that is late enough to show the node "ahead" is
//     one read after the reading was taken, so the verdict stands: a late
//     call is no false alarm. What a slow node cannot do is help rebuild a
//     reference (rebuild takes readings whose round trip is within the
//     band): a Locker that lost its reference (idle for long, or new) with
//     one node cut off and the other slow waits until both fast nodes
//     answer.
//   - A node whose clock runs fast against the others by more than they
//     drift apart drifts out of the band and is recovered (a copy, well
//     under a second), then counts again with a new offset. A node that
//     runs slow is moved along by the calls.

// The clock verdicts of a reply (see judge).
const (
	clockUnjudged int8 = iota // no reading, no reference, or not placed within the band
	clockGood                 // within the band: the reply may count
	clockAhead                // ahead of any honest clock: the node's locks may have expired early
)

// clockReading is a node's reading of the reference clock, as one opsScript call
// reported it.
type clockReading struct {
	at     int64 // the node's TIME minus its offset, in ns
	offset int64 // the node's offset, in ms
	sent   int64 // when the call was sent, ns after the Locker's birth
	read   int64 // when its reply was read, ns after the Locker's birth
}

// refClock is a Locker's estimate of the deployment's reference clock,
// from the last good reading of each node. Its methods are safe for
// concurrent use.
type refClock struct {
	quorum int
	band   int64   // ns: ClockTolerance/2
	rate   float64 // the drift allowance per unit of time: DriftFactor

	mu   sync.Mutex
	last []clockReading // per node, the last good reading
	good []bool         // per node, whether last holds one
	buf  []int64        // scratch for the medians
}

func newRefClock(nodes, quorum int, cfg Config) *refClock {
	return &refClock{
		quorum: quorum,
		band:   int64(cfg.ClockTolerance / 2),
		rate:   cfg.DriftFactor,
		last:   make([]clockReading, nodes),
		good:   make([]bool, nodes),
		buf:    make([]int64, 0, nodes),
	}
}

// bounds returns the lower and upper bound of the reference at t (ns after
// the Locker's birth), and whether there is a reference: good readings of a
// majority of the nodes, whose bounds lie at most the band apart. c.mu is
// held.
func (c *refClock) bounds(t int64) (lo, hi int64, ok bool) {
	lows := c.buf[:0]
	for i, rd := range c.last {
		if c.good[i] {
			lows = append(lows, rd.lowAt(t, c.rate))
		}
	}
	k := len(lows)
	if k < c.quorum {
		return 0, 0, false
	}
	slices.Sort(lows)
	lo = lows[(k-1)/2]
	highs := lows[:0]
	for i, rd := range c.last {
		if c.good[i] {
			highs = append(highs, rd.highAt(t, c.rate))
		}
	}
	slices.Sort(highs)
	hi = highs[k/2]
	c.buf = highs[:0]
	return lo, hi, hi-lo <= c.band
}

// lowAt and highAt are the bounds that reading rd puts on the node's
// reading of the reference at t, with rate the drift allowance.
func (rd clockReading) lowAt(t int64, rate float64) int64 {
	d := t - rd.read
	return rd.at + d - int64(rate*float64(abs(d)))
}

func (rd clockReading) highAt(t int64, rate float64) int64 {
	d := t - rd.sent
	return rd.at + d + int64(rate*float64(abs(d)))
}

// othersBounds returns the bounds that the good readings of the nodes
// other than skip put on the reference: lo, the tightest lower bound at s,
// and loosest, the loosest upper bound at r; and whether a majority less
// one of the nodes, and at least one, has such a
// reading: with the reading of skip, which is being judged, a majority. The
// tightest lower bound, not a median: when skip is the node that lies (see
// judge), the others are honest, so each of their bounds holds, and one
// that was read long ago (a node cut off since) only bounds less tightly.
// c.mu is held.
func (c *refClock) othersBounds(skip int, s, r int64) (lo, loosest int64, ok bool) {
	k := 0
	for i, rd := range c.last {
		if !c.good[i] || i == skip {
			continue
		}
		l, h := rd.lowAt(s, c.rate), rd.highAt(r, c.rate)
		if k == 0 || l > lo {
			lo = l
		}
		if k == 0 || h > loosest {
			loosest = h
		}
		k++
	}
	return lo, loosest, k > 0 && k >= c.quorum-1
}

// ref returns the lower bound of the reference at t in ms, for a call sent
// then, and whether there is a reference.
func (c *refClock) ref(t int64) (int64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	lo, _, ok := c.bounds(t)
	return lo / int64(time.Millisecond), ok
}

// known reports whether there is a reference at t.
func (c *refClock) known(t int64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, _, ok := c.bounds(t)
	return ok
}

// judge returns the verdict on node i's reading rd and keeps a good one.
func (c *refClock) judge(i int, rd clockReading) int8 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.judgeLocked(i, rd)
}

func (c *refClock) judgeLocked(i int, rd clockReading) int8 {
	lo, loosest, ok := c.othersBounds(i, rd.sent, rd.read)
	if !ok {
		// Too few other nodes with a reading (a single node): the whole
		// reference, the node's own readings included.
		if lo, _, ok = c.bounds(rd.sent); !ok {
			return clockUnjudged
		}
		_, loosest, _ = c.bounds(rd.read)
	}
	if rd.at > loosest+c.band {
		// Ahead of what any of the other nodes' readings allows.
		return clockAhead
	}
	if _, hiAll, ok := c.bounds(rd.read); ok && rd.at > hiAll+c.band {
		return clockAhead
	}
	// The node read its clock at some moment after sent, when the
	// reference read at least lo: rd.at - lo bounds the node's offset from
	// above, and the reading is good when that lies within the band, and
	// rd.at not more than the band below lo (a node further behind is moved
	// up by the calls, see Behind).
	if rd.at <= lo+c.band && rd.at >= lo-c.band {
		// Keep the reading that bounds the node more tightly now: a fast
		// reply's bounds stay tighter than a slow one's for a while.
		old := c.last[i]
		if !c.good[i] || rd.read-rd.sent <= old.read-old.sent+int64(2*c.rate*float64(rd.read-old.read)) {
			c.last[i], c.good[i] = rd, true
		}
		return clockGood
	}
	return clockUnjudged
}

// rebuild makes a reference from the readings of one round, rds[i] being
// node idx[i]'s, when a majority of them agree within the band, and
// reports whether it did. Readings whose round trip exceeds the band are
// too imprecise to take part. A reference that is still known is kept.
func (c *refClock) rebuild(idx []int, rds []clockReading) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	var t int64
	for _, rd := range rds {
		t = max(t, rd.read)
	}
	if _, _, ok := c.bounds(t); ok {
		return true
	}
	// Each reading taken to t: the middle of its interval.
	mids := make([]int64, 0, len(rds))
	for _, rd := range rds {
		if rd.read-rd.sent <= c.band {
			mids = append(mids, rd.at+t-(rd.sent+rd.read)/2)
		}
	}
	if len(mids) < c.quorum {
		return false
	}
	sorted := slices.Clone(mids)
	slices.Sort(sorted)
	m := sorted[(len(sorted)-1)/2]
	var agree []int
	for j, rd := range rds {
		if rd.read-rd.sent > c.band {
			continue
		}
		mid := rd.at + t - (rd.sent+rd.read)/2
		if abs(mid-m) <= c.band/2 {
			agree = append(agree, j)
		}
	}
	if len(agree) < c.quorum {
		return false
	}
	clear(c.good)
	for _, j := range agree {
		c.last[idx[j]], c.good[idx[j]] = rds[j], true
	}
	return true
}

func abs(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}

// since returns t as ns after the Locker's birth.
func (l *Locker) since(t time.Time) int64 { return int64(t.Sub(l.born)) }

// settleClock judges the replies of a round, res[i] being nodes[i]'s, that
// came while the Locker had no reference, after building one from the
// round itself. A reply found ahead is observed again, so that the node
// is taken for lost.
func (l *Locker) settleClock(nodes []*node, res []reply, start time.Time) {
	var idx []int
	var rds []clockReading
	for i, r := range res {
		if r.err == nil && r.hasClock && r.clock == clockUnjudged {
			idx = append(idx, nodes[i].index)
			rds = append(rds, r.rd)
		}
	}
	if len(rds) == 0 || l.clock.known(l.since(time.Now())) {
		return
	}
	if !l.clock.rebuild(idx, rds) {
		return
	}
	for i := range res {
		r := &res[i]
		if r.err != nil || !r.hasClock || r.clock != clockUnjudged {
			continue
		}
		r.clock = l.clock.judge(nodes[i].index, r.rd)
		if r.clock == clockAhead {
			l.observeState(nodes[i], r.state, true, start)
		}
	}
}

// jumped records that a reply of n, which has its marker, showed its clock
// ahead: the watcher deletes the marker and recovers the node.
func (l *Locker) jumped(n *node) {
	if !n.jumped.CompareAndSwap(false, true) {
		return
	}
	l.logger.Warn("lock node's clock jumped forward: taken for a node that lost its data until its locks are copied back",
		zap.Int("node", n.index), zap.String("addr", n.addr))
	l.wakeWatcher()
}

// clockLoss deletes the marker of n, whose clock jumped forward, so that
// every Locker takes it for a node that lost its data, and then advances
// its recovery (which registers it at once).
func (l *Locker) clockLoss(ctx context.Context, n *node) error {
	var ref any = "" // without a reference, the recovery's end sets the offset
	if ms, ok := l.clock.ref(l.since(time.Now())); ok {
		ref = ms
	}
	if _, err := l.run(ctx, n, lossScript, []string{l.markerArg.(string), l.clockArg.(string)}, ref); err != nil {
		return fmt.Errorf("clock jump: delete the marker: %w", err)
	}
	n.jumped.Store(false)
	return l.recoverNode(ctx, n)
}

// clockRef returns the lower bound of the reference clock in ms, for a call
// sent now, or an error when the Locker has none.
func (l *Locker) clockRef() (int64, error) {
	ref, ok := l.clock.ref(l.since(time.Now()))
	if !ok {
		return 0, errNoReference
	}
	return ref, nil
}

var errNoReference = errors.New("quorum: no reference clock yet (a majority of the nodes must answer with clocks that agree within ClockTolerance/2)")
