package proxy

import (
	"bufio"
	"context"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/lockproxy/lockproxy/proxy/internal/resp"
)

// Batching. shared.go and internal/cluster's Order own how commands leave and replies
// come back on every backend connection a client's commands go on: the
// shared connections to one Redis and to each master of a cluster, a
// cluster client's own connections (groups of one, clustercall.go), and
// the connection of one client of one Redis, or a cluster client's pinned
// pub/sub connection (muxConn.one). A command is queued with the client it
// answers (and, in front of a cluster, its ticket in the client's
// cluster.Order), written with what queued meanwhile in one write,
// and its reply is read by the connection's reader and put in the
// client's order; on a connection of one client, the client's replyQueue
// tells what each frame answers. Where a command goes is the upstream's
// (upstream.go, clusterroute.go).

// muxConn is one backend connection, multiplexed: as a shared connection
// it carries the stateless commands of many clients. Commands are appended to one write buffer. A client writes
// the buffer itself only when the connection is idle (no command waiting for
// its reply); otherwise the reader writes it as soon as it has handed out
// every reply that has arrived, just before it would wait for more. So
// under load the commands of all the clients that arrived while Redis was
// busy go out in one write, and Redis reads and answers many clients'
// commands per system call; when idle, a command goes out at once. Replies
// come back in the same order; the reader appends each to its client's
// sink.
//
// A client uses its shared connection until it sends a command that
// changes or depends on its connection's state (see resp.Stateless); from then
// on it has a connection of its own: a muxConn with one client (one),
// whose reader copies each frame to that client's own buffered output and
// matches it against the client's replyQueue.
//
// Order across connections. A command waiting in wbuf was received before
// any command received later on another connection, so it must not wait
// while such a command goes out: Redis would run them the other way round
// (a GET sent after a SET would miss it, if the SET waits behind another
// client's slow script). So every write to the backend, shared or
// dedicated, first writes whatever waits on the shared connections to the
// same server, the longest-waiting first (muxGroup.writeQueued). Only
// commands that wait at the same time can leave in another order than they
// came, and only when they wait on different shared connections.
type muxConn struct {
	p    *Proxy
	addr string    // a cluster master's; "" for the backend (see Proxy.dial)
	grp  *muxGroup // the connections to the same server

	mu      sync.Mutex
	be      *backendConn // nil until dialled; replaced when it dies
	wbuf    []byte       // commands waiting to be written
	wn      int          // how many commands wbuf holds
	out     int          // commands written whose replies have not been read
	spare   []byte
	writing bool
	// since orders the batches waiting on the shared connections: the
	// Proxy's batch count when wbuf's first command came; 0 while wbuf is
	// empty. Written under mu, read without it by writeQueued.
	since atomic.Uint64
	// wrote is signalled, when waiters is not zero, at the end of a write,
	// for writeWaiting.
	wrote   sync.Cond
	waiters int
	// retired: the connection served an earlier access generation whose
	// clients are gone (router.retire), or the client it was its own
	// connection of has gone; it is never dialed again.
	retired bool
	// own is set on a cluster client's own connection to a master (a
	// group of one, clustercall.go): it is dialled under ctx, the
	// client's, in the client's connection state, and its replies are
	// not counted in the client's replyQueue.
	own *clusterSession
	ctx context.Context
	// one is set on the connection of one client of one Redis (or a
	// cluster client's pinned pub/sub connection) once it has left its
	// shared connection: a group of one, dialled by the session in its
	// connection state (session.connect), its commands written by write,
	// and read by read for as long as it lives, each frame matched by the
	// client's replyQueue rather than the pending list (session.frame),
	// since frames may answer no command (pushes, messages, MONITOR
	// lines) and commands may get no reply (CLIENT REPLY OFF).
	one *session
	// reading: a goroutine reads be. On a cluster client's own
	// connection it runs only while replies are owed there (push starts
	// it, read ends it), so an idle client keeps no goroutine or buffer
	// per master; on a connection of one, for as long as be lives.
	reading bool
}

