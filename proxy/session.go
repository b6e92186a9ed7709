package proxy

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tidwall/redcon"
	"go.uber.org/zap"
)

// maxBacklog bounds the commands a client may pipeline behind one of the
// proxy's own commands that is still running (LOCK ... WAIT). Past it, the
// proxy stops reading from that client until the backlog drains.
const maxBacklog = 1 << 16

// Replies the proxy writes itself.
var (
	replyConnLost    = []byte("-ERR backend unavailable: connection lost\r\n")
	replyNotInMulti  = []byte("-ERR Command not allowed inside a transaction\r\n")
	replyExecAbort   = []byte("-EXECABORT Transaction discarded because of previous errors.\r\n")
	cmdDiscard       = []byte("*1\r\n$7\r\nDISCARD\r\n")
	replyMaxClients  = []byte("-ERR max number of clients reached\r\n")
	subscribedPrefix = "-ERR Can't execute '"
	subscribedSuffix = "': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / RESET are allowed in this context\r\n"
)

// entryKind says what the forwarding loop must learn from a command's
// reply. Most commands are entryPlain: one reply, no connection state.
type entryKind uint8

const (
	entryPlain entryKind = iota
	entrySubscribe
	entryUnsubscribe
	entrySelect
	entryAuth
	entryHello
	entrySetName
	entryMonitor
	entryReset
	entryQuit
	entryMulti
	entryExec // EXEC or DISCARD
	// entryInternal is a command the proxy sent on its own behalf (its
	// AUTH after a client's RESET); its reply is not the client's.
	entryInternal
)

// Pub/sub families: channels, patterns, shard channels.
const (
	famChannel uint8 = iota
	famPattern
	famShard
)

// entry is a forwarded command whose reply has not reached the client yet.
type entry struct {
	kind entryKind
	fam  uint8
	// n is the number of subscription confirmations still expected for a
	// (un)subscribe; 0 on an UNSUBSCRIBE without arguments until its first
	// confirmation tells how many there will be.
	n   int64
	arg int64  // HELLO's protocol version
	at  int64  // when it was sent, from metrics.stamp; 0 when not sampled
	raw []byte // the request, for state replayed on reconnect
	// replace, when set, is what the client gets instead of the reply:
	// EXECABORT for an EXEC sent to the backend as DISCARD.
	replace []byte
}

// replayState is the connection state a client set on its backend
// connection. When the backend connection is lost, the next one is brought
// to the same state before the client's next command.
type replayState struct {
	auth, hello, name, db []byte
}

// localItem is a command answered by the proxy rather than the backend,
// in its place in the client's stream.
type localItem struct {
	args  [][]byte
	reply []byte // set when the answer is already known (an error)
	// build makes the reply of a forwardable command the proxy answers
	// itself (INFO lockproxy, COMMAND ...), in the client's protocol.
	build  func(resp3 bool) ([]byte, error)
	silent bool // CLIENT REPLY OFF or SKIP is in effect
	quit   bool // close the connection after the reply
}

// backend is one connection to the backend Redis, dedicated to a session.
type backend struct {
	nc   net.Conn
	r    *bufio.Reader
	w    *bufio.Writer
	dead bool // guarded by session.mu, or by shared.mu on a shared connection
	done chan struct{}
	// pending is set on a shared connection: whose replies are coming.
	pending *pending
}

