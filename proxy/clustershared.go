package proxy

import (
	"bufio"
	"bytes"
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tidwall/redcon"

	"github.com/lockproxy/lockproxy/proxy/internal/backend"
	"github.com/lockproxy/lockproxy/proxy/internal/cluster"
	"github.com/lockproxy/lockproxy/proxy/internal/resp"
)

// Shared connections per master. In front of a cluster, the stateless
// commands of a client without connection state of its own (no AUTH,
// HELLO or CLIENT SETNAME, no transaction or WATCH, not subscribed or
// monitoring), whose keys are in one slot, go to the master of that slot
// on one of its BackendConfig.SharedConnections shared connections, as
// the commands of a client of one Redis do (shared.go): batched with the
// other clients' commands, written in arrival order, and answered by the
// connection's reader straight into the client's sink. A client uses the
// connection of the same index at every master.
//
// A client's pipeline may go to several masters at once, whose replies
// come back in any order: each command takes a ticket in the client's
// cluster.Order, and a reply that comes before the ones ahead of it waits
// there until they have been written. A redirection (MOVED, ASK) or a
// slot not served yet (TRYAGAIN, CLUSTERDOWN) on a shared connection is
// never the client's: the command is sent again where the cluster says, on
// that master's shared connection (after ASKING, in the same write, for
// ASK), within BackendConfig.ClusterRetry, and its reply takes the same
// place. A command that may change who the masters let in (CONFIG SET
// requirepass, ACL SETUSER ...) starts a new generation of shared
// connections for the clients that connect after it
// (router.accessChanged). Every other command goes on the client's own
// connections (clustercall.go), after the replies owed on the shared ones
// (session.settleCluster); its replies take their place in the same
// cluster.Order.

// router is the proxy's view of a Redis Cluster: the slot map and the
// COMMAND table (clusterRouter), and the shared connections to each
// master.
type router struct {
	*cluster.Router
	p *Proxy

	// The shared connections to each master (clustershared.go), by
	// master and access generation, all of them, and all the groups for
	// Proxy.writeQueued.
	shMu      sync.Mutex
	shared    map[groupKey]*muxGroup
	sharedAll atomic.Pointer[[]*muxConn]
	groups    atomic.Pointer[[]*muxGroup]
	// access counts the commands that may have changed who the masters
	// let in (CONFIG SET requirepass, ACL SETUSER ...): a generation of
	// shared connections serves the clients that connected during it
	// (see accessChanged). sessions counts each generation's clients;
	// under shMu.
	access   atomic.Uint64
	sessions map[uint64]int

	// spares are each master's spare connections (clusterspare.go),
	// under spMu; spClosed, that the proxy shut them down.
	spMu     sync.Mutex
	spares   map[string]*backend.Spares
	spClosed bool
	// clientIDs are the clients by the id CLIENT ID gave them, for
	// CLIENT TRACKING ... REDIRECT (clustertracking.go).
	clientIDs sync.Map // int64 -> *session
}

// ready reads the slot map and checks that every master answers PING.
func (r *router) ready(ctx context.Context) error {
	if err := r.Router.Ready(ctx); err != nil {
		return &BackendError{Err: err}
	}
	return nil
}

func newRouter(p *Proxy) *router {
	b := &p.cfg.Backend
	r := &router{p: p}
	r.Router = cluster.NewRouter(cluster.RouterConfig{
		Seeds:   b.Cluster,
		Timeout: b.DialTimeout,
		TLS:     b.TLS != nil,
		Options: b.controlOptions,
		Masters: r.keepSpares, // clusterspare.go
	})
	return r
}

// sharedList returns the shared connections to the masters.
func (r *router) sharedList() []*muxConn {
	if l := r.sharedAll.Load(); l != nil {
		return *l
	}
	return nil
}

// groupList returns the masters' groups of shared connections.
func (r *router) groupList() []*muxGroup {
	if l := r.groups.Load(); l != nil {
		return *l
	}
	return nil
}

// groupKey names a group of shared connections: its master and the
// access generation it serves.
type groupKey struct {
	addr   string
	access uint64
}

// sharedConn returns the shared connection number i (modulo their number)
// to the master at addr for the clients of access generation gen, making
// the group on first use.
func (r *router) sharedConn(addr string, i, gen uint64) *muxConn {
	r.shMu.Lock()
	defer r.shMu.Unlock()
	if r.shared == nil {
		r.shared = map[groupKey]*muxGroup{}
	}
	k := groupKey{addr, gen}
	g := r.shared[k]
	if g == nil {
		g = newMuxGroup(r.p, addr, max(r.p.cfg.Backend.SharedConnections, 1))
		g.forwarded = r.Counter(addr)
		r.shared[k] = g
		all := append(append([]*muxConn(nil), r.sharedList()...), g.list...)
		r.sharedAll.Store(&all)
		groups := append(append([]*muxGroup(nil), r.groupList()...), g)
		r.groups.Store(&groups)
	}
	return g.list[i%uint64(len(g.list))]
}

