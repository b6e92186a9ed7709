package proxy

import (
	"slices"
	"sync"
	"time"

	"github.com/tidwall/redcon"

	"github.com/lockproxy/lockproxy/proxy/internal/condwait"
	"github.com/lockproxy/lockproxy/proxy/internal/resp"
)

// maxBacklog bounds the commands a client may pipeline behind one of the
// proxy's own commands that is still running (LOCK ... WAIT). Past it, the
// proxy stops reading from that client until the backlog drains.
const maxBacklog = 1 << 16

// replyQueue is what a client is owed, in order: the commands forwarded to
// the backend whose replies have not been written yet (the fifo), and the
// reply the proxy is making itself (a local command is running), with the
// client's commands held back behind it. It owns the connection's state
// machine, which learns from both, and the dedicated backend connection the
// fifo's replies come from.
//
// Its methods are safe for concurrent use: the forwarder pushes, the
// backend's reader pops, and whoever must keep its place in the stream
// waits here (waitTurn, waitEmpty, waitIdle).
type replyQueue struct {
	m *metrics

	mu      sync.Mutex
	cond    sync.Cond // signalled when the queue empties, a local reply ends, or the client goes
	fifo    []entry
	head    int
	busy    bool // a local command is being answered
	backlog []redcon.Command
	closed  bool
	st      connState
	be      *backendConn // the dedicated connection; nil on the shared one
	// identity, when set, is told the integer replies to CLIENT ID and
	// to CLIENT KILL with an ID filter (entryClientID, entryKill), after
	// q.mu is let go.
	identity func(kind entryKind, id, n int64)
}

func (q *replyQueue) init(m *metrics) {
	q.m = m
	q.cond.L = &q.mu
	q.st = newConnState()
}

// send records e, sent on be (nil: on a shared connection). It reports
// false when be has died meanwhile, and records nothing: the caller
// connects again. Otherwise replies tells whether a reply is owed for e.
func (q *replyQueue) send(e *entry, be *backendConn) (ok, replies bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if be != nil && (be.Dead || q.st.holds(e)) {
		return false, false // connect again, or be refused (see doomed)
	}
	if replies = q.st.sent(e); replies {
		e.at = q.m.stamp()
		q.fifo = append(q.fifo, *e)
	}
	return true, replies
}

// sendPlain records n commands of no effect on the connection
// (resp.Plain), sent on a shared connection, as n sends would.
func (q *replyQueue) sendPlain(n int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.fifo = slices.Grow(q.fifo, n)
	for n > 0 {
		k := min(n, latencySample-1)
		n -= k
		at, stamp := q.m.stampRun(k)
		for i := range k {
			e := entry{}
			if q.st.sent(&e) {
				if i == at {
					e.at = stamp
				}
				q.fifo = append(q.fifo, e)
			}
		}
	}
}

// doomed reports what the client gets in place of e, when e belongs to a
// transaction whose backend connection was lost (see connState.doomed);
// nil when e may be sent.
func (q *replyQueue) doomed(e *entry) []byte {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.st.doomed(e)
}

// unsent records that e could not be sent (see connState.unsent).
func (q *replyQueue) unsent(e *entry) {
	q.mu.Lock()
	q.st.unsent(e)
	q.mu.Unlock()
}

// replyReplay returns the CLIENT REPLY a new backend connection must be
// sent first, nil when replies are on.
func (q *replyQueue) replyReplay() []byte {
	q.mu.Lock()
	defer q.mu.Unlock()
	switch q.st.mode {
	case replyOff:
		return cmdReplyOff
	case replySkip:
		return cmdReplySkip
	}
	return nil
}

// silent reports whether the reply to a command answered by the proxy is
// suppressed by CLIENT REPLY, and consumes a SKIP; skipped tells it did.
func (q *replyQueue) silent() (silent, skipped bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	skipped = q.st.mode == replySkip
	return q.st.silent(), skipped
}

// silentFor is silent for a command that was to be forwarded but could
// not be: it applies e's own CLIENT REPLY or RESET to the reply mode.
func (q *replyQueue) silentFor(e *entry) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return !q.st.replies(e)
}

// markable reports whether the proxy may send a command of its own ahead
// of the client's next one and get its reply: replies are on (no SKIP
// pending), and no transaction, subscription or MONITOR is open.
func (q *replyQueue) markable() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	st := &q.st
	return st.mode == replyOn && !st.multi && !st.subscribed() && !st.monitor && !st.replica
}