// session is one client connection. Commands are handled in order by a
// single forwarder: redcon's connection goroutine, or, while one of the
// proxy's own commands runs, the local runner goroutine (busy). Replies from
// the backend are copied to the client by the backend's reader goroutine.
// The fifo of entries lets the runner wait until every reply before its
// command has been written, so replies reach the client in request order.
type session struct {
	p   *Proxy
	nc  *clientConn
	log *zap.Logger
	ctx context.Context
	// cancel ends ctx when the client goes, which aborts a LOCK ... WAIT.
	cancel context.CancelFunc

	// Used only by the forwarder.
	sh        *shared // nil when multiplexing is off
	dedicated bool    // the client has left its shared connection for good
	sharedOut bool    // commands were sent on the shared connection since the last flush
	be        *backend
	replyOff  bool // CLIENT REPLY OFF
	skipNext  bool // CLIENT REPLY SKIP
	authed    bool // under proxy authentication
	// queuing: a MULTI was sent and no EXEC, DISCARD or RESET since, so
	// the backend queues what comes next; the proxy then forwards INFO and
	// COMMAND instead of answering them, and they keep their place in
	// EXEC's reply.
	queuing bool
	loc     Local
	buf     []byte

	mu      sync.Mutex
	cond    sync.Cond
	fifo    []entry
	head    int
	busy    bool
	backlog []redcon.Command
	closed  bool
	// Connection state learned from the backend's replies.
	proto               int64
	nChan, nPat, nShard int64
	monitor, inMulti    bool
	// txnFailed: the proxy refused a command of the open transaction (a
	// LOCK, or a command its key guard stopped), so EXEC must abort, as it
	// does in Redis after an error while queuing.
	txnFailed bool
	state     replayState

	wmu     sync.Mutex    // guards out
	out     *bufio.Writer // made on first use: an idle client needs none
	discard *bufio.Writer // replies to the proxy's own commands

	// sink collects the replies from the shared connection until the
	// forwarder writes them to the client.
	sinkMu sync.Mutex
	sink   []byte
	spare  []byte // the last sink written, for the next takeSink; s.wmu is held
	// raw is the client's socket when it is plain TCP: the shared reader
	// then writes replies to it directly (see pushOut).
	raw syscall.RawConn
	rw  rawWrite // tryWrite's state; s.wmu is held

	wg sync.WaitGroup // the backend readers and the local runner
}

func newSession(p *Proxy, nc *clientConn, log *zap.Logger) *session {
	s := &session{p: p, nc: nc, log: log, proto: 2}
	s.ctx, s.cancel = context.WithCancel(p.root)
	s.cond.L = &s.mu
	s.discard = bufio.NewWriterSize(io.Discard, 64)
	s.authed = p.auth == nil
	s.sh = p.pickShared()
	if sc, ok := nc.Conn.(syscall.Conn); ok && s.sh != nil {
		s.raw, _ = sc.SyscallConn()
	}
	return s
}

// handle processes one command from redcon's connection goroutine.
func (s *session) handle(cmd redcon.Command) {
	s.mu.Lock()
	if s.busy {
		for len(s.backlog) >= maxBacklog && s.busy && !s.closed {
			s.cond.Wait()
		}
		if s.busy {
			s.backlog = append(s.backlog, cmd)
			s.mu.Unlock()
			return
		}
	}
	s.mu.Unlock()
	it, forwarded := s.forward(cmd)
	if forwarded {
		return
	}
	s.flush()
	s.mu.Lock()
	// A command that is quick to answer, with no reply due before it, is
	// answered here, on redcon's goroutine; the others get a goroutine of
	// their own, so that this one goes on reading and sees the client hang
	// up while they wait.
	now := s.head == len(s.fifo) && !s.mayWait(it)
	s.busy = true
	s.mu.Unlock()
	s.wg.Add(1)
	if now {
		s.answerNow(it)
		return
	}
	go s.runLocal(it)
}

// mayWait reports whether answering it may take longer than a round trip
// to the lock nodes: a LOCK with WAIT, as Config.MayWait tells.
func (s *session) mayWait(it localItem) bool {
	return it.args != nil && (s.p.cfg.MayWait == nil || s.p.cfg.MayWait(it.args))
}

// answerNow answers it on the calling goroutine. Nothing can have queued
// behind it meanwhile: that goroutine is the one that reads the client.
func (s *session) answerNow(it localItem) {
	defer s.wg.Done()
	defer s.recoverPanic()
	s.answer(it)
	s.mu.Lock()
	s.busy = false
	s.cond.Broadcast()
	s.mu.Unlock()
}