// sharedGroup is the shared connections to one server: the backend, or
// one master of a cluster. The arrival order is kept within a group only:
// commands sent to different servers cannot see each other's effects (a
// cluster's masters hold different keys; each command with keys goes to
// the master of their slot), so a master's batch need not go out before
// another master's command that came after it, and each master's
// connections batch as the backend's do, whatever the other masters'
// connections have waiting. Its methods are safe for concurrent use.
type muxGroup struct {
	list []*muxConn // set before any connection is used
	// queued counts the connections of the group with commands waiting to
	// be written.
	queued atomic.Int64
	// forwarded counts the commands sent to a cluster master (see
	// router.forwarded); nil for the backend's group.
	forwarded *atomic.Uint64
	// acl is set on the shared connections of a user of Redis's ACL,
	// signed in as that user (acl.go).
	acl *aclGroup
}

// newSharedGroup makes n shared connections to addr ("" for the backend).
func newMuxGroup(p *Proxy, addr string, n int) *muxGroup {
	g := &muxGroup{}
	for range n {
		sh := &muxConn{p: p, addr: addr, grp: g}
		sh.wrote.L = &sh.mu
		g.list = append(g.list, sh)
	}
	return g
}

// pending is who the replies on one shared backend connection belong to.
type pending struct {
	sessions []*session
	// tickets are the cluster sessions' places of the replies in their
	// order (clustershared.go), alongside sessions; 0 elsewhere.
	tickets []uint64
	head    int
}

// send queues one command of s; it returns an error when the backend
// cannot be reached.
func (sh *muxConn) send(s *session, e entry, raw []byte) error {
	return sh.queue(s, 0, nil, raw, &e)
}

// queue queues raw for s, whose reply is its ticket's (0 outside a
// cluster), after pre when set, whose reply nobody reads (ASKING). e, when
// set, is recorded in s's reply queue. It returns an error when the
// backend cannot be reached.
func (sh *muxConn) queue(s *session, ticket uint64, pre, raw []byte, e *entry) error {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.be == nil || sh.be.Dead {
		if sh.retired {
			return errClusterClosed
		}
		if err := sh.connect(); err != nil {
			return err
		}
	}
	if pre != nil {
		sh.push(nil, 0, pre)
	}
	sh.push(s, ticket, raw)
	if e != nil {
		s.sendShared(*e)
	}
	return nil
}

// push appends raw, whose reply is s's with ticket, to what waits to be
// written; sh.mu is held and the connection live.
func (sh *muxConn) push(s *session, ticket uint64, raw []byte) {
	if len(sh.wbuf) == 0 {
		sh.since.Store(sh.p.batches.Add(1))
		sh.grp.queued.Add(1)
	}
	sh.wbuf = append(sh.wbuf, raw...)
	sh.wn++
	q := sh.be.pending
	q.sessions = append(q.sessions, s)
	q.tickets = append(q.tickets, ticket)
	if !sh.reading {
		sh.startReader()
	}
}

// startReader starts the goroutine that reads sh.be; sh.mu is held.
func (sh *muxConn) startReader() {
	sh.reading = true
	sh.p.sharedWG.Add(1)
	go sh.readShared(sh.be)
}

// stopIdle reports whether the reader of a client's own connection ends
// now that no reply is owed on be (the next command starts another).
func (sh *muxConn) stopIdle(be *backendConn) bool {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.be != be || len(be.pending.sessions) > 0 || be.R.Buffered() > 0 || (sh.own != nil && sh.own.listen.Load()) {
		return false
	}
	sh.reading = false
	return true
}

// ready returns the live connection, dialing it when there is none.
func (sh *muxConn) ready() (*backendConn, error) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if be := sh.be; be != nil && !be.Dead && !sh.reading && !be.Open() {
		// Closed while idle, with no reader to notice (the node's
		// timeout, CLIENT KILL, a restart): dial again, as for a
		// connection found lost.
		be.NC.Close()
		be.Dead = true
	}
	if sh.be == nil || sh.be.Dead {
		if sh.retired {
			return nil, errClusterClosed
		}
		if err := sh.connect(); err != nil {
			return nil, err
		}
	}
	return sh.be, nil
}