// inMulti reports whether a transaction is open, as far as the commands
// sent tell.
func (q *replyQueue) inMulti() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.st.multi
}

// refused records that the proxy refused a command of the client.
func (q *replyQueue) refused() {
	q.mu.Lock()
	q.st.refused()
	q.mu.Unlock()
}

// peek reports what the oldest reply owed answers (entryPlain when none
// is owed), what the client gets instead of it, if not the reply, and
// whether the client gets nothing of it (an entry of the proxy's own, or a
// hidden one).
func (q *replyQueue) peek() (kind entryKind, replace []byte, hidden bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.head == len(q.fifo) {
		return entryPlain, nil, false
	}
	e := &q.fifo[q.head]
	return e.kind, e.replace, e.hidden || e.kind == entryInternal
}

// reveal is connState.reveal, under the queue's lock.
func (q *replyQueue) reveal(e *entry) (ok, off bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.st.reveal(e)
}

// replicate records that the oldest command owed a reply, a SYNC or PSYNC,
// is answered with the replication stream: it is done with, and the
// connection is a replica's from now on.
func (q *replyQueue) replicate() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.st.replica = true
	q.pop(1)
	q.cond.Broadcast()
}

// waitSync waits, after a SYNC or PSYNC was sent on be, until it is
// answered, and reports whether the answer is the replication stream
// rather than an error. Redis answers at once or sends a newline every
// second until it does; the wait also ends when be is lost or the client
// goes.
func (q *replyQueue) waitSync(be *backendConn) (replica bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for !q.st.replica && q.head < len(q.fifo) && !be.Dead && !q.closed {
		q.cond.Wait()
	}
	return q.st.replica
}

// account matches one reply frame copied to the client against the fifo
// and learns the connection state it carries. It reports whether the frame
// answered a QUIT.
func (q *replyQueue) account(ri *resp.ReplyInfo) (quit bool) {
	q.mu.Lock()
	kind, arg := entryPlain, int64(0)
	if q.head < len(q.fifo) {
		kind, arg = q.fifo[q.head].kind, q.fifo[q.head].arg
	}
	quit, popped := q.answer(ri)
	q.mu.Unlock()
	if (kind == entryClientID || kind == entryKill) && popped && ri.Type == ':' && q.identity != nil {
		if n, ok := resp.ParseLength(ri.Line()); ok { // the line after ':'
			q.identity(kind, arg, n)
		}
	}
	return quit
}

// accountPlain matches n replies, none of them a push, to n commands sent
// in a run (sendPlain), as n calls of account would. What they carry is
// nothing the connection state learns from: plainReply stands for each.
func (q *replyQueue) accountPlain(n int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for range n {
		q.answer(&plainReply)
	}
}

// plainReply is accountPlain's reply: a frame that is no push, no
// message and no confirmation. Only read.
var plainReply = resp.ReplyInfo{Type: '$'}

// answer is account's work; q.mu is held. popped reports whether the
// frame answered the oldest command.
func (q *replyQueue) answer(ri *resp.ReplyInfo) (quit, popped bool) {
	var e *entry
	if q.head < len(q.fifo) {
		e = &q.fifo[q.head]
	}
	o := q.st.replied(ri, e)
	switch o {
	case unsolicited, confirming:
		return false, false
	case answered, answeredQuit:
		if e.at != 0 && e.kind != entryInternal {
			q.m.latency.Observe(float64(q.m.since()-e.at) / 1e9)
		}
	}
	q.pop(1)
	return o == answeredQuit, true
}

// pop drops n answered entries; q.mu is held. An empty fifo is reset and
// wakes whoever waits for it.
func (q *replyQueue) pop(n int) {
	q.head += n
	if q.head == len(q.fifo) {
		q.fifo = q.fifo[:0]
		q.head = 0
		q.cond.Broadcast()
	}
}

// attach makes be the dedicated backend connection, unless the client has
// gone.
func (q *replyQueue) attach(be *backendConn) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return errClosed
	}
	q.be = be
	return nil
}

// dead reports whether be has been lost.
func (q *replyQueue) dead(be *backendConn) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return be.Dead
}

// replay returns the state a new backend connection must be brought to.
func (q *replyQueue) replay() replayState {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.st.replay
}

// client returns what the client set on its connection.
func (q *replyQueue) client() clientState {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.st.clientState
}

