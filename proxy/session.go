package proxy

import (
	"bytes"
	"context"
	"errors"
	"io"
	"sync"
	"time"

	"github.com/tidwall/redcon"
	"go.uber.org/zap"

	"github.com/lockproxy/lockproxy/proxy/internal/backend"
	"github.com/lockproxy/lockproxy/proxy/internal/clientid"
	"github.com/lockproxy/lockproxy/proxy/internal/cluster"
	"github.com/lockproxy/lockproxy/proxy/internal/clusterclient"
	"github.com/lockproxy/lockproxy/proxy/internal/fenced"
	"github.com/lockproxy/lockproxy/proxy/internal/resp"
)

// Replies the proxy writes itself.
var (
	replyOK           = resp.ReplyOK
	replyConnLost     = resp.ReplyConnLost
	replyNotInMulti   = []byte("-ERR Command not allowed inside a transaction\r\n")
	replyExecAbort    = resp.ReplyExecAbort
	replyTxnLost      = resp.ErrorReply(&BackendError{Err: errTxnLost})
	replyNestedMulti  = []byte("-ERR MULTI calls can not be nested\r\n")
	replyWatchInMulti = []byte("-ERR WATCH inside MULTI is not allowed\r\n")
	replyNull2        = []byte("*-1\r\n")
	replyNull3        = []byte("_\r\n")
	cmdDiscard        = resp.CmdDiscard
	cmdReplyOff       = command("CLIENT", "REPLY", "OFF")
	cmdReplySkip      = command("CLIENT", "REPLY", "SKIP")
	cmdReplyOn        = command("CLIENT", "REPLY", "ON")
	replyMaxClients   = []byte("-ERR max number of clients reached\r\n")
	subscribedPrefix  = "-ERR Can't execute '"
	subscribedSuffix  = "': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / RESET are allowed in this context\r\n"
)

// errTxnLost is why a command of a transaction whose backend connection
// was lost is refused: what the backend had queued is gone, so the
// transaction fails as a whole.
var errTxnLost = clusterclient.ErrTxnLost

// localItem is a command answered by the proxy rather than the backend,
// in its place in the client's stream.
type localItem struct {
	args  [][]byte
	reply []byte // set when the answer is already known (an error)
	// build makes the reply of a forwardable command the proxy answers
	// itself (INFO lockproxy, COMMAND ...), in the client's protocol.
	build  func(resp3 bool) ([]byte, error)
	silent bool     // CLIENT REPLY OFF or SKIP is in effect
	fenced [][]byte // a FENCED's arguments (fenced.go)
	quit   bool     // close the connection after the reply
}

// backendConn is one connection to the backend Redis.
type backendConn = backend.Conn