// runLocal answers it, then goes on with the commands that queued behind
// it until none is left, and hands forwarding back to redcon's goroutine.
func (s *session) runLocal(it localItem) {
	defer s.wg.Done()
	defer s.recoverPanic()
	s.answer(it)
	for {
		s.mu.Lock()
		if len(s.backlog) == 0 || s.closed {
			s.busy = false
			s.backlog = nil
			s.cond.Broadcast()
			s.mu.Unlock()
			return
		}
		batch := s.backlog
		s.backlog = nil
		s.cond.Broadcast()
		s.mu.Unlock()
		for _, cmd := range batch {
			if it, forwarded := s.forward(cmd); !forwarded {
				s.flush()
				s.answer(it)
			}
		}
		s.flush()
	}
}

// forward sends cmd to the backend, or returns false and the item to
// answer locally in its place.
func (s *session) forward(cmd redcon.Command) (localItem, bool) {
	var nb [24]byte
	name := lower(&nb, cmd.Args[0])
	if s.p.auth != nil {
		reply, rewritten := s.p.auth.gate(s, name, cmd.Args)
		if reply != nil {
			return localItem{reply: reply, silent: s.silent()}, false
		}
		if rewritten != nil {
			cmd.Raw = rewritten
		}
	}
	if s.p.cfg.IsLocal != nil && s.p.cfg.IsLocal(cmd.Args[0]) {
		return localItem{args: cmd.Args, silent: s.silent()}, false
	}
	if !s.queuing {
		if build, ok := s.intercept(name, cmd.Args); ok {
			return localItem{build: build, silent: s.silent()}, false
		}
	}
	if s.p.guard != nil {
		if err := s.p.guard.check(name, cmd.Args); err != nil {
			return localItem{reply: errorReply(err), silent: s.silent()}, false
		}
	}
	e, replies := s.classify(name, cmd)
	if s.sh != nil && !s.dedicated && e.kind == entryQuit {
		// A client without a connection of its own has nothing to close
		// on the backend: the proxy answers QUIT as Redis does.
		return localItem{reply: replyOK, silent: !replies, quit: true}, false
	}
	if s.sh != nil && !s.dedicated {
		if replies && stateless(name) {
			if err := s.sh.send(s, e, cmd.Raw); err != nil {
				s.p.m.unavailable.Add(1)
				return localItem{reply: errorReply(&BackendError{Err: err})}, false
			}
			s.sharedOut = true
			s.p.m.forwarded.Add(1)
			return localItem{}, true
		}
		// Replies on the shared connection come first; from now on the
		// client's commands go to a connection of its own.
		s.settleShared()
		s.dedicated = true
	}
	raw := cmd.Raw
	switch e.kind {
	case entryMulti:
		s.queuing = true
	case entryExec, entryReset:
		s.queuing = false
		s.mu.Lock()
		failed := s.txnFailed
		s.txnFailed = false
		s.mu.Unlock()
		if failed && string(name) == "exec" {
			// The backend queued the rest of the transaction; throw it
			// away and answer as Redis does.
			raw, e.replace = cmdDiscard, replyExecAbort
		}
	}
	for {
		if err := s.connect(); err != nil {
			if s.ctx.Err() == nil {
				s.log.Debug("backend unavailable", zap.Error(err))
			}
			s.p.m.unavailable.Add(1)
			return localItem{reply: errorReply(&BackendError{Err: err}), silent: !replies}, false
		}
		if !replies {
			break
		}
		if s.push(e) {
			break
		}
	}
	if _, err := s.be.w.Write(raw); err != nil {
		s.be.nc.Close() // the reader sees it and answers what is pending
	}
	if e.kind == entryReset {
		s.reauth()
	}
	s.p.m.forwarded.Add(1)
	if ce := s.log.Check(zap.DebugLevel, "forward"); ce != nil {
		ce.Write(zap.String("command", string(name))) // a copy: name stays on the stack
	}
	return localItem{}, true
}

// reauth follows a client's RESET, which signs the backend connection out,
// with the proxy's own AUTH and SELECT, whose replies the client never sees.
func (s *session) reauth() {
	for _, raw := range s.p.setup {
		if s.push(entry{kind: entryInternal}) {
			s.be.w.Write(raw)
		}
	}
}

