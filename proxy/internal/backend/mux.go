package backend

import (
	"bufio"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/lockproxy/lockproxy/proxy/internal/resp"
)

// Batching. Mux, Group and internal/cluster's Order own how commands
// leave and replies come back on every backend connection a client's
// commands go on: the shared connections to one Redis and to each master
// of a cluster, a cluster client's own connections (groups of one,
// NewOwn), and the connection of one client of one Redis, or a cluster
// client's pinned pub/sub connection (NewOne). A command is queued with
// the client it answers (and, in front of a cluster, its ticket in the
// client's cluster.Order), written with what queued meanwhile in one
// write, and its reply is read by the connection's reader and put in the
// client's order; on a connection of one client, the client's reply
// queue tells what each frame answers (Owner.Frame). Where a command goes
// is the proxy's session's.

// ErrClosed is the error of a command queued on a connection retired for
// good (Mux.Retire).
var ErrClosed = errors.New("connection closed")

// Client is what a connection does with the client a reply on it
// answers: a session of the proxy. Its methods are called by the
// connection's reader, except Queued, called under the connection's lock
// as the client's command is queued.
type Client interface {
	// Queued records the command the client is queuing (Mux.Queue with
	// note set), under the connection's lock: the reply cannot be read
	// before it is recorded.
	Queued()
	// QueuedPlain records, as Queued, the n commands of a run the client
	// is queuing (Mux.QueueRun): commands of no effect on the connection.
	QueuedPlain(n int)
	// Sink is where the reader copies the client's replies.
	Sink() io.Writer
	// Replied matches a reply the reader copied to the sink.
	Replied(ri *resp.ReplyInfo)
	// RepliedPlain matches n replies the reader copied to the sink, none
	// of them a push, to n commands the client queued in runs
	// (QueueRun): as n calls of Replied would, at once.
	RepliedPlain(n int)
	// PushOut writes the sink to the client if the reader is the one
	// that writes it.
	PushOut()
	// Disconnect closes the client's connection: its reply was cut short.
	Disconnect()
	// Ordered reports whether the client's replies take tickets in an
	// order of its own (a cluster client's), read by OrderedReply and
	// answered by Answer.
	Ordered() bool
	// OrderedReply reads the reply to ticket from r, through w and sink,
	// and puts it in its place in the client's order. answered is false
	// when the reply was a redirection: the command is sent again, and
	// its reply comes later; with err, it is false when nothing of the
	// reply reached the client. own is the server's address on a
	// cluster client's own connection, where the server may push right
	// behind the reply (Pusher), "" on a shared connection.
	OrderedReply(r *bufio.Reader, ticket uint64, w *bufio.Writer, sink *Sink, ri *resp.ReplyInfo, own string) (answered bool, err error)
	// Answer gives the client reply, an error of the proxy's own, for the
	// command with ticket; own is set on a cluster client's own
	// connection, whose replies the client's reply queue does not count.
	Answer(ticket uint64, reply []byte, own bool)
	// Drained reports whether an ordered client is owed no reply now.
	Drained() bool
}

// Owner is the client of a connection of one (NewOne): its reader hands
// it every frame, since frames may answer no command (pushes, messages,
// MONITOR lines) and commands may get no reply (CLIENT REPLY OFF).
type Owner interface {
	// Frame copies one frame of be, first being its first byte, to the
	// client, and reports false when be is done with.
	Frame(be *Conn, first byte, ri *resp.ReplyInfo) bool
	// BackendLost answers what waits on be with an error, or disconnects
	// the client.
	BackendLost(be *Conn, cause error)
}

// Pusher is the cluster client of its own connections (NewOwn), whose
// masters may push on them (CLIENT TRACKING without REDIRECT).
type Pusher interface {
	// Listening reports whether the masters push: the readers then read
	// while no reply is owed.
	Listening() bool
	// Push reads a push from r, the connection to addr, and gives it to
	// the client right after the reply with ticket after (0: none).
	Push(r *bufio.Reader, addr string, after uint64) error
	// Lost is told that the client's own connection was lost other than
	// by Retire (the node closed it, or its reply was cut short); it
	// reports whether the client is being disconnected for it, in which
	// case nothing more is sent for it.
	Lost() bool
}