// joined counts a new client in the current access generation, which it
// returns.
func (r *router) joined() uint64 {
	r.shMu.Lock()
	defer r.shMu.Unlock()
	gen := r.access.Load()
	if r.sessions == nil {
		r.sessions = map[uint64]int{}
	}
	r.sessions[gen]++
	return gen
}

// left counts a client of generation gen gone. The shared connections of
// an earlier generation are closed with its last client.
func (r *router) left(gen uint64) {
	r.shMu.Lock()
	defer r.shMu.Unlock()
	r.sessions[gen]--
	if r.sessions[gen] > 0 || gen == r.access.Load() {
		return
	}
	delete(r.sessions, gen)
	r.retire(gen)
}

// accessChanged starts a new access generation: a command may change who
// the masters let in. Redis applies such a change to the connections
// opened after it, and the clients already connected keep what they had
// (a password set now is asked of new connections only). So the shared
// connections, signed in before, go on serving the clients connected
// before, and the clients that connect from now on share new ones, dialed
// after the change. Without clients, the older generations' connections
// are closed at once.
func (r *router) accessChanged() {
	r.shMu.Lock()
	defer r.shMu.Unlock()
	old := r.access.Add(1) - 1
	if r.sessions[old] == 0 {
		delete(r.sessions, old)
		r.retire(old)
	}
}

// retire closes the shared connections of generation gen and forgets
// them; r.shMu is held.
func (r *router) retire(gen uint64) {
	var all []*muxConn
	var groups []*muxGroup
	for _, g := range r.groupList() {
		if r.shared[groupKey{g.list[0].addr, gen}] == g {
			delete(r.shared, groupKey{g.list[0].addr, gen})
			for _, sh := range g.list {
				sh.retire()
			}
			continue
		}
		groups = append(groups, g)
		all = append(all, g.list...)
	}
	r.sharedAll.Store(&all)
	r.groups.Store(&groups)
}

// closeShared closes the shared connections to the masters; their readers
// end.
func (r *router) closeShared() {
	for _, sh := range r.sharedList() {
		sh.close()
	}
}

// sharesCluster reports whether a routed call goes on a shared connection.
func (s *session) sharesCluster(name []byte, args [][]byte, c *cluster.Call) bool {
	cs := s.cl
	if changesAccess(name, args) {
		cs.r.accessChanged()
	}
	return s.p.cfg.Backend.SharedConnections > 0 && c.Kind == cluster.CallPlain && c.One.Tx == nil &&
		c.Learn == nil && !c.Alone && c.One.Addr != "" && cs.Txn == nil && cs.Watch == nil &&
		cs.st.replay.empty() && !cs.monitorOn && s.be == nil && cs.trk.Load() == nil && !cs.r.Paused() &&
		resp.Stateless(name) && resp.Lookup(name).Flags&(resp.Blocking|resp.Script) == 0
}

// changesAccess reports whether a command may change which connections
// the server lets in: CONFIG SET requirepass, ACL SETUSER, DELUSER, LOAD.
func changesAccess(name []byte, args [][]byte) bool {
	if resp.Lookup(name).Has(resp.ChangesAccess) {
		// CONFIG: when it names requirepass.
		for _, a := range args[1:] {
			if bytes.EqualFold(a, []byte("requirepass")) {
				return true
			}
		}
		return false
	}
	return resp.Of(name, args).Has(resp.ChangesAccess)
}

// routeShared sends c on the shared connection to its master; it reports
// false, having sent nothing, when that connection cannot be had (the
// call then tries the client's own, and waits for the cluster).
func (s *session) routeShared(name []byte, cmd redcon.Command, c *cluster.Call) bool {
	cs := s.cl
	if cs.ownUsed {
		s.settleCluster() // the replies on the client's own connections come first
	}
	var sh *muxConn
	for _, c2 := range cs.sharedConns {
		if c2.addr == c.One.Addr {
			sh = c2
			break
		}
	}
	if sh == nil {
		sh = cs.r.sharedConn(c.One.Addr, cs.sharedIdx, cs.access)
		cs.sharedConns = append(cs.sharedConns, sh)
	}
	ticket := cs.order.Add(c.One.Raw, c.One.Slot, cluster.TicketOpts{Seq: c.Seq})
	e := classify(name, cmd)
	if err := sh.queue(s, ticket, nil, c.One.Raw, &e); err != nil {
		cs.order.Drop(ticket)
		return false
	}
	s.markShared(sh)
	cs.sharedUsed = true
	if c.Seq != 0 {
		cs.LastShared = true // see waitMark
	}
	s.p.m.forwarded.Add(1)
	sh.grp.forwarded.Add(1)
	return true
}

// markShared notes that sh has a command of the client's to write.
func (s *session) markShared(sh *muxConn) {
	s.sharedOut = true
	for _, d := range s.dirty {
		if d == sh {
			return
		}
	}
	s.dirty = append(s.dirty, sh)
}