// session is one client connection. Commands are handled in order by a
// single forwarder: redcon's connection goroutine, or, while one of the
// proxy's own commands runs, the local runner goroutine (see replyQueue's
// hold and next). Replies are copied to the client by the reader of the
// backend connection they come on (internal/backend's Mux): the shared connections',
// into the client's sink, and the client's connection of one's, into its
// buffered output, matched against its replyQueue (Frame).
//
// The session keeps what only the forwarder uses; the parts that other
// goroutines reach have their own types and locks: q, what the client is
// owed and the connection's state (queue.go, state.go), and w, the write
// side of the client's socket (writer.go).
type session struct {
	p   *Proxy
	nc  *clientConn
	log *zap.Logger
	ctx context.Context
	// cancel ends ctx when the client goes, which aborts a LOCK ... WAIT.
	cancel context.CancelFunc

	q replyQueue
	w clientWriter

	// Used only by the forwarder.
	sh        *backend.Mux // nil when multiplexing is off
	dedicated bool         // the client has left its shared connection for good
	sharedOut bool         // commands were sent on the shared connection since the last flush
	// replica: the backend answered the client's SYNC or PSYNC with the
	// replication stream; whatever the client sends now goes to the
	// backend as it is (see relay).
	replica bool
	nb      [24]byte // the name of the command being forwarded, lowered
	// queuing is the command being queued on a shared connection, which
	// the connection records under its lock (Queued).
	queuing entry
	// conn is the client's connection of one, made at its first command
	// that cannot share one (backend.NewOne); be is its live backend
	// connection, nil before the first and after a cluster client's
	// pinned one was closed. connOut: commands were put on it since the
	// last flush.
	conn    *backend.Mux
	be      *backendConn
	connOut bool
	// waitStale: the client sent commands on another connection than its
	// own one (the shared one, or an own one since lost), whose writes a
	// WAIT on its own one would not wait for (see waitMark).
	waitStale bool
	authed    bool      // under proxy authentication
	acl       aclClient // under Redis's ACL at the proxy (aclsession.go)
	loc       Local
	named     bool   // loc was told the client's name, locName
	locName   []byte // the raw CLIENT SETNAME that named the client for loc
	addr      string // the client's address
	buf       []byte
	// The context that bounds the local commands (see commandContext),
	// used only where loc is.
	cmdCtx    context.Context
	cmdCancel context.CancelFunc
	// up says where commands go; cl routes them when the backend is a
	// Redis Cluster (clusterhost.go), and cst is the state the client set
	// there.
	up  upstream
	cl  *clusterclient.Client
	cst clusterState
	// fc are the connections FENCED runs on (fenced.go).
	fc   fencedConns
	fenv *fenced.Env // what internal/fenced needs of the session, made at its first FENCED

	wg sync.WaitGroup // the backend readers and the local runner

	// ids are the ids CLIENT ID gave the client (identity.go).
	ids clientid.Held[clientID]
}

func newSession(p *Proxy, nc *clientConn, log *zap.Logger) *session {
	s := &session{p: p, nc: nc, log: log}
	s.ctx, s.cancel = context.WithCancel(p.root)
	s.q.init(p.m)
	s.q.identity = s.identity // identity.go
	s.authed = p.auth == nil
	s.sh = p.pickShared()
	s.up = single{s}
	if p.router != nil {
		s.cl = clusterclient.New(s.ctx, p.router.Router, s)
		s.up = clusterUp{s}
	}
	s.w.init(nc, &p.sharedWG, s.sh != nil || s.cl != nil)
	return s
}

// handle processes one command from redcon's connection goroutine.
func (s *session) handle(cmd redcon.Command) {
	if s.q.hold(cmd) {
		return
	}
	if s.cl != nil && s.cl.Blocking() {
		// A command sent may block: waiting for its reply runs on a
		// goroutine of its own, and this command waits behind it.
		s.startCluster()
		if s.q.hold(cmd) {
			return
		}
	}
	it, forwarded := s.forward(cmd, s.nc.order)
	if forwarded {
		return
	}
	s.flush()
	// The commands before it have left. It goes to the lock nodes, or is
	// answered by the proxy, never to the backend, and a lock command
	// takes a round trip to the nodes or waits: other clients' commands
	// do not wait for it, nor for what follows it in this read.
	s.nc.order.End()
	// A command that is quick to answer, with no reply due before it, is
	// answered here, on redcon's goroutine; the others get a goroutine of
	// their own, so that this one goes on reading and sees the client hang
	// up while they wait.
	now := s.q.startLocal() && !s.mayWait(it)
	s.wg.Add(1)
	if now {
		s.answerNow(it)
		return
	}
	go s.runLocal(it)
}

// endBatch follows the commands of one read from the client: what they
// sent to the backend goes out, unless a local command is still running,
// whose runner sends what follows it.
func (s *session) endBatch() {
	if s.q.running() {
		return
	}
	if s.cl != nil && s.cl.Blocking() {
		// The blocking command leaves here, before this goroutine reads
		// again and so lets the reads after this one go on (the arrival
		// order): another client's command sent right after it must not
		// reach the master first.
		s.flush()
		s.startCluster()
		return
	}
	s.flush()
}