// queueOn queues raw for s with ticket, as queue does, if be, which ready
// returned, is still the live connection; it reports false otherwise.
func (sh *muxConn) queueOn(be *backendConn, s *session, ticket uint64, raw []byte) bool {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.be != be || be.Dead {
		return false
	}
	sh.push(s, ticket, raw)
	return true
}

// newOne makes the connection of one of s (see muxConn.one); it is dialled
// and attached by the session.
func newOne(s *session) *muxConn {
	sh := newMuxGroup(s.p, "", 1).list[0]
	sh.one = s
	return sh
}

// attach makes be, dialled by the session, the live connection of a
// client's connection of one, and starts its reader. What waited to be
// written on the connection before, which was lost, is dropped: the
// client has been answered for it (session.backendLost).
func (sh *muxConn) attach(be *backendConn) {
	sh.mu.Lock()
	if len(sh.wbuf) > 0 {
		sh.since.Store(0)
		sh.grp.queued.Add(-1)
	}
	sh.wbuf, sh.wn, sh.out = sh.wbuf[:0], 0, 0
	sh.be = be
	sh.reading = true
	sh.mu.Unlock()
	sh.one.wg.Add(1)
	go sh.readOne(be)
}

// put appends raw to what waits to be written on a client's connection
// of one; its replies are matched by the client's replyQueue, not by the
// pending list.
func (sh *muxConn) put(raw []byte) {
	sh.mu.Lock()
	if len(sh.wbuf) == 0 {
		// since stays 0: the group of one is in no list writeQueued
		// goes through, and the global batch count is left alone.
		sh.grp.queued.Add(1)
	}
	sh.wbuf = append(sh.wbuf, raw...)
	sh.wn++
	sh.mu.Unlock()
}

// connect dials a new shared connection; sh.mu is held.
func (sh *muxConn) connect() error {
	p := sh.p
	var be *backendConn
	var err error
	switch {
	case sh.own != nil:
		// The client's own: a failure is the client's, and it retries
		// as the cluster says (session.again), not after a backoff.
		be, err = sh.own.r.dedicated(sh.ctx, sh.addr, sh.own.replay())
		if cmd := sh.own.trackingFor(sh.addr); err == nil && cmd != nil {
			// Tracking on again (clustertracking.go).
			ctx, cancel := context.WithTimeout(sh.ctx, p.cfg.Backend.DialTimeout)
			if err = be.Setup(ctx, [][]byte{cmd}); err != nil {
				be.NC.Close()
			}
			cancel()
		}
	default:
		if err := p.backoff.Check(); err != nil {
			return err
		}
		var st replayState
		if g := sh.grp.acl; g != nil {
			st.auth = *g.auth.Load()
		}
		if sh.addr != "" {
			be, err = p.dialAddr(p.root, sh.addr, st)
		} else {
			be, err = p.dial(p.root, st)
		}
		p.backoff.Record(err)
	}
	if err != nil {
		return err
	}
	be.pending = &pending{}
	sh.be = be
	if len(sh.wbuf) > 0 {
		// The commands of the lost connection; fail answered them.
		sh.since.Store(0)
		sh.grp.queued.Add(-1)
	}
	sh.wbuf, sh.wn, sh.out = sh.wbuf[:0], 0, 0
	sh.reading = false
	if sh.own == nil {
		sh.startReader() // a client's own starts reading with its first command
	}
	return nil
}

// flush writes what is buffered if the connection is idle. Otherwise the
// reader writes it once the replies in flight have been handed out.
func (sh *muxConn) flush() {
	if sh.own != nil || sh.one != nil {
		// One client's: its commands go out as the client's batch ends,
		// after what waits on the shared connections (see shared).
		sh.p.writeQueued()
		sh.mu.Lock()
		sh.write()
		return
	}
	sh.mu.Lock()
	if sh.out > 0 {
		sh.mu.Unlock()
		return
	}
	sh.writeInOrder()
}