// Env is what every multiplexed connection of a proxy shares: its
// settings, its counters and the hooks into the proxy. Its fields are set
// before any connection is used.
type Env struct {
	WriteTimeout time.Duration
	Log          *zap.Logger
	// Readers counts the readers of the shared connections and of the
	// cluster clients' own connections.
	Readers *sync.WaitGroup
	// ConnLost counts the commands answered with a connection-lost error.
	ConnLost *atomic.Uint64
	// CheckReply sees every reply read (a -READONLY tells the Sentinel
	// follower the primary changed); Trouble, every shared connection
	// lost.
	CheckReply func(ri *resp.ReplyInfo)
	Trouble    func()
	// WriteAll writes what waits on every shared connection, before a
	// connection of one client writes (Proxy.writeQueued).
	WriteAll func()
	// Queued, when set, counts the commands waiting on the shared
	// connections that keep one order with g's (every ACL user's to one
	// Redis), and WriteQueued writes them, the batch that waited longest
	// first; without them, g's own are.
	Queued      func(g *Group) int64
	WriteQueued func(g *Group, limit uint64)

	// batches counts the batches of commands begun on the shared
	// connections, which orders them (see Mux).
	batches atomic.Uint64
}

// Batches returns the count of batches begun so far: the batches begun
// after it are newer than what the caller writes next.
func (e *Env) Batches() uint64 { return e.batches.Load() }

// Mux is one backend connection, multiplexed: as a shared connection
// it carries the stateless commands of many clients. Commands are
// appended to one write buffer. A client writes the buffer itself only
// when the connection is idle (no command waiting for its reply);
// otherwise the reader writes it as soon as it has handed out every reply
// that has arrived, just before it would wait for more. So under load the
// commands of all the clients that arrived while Redis was busy go out in
// one write, and Redis reads and answers many clients' commands per
// system call; when idle, a command goes out at once. Replies come back in
// the same order; the reader appends each to its client's sink.
//
// A client uses its shared connection until it sends a command that
// changes or depends on its connection's state (see resp.Stateless); from
// then on it has a connection of its own: a Mux with one client (NewOne),
// whose reader copies each frame to that client's own buffered output and
// matches it against the client's reply queue.
//
// Order across connections. A command waiting in wbuf was received before
// any command received later on another connection, so it must not wait
// while such a command goes out: Redis would run them the other way round
// (a GET sent after a SET would miss it, if the SET waits behind another
// client's slow script). So every write to the backend, shared or
// dedicated, first writes whatever waits on the shared connections to the
// same server, the longest-waiting first (Group.WriteQueued). Only
// commands that wait at the same time can leave in another order than they
// came, and only when they wait on different shared connections.
type Mux struct {
	env  *Env
	addr string // a cluster master's; "" for the backend
	grp  *Group // the connections to the same server
	// dial dials the connection, on a shared connection or a cluster
	// client's own; nil on a connection of one, which its owner dials
	// (Attach).
	dial func() (*Conn, error)

	mu   sync.Mutex
	be   *Conn  // nil until dialled; replaced when it dies
	wbuf []byte // commands waiting to be written
	wn   int    // how many commands wbuf holds
	out  int    // commands written whose replies have not been read
	// turns counts FlushTurn's calls with replies in flight on the
	// backend's connections; apart is whether the server answered from
	// another CPU when FlushTurn last looked (never for a cluster
	// master's).
	turns   uint8
	apart   bool
	spare   []byte
	writing bool
	// since orders the batches waiting on the shared connections: the
	// Env's batch count when wbuf's first command came; 0 while wbuf is
	// empty. Written under mu, read without it by WriteQueued.
	since atomic.Uint64
	// wrote is signalled, when waiters is not zero, at the end of a write,
	// for WriteWaiting.
	wrote   sync.Cond
	waiters int
	// retired: the connection served an earlier access generation whose
	// clients are gone, or the client it was its own connection of has
	// gone or is disconnected for its loss (Pusher.Lost); it is never
	// dialed again.
	retired bool
	// own is set on a cluster client's own connection to a master (a
	// group of one, NewOwn): it is dialled in the client's connection
	// state, and its replies are not counted in the client's reply queue.
	// pusher is that client: the master may push on the connection.
	own    bool
	pusher Pusher
	// one is set on the connection of one client of one Redis (or a
	// cluster client's pinned pub/sub connection) once it has left its
	// shared connection: a group of one, dialled by the session in its
	// connection state (Attach), its commands written by write, and read
	// by readOne for as long as it lives, each frame matched by the
	// client's reply queue rather than the pending list (Owner.Frame),
	// since frames may answer no command (pushes, messages, MONITOR
	// lines) and commands may get no reply (CLIENT REPLY OFF). oneWG
	// counts its reader.
	one   Owner
	oneWG *sync.WaitGroup
	// oneRI is readOne's: handed to the owner through an interface, a
	// local would be allocated by each reader. One reader at a time: the
	// owner attaches a new connection once the old one's reader is done.
	oneRI resp.ReplyInfo
	// reading: a goroutine reads be. On a cluster client's own
	// connection it runs only while replies are owed there (push starts
	// it, readShared ends it), so an idle client keeps no goroutine or
	// buffer per master; on a connection of one, for as long as be lives.
	reading bool
}