// silent reports whether the next reply is suppressed by CLIENT REPLY, and
// consumes a SKIP.
func (s *session) silent() bool {
	if s.replyOff {
		return true
	}
	if s.skipNext {
		s.skipNext = false
		return true
	}
	return false
}

// classify returns the entry for a forwarded command and whether a reply
// is expected. It tracks CLIENT REPLY, the one piece of state that decides
// whether a reply comes at all.
func (s *session) classify(name []byte, cmd redcon.Command) (entry, bool) {
	args := cmd.Args
	e := entry{}
	switch string(name) {
	case "subscribe", "psubscribe", "ssubscribe":
		e = entry{kind: entrySubscribe, fam: family(name), n: int64(len(args) - 1)}
	case "unsubscribe", "punsubscribe", "sunsubscribe":
		e = entry{kind: entryUnsubscribe, fam: family(name), n: int64(len(args) - 1)}
	case "select":
		e = entry{kind: entrySelect, raw: cmd.Raw}
	case "auth":
		e = entry{kind: entryAuth, raw: cmd.Raw}
	case "hello":
		e = entry{kind: entryHello, raw: cmd.Raw}
		if len(args) > 1 {
			e.arg, _ = strconv.ParseInt(string(args[1]), 10, 64)
		}
	case "monitor":
		e = entry{kind: entryMonitor}
	case "reset":
		e = entry{kind: entryReset}
		s.replyOff, s.skipNext = false, false
	case "quit":
		e = entry{kind: entryQuit}
	case "multi":
		e = entry{kind: entryMulti}
	case "exec", "discard":
		e = entry{kind: entryExec}
	case "client":
		if len(args) < 2 {
			break
		}
		var sb [24]byte
		switch string(lower(&sb, args[1])) {
		case "setname":
			e = entry{kind: entrySetName, raw: cmd.Raw}
		case "reply":
			if len(args) != 3 {
				break
			}
			switch string(lower(&sb, args[2])) {
			case "on":
				s.replyOff, s.skipNext = false, false
				return e, true
			case "off":
				s.replyOff = true
				return e, false
			case "skip":
				s.skipNext = true
				return e, false
			}
		}
	}
	return e, !s.silent()
}

// family tells the pub/sub family of a (un)subscribe command name.
func family(name []byte) uint8 {
	switch string(name) {
	case "psubscribe", "punsubscribe":
		return famPattern
	case "ssubscribe", "sunsubscribe":
		return famShard
	}
	return famChannel
}

// push queues e for the current backend. It reports false when that
// backend has died meanwhile, and the caller connects again.
func (s *session) push(e entry) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.be.dead {
		return false
	}
	e.at = s.p.m.stamp()
	s.fifo = append(s.fifo, e)
	return true
}

// flush sends what the forwarder has written to the backend.
func (s *session) flush() {
	if s.sharedOut {
		s.sharedOut = false
		s.sh.flush()
		if s.raw == nil {
			s.drainShared() // a TLS client's replies are written by its own goroutine
		}
	}
	if s.be == nil || s.be.w.Buffered() == 0 {
		return
	}
	s.be.nc.SetWriteDeadline(time.Now().Add(s.p.cfg.Backend.WriteTimeout))
	if err := s.be.w.Flush(); err != nil {
		s.be.nc.Close()
	}
}

// output returns the client's buffered writer; s.wmu is held.
func (s *session) output() *bufio.Writer {
	if s.out == nil {
		s.out = bufio.NewWriterSize(s.nc, 4096)
	}
	return s.out
}

// settleShared sends what is queued on the shared connection and waits
// until all the client's replies from it have been written.
func (s *session) settleShared() {
	if s.sharedOut {
		s.sharedOut = false
		s.sh.flush()
	}
	s.drainShared()
}

// drainShared waits for the replies to the commands the client sent on
// its shared connection and makes sure they have been written to the
// client, so that what the forwarder writes next comes after them.
func (s *session) drainShared() {
	s.mu.Lock()
	for s.head < len(s.fifo) && !s.closed {
		s.cond.Wait()
	}
	s.mu.Unlock()
	s.wmu.Lock()
	s.writeSink()
	s.wmu.Unlock()
}

