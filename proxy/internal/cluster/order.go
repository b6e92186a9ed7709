package cluster

import (
	"io"
	"sync"
	"time"

	"github.com/lockproxy/lockproxy/proxy/internal/condwait"
)

// The order of a cluster client's replies. The client's commands go to
// several masters, whose replies come back in any order; each reply takes
// a ticket in the client's Order when its command is queued, and the
// connections' readers put the replies in place: a reply that comes
// before the ones ahead of it waits until they have been written. A call
// made of several parts gathers their replies (Gather) and the last one
// makes the client's reply in the call's place.

// Order is the place of each reply a cluster client is owed, on the
// shared connections or its own. Its methods are safe for concurrent use:
// the forwarder takes tickets, the connections' readers put replies in
// place.
type Order struct {
	mu    sync.Mutex
	cond  sync.Cond // signalled when every reply owed has been written, or the client went
	slots []orderSlot
	head  int    // the first reply not written yet
	first uint64 // the ticket of slots[0]; tickets start at 1
	// closed: the client has gone; nobody waits for its replies.
	closed bool
	// muting: the replies of the command being routed are held back
	// from the client (CLIENT REPLY; session.muteReplies): the tickets
	// taken meanwhile, but a part's, get mute.
	muting bool
}

// orderSlot is one reply owed: to a command sent, or the proxy's own.
type orderSlot struct {
	raw      []byte // the command, to send again when redirected
	slot     int
	arrived  bool
	reply    []byte    // the reply, when it came before one ahead of it
	deadline time.Time // for the redirections, from the first one
	// after is what its connection pushed after the reply (PushAfter),
	// written right after it.
	after []byte
	TicketOpts
}

// TicketOpts is what a ticket's reply is for, besides the client.
type TicketOpts struct {
	// own: sent on the client's own connection (clustercall.go), where
	// a redirection is sent again.
	Own bool
	// stay: inside a transaction, where a redirection cannot be followed:
	// the client gets replyMovedInTxn instead.
	Stay bool
	// seq is the call's seq: where a redirection sends it, WAIT goes.
	Seq uint32
	// replace, when set, is what the client gets instead of the reply.
	Replace []byte
	// g, when set, takes the reply as its part gi: the reply is one of a
	// call's parts, not the client's.
	G    *Gather
	Part int
	// mute: the reply is not written to the client (CLIENT REPLY OFF or
	// SKIP), only waited for.
	Mute bool
}

// Gather collects the replies of a call's parts (clustercall.go). Its
// fields are guarded by the Order's lock until Done is closed.
type Gather struct {
	Replies [][]byte
	left    int
	Ticket  uint64 // the call's own place in the order
	// transform, when set, makes the call's reply from its parts' replies
	// and is run by whoever puts the last part; failed records whether
	// that reply is an error. Without it the forwarder makes the reply.
	Transform func(replies [][]byte) ([]byte, bool)
	Failed    bool
	Done      chan struct{} // closed when every part has come
}

// Init prepares a zero Order for use, before any other method.
func (o *Order) Init() { o.cond.L = &o.mu }

// NewGather returns a Gather of n parts.
func NewGather(n int) *Gather {
	return &Gather{Replies: make([][]byte, n), left: n, Done: make(chan struct{})}
}

// Add takes the next ticket, for raw (copied) to slot.
func (o *Order) Add(raw []byte, slot int, opts TicketOpts) uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.head == len(o.slots) {
		o.first += uint64(len(o.slots))
		o.slots, o.head = o.slots[:0], 0
		if o.first == 0 {
			o.first = 1
		}
	}
	n := len(o.slots)
	if n < cap(o.slots) {
		o.slots = o.slots[:n+1] // keep the buffers of an earlier use
	} else {
		o.slots = append(o.slots, orderSlot{})
	}
	sl := &o.slots[n]
	sl.raw = append(sl.raw[:0], raw...)
	sl.slot, sl.arrived, sl.reply, sl.deadline, sl.after = slot, false, sl.reply[:0], time.Time{}, sl.after[:0]
	sl.TicketOpts = opts
	if o.muting && opts.G == nil {
		sl.Mute = true
	}
	return o.first + uint64(n)
}

// Drop gives back the last ticket, whose command could not be sent.
func (o *Order) Drop(ticket uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if n := len(o.slots); n > o.head && o.first+uint64(n-1) == ticket {
		o.slots = o.slots[:n-1]
	}
}

// Ahead reports whether ticket's reply is the next to write, as it is.
func (o *Order) Ahead(ticket uint64) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	i := int(ticket - o.first)
	return i == o.head && i < len(o.slots) && o.slots[i].G == nil && o.slots[i].Replace == nil && !o.slots[i].Mute
}