// writeInOrder writes what is buffered, after what waits on the other
// shared connections to the same server. sh.mu is held on entry and
// released on return.
func (sh *muxConn) writeInOrder() {
	if a := sh.p.acl; a != nil {
		// Every user's shared connections to one Redis keep one order.
		if a.queued(sh.grp) <= 1 {
			sh.write()
			return
		}
		sh.mu.Unlock()
		if sh.addr == "" {
			a.writeQueued(sh.p.batches.Load())
		} else {
			sh.grp.writeQueued(sh.p.batches.Load())
		}
		return
	}
	if sh.grp.queued.Load() <= 1 {
		sh.write() // nothing waits elsewhere
		return
	}
	sh.mu.Unlock()
	sh.grp.writeQueued(sh.p.batches.Load())
}

// write writes everything buffered unless a write is in progress (whose
// goroutine then writes it). sh.mu is held on entry and released on return.
func (sh *muxConn) write() {
	if sh.writing {
		sh.mu.Unlock()
		return
	}
	sh.writing = true
	for len(sh.wbuf) > 0 {
		buf, be := sh.wbuf, sh.be
		sh.out += sh.wn
		sh.wbuf, sh.wn = sh.spare[:0], 0
		sh.since.Store(0)
		sh.grp.queued.Add(-1)
		sh.mu.Unlock()
		be.NC.SetWriteDeadline(time.Now().Add(sh.p.cfg.Backend.WriteTimeout))
		_, err := be.NC.Write(buf)
		if err != nil {
			be.NC.Close() // the reader answers everything pending with an error
		}
		sh.mu.Lock()
		if cap(buf) <= 64<<10 {
			sh.spare = buf[:0]
		} else {
			// One big command (a client's own connection carries values
			// of any size): not kept for the next batch.
			sh.spare = nil
		}
	}
	sh.writing = false
	if sh.waiters > 0 {
		sh.wrote.Broadcast()
	}
	sh.mu.Unlock()
}

// writeWaiting writes the commands waiting in wbuf if they came in a batch
// numbered limit or lower, and returns once they have been written.
func (sh *muxConn) writeWaiting(limit uint64) {
	sh.mu.Lock()
	for sh.writing {
		// The writer writes wbuf until it is empty before it stops.
		sh.waiters++
		sh.wrote.Wait()
		sh.waiters--
	}
	if since := sh.since.Load(); since == 0 || since > limit {
		sh.mu.Unlock()
		return
	}
	sh.write()
}

// writeQueued writes the commands waiting on the shared connections, the
// batch that has waited longest first, and returns once they have been
// written. Called before a write to the backend, it keeps the order in
// which commands came across connections (see shared).
func (p *Proxy) writeQueued() {
	// Batches that start after this one are newer than what the caller
	// writes next; they wait for their own turn.
	limit := p.batches.Load()
	if p.router == nil {
		if p.acl != nil {
			p.acl.writeQueued(limit)
			return
		}
		p.group.writeQueued(limit)
		return
	}
	for _, g := range p.router.groupList() {
		g.writeQueued(limit)
	}
}

// writeQueued writes the commands waiting on g's connections in batches
// numbered limit or lower, the batch that has waited longest first, and
// returns once they have been written.
func (g *muxGroup) writeQueued(limit uint64) {
	for g.queued.Load() > 0 {
		var oldest *muxConn
		first := limit + 1
		for _, sh := range g.list {
			if since := sh.since.Load(); since != 0 && since < first {
				oldest, first = sh, since
			}
		}
		if oldest == nil {
			return
		}
		oldest.writeWaiting(limit)
	}
}