// takeSink swaps the sink for the spare buffer and returns what it held;
// s.wmu is held.
func (s *session) takeSink() []byte {
	spare := s.spare
	s.spare = nil
	s.sinkMu.Lock()
	out := s.sink
	s.sink = spare[:0]
	s.sinkMu.Unlock()
	return out
}

// recycle keeps a written sink buffer as the next spare, unless it grew
// large for one big reply; s.wmu is held.
func (s *session) recycle(b []byte) {
	if cap(b) <= 64<<10 {
		s.spare = b[:0]
	}
}

// writeSink writes everything in the sink, blocking; s.wmu is held.
func (s *session) writeSink() {
	for {
		out := s.takeSink()
		if len(out) == 0 {
			s.recycle(out)
			return
		}
		s.nc.Write(out)
		s.recycle(out)
	}
}

// pushOut writes the sink to the client from the shared connection's reader
// without ever blocking it: if another goroutine holds s.wmu, that one
// writes the sink before it lets go; if the socket takes only part, a
// goroutine of its own writes the rest. Only plain TCP clients are pushed
// to; the goroutine of a TLS client writes its replies itself.
func (s *session) pushOut() {
	for s.wmu.TryLock() {
		out := s.takeSink()
		if len(out) > 0 {
			n := s.tryWrite(out)
			if n < len(out) {
				// The client reads slowly: hand s.wmu over to a goroutine
				// that may block.
				s.p.sharedWG.Add(1)
				go s.finish(out, n)
				return
			}
		}
		s.recycle(out)
		s.wmu.Unlock()
		// A reply appended while s.wmu was held elsewhere is written by
		// whoever takes s.wmu next; make sure someone does.
		s.sinkMu.Lock()
		empty := len(s.sink) == 0
		s.sinkMu.Unlock()
		if empty {
			return
		}
	}
}

// finish writes out[n:] and then the sink, blocking, with s.wmu held.
func (s *session) finish(out []byte, n int) {
	defer s.p.sharedWG.Done()
	s.nc.Write(out[n:])
	s.recycle(out)
	s.writeSink()
	s.wmu.Unlock()
	s.sinkMu.Lock()
	empty := len(s.sink) == 0
	s.sinkMu.Unlock()
	if !empty {
		s.pushOut()
	}
}

// tryWrite writes as much of b as the socket takes without waiting.
func (s *session) tryWrite(b []byte) int {
	if s.rw.f == nil {
		s.rw.f = s.rw.write // one closure per session, not per write
	}
	s.rw.b, s.rw.n = b, 0
	s.raw.Write(s.rw.f)
	s.rw.b = nil
	return s.rw.n
}

// rawWrite writes b to a socket without waiting for it to become writable.
type rawWrite struct {
	b []byte
	n int // how much of b was written
	f func(fd uintptr) bool
}

func (w *rawWrite) write(fd uintptr) bool {
	for w.n < len(w.b) {
		k, err := syscall.Write(int(fd), w.b[w.n:])
		if k > 0 {
			w.n += k
		}
		if err != nil {
			break // EAGAIN: the rest goes to finish; other errors show there too
		}
	}
	return true
}

// connect makes sure the forwarder has a live backend connection.
func (s *session) connect() error {
	if s.be != nil {
		s.mu.Lock()
		dead := s.be.dead
		s.mu.Unlock()
		if !dead {
			return nil
		}
		// The old reader answers what was pending before the new
		// connection's replies may start. A transaction dies with it.
		<-s.be.done
		s.be = nil
		s.queuing = false
	}
	s.mu.Lock()
	state := s.state
	s.mu.Unlock()
	if err := s.p.backoff.check(); err != nil {
		return err
	}
	be, err := s.p.dial(s.ctx, state)
	s.p.backoff.record(err)
	if err != nil {
		return err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		be.nc.Close()
		return errClosed
	}
	s.be = be
	s.mu.Unlock()
	s.wg.Add(1)
	go s.readBackend(be)
	return nil
}