// Group is the shared connections to one server: the backend, or one
// master of a cluster. The arrival order is kept within a group only:
// commands sent to different servers cannot see each other's effects (a
// cluster's masters hold different keys; each command with keys goes to
// the master of their slot), so a master's batch need not go out before
// another master's command that came after it, and each master's
// connections batch as the backend's do, whatever the other masters'
// connections have waiting. Its methods are safe for concurrent use.
type Group struct {
	addr string
	list []*Mux // set before any connection is used
	// queued counts the connections of the group with commands waiting to
	// be written.
	queued atomic.Int64
	// Forwarded counts the commands sent to a cluster master; nil for the
	// backend's group. Set before any connection is used.
	Forwarded *atomic.Uint64
}

// NewGroup makes n shared connections to addr ("" for the backend), each
// dialled by dial.
func NewGroup(env *Env, addr string, n int, dial func() (*Conn, error)) *Group {
	g := &Group{addr: addr}
	for range n {
		sh := &Mux{env: env, addr: addr, grp: g, dial: dial}
		sh.wrote.L = &sh.mu
		g.list = append(g.list, sh)
	}
	return g
}

// NewOwn makes a cluster client's own connection to the master at addr,
// dialled by dial in the client's state, in a group of its own; p is the
// client, given the pushes the master sends on it.
func NewOwn(env *Env, addr string, dial func() (*Conn, error), p Pusher) *Mux {
	sh := NewGroup(env, addr, 1, dial).list[0]
	sh.own, sh.pusher = true, p
	return sh
}

// NewOne makes the connection of one of o (see Mux.one); it is dialled by
// o and attached (Attach). wg counts its reader.
func NewOne(env *Env, o Owner, wg *sync.WaitGroup) *Mux {
	sh := NewGroup(env, "", 1, nil).list[0]
	sh.one, sh.oneWG = o, wg
	return sh
}

// Addr returns the address g's connections are to: a cluster master's,
// "" for the backend.
func (g *Group) Addr() string { return g.addr }

// List returns g's connections.
func (g *Group) List() []*Mux { return g.list }

// Queued counts the connections of g with commands waiting to be written.
func (g *Group) Queued() int64 { return g.queued.Load() }

// Addr returns the address sh is to: a cluster master's, "" for the
// backend.
func (sh *Mux) Addr() string { return sh.addr }

// LocalAddr returns the local address of sh's live connection, "" when
// it has none.
func (sh *Mux) LocalAddr() string {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if be := sh.be; be != nil && !be.Dead {
		return be.NC.LocalAddr().String()
	}
	return ""
}