// pubsub reports whether the client is subscribed, as the replies so far
// tell, and whether it speaks RESP3.
func (q *replyQueue) pubsub() (subscribed, resp3 bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.st.subscribed(), q.st.proto == 3
}

// adopt brings the connection state to what the client set elsewhere (on
// its cluster connections), before a new connection is dialed with it.
func (q *replyQueue) adopt(st clientState) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.st.clientState = st
	if !st.resp3() {
		q.st.proto = 2
	}
}

// lose marks be dead and the state it held gone. It returns how many
// entries are owed a reply that will not come (to pass to forget once
// they are answered), how many of them are the client's, whether the
// client was listening or has gone, either of which means disconnecting it,
// and whether it had sent QUIT (then Redis closed be, as it should).
func (q *replyQueue) lose(be *backendConn) (owed, visible int, listening, closed, quit bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	be.Dead = true
	q.cond.Broadcast() // a forwarder in waitSync
	owed = len(q.fifo) - q.head
	for _, e := range q.fifo[q.head:] {
		if e.kind != entryInternal {
			visible++
		}
	}
	quit = q.st.quit
	return owed, visible, q.st.lost(), q.closed, quit
}

// forget drops n entries that lose counted.
func (q *replyQueue) forget(n int) {
	q.mu.Lock()
	q.pop(n)
	q.mu.Unlock()
}

// turn is the connection state a local command is answered in.
type turn struct {
	resp3, multi, subscribed bool
	name                     []byte // the CLIENT SETNAME that named the client, nil for none
}

// waitTurn waits until every reply owed before now has been written, and
// returns the state then; ok is false when the client has gone.
func (q *replyQueue) waitTurn() (t turn, ok bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for q.head < len(q.fifo) && !q.closed {
		q.cond.Wait()
	}
	return turn{resp3: q.st.proto == 3, multi: q.st.multi, subscribed: q.st.subscribed(), name: q.st.replay.name}, !q.closed
}

// waitEmpty waits until no reply from the backend is owed.
func (q *replyQueue) waitEmpty() {
	q.mu.Lock()
	for q.head < len(q.fifo) && !q.closed {
		q.cond.Wait()
	}
	q.mu.Unlock()
}

// waitIdle waits until nothing at all is owed, or the client has gone, or
// d has passed.
func (q *replyQueue) waitIdle(d time.Duration) {
	q.mu.Lock()
	condwait.Wait(&q.cond, d, func() bool { return (q.head == len(q.fifo) && !q.busy) || q.closed })
	q.mu.Unlock()
}

// hold keeps cmd back, behind the local command that is running, and
// reports whether it did; it waits while the backlog is full. It reports
// false when no local command is running: the caller handles cmd.
func (q *replyQueue) hold(cmd redcon.Command) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.busy {
		return false
	}
	for len(q.backlog) >= maxBacklog && q.busy && !q.closed {
		q.cond.Wait()
	}
	if !q.busy {
		return false
	}
	q.backlog = append(q.backlog, cmd)
	return true
}

// startLocal records that a local command is being answered, which holds
// back what follows. It reports whether no reply is owed before it.
func (q *replyQueue) startLocal() (first bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.busy = true
	return q.head == len(q.fifo)
}

// endLocal records that no local command is being answered any more.
func (q *replyQueue) endLocal() {
	q.mu.Lock()
	q.busy = false
	q.cond.Broadcast()
	q.mu.Unlock()
}

// next returns the commands held back meanwhile, or, when there are none
// or the client has gone, ends the local run and returns nil.
func (q *replyQueue) next() []redcon.Command {
	q.mu.Lock()
	defer q.mu.Unlock()
	batch := q.backlog
	q.backlog = nil
	q.cond.Broadcast()
	if len(batch) == 0 || q.closed {
		q.busy = false
		return nil
	}
	return batch
}

// running reports whether a local command is being answered.
func (q *replyQueue) running() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.busy
}

// inflight reports whether a command is still being answered.
func (q *replyQueue) inflight() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.head < len(q.fifo) || q.busy
}

// waiting reports whether the client is waiting on the server rather than
// idle: a command in flight, a subscription or MONITOR.
func (q *replyQueue) waiting() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.head < len(q.fifo) || q.busy || q.st.listening()
}

// close records that the client has gone, wakes every waiter, and returns
// the dedicated backend connection to close.
func (q *replyQueue) close() (be *backendConn, first bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return nil, false
	}
	q.closed = true
	q.cond.Broadcast()
	return q.be, true
}