// readBackend copies the backend's replies to the client until the backend
// connection ends.
func (s *session) readBackend(be *backend) {
	defer s.wg.Done()
	defer close(be.done)
	defer s.recoverPanic()
	var ri replyInfo
	for {
		if _, err := be.r.Peek(1); err != nil {
			s.backendLost(be, err)
			return
		}
		internal, replace := s.next(be)
		if internal {
			if err := copyReply(s.discard, be.r, &ri); err != nil {
				s.backendLost(be, err)
				return
			}
			s.account(&ri)
			if be.r.Buffered() == 0 {
				// What the client's replies before it left in the buffer.
				s.wmu.Lock()
				s.output().Flush()
				s.wmu.Unlock()
			}
			continue
		}
		s.wmu.Lock()
		var err error
		if replace != nil {
			if err = copyReply(s.discard, be.r, &ri); err == nil {
				s.output().Write(replace)
			}
		} else {
			err = copyReply(s.output(), be.r, &ri)
		}
		if err == nil && be.r.Buffered() == 0 {
			err = s.output().Flush()
		}
		s.wmu.Unlock()
		if err != nil {
			s.backendLost(be, err)
			return
		}
		if s.account(&ri) {
			// QUIT: Redis closes the connection after its +OK.
			s.wmu.Lock()
			s.output().Flush()
			s.wmu.Unlock()
			s.nc.Close()
			s.backendLost(be, errClosed)
			return
		}
	}
}