// Counts returns how many commands written on sh wait for their replies,
// and how many wait to be written.
func (sh *Mux) Counts() (out, queued int) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.out, sh.wn
}

// Group returns the group sh belongs to.
func (sh *Mux) Group() *Group { return sh.grp }

// pending is who the replies on one shared backend connection belong to.
type pending struct {
	clients []Client
	// tickets are the ordered clients' places of the replies in their
	// order, alongside clients; 0 elsewhere.
	tickets []uint64
	head    int
}

// Queue queues raw for c, whose reply is its ticket's (0 outside a
// cluster), after pre when set, whose reply nobody reads (ASKING). With
// note, c.Queued records it under the connection's lock. It returns an
// error when the backend cannot be reached.
func (sh *Mux) Queue(c Client, ticket uint64, pre, raw []byte, note bool) error {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if err := sh.live(); err != nil {
		return err
	}
	if pre != nil {
		sh.push(nil, 0, pre, 1)
	}
	sh.push(c, ticket, raw, 1)
	if note {
		c.Queued()
	}
	return nil
}

// QueueRun queues raw, n whole requests of c's, as n calls of Queue
// with note set would (no tickets: one Redis's shared connection), under
// one lock.
func (sh *Mux) QueueRun(c Client, raw []byte, n int) error {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if err := sh.live(); err != nil {
		return err
	}
	sh.push(c, plainTicket, raw, n)
	c.QueuedPlain(n)
	return nil
}

// live dials the connection when there is none; sh.mu is held.
func (sh *Mux) live() error {
	if sh.be != nil && !sh.be.Dead {
		return nil
	}
	if sh.retired {
		return ErrClosed
	}
	return sh.connect()
}

// plainTicket marks in a pending list a command queued in a run
// (QueueRun), whose reply the reader matches with the others of the run
// (Client.RepliedPlain). Only a client without an order of its own queues
// runs, and such a client's tickets mean nothing otherwise (0).
const plainTicket = ^uint64(0)

// push appends raw, n requests whose replies are c's with ticket, to
// what waits to be written; sh.mu is held and the connection live.
func (sh *Mux) push(c Client, ticket uint64, raw []byte, n int) {
	if len(sh.wbuf) == 0 {
		sh.since.Store(sh.env.batches.Add(1))
		sh.grp.queued.Add(1)
	}
	sh.wbuf = append(sh.wbuf, raw...)
	sh.wn += n
	q := sh.be.pending
	for range n {
		q.clients = append(q.clients, c)
		q.tickets = append(q.tickets, ticket)
	}
	if !sh.reading {
		sh.startReader()
	}
}

// startReader starts the goroutine that reads sh.be; sh.mu is held.
func (sh *Mux) startReader() {
	sh.reading = true
	sh.env.Readers.Add(1)
	go sh.readShared(sh.be)
}

// stopIdle reports whether the reader of a client's own connection ends
// now that no reply is owed on be (the next command starts another).
func (sh *Mux) stopIdle(be *Conn) bool {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.be != be || len(be.pending.clients) > 0 || be.R.Buffered() > 0 || (sh.own && sh.pusher.Listening()) {
		return false
	}
	sh.reading = false
	return true
}

// Ready returns the live connection, dialing it when there is none.
func (sh *Mux) Ready() (*Conn, error) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if be := sh.be; be != nil && !be.Dead && !sh.reading && !be.Open() {
		// Closed while idle, with no reader to notice (the node's
		// timeout, CLIENT KILL, a restart): dial again, as for a
		// connection found lost, unless the client is disconnected for
		// it.
		be.NC.Close()
		be.Dead = true
		if sh.own && !sh.retired && sh.pusher.Lost() {
			sh.retired = true // live refuses: nothing more is sent for the client
		}
	}
	if err := sh.live(); err != nil {
		return nil, err
	}
	return sh.be, nil
}