// readOne hands every frame on be, a client's connection of one
// (sh.one), to the client, until be ends: the client's replyQueue tells
// what each frame answers (session.frame), and its buffered output gets
// it.
func (sh *muxConn) readOne(be *backendConn) {
	s := sh.one
	defer s.wg.Done()
	defer close(be.Done) // connect waits for it before a new connection's replies
	defer func() {
		// A panic here ends this backend connection, not the process: the
		// next command dials.
		if r := recover(); r != nil {
			sh.p.log.Error("panic reading a backend connection", zap.Any("panic", r), zap.StackSkip("stack", 1))
			// Part of a reply may have reached the client: it is
			// disconnected, as when a reply is cut short.
			s.backendLost(be, resp.ErrMidReply)
		}
	}()
	var ri resp.ReplyInfo
	for {
		b, err := be.R.Peek(1)
		if err != nil {
			s.backendLost(be, err)
			return
		}
		if !s.frame(be, b[0], &ri) {
			return
		}
	}
}

// readShared hands every reply on be, a shared connection or a cluster
// client's own, to the client it belongs to, in the order of the pending
// list: into the client's sink, or, in front of a cluster, into its
// cluster.Order.
func (sh *muxConn) readShared(be *backendConn) {
	defer sh.p.sharedWG.Done()
	defer func() {
		// A panic here ends this backend connection, not the process: its
		// clients get connection-lost errors and the next command dials.
		if r := recover(); r != nil {
			sh.p.log.Error("panic reading a backend connection", zap.Any("panic", r), zap.StackSkip("stack", 1))
			sh.fail(be, nil)
		}
	}()
	var ri resp.ReplyInfo
	// The pending list's clients get their replies through a pooled
	// buffer into their sinks.
	rb := readerPool.Get().(*readerBufs)
	defer rb.release()
	sink, w := &rb.sink, rb.w
	// On a client's own connection the master may push (clustertracking.go):
	// ownAddr is then its address, and last the ticket of the last reply read.
	var ownAddr string
	if sh.own != nil {
		ownAddr = sh.addr
	}
	var last uint64
	for {
		b, err := be.R.Peek(1)
		if err != nil {
			sh.fail(be, nil)
			return
		}
		if b[0] == '>' && sh.own != nil {
			// A push of the master's, not right behind a reply (those
			// come with it, sharedReply): it goes before the reply of
			// the next command in flight here, or after the last one.
			after := last
			sh.mu.Lock()
			for i := be.pending.head; i < len(be.pending.sessions); i++ {
				if be.pending.sessions[i] != nil {
					after = be.pending.tickets[i] - 1
					break
				}
			}
			sh.mu.Unlock()
			if err := sh.own.ownPush(be.R, sh.addr, after); err != nil {
				sh.fail(be, nil)
				return
			}
			continue
		}
		// One lock per reply: take its session, count it as answered
		// (a client that finds nothing in flight writes its command
		// itself), and note whose reply comes next.
		sh.mu.Lock()
		q := be.pending
		var s, next *session
		var ticket uint64
		if q.head < len(q.sessions) {
			s, ticket = q.sessions[q.head], q.tickets[q.head]
			if s != nil {
				last = ticket
			}
			q.sessions[q.head] = nil
			q.head++
			if q.head == len(q.sessions) {
				q.sessions, q.tickets, q.head = q.sessions[:0], q.tickets[:0], 0
			} else {
				next = q.sessions[q.head]
			}
		}
		if sh.be == be && sh.out > 0 {
			sh.out--
		}
		sh.mu.Unlock()
		sink.w = nil
		answered := true
		if s != nil && s.cl != nil {
			answered, err = s.sharedReply(be.R, ticket, w, sink, &ri, ownAddr)
		} else {
			if s != nil {
				sink.w = s.sink()
			}
			err = resp.CopyReply(w, be.R, &ri)
			// A client's consecutive replies reach its sink together:
			// one lock and one copy for a pipeline's run of replies, not
			// one each. The last of the run is flushed before it is
			// counted as answered, so a client that finds nothing owed
			// finds every reply in the sink.
			if err != nil || s == nil || next != s || be.R.Buffered() == 0 {
				w.Flush()
			}
		}
		if err != nil && s != nil && s.cl != nil && !answered {
			// Nothing of the reply reached the client (it was gathered
			// as a part, or waited behind replies ahead of it): it gets
			// the error the commands behind it on be get, and keeps its
			// connection.
			sh.p.m.connLost.Add(1)
			s.answerShared(ticket, replyConnLost, sh.own != nil)
			sh.fail(be, nil)
			return
		}
		if err != nil {
			sh.fail(be, s)
			return
		}
		idle := be.R.Buffered() == 0 // the reader would wait for more next
		sh.p.checkReply(&ri)
		if s != nil && answered && sh.own == nil {
			s.replied(&ri)
		}
		// Before waiting for more, send what queued up meanwhile, and do
		// it before writing to the client, so that Redis works on it while
		// the replies go out.
		if idle && sh.own == nil {
			sh.mu.Lock()
			if sh.be == be && len(sh.wbuf) > 0 {
				sh.writeInOrder()
			} else {
				sh.mu.Unlock()
			}
		}
		// A client's consecutive replies go out in one write. next may be
		// stale (nil) when more commands were queued after it was read;
		// the client is then pushed to once more than needed. A cluster
		// client's replies still owed on other masters' connections are
		// pushed by the reader that puts the last of them in place.
		if s != nil && (idle || next != s) && (s.cl == nil || s.cl.order.Drained()) {
			s.pushOut()
		}
		if sh.own != nil && idle && sh.stopIdle(be) {
			return
		}
	}
}