// next reports whether the next reply answers the proxy's own command,
// and what the client gets instead of it, if not the reply itself (a push
// is always the client's, as it is).
func (s *session) next(be *backend) (internal bool, replace []byte) {
	b, _ := be.r.Peek(1)
	if len(b) == 0 || b[0] == '>' {
		return false, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.head == len(s.fifo) {
		return false, nil
	}
	e := &s.fifo[s.head]
	return e.kind == entryInternal, e.replace
}

// backendLost answers every command still waiting on be with an error and
// marks be dead. A client whose stream broke mid-reply, or that was
// subscribed or monitoring, is disconnected instead: its state is gone and
// it must notice, as it would if Redis itself had dropped it.
func (s *session) backendLost(be *backend, cause error) {
	be.nc.Close()
	s.mu.Lock()
	be.dead = true
	n := len(s.fifo) - s.head
	visible := 0
	for _, e := range s.fifo[s.head:] {
		if e.kind != entryInternal {
			visible++
		}
	}
	drop := s.closed || s.nc.broken.Load() || errors.Is(cause, errMidReply) ||
		s.nChan+s.nPat+s.nShard > 0 || s.monitor
	s.nChan, s.nPat, s.nShard, s.monitor, s.inMulti = 0, 0, 0, false, false
	s.txnFailed = false
	closed := s.closed
	s.mu.Unlock()
	if !closed && !errors.Is(cause, errClosed) {
		s.log.Debug("backend connection lost", zap.Error(cause))
	}
	if drop {
		s.nc.Close()
	} else if visible > 0 {
		s.p.m.connLost.Add(uint64(visible))
		s.wmu.Lock()
		for range visible {
			s.output().Write(replyConnLost)
		}
		s.output().Flush()
		s.wmu.Unlock()
	}
	s.mu.Lock()
	s.head += n
	s.compact()
	s.mu.Unlock()
}

// compact resets an empty fifo and wakes a runner waiting for it.
func (s *session) compact() {
	if s.head == len(s.fifo) {
		s.fifo = s.fifo[:0]
		s.head = 0
		s.cond.Broadcast()
	}
}

// account matches one reply copied to the client against the fifo and
// learns the connection state it carries. It reports whether the reply
// answered a QUIT.
func (s *session) account(ri *replyInfo) (quit bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var e *entry
	if s.head < len(s.fifo) {
		e = &s.fifo[s.head]
	}
	if s.pubsubFrame(ri, e) {
		return false
	}
	if ri.typ == '>' {
		return false // another push, such as a client-tracking invalidation
	}
	if s.monitor && ri.typ == '+' && isMonitorLine(ri.lineBytes()) {
		return false
	}
	if e == nil {
		return false
	}
	if e.at != 0 && e.kind != entryInternal {
		s.p.m.latency.Observe(float64(s.p.m.since()-e.at) / 1e9)
	}
	ok := ri.typ != '-' && ri.typ != '!'
	switch e.kind {
	case entrySelect:
		if ok {
			s.state.db = e.raw
		}
	case entryAuth:
		if ok {
			s.state.auth = e.raw
		}
	case entrySetName:
		if ok {
			s.state.name = e.raw
		}
	case entryHello:
		if ok {
			s.state.hello = e.raw
			if e.arg == 2 || e.arg == 3 {
				s.proto = e.arg
			}
		}
	case entryMonitor:
		s.monitor = s.monitor || ok
	case entryReset:
		s.state = replayState{}
		s.proto, s.nChan, s.nPat, s.nShard, s.monitor, s.inMulti = 2, 0, 0, 0, false, false
	case entryMulti:
		s.inMulti = s.inMulti || ok
	case entryExec:
		s.inMulti = false
	case entryQuit:
		quit = true
	}
	s.head++
	s.compact()
	return quit
}

// pubsubFrame recognises subscription confirmations and messages. In RESP3
// they are pushes; in RESP2 they are arrays, recognised only while the
// client is subscribed or a (un)subscribe awaits its confirmations, since
// an ordinary array reply may happen to start with "message".
func (s *session) pubsubFrame(ri *replyInfo, e *entry) bool {
	switch ri.typ {
	case '>':
	case '*':
		awaiting := e != nil && (e.kind == entrySubscribe || e.kind == entryUnsubscribe)
		if s.proto != 2 || (s.nChan+s.nPat+s.nShard == 0 && !awaiting) {
			return false
		}
	default:
		return false
	}
	head := ri.headString()
	var fam uint8
	switch string(head) {
	case "message", "smessage":
		return ri.n == 3
	case "pmessage":
		return ri.n == 4
	case "subscribe", "unsubscribe":
		fam = famChannel
	case "psubscribe", "punsubscribe":
		fam = famPattern
	case "ssubscribe", "sunsubscribe":
		fam = famShard
	default:
		return false
	}
	if ri.n != 3 || !ri.hasInt {
		return false
	}
	var before int64
	switch fam {
	case famChannel:
		before = s.nChan
		s.nChan = max(0, ri.third-s.nPat)
	case famPattern:
		before = s.nPat
		s.nPat = max(0, ri.third-s.nChan)
	case famShard:
		before = s.nShard
		s.nShard = ri.third
	}
	if e != nil && (e.kind == entrySubscribe || e.kind == entryUnsubscribe) && e.fam == fam {
		if e.n == 0 {
			e.n = max(1, before) // an UNSUBSCRIBE of everything in the family
		}
		e.n--
		if e.n == 0 {
			s.head++
			s.compact()
		}
	}
	return true
}

// isMonitorLine recognises MONITOR's "+1700000000.123456 [0 127.0.0.1:5]".
func isMonitorLine(b []byte) bool {
	if len(b) < 2 || b[0] != '+' {
		return false
	}
	i := 1
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	return i > 1 && i < len(b) && b[i] == '.'
}

// answer writes the reply to a locally answered command once every reply
// before it has reached the client.
func (s *session) answer(it localItem) {
	s.p.m.local.Add(1)
	s.mu.Lock()
	for s.head < len(s.fifo) && !s.closed {
		s.cond.Wait()
	}
	closed := s.closed
	proto, inMulti := s.proto, s.inMulti
	subscribed := s.nChan+s.nPat+s.nShard > 0
	s.mu.Unlock()
	if closed {
		return
	}
	reply := it.reply
	if reply == nil {
		var nb [24]byte
		switch {
		case it.build != nil:
			var err error
			if reply, err = it.build(proto == 3); err != nil {
				reply = errorReply(err)
			}
		case inMulti:
			reply = replyNotInMulti
		case proto == 2 && subscribed:
			reply = append(append([]byte(subscribedPrefix), lower(&nb, it.args[0])...), subscribedSuffix...)
		default:
			if s.loc == nil {
				s.loc = s.p.cfg.NewLocal()
			}
			ctx, cancel := context.WithTimeout(s.ctx, s.p.cfg.CommandTimeout)
			s.buf = s.loc.Serve(ctx, s.buf[:0], it.args, proto == 3)
			cancel()
			reply = s.buf
		}
	}
	if inMulti && len(reply) > 0 && reply[0] == '-' {
		s.mu.Lock()
		s.txnFailed = true
		s.mu.Unlock()
	}
	if it.quit {
		defer s.nc.Close()
	}
	if it.silent {
		return
	}
	s.wmu.Lock()
	s.writeSink()
	s.output().Write(reply)
	s.output().Flush()
	s.wmu.Unlock()
}

// protocolError answers a request that broke the protocol or a limit,
// after the replies to the requests before it (waiting at most a second
// for them). redcon closes the connection next.
func (s *session) protocolError(err error) {
	s.p.m.protocolErrors.Add(1)
	s.mu.Lock()
	var timedOut atomic.Bool
	t := time.AfterFunc(time.Second, func() {
		s.mu.Lock()
		timedOut.Store(true)
		s.cond.Broadcast()
		s.mu.Unlock()
	})
	for (s.head < len(s.fifo) || s.busy) && !s.closed && !timedOut.Load() {
		s.cond.Wait()
	}
	s.mu.Unlock()
	t.Stop()
	s.wmu.Lock()
	s.writeSink()
	s.output().WriteString("-ERR " + err.Error() + "\r\n")
	s.output().Flush()
	s.wmu.Unlock()
}

// recoverPanic contains a panic to this client: it is logged and the
// client's connection is closed, and the process and every other client
// carry on. It is deferred at the top of every goroutine that works for the
// session.
func (s *session) recoverPanic() {
	r := recover()
	if r == nil {
		return
	}
	s.log.Error("panic serving client; closing its connection", zap.Any("panic", r), zap.StackSkip("stack", 1))
	s.nc.Close()
	s.mu.Lock()
	s.busy = false
	s.cond.Broadcast()
	s.mu.Unlock()
}

// waiting reports whether the client is waiting on the server rather than
// idle: a command in flight, a subscription or MONITOR.
func (s *session) waiting() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.head < len(s.fifo) || s.busy || s.nChan+s.nPat+s.nShard > 0 || s.monitor
}