// QueueOn queues raw for c with ticket, as Queue does, if be, which Ready
// returned, is still the live connection; it reports false otherwise.
func (sh *Mux) QueueOn(be *Conn, c Client, ticket uint64, raw []byte) bool {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.be != be || be.Dead {
		return false
	}
	sh.push(c, ticket, raw, 1)
	return true
}

// Attach makes be, dialled by the owner, the live connection of a
// client's connection of one, and starts its reader. What waited to be
// written on the connection before, which was lost, is dropped: the
// client has been answered for it (Owner.BackendLost).
func (sh *Mux) Attach(be *Conn) {
	sh.mu.Lock()
	if len(sh.wbuf) > 0 {
		sh.since.Store(0)
		sh.grp.queued.Add(-1)
	}
	sh.wbuf, sh.wn, sh.out = sh.wbuf[:0], 0, 0
	sh.be = be
	sh.reading = true
	sh.mu.Unlock()
	sh.oneWG.Add(1)
	go sh.readOne(be)
}

// Put appends raw to what waits to be written on a client's connection
// of one; its replies are matched by the client's reply queue, not by the
// pending list.
func (sh *Mux) Put(raw []byte) {
	sh.mu.Lock()
	if len(sh.wbuf) == 0 {
		// since stays 0: the group of one is in no list WriteQueued
		// goes through, and the global batch count is left alone.
		sh.grp.queued.Add(1)
	}
	sh.wbuf = append(sh.wbuf, raw...)
	sh.wn++
	sh.mu.Unlock()
}

// connect dials a new connection; sh.mu is held.
func (sh *Mux) connect() error {
	be, err := sh.dial()
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
	if !sh.own {
		sh.startReader() // a client's own starts reading with its first command
	}
	return nil
}