// Put records that ticket's reply came: written to w already when written
// is set, else reply, written once the replies ahead of it have been. It
// writes every reply that waited behind it.
func (o *Order) Put(ticket uint64, written bool, reply []byte, w io.Writer) {
	o.mu.Lock()
	defer o.mu.Unlock()
	i := int(ticket - o.first)
	if i < o.head || i >= len(o.slots) {
		return // not owed (the order was reset)
	}
	sl := &o.slots[i]
	if sl.arrived {
		return
	}
	sl.arrived = true
	switch {
	case written:
		w.Write(sl.after)
		o.head++
	case sl.G != nil:
		o.gathered(sl.G, sl.Part, reply)
	case sl.Replace != nil:
		sl.reply = append(sl.reply[:0], sl.Replace...)
	default:
		sl.reply = append(sl.reply[:0], reply...)
	}
	for o.head < len(o.slots) && o.slots[o.head].arrived {
		if !o.slots[o.head].Mute {
			w.Write(o.slots[o.head].reply)
		}
		w.Write(o.slots[o.head].after) // pushes are not replies: never muted
		o.head++
	}
	if o.head == len(o.slots) {
		o.cond.Broadcast()
	}
}

// PushAfter places frame, a push a connection sent after ticket's reply,
// right after that reply: at once when it has been written (or ticket is
// 0, no reply came on the connection), else once it is. A master writes a
// push into the one stream of its connection, before or after a reply, as
// one Redis does for a client (an eviction's invalidation before the reply
// of the command that evicted, an invalidation the client's own write
// caused after its reply); placed after the reply it followed, it keeps
// that order among the replies of every master.
func (o *Order) PushAfter(ticket uint64, frame []byte, w io.Writer) {
	o.mu.Lock()
	defer o.mu.Unlock()
	i := int(ticket - o.first)
	if ticket == 0 || i < o.head || i >= len(o.slots) {
		w.Write(frame)
		return
	}
	o.slots[i].after = append(o.slots[i].after, frame...)
}

// gathered keeps reply as part i of g; the last part makes the call's
// reply when g has a transform. o.mu is held.
func (o *Order) gathered(g *Gather, i int, reply []byte) {
	g.Replies[i] = append([]byte(nil), reply...)
	if g.left--; g.left > 0 {
		return
	}
	defer close(g.Done) // after Failed is set: the forwarder reads it then
	if g.Transform == nil {
		return
	}
	b, failed := g.Transform(g.Replies)
	g.Failed = failed
	if j := int(g.Ticket - o.first); j >= o.head && j < len(o.slots) {
		sl := &o.slots[j]
		sl.arrived = true
		sl.reply = append(sl.reply[:0], b...)
	}
}

// Drained reports whether every reply owed has been written to the sink.
func (o *Order) Drained() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.head == len(o.slots)
}

// Wait waits until every reply owed has been written to the sink, or the
// client has gone.
func (o *Order) Wait() {
	o.mu.Lock()
	defer o.mu.Unlock()
	for o.head < len(o.slots) && !o.closed {
		o.cond.Wait()
	}
}

// WaitFor is Wait, for d at most.
func (o *Order) WaitFor(d time.Duration) {
	o.mu.Lock()
	condwait.Wait(&o.cond, d, func() bool { return o.head == len(o.slots) || o.closed })
	o.mu.Unlock()
}

// Close wakes whoever waits: the client has gone.
func (o *Order) Close() {
	o.mu.Lock()
	o.closed = true
	o.cond.Broadcast()
	o.mu.Unlock()
}

// Command returns ticket's command, slot and options, and the time its
// redirections must end by.
func (o *Order) Command(ticket uint64, retry time.Duration) (raw []byte, slot int, opts TicketOpts, deadline time.Time, ok bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	i := int(ticket - o.first)
	if i < o.head || i >= len(o.slots) {
		return nil, 0, TicketOpts{}, time.Time{}, false
	}
	sl := &o.slots[i]
	if sl.deadline.IsZero() {
		sl.deadline = time.Now().Add(retry)
	}
	return append([]byte(nil), sl.raw...), sl.slot, sl.TicketOpts, sl.deadline, true
}

// Mute holds back from the client (on) the replies of the tickets taken
// from now on but a part's, or stops holding them back: the command being
// routed comes while CLIENT REPLY OFF or SKIP is in effect.
func (o *Order) Mute(on bool) {
	o.mu.Lock()
	o.muting = on
	o.mu.Unlock()
}

// Stays reports whether a redirection of ticket's command must not be
// followed (inside a transaction).
func (o *Order) Stays(ticket uint64) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	i := int(ticket - o.first)
	return i >= o.head && i < len(o.slots) && o.slots[i].Stay
}