// inflight reports whether a command is still being answered.
func (s *session) inflight() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.head < len(s.fifo) || s.busy
}

// close ends the session when the client connection has closed. It runs in
// redcon's closed callback, under redcon's server lock, so it only signals;
// the proxy's cleanup goroutine waits for the session's goroutines.
func (s *session) close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	s.cond.Broadcast()
	be := s.be
	s.mu.Unlock()
	s.cancel()
	if be != nil {
		be.nc.Close()
	}
}

// wait waits for the session's goroutines after close, then ends its lock
// state (KEEPALIVE locks are released).
func (s *session) wait() {
	s.wg.Wait()
	if s.loc != nil {
		s.loc.Close()
	}
}

// lower writes the ASCII lower case of b into buf and returns it, or
// returns nil when b does not fit: no command name is that long.
func lower(buf *[24]byte, b []byte) []byte {
	if len(b) > len(buf) {
		return nil
	}
	for i, c := range b {
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		buf[i] = c
	}
	return buf[:len(b)]
}

// errorReply encodes err as a Redis "-ERR ..." reply on one line.
func errorReply(err error) []byte {
	msg := err.Error()
	b := make([]byte, 0, len(msg)+8)
	b = append(b, "-ERR "...)
	for i := 0; i < len(msg); i++ {
		c := msg[i]
		if c == '\r' || c == '\n' {
			c = ' '
		}
		b = append(b, c)
	}
	return append(b, '\r', '\n')
}