// startCluster waits for the replies the client is owed in front of a
// cluster, one of which may block, on a goroutine of its own, as a local
// command that may wait runs (see runLocal): redcon's goroutine goes on
// reading the client, holding back its commands, and sees it hang up
// while a blocking command waits.
func (s *session) startCluster() {
	s.q.startLocal()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer s.Recover()
		s.flush()
		s.cl.Settle()
		s.drainBacklog()
	}()
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
	defer s.Recover()
	s.answer(it)
	s.q.endLocal()
}

// runLocal answers it, then goes on with the commands that queued behind
// it until none is left, and hands forwarding back to redcon's goroutine.
func (s *session) runLocal(it localItem) {
	defer s.wg.Done()
	defer s.Recover()
	s.answer(it)
	s.drainBacklog()
}

// drainBacklog handles the commands held back while a local command ran
// (or the wait for a cluster client's replies), until none is left, and
// hands forwarding back to redcon's goroutine.
func (s *session) drainBacklog() {
	for {
		batch := s.q.next()
		if batch == nil {
			return
		}
		for _, cmd := range batch {
			// Held back behind the client's own local command: its
			// read has left the arrival order (see handle).
			if it, forwarded := s.forward(cmd, nil); !forwarded {
				s.flush()
				s.answer(it)
			}
		}
		s.flush()
	}
}

// forward sends cmd to the backend, or returns false and the item to
// answer locally in its place. order is the arrival order of the read cmd
// came in, when it is the read just made on redcon's goroutine: a command
// that is not the proxy's own waits there for the commands other clients
// sent before it (internal/backend, Arrivals).
func (s *session) forward(cmd redcon.Command, order *backend.Arrival) (localItem, bool) {
	if s.cl != nil && s.cl.Quitting() {
		// After a cluster client's QUIT, which closes the connection
		// (one Redis runs QUIT itself).
		return localItem{reply: replyOK, silent: true}, false
	}
	if s.replica {
		// A replica's REPLCONF ACK and whatever else it sends are Redis's
		// to interpret, not the proxy's.
		s.conn.Put(cmd.Raw)
		s.connOut = true
		s.p.m.forwarded.Add(1)
		return localItem{}, true
	}
	// The name is lowered into the session's buffer: on the stack it
	// would move to the heap at every command, as it is passed on to
	// the upstream through an interface.
	name := resp.Lower(&s.nb, cmd.Args[0])
	if s.p.acl != nil {
		if it, done := s.aclGate(name, &cmd); done {
			return it, false
		}
	} else if s.p.auth != nil {
		var reply, rewritten []byte
		reply, rewritten, s.authed = s.p.auth.Gate(s.authed, name, cmd.Args)
		if reply != nil {
			return localItem{reply: reply, silent: s.silent()}, false
		}
		if rewritten != nil {
			cmd.Raw = rewritten
		}
	}
	if it, ok := s.fencedItem(name, cmd.Args); ok {
		order.Wait()
		return it, false
	}
	if s.p.cfg.IsLocal != nil && s.p.cfg.IsLocal(cmd.Args[0]) {
		return localItem{args: cmd.Args, silent: s.silent()}, false
	}
	order.Wait()
	if build, ok := s.intercept(name, cmd.Args); ok && !s.q.inMulti() && (s.cl == nil || s.cl.Txn == nil) {
		// Inside a transaction they are queued like any command, and
		// keep their place in EXEC's reply.
		return localItem{build: build, silent: s.silent()}, false
	}
	if s.p.guard != nil {
		if err := s.p.guardCheck(name, cmd.Args); err != nil {
			return localItem{reply: resp.ErrorReply(err), silent: s.silent()}, false
		}
	}
	if err := s.p.guardRecords(name, cmd.Args); err != nil {
		return localItem{reply: resp.ErrorReply(err), silent: s.silent()}, false
	}
	if it, forwarded, dedicated := s.up.forward(name, cmd); !dedicated {
		return it, forwarded
	}
	return s.forwardBackend(name, cmd)
}