// fail ends be: every client waiting on it gets a connection-lost error,
// and cut, whose reply was cut short, is disconnected.
func (sh *muxConn) fail(be *backendConn, cut *session) {
	be.NC.Close()
	if sh.own == nil {
		sh.p.backendTrouble()
	}
	sh.mu.Lock()
	be.Dead = true
	if sh.be == be {
		sh.reading = false
	}
	q := be.pending
	waiting, tickets := q.sessions[q.head:], q.tickets[q.head:]
	q.sessions, q.tickets, q.head = nil, nil, 0
	sh.mu.Unlock()
	if cut != nil {
		cut.disconnect()
		if sh.own == nil {
			cut.replied(&resp.ReplyInfo{Type: '-'})
		}
	}
	for i, s := range waiting {
		if s == nil {
			continue // an ASKING
		}
		sh.p.m.connLost.Add(1)
		s.answerShared(tickets[i], replyConnLost, sh.own != nil)
	}
}

// retire closes the connection for good.
func (sh *muxConn) retire() {
	sh.mu.Lock()
	sh.retired = true
	sh.mu.Unlock()
	sh.close()
}

// close closes the connection; the reader ends.
func (sh *muxConn) close() {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.be != nil {
		sh.be.NC.Close()
	}
}

// readerBufs is a reader's output buffer and the sink it writes through.
// A cluster client's own connection starts a reader for each batch it
// sends and ends it once nothing is owed (muxConn.stopIdle), so the buffers
// come from a pool: neither a 4 KB buffer per batch nor one kept per idle
// client and master.
type readerBufs struct {
	sink sinkWriter
	w    *bufio.Writer
}

var readerPool = sync.Pool{New: func() any {
	rb := &readerBufs{}
	rb.w = bufio.NewWriterSize(&rb.sink, 4096)
	return rb
}}

// release gives rb back to the pool, emptied.
func (rb *readerBufs) release() {
	buf := rb.sink.buf[:0]
	if cap(buf) > 64<<10 {
		buf = nil
	}
	rb.sink = sinkWriter{buf: buf}
	rb.w.Reset(&rb.sink)
	readerPool.Put(rb)
}

// sinkWriter appends to the sink of the client whose reply is copied, or,
// while capture is set, to buf.
type sinkWriter struct {
	w       *clientWriter
	capture bool
	buf     []byte
}

func (w *sinkWriter) Write(b []byte) (int, error) {
	if w.capture {
		w.buf = append(w.buf, b...)
		return len(b), nil
	}
	if w.w == nil {
		return len(b), nil // a reply nobody waits for
	}
	return w.w.Write(b)
}