// sharedReply reads the reply to ticket from r, on a shared connection or
// one of the client's own, and puts it in its place in the client's
// replies. answered is false when the reply was a redirection: the command
// is sent again, and its reply comes later; with err, it is false when
// nothing of the reply reached the client.
func (s *session) sharedReply(r *bufio.Reader, ticket uint64, w *bufio.Writer, sink *sinkWriter, ri *resp.ReplyInfo, own string) (answered bool, err error) {
	o := &s.cl.order
	b, err := r.Peek(1)
	if err != nil {
		return false, err
	}
	if b[0] != '-' && o.Ahead(ticket) {
		// The usual case: straight to the client's sink.
		sink.w = s.sink()
		err = resp.CopyReply(w, r, ri)
		w.Flush()
		sink.w = nil
		if err == nil {
			if own != "" {
				err = s.cl.pushesAfter(r, own, ticket)
			}
			o.Put(ticket, true, nil, &s.w)
		}
		return true, err
	}
	sink.capture, sink.buf = true, sink.buf[:0]
	err = resp.CopyReply(w, r, ri)
	w.Flush()
	sink.capture = false
	if err == nil && own != "" {
		err = s.cl.pushesAfter(r, own, ticket)
	}
	if err != nil {
		return false, err
	}
	reply := sink.buf
	if ri.Type == '-' {
		if kind, target := cluster.Redirected(sink.buf); kind != cluster.RedirNone {
			if !o.Stays(ticket) {
				s.redirect(redirect{ticket, kind, target})
				return false, nil
			}
			reply = replyMovedInTxn
		}
	}
	o.Put(ticket, false, reply, &s.w)
	if cap(sink.buf) > 64<<10 {
		sink.buf = nil
	}
	return true, nil
}

// answerShared gives the client reply, an error of the proxy's own, for
// the command with ticket on a shared connection, or on one of a cluster
// client's own when own is set (whose replies its replyQueue does not
// count).
func (s *session) answerShared(ticket uint64, reply []byte, own bool) {
	if s.cl != nil {
		s.cl.order.Put(ticket, false, reply, &s.w)
	} else {
		s.sink().Write(reply)
	}
	if !own {
		s.replied(&resp.ReplyInfo{Type: '-'})
	}
	s.pushOut()
}

// redirect is a redirection to follow.
type redirect struct {
	ticket uint64
	kind   cluster.Redirection
	target string
}

// redirect has d followed after the redirections of the client's that
// came before it, on a goroutine of the client's (counted in sharedWG),
// as it may wait for the slot map: two commands of a pipeline redirected
// to the same node reach it in the client's order.
func (s *session) redirect(d redirect) {
	cs := s.cl
	cs.redirMu.Lock()
	defer cs.redirMu.Unlock()
	cs.redirs = append(cs.redirs, d)
	if len(cs.redirs) == 1 {
		s.p.sharedWG.Add(1)
		go s.redirecting()
	}
}

// redirecting follows the client's redirections in turn until none is
// left.
func (s *session) redirecting() {
	defer s.p.sharedWG.Done()
	cs := s.cl
	for {
		cs.redirMu.Lock()
		d := cs.redirs[0]
		cs.redirMu.Unlock()
		s.redirectShared(d.ticket, d.kind, d.target)
		cs.redirMu.Lock()
		cs.redirs = cs.redirs[1:]
		left := len(cs.redirs)
		if left == 0 {
			cs.redirs = nil
		}
		cs.redirMu.Unlock()
		if left == 0 {
			return
		}
	}
}

// redirectShared sends the command with ticket again where a redirection
// says, on that master's shared connection, or the client's own
// connection to it when it came on one.
func (s *session) redirectShared(ticket uint64, kind cluster.Redirection, target string) {
	defer s.recoverPanic()
	cs := s.cl
	r := cs.r
	raw, slot, opts, deadline, ok := cs.order.Command(ticket, s.p.cfg.Backend.ClusterRetry)
	if !ok {
		return
	}
	if time.Now().After(deadline) || s.ctx.Err() != nil {
		s.answerShared(ticket, resp.ErrorReply(&BackendError{Err: errRetriesSpent}), opts.Own)
		return
	}
	addr := target
	var pre []byte
	switch kind {
	case cluster.RedirMoved:
		r.Moved.Add(1)
		r.Reload(s.ctx, r.Gen.Load())
	case cluster.RedirAsk:
		r.Asked.Add(1)
		pre = cmdAsking
	case cluster.RedirWait:
		p := cluster.Part{Slot: slot}
		if !s.again(&p, deadline) || p.Addr == "" {
			s.answerShared(ticket, resp.ErrorReply(&BackendError{Err: errRetriesSpent}), opts.Own)
			return
		}
		addr = p.Addr
	}
	var sh *muxConn
	if opts.Own {
		sh = cs.ownConn(s, addr)
	} else {
		sh = r.sharedConn(addr, cs.sharedIdx, cs.access)
	}
	if err := sh.queue(s, ticket, pre, raw, nil); err != nil {
		s.p.m.unavailable.Add(1)
		s.answerShared(ticket, resp.ErrorReply(&BackendError{Err: err}), opts.Own)
		return
	}
	if opts.Seq != 0 {
		cs.NoteMoved(opts.Seq, addr)
	}
	sh.flush()
}