// forwardBackend is forward's last part: cmd goes to the backend on the
// client's dedicated connection. A function of its own so that its frame
// is not on the stack while a cluster client's command is routed (see
// planState).
func (s *session) forwardBackend(name []byte, cmd redcon.Command) (localItem, bool) {
	e := classify(name, cmd)
	offAgain := false // replies were turned on for e, and go off after it (see connState.reveal)
	for {
		doomed, err := s.connect(&e)
		if doomed != nil {
			return localItem{reply: doomed, silent: s.silent()}, false
		}
		if err != nil {
			if s.ctx.Err() == nil {
				s.log.Debug("backend unavailable", zap.Error(err))
			}
			s.p.m.unavailable.Add(1)
			s.q.unsent(&e)
			return localItem{reply: resp.ErrorReply(&BackendError{Err: err}), silent: s.q.silentFor(&e)}, false
		}
		if s.waitStale && resp.Lookup(name).Has(resp.Waits) {
			s.waitMark()
		}
		reveal, off := false, false
		if replayedKind(e.kind) { // the others are never revealed: no lock for them
			reveal, off = s.q.reveal(&e)
		}
		if reveal {
			if ok, _ := s.q.send(&entry{kind: entryInternal}, s.be); ok {
				s.conn.Put(cmdReplyOn)
			}
		}
		if ok, _ := s.q.send(&e, s.be); ok {
			offAgain = off
			break
		}
		if doomed := s.q.doomed(&e); doomed != nil {
			return localItem{reply: doomed, silent: s.silent()}, false
		}
	}
	raw := cmd.Raw
	if e.replace != nil {
		// The backend queued the rest of a transaction the proxy refused
		// a command of; throw it away and answer as Redis does.
		raw = cmdDiscard
	}
	s.conn.Put(raw) // a write that fails closes the connection; the reader answers what is pending
	if offAgain {
		s.conn.Put(cmdReplyOff)
	}
	s.connOut = true
	if e.kind == entryReset {
		s.reauth()
	}
	if e.kind == entrySync {
		// What the client sends next is a replica's if the backend
		// answers with the replication stream, and a command otherwise.
		s.flush()
		s.replica = s.q.waitSync(s.be)
	}
	s.p.m.forwarded.Add(1)
	if ce := s.log.Check(zap.DebugLevel, "forward"); ce != nil {
		ce.Write(zap.String("command", string(name))) // a copy: name stays on the stack
	}
	return localItem{}, true
}

// waitMark sends, before a WAIT or WAITAOF on the client's own connection,
// the proxy's mark script (waitMarkScript), whose reply the client never
// sees: Redis waits for the replication offset of the connection's last
// write, and the client's writes went on another connection, so without
// it a WAIT would count every replica at once, as on a fresh connection.
// Not inside a transaction (Redis answers WAIT there at once), nor while
// replies are off or skipped, or the client subscribed.
func (s *session) waitMark() {
	if !s.q.markable() {
		return // the next WAIT marks
	}
	if ok, _ := s.q.send(&entry{kind: entryInternal}, s.be); ok {
		s.conn.Put(waitMarkOne)
		s.connOut, s.waitStale = true, false
	}
}

// silent reports whether CLIENT REPLY suppresses the reply to a command
// the proxy answers itself, and consumes a SKIP. A SKIP was sent to the
// backend too, which would spend it on the client's next forwarded
// command instead: a CLIENT REPLY ON of the proxy's own, whose reply the
// client never sees, spends it there (Redis clears the skip of the
// command it runs, and answers it).
func (s *session) silent() bool {
	silent, skipped := s.q.silent()
	if skipped && s.be != nil {
		if ok, _ := s.q.send(&entry{kind: entryInternal}, s.be); ok {
			s.conn.Put(cmdReplyOn)
			s.connOut = true
		}
	}
	return silent
}

// waitMarkOne is waitMark's command in front of one Redis.
var waitMarkOne = cluster.WaitMarkCommand(cluster.WaitMarkKey)