// Flush writes what is buffered if the connection is idle. Otherwise the
// reader writes it once the replies in flight have been handed out.
func (sh *Mux) Flush() {
	if sh.own || sh.one != nil {
		// One client's: its commands go out as the client's batch ends,
		// after what waits on the shared connections (see Mux).
		sh.env.WriteAll()
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

// eagerBatch is how many commands waiting on a shared connection go out
// at the end of a turn of the reading loop even while replies are in
// flight, and how many in flight keep a Redis on another CPU busy
// (FlushTurn).
const eagerBatch = 64

// FlushTurn writes what is buffered at the end of a turn of the reading
// loop: as Flush does, and also while replies are in flight when
// eagerBatch commands or more wait, or when fewer than eagerBatch are in
// flight to a Redis that answers from another CPU than the loop's
// (rawio.Apart, looked at every 64 turns). One batch in flight keeps
// the commands that come meanwhile for one write and one wake of Redis,
// once the reader has handed out the replies: on the proxy's CPU, Redis
// runs only when the proxy waits anyway, and every write would wake it
// to take the CPU from the proxy. On a CPU of its own, Redis is idle from
// its last reply until then, and a write at once lets it work meanwhile
// (bench/README.md, "Where the kernel puts the processes", has what each
// way costs). Only the backend's connections look where Redis answers
// from, not a cluster master's: masters share CPUs with each other and
// the batches they get, one write each per turn, are small; there the
// early writes cost the masters and the proxy more CPU per command than
// they gain (bench/README.md, "A cluster's masters and the early
// writes"). The loop never waits for a Redis that does not read: it
// writes only what the socket takes at once (rawio.Conn.Fits), and only
// when nothing waits on the group's other connections; the reader writes
// the rest.
func (sh *Mux) FlushTurn() {
	if sh.own || sh.one != nil {
		sh.Flush()
		return
	}
	sh.mu.Lock()
	if sh.out == 0 {
		sh.writeInOrder()
		return
	}
	if sh.addr == "" { // the backend's, not a cluster master's
		if sh.turns++; sh.turns%64 == 1 {
			sh.apart = sh.be.apart()
		}
	}
	if (sh.wn >= eagerBatch || sh.apart && sh.out < eagerBatch) && !sh.writing && sh.env.Queued == nil && sh.grp.queued.Load() <= 1 &&
		sh.be.fits(len(sh.wbuf)) {
		sh.writeOnce() // not what comes meanwhile: it may not fit
		return
	}
	sh.mu.Unlock()
}

// writeInOrder writes what is buffered, after what waits on the other
// shared connections to the same server. sh.mu is held on entry and
// released on return.
func (sh *Mux) writeInOrder() {
	if sh.env.Queued != nil {
		// Every user's shared connections to one Redis keep one order.
		if sh.env.Queued(sh.grp) <= 1 {
			sh.write()
			return
		}
		sh.mu.Unlock()
		sh.env.WriteQueued(sh.grp, sh.env.batches.Load())
		return
	}
	if sh.grp.queued.Load() <= 1 {
		sh.write() // nothing waits elsewhere
		return
	}
	sh.mu.Unlock()
	sh.grp.WriteQueued(sh.env.batches.Load())
}

// write writes everything buffered unless a write is in progress (whose
// goroutine then writes it). sh.mu is held on entry and released on return.
func (sh *Mux) write() { sh.writeBatches(false) }

// writeOnce writes what is buffered now, and not what is buffered while
// it writes, unless a write is in progress. sh.mu is held on entry and
// released on return.
func (sh *Mux) writeOnce() { sh.writeBatches(true) }

// writeBatches is write, or writeOnce with once set.
func (sh *Mux) writeBatches(once bool) {
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
		be.NC.SetWriteDeadline(time.Now().Add(sh.env.WriteTimeout))
		_, err := be.out.Write(buf)
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
		if once {
			break
		}
	}
	sh.writing = false
	if sh.waiters > 0 {
		sh.wrote.Broadcast()
	}
	sh.mu.Unlock()
}

// WriteWaiting writes the commands waiting in wbuf if they came in a batch
// numbered limit or lower, and returns once they have been written.
func (sh *Mux) WriteWaiting(limit uint64) {
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

// WriteQueued writes the commands waiting on g's connections in batches
// numbered limit or lower, the batch that has waited longest first, and
// returns once they have been written.
func (g *Group) WriteQueued(limit uint64) {
	for g.queued.Load() > 0 {
		var oldest *Mux
		first := limit + 1
		for _, sh := range g.list {
			if since := sh.since.Load(); since != 0 && since < first {
				oldest, first = sh, since
			}
		}
		if oldest == nil {
			return
		}
		oldest.WriteWaiting(limit)
	}
}

// Oldest returns the connection of g whose batch waits since before
// first, the longest-waiting, or oldest and first when none does.
func (g *Group) Oldest(oldest *Mux, first uint64) (*Mux, uint64) {
	if g.queued.Load() == 0 {
		return oldest, first
	}
	for _, sh := range g.list {
		if since := sh.since.Load(); since != 0 && since < first {
			oldest, first = sh, since
		}
	}
	return oldest, first
}

// readOne hands every frame on be, a client's connection of one
// (sh.one), to the client, until be ends: the client's reply queue tells
// what each frame answers (Owner.Frame), and its buffered output gets
// it.
func (sh *Mux) readOne(be *Conn) {
	o := sh.one
	defer sh.oneWG.Done()
	defer close(be.Done) // the owner waits for it before a new connection's replies
	defer func() {
		// A panic here ends this backend connection, not the process: the
		// next command dials.
		if r := recover(); r != nil {
			sh.env.Log.Error("panic reading a backend connection", zap.Any("panic", r), zap.StackSkip("stack", 1))
			// Part of a reply may have reached the client: it is
			// disconnected, as when a reply is cut short.
			o.BackendLost(be, resp.ErrMidReply)
		}
	}()
	ri := &sh.oneRI
	for {
		b, err := be.R.Peek(1)
		if err != nil {
			o.BackendLost(be, err)
			return
		}
		if !o.Frame(be, b[0], ri) {
			return
		}
	}
}

// readShared hands every reply on be, a shared connection or a cluster
// client's own, to the client it belongs to, in the order of the pending
// list: into the client's sink, or, for an ordered client (in front of a
// cluster), into its order.
func (sh *Mux) readShared(be *Conn) {
	defer sh.env.Readers.Done()
	defer func() {
		// A panic here ends this backend connection, not the process: its
		// clients get connection-lost errors and the next command dials.
		if r := recover(); r != nil {
			sh.env.Log.Error("panic reading a backend connection", zap.Any("panic", r), zap.StackSkip("stack", 1))
			sh.fail(be, nil)
		}
	}()
	// The pending list's clients get their replies through a pooled
	// buffer into their sinks. The ReplyInfo is the pool's too: handed to
	// the clients through an interface, it would be allocated by each
	// reader (one per batch on a cluster client's own connection).
	rb := readerPool.Get().(*readerBufs)
	defer rb.release()
	sink, w, ri := &rb.sink, rb.w, &rb.ri
	// On a client's own connection the master may push (Pusher): ownAddr
	// is then its address, and last the ticket of the last reply read.
	var ownAddr string
	if sh.own {
		ownAddr = sh.addr
	}
	var last uint64
	// owed counts the replies of a run (plainTicket) copied to owedTo's
	// sink and not yet matched: they are, together, before its sink is
	// pushed out, before any other reply of its is matched, and before
	// the reader waits for more or ends.
	var owedTo Client
	owed := 0
	settle := func() {
		if owed > 0 {
			c, n := owedTo, owed
			owedTo, owed = nil, 0
			c.RepliedPlain(n)
		}
	}
	defer settle()
	for {
		b, err := be.R.Peek(1)
		if err != nil {
			settle()
			sh.fail(be, nil)
			return
		}
		if b[0] == '>' && sh.own {
			// A push of the master's, not right behind a reply (those
			// come with it, Client.OrderedReply): it goes before the
			// reply of the next command in flight here, or after the
			// last one.
			after := last
			sh.mu.Lock()
			for i := be.pending.head; i < len(be.pending.clients); i++ {
				if be.pending.clients[i] != nil {
					after = be.pending.tickets[i] - 1
					break
				}
			}
			sh.mu.Unlock()
			if err := sh.pusher.Push(be.R, sh.addr, after); err != nil {
				sh.fail(be, nil)
				return
			}
			continue
		}
		// One lock per reply: take its client, count it as answered
		// (a client that finds nothing in flight writes its command
		// itself), and note whose reply comes next.
		sh.mu.Lock()
		q := be.pending
		var c, next Client
		var ticket uint64
		if q.head < len(q.clients) {
			c, ticket = q.clients[q.head], q.tickets[q.head]
			if c != nil {
				last = ticket
			}
			q.clients[q.head] = nil
			q.head++
			if q.head == len(q.clients) {
				q.clients, q.tickets, q.head = q.clients[:0], q.tickets[:0], 0
			} else {
				next = q.clients[q.head]
			}
		}
		if sh.be == be && sh.out > 0 {
			sh.out--
		}
		sh.mu.Unlock()
		sink.W = nil
		answered := true
		ordered := c != nil && c.Ordered()
		if ordered {
			answered, err = c.OrderedReply(be.R, ticket, w, sink, ri, ownAddr)
		} else {
			if c != nil {
				sink.W = c.Sink()
			}
			err = resp.CopyReply(w, be.R, ri)
			// A client's consecutive replies reach its sink together:
			// one lock and one copy for a pipeline's run of replies, not
			// one each. The last of the run is flushed before it is
			// counted as answered, so a client that finds nothing owed
			// finds every reply in the sink.
			if err != nil || c == nil || next != c || be.R.Buffered() == 0 {
				w.Flush()
			}
		}
		if err != nil && ordered && !answered {
			// Nothing of the reply reached the client (it was gathered
			// as a part, or waited behind replies ahead of it): it gets
			// the error the commands behind it on be get, and keeps its
			// connection.
			sh.env.ConnLost.Add(1)
			c.Answer(ticket, resp.ReplyConnLost, sh.own)
			sh.fail(be, nil)
			return
		}
		if err != nil {
			settle()
			sh.fail(be, c)
			return
		}
		idle := be.R.Buffered() == 0 // the reader would wait for more next
		sh.env.CheckReply(ri)
		if c != nil && answered && !sh.own {
			if ticket == plainTicket && ri.Type != '>' {
				owedTo = c
				owed++
				if idle || next != c {
					settle()
				}
			} else {
				settle()
				c.Replied(ri)
			}
		}
		// Before waiting for more, send what queued up meanwhile, and do
		// it before writing to the client, so that Redis works on it while
		// the replies go out.
		if idle && !sh.own {
			sh.mu.Lock()
			if sh.be == be && len(sh.wbuf) > 0 {
				sh.writeInOrder()
			} else {
				sh.mu.Unlock()
			}
		}
		// A client's consecutive replies go out in one write. next may be
		// stale (nil) when more commands were queued after it was read;
		// the client is then pushed to once more than needed. An ordered
		// client's replies still owed on other masters' connections are
		// pushed by the reader that puts the last of them in place.
		if c != nil && (idle || next != c) && (!ordered || c.Drained()) {
			c.PushOut()
		}
		if sh.own && idle && sh.stopIdle(be) {
			return
		}
	}
}

// fail ends be: every client waiting on it gets a connection-lost error,
// and cut, whose reply was cut short, is disconnected.
func (sh *Mux) fail(be *Conn, cut Client) {
	be.NC.Close()
	if !sh.own {
		sh.env.Trouble()
	}
	sh.mu.Lock()
	be.Dead = true
	if sh.be == be {
		sh.reading = false
	}
	q := be.pending
	waiting, tickets := q.clients[q.head:], q.tickets[q.head:]
	q.clients, q.tickets, q.head = nil, nil, 0
	retired := sh.retired
	sh.mu.Unlock()
	if sh.own && !retired && sh.pusher.Lost() {
		sh.mu.Lock()
		sh.retired = true
		sh.mu.Unlock()
	}
	if cut != nil {
		cut.Disconnect()
		if !sh.own {
			cut.Replied(&resp.ReplyInfo{Type: '-'})
		}
	}
	for i, c := range waiting {
		if c == nil {
			continue // an ASKING
		}
		sh.env.ConnLost.Add(1)
		c.Answer(tickets[i], resp.ReplyConnLost, sh.own)
	}
}

// Retire closes the connection for good.
func (sh *Mux) Retire() {
	sh.mu.Lock()
	sh.retired = true
	sh.mu.Unlock()
	sh.Close()
}

// Close closes the connection; the reader ends.
func (sh *Mux) Close() {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.be != nil {
		sh.be.NC.Close()
	}
}

// readerBufs is a reader's output buffer and the sink it writes through.
// A cluster client's own connection starts a reader for each batch it
// sends and ends it once nothing is owed (Mux.stopIdle), so the buffers
// come from a pool: neither a 4 KB buffer per batch nor one kept per idle
// client and master.
type readerBufs struct {
	sink Sink
	w    *bufio.Writer
	ri   resp.ReplyInfo
}

var readerPool = sync.Pool{New: func() any {
	rb := &readerBufs{}
	rb.w = bufio.NewWriterSize(&rb.sink, 4096)
	return rb
}}

// release gives rb back to the pool, emptied.
func (rb *readerBufs) release() {
	buf := rb.sink.Buf[:0]
	if cap(buf) > 64<<10 {
		buf = nil
	}
	rb.sink = Sink{Buf: buf}
	rb.w.Reset(&rb.sink)
	rb.ri = resp.ReplyInfo{}
	readerPool.Put(rb)
}

// Sink is what a reader's buffer writes to: the sink of the client whose
// reply is copied (W), or, while Capture is set, Buf.
type Sink struct {
	W       io.Writer
	Capture bool
	Buf     []byte
}

func (w *Sink) Write(b []byte) (int, error) {
	if w.Capture {
		w.Buf = append(w.Buf, b...)
		return len(b), nil
	}
	if w.W == nil {
		return len(b), nil // a reply nobody waits for
	}
	return w.W.Write(b)
}