// reauth follows a client's RESET, which signs the backend connection out,
// with the proxy's own AUTH and SELECT, whose replies the client never sees.
func (s *session) reauth() {
	for _, raw := range s.p.setup {
		if ok, _ := s.q.send(&entry{kind: entryInternal}, s.be); ok {
			s.conn.Put(raw)
		}
	}
}

// flush sends what the forwarder has written to the backend.
func (s *session) flush() {
	if s.sharedOut {
		s.flushShared()
		if !s.w.pushed() {
			// A TLS client's replies are written by its own goroutine.
			// The commands have left: other clients' need not wait.
			s.nc.order.End()
			s.drainShared()
		}
	}
	if s.connOut {
		// After what waits on the shared connections, which came before
		// (see shared).
		s.connOut = false
		s.conn.Flush()
	}
}

// settleShared sends what is queued on the shared connection and waits
// until all the client's replies from it have been written.
func (s *session) settleShared() {
	if s.sharedOut {
		s.flushShared()
	}
	s.drainShared()
}

// flushShared writes, or has the readers write, what the client queued on
// shared connections.
func (s *session) flushShared() {
	s.sharedOut = false
	s.flushDirty()
}

// flushDirty writes, or has the readers write, what the client queued on
// shared connections and, in front of a cluster, its own.
func (s *session) flushDirty() {
	if s.sh != nil {
		s.sh.Flush()
	}
	if s.cl != nil {
		s.cl.FlushDirty()
	}
}

// drainShared waits for the replies to the commands the client sent on
// its shared connection and makes sure they have been written to the
// client, so that what the forwarder writes next comes after them.
func (s *session) drainShared() {
	s.q.waitEmpty()
	if s.cl != nil {
		s.cl.Order().Wait()
	}
	s.w.drain()
}

// connect makes sure the forwarder has a live backend connection for e,
// unless e belongs to a transaction whose connection was lost: then it
// returns what the client gets instead (see connState.doomed), and dials
// nothing.
func (s *session) connect(e *entry) (doomed []byte, err error) {
	if s.be != nil {
		if !s.q.dead(s.be) {
			return nil, nil
		}
		// The old reader answers what was pending before the new
		// connection's replies may start.
		<-s.be.Done
		s.be = nil
		s.waitStale = true
	}
	if doomed := s.q.doomed(e); doomed != nil {
		return doomed, nil
	}
	be, err := s.up.dial(s.q.replay())
	if err != nil {
		return nil, err
	}
	if err := s.q.attach(be); err != nil {
		be.NC.Close()
		return nil, err
	}
	if s.conn == nil {
		s.conn = backend.NewOne(&s.p.mux, s, &s.wg)
	}
	s.be = be
	s.conn.Attach(be)
	// CLIENT REPLY OFF or SKIP answers nothing: it is sent with the
	// command that follows rather than replayed with the rest.
	if raw := s.q.replyReplay(); raw != nil {
		s.conn.Put(raw)
		s.connOut = true
	}
	return nil, nil
}

// Frame copies one frame of be, the client's connection of one, to the
// client, first being its first byte, as the replyQueue says what it
// answers, and learns from it. It reports false when be is done with: lost,
// answered a QUIT, or a replication stream that was relayed until it
// ended.
func (s *session) Frame(be *backendConn, first byte, ri *resp.ReplyInfo) bool {
	// A push is always the client's, as it is.
	kind, replace, hidden := entryPlain, []byte(nil), false
	if first != '>' {
		kind, replace, hidden = s.q.peek()
	}
	if kind == entrySync && first != '-' {
		// SYNC or PSYNC is answered with the replication stream (or
		// the newlines Redis sends until it starts).
		s.q.replicate()
		s.BackendLost(be, s.relay(be))
		return false
	}
	var err error
	if hidden {
		err = s.w.skip(be.R, ri)
	} else {
		err = s.w.copyFrom(be.R, ri, replace)
	}
	if err != nil {
		s.BackendLost(be, err)
		return false
	}
	s.p.checkReply(ri)
	if s.q.account(ri) {
		// QUIT: Redis closes the connection after its +OK.
		s.w.flush()
		s.nc.Close()
		s.BackendLost(be, errClosed)
		return false
	}
	return true
}

// relay copies the replication stream from be to the client as it comes,
// until either side ends it: the RDB payload (which has no CRLF after it,
// or ends with an EOF mark), the newlines before it, and the commands after
// it are not replies and are not parsed.
func (s *session) relay(be *backendConn) error {
	if ce := s.log.Check(zap.DebugLevel, "replication stream"); ce != nil {
		ce.Write()
	}
	return s.w.relay(be.R)
}

// BackendLost answers every command still waiting on be with an error and
// marks be dead. A client whose stream broke mid-reply, or that was
// subscribed or monitoring, is disconnected instead: its state is gone and
// it must notice, as it would if Redis itself had dropped it.
func (s *session) BackendLost(be *backendConn, cause error) {
	be.NC.Close()
	owed, visible, listening, closed, quit := s.q.lose(be)
	drop := closed || s.nc.broken.Load() || errors.Is(cause, resp.ErrMidReply) || listening
	if !closed && !quit && !errors.Is(cause, errClosed) {
		s.log.Debug("backend connection lost", zap.Error(cause))
		s.p.backendTrouble()
	}
	if drop {
		s.nc.Close()
	} else if visible > 0 {
		s.p.m.connLost.Add(uint64(visible))
		s.w.repeat(replyConnLost, visible)
	}
	s.q.forget(owed)
}

// answer writes the reply to a locally answered command once every reply
// before it has reached the client.
func (s *session) answer(it localItem) {
	s.p.m.local.Add(1)
	if s.cl != nil {
		s.cl.Order().Wait() // the replies routed before it
	}
	t, ok := s.q.waitTurn()
	if !ok {
		return
	}
	if s.cl != nil && s.be == nil {
		t.multi, t.resp3 = s.cl.Txn != nil, s.cst.st.resp3()
	}
	reply := it.reply
	if reply == nil {
		var nb [24]byte
		switch {
		case it.build != nil:
			var err error
			if reply, err = it.build(t.resp3); err != nil {
				reply = resp.ErrorReply(err)
			}
		case t.multi:
			reply = replyNotInMulti
		case !t.resp3 && t.subscribed:
			reply = append(append([]byte(subscribedPrefix), resp.Lower(&nb, it.cmdName())...), subscribedSuffix...)
		case it.fenced != nil:
			if reply = s.lockDenied(it.fenced); reply == nil {
				reply = s.fenced(it.fenced)
			}
		default:
			if s.loc == nil {
				s.loc = s.p.cfg.NewLocal()
			}
			name := t.name
			if s.cl != nil {
				// In front of a cluster the name is the client's
				// own state, replayed on each of its connections.
				name = s.cst.st.replay.name
			}
			s.identify(name)
			if reply = s.lockDenied(it.args); reply == nil {
				s.buf = s.loc.Serve(s.commandContext(), s.buf[:0], it.args, t.resp3)
				reply = s.lockListed(it.args, s.buf)
			}
		}
	}
	if t.multi && len(reply) > 0 && reply[0] == '-' {
		if s.cl != nil && s.cl.Txn != nil {
			s.cl.Txn.Failed.Store(true)
		} else {
			s.q.refused()
		}
	}
	if it.quit {
		defer s.nc.Close()
	}
	if it.silent {
		return
	}
	s.w.write(reply)
}

// identify tells a ClientLocal its client's name and address when it has
// not been told them yet or the name changed.
func (s *session) identify(name []byte) {
	cl, ok := s.loc.(ClientLocal)
	if !ok || (s.named && bytes.Equal(name, s.locName)) {
		return
	}
	s.named, s.locName = true, name
	var n string
	if cmd, err := redcon.Parse(name); err == nil && len(cmd.Args) == 3 {
		n = string(cmd.Args[2])
	}
	cl.SetClient(n, s.addr)
}

// commandContext returns the context a local command runs under: s.ctx
// with a deadline at least CommandTimeout and at most a 64th more away.
// The commands of that 64th share one context, so that a LOCK or UNLOCK
// does not make and stop a timer of its own: that was 6% of the proxy's
// CPU per LOCK+UNLOCK with 50 clients locking at once. Never less than
// CommandTimeout, so that a WAIT up to lock.max_wait, which the
// configuration keeps shorter, always fits.
func (s *session) commandContext() context.Context {
	now, d := time.Now(), s.p.cfg.CommandTimeout
	if s.cmdCtx != nil {
		if until, _ := s.cmdCtx.Deadline(); until.Sub(now) >= d {
			return s.cmdCtx
		}
		s.cmdCancel()
	}
	s.cmdCtx, s.cmdCancel = context.WithDeadline(s.ctx, now.Add(d+d/64))
	return s.cmdCtx
}

// protocolError answers a request that broke the protocol or a limit,
// after the replies to the requests before it (waiting at most a second
// for them). redcon closes the connection next.
func (s *session) protocolError(err error) {
	s.p.m.protocolErrors.Add(1)
	start := time.Now()
	s.q.waitIdle(time.Second)
	if s.cl != nil {
		s.cl.Order().WaitFor(time.Second - time.Since(start))
	}
	s.w.write([]byte("-ERR " + err.Error() + "\r\n"))
}

// Recover contains a panic to this client: it is logged and the
// client's connection is closed, and the process and every other client
// carry on. It is deferred at the top of every goroutine that works for the
// session.
func (s *session) Recover() {
	r := recover()
	if r == nil {
		return
	}
	s.log.Error("panic serving client; closing its connection", zap.Any("panic", r), zap.StackSkip("stack", 1))
	s.nc.Close()
	s.q.endLocal()
}

// waiting reports whether the client is waiting on the server rather than
// idle: a command in flight, a subscription or MONITOR.
func (s *session) waiting() bool { return s.q.waiting() }

// inflight reports whether a command is still being answered.
func (s *session) inflight() bool { return s.q.inflight() }

// close ends the session when the client connection has closed. It runs in
// redcon's closed callback, under redcon's server lock, so it only signals;
// the proxy's cleanup goroutine waits for the session's goroutines.
func (s *session) close() {
	be, first := s.q.close()
	if !first {
		return
	}
	s.cancel()
	if be != nil {
		be.NC.Close()
	}
	if s.cl != nil {
		s.cl.Close()
	}
}

// wait waits for the session's goroutines after close, then ends its lock
// state (KEEPALIVE locks are released).
func (s *session) wait() {
	s.wg.Wait()
	s.p.clientIDs.Forget(&s.ids)
	s.fc.close()
	if s.loc != nil {
		s.loc.Close()
	}
}

// What a multiplexed connection does with the session of a client it
// carries (backend.Client, backend.Owner; Ordered, OrderedReply, Answer
// and Drained are in clusterhost.go).

var (
	_ backend.Client = (*session)(nil)
	_ backend.Owner  = (*session)(nil)
)

// Queued records s.queuing, the command the forwarder is queuing on a
// shared connection.
func (s *session) Queued() { s.q.send(&s.queuing, nil) }

// QueuedPlain records the n commands of a run the loop queues.
func (s *session) QueuedPlain(n int) { s.q.sendPlain(n) }

// Sink is where the shared reader copies the client's replies.
func (s *session) Sink() io.Writer { return &s.w }

// Replied matches a reply the shared reader copied to the sink.
func (s *session) Replied(ri *resp.ReplyInfo) { s.q.account(ri) }

// RepliedPlain matches n replies to commands the loop queued in a run.
func (s *session) RepliedPlain(n int) { s.q.accountPlain(n) }

// PushOut writes the sink to the client if the shared reader is the one
// that writes it.
func (s *session) PushOut() {
	if s.w.pushed() {
		s.w.pushOut()
	}
}

// Disconnect closes the client's connection.
func (s *session) Disconnect() { s.nc.Close() }
