package clusterclient

import (
	"bufio"
	"bytes"
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
// the commands of a client of one Redis do (backend.Mux): batched with the
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
// connections (call.go), after the replies owed on the shared ones
// (Settle); its replies take their place in the same
// cluster.Order.

// sharesCluster reports whether a routed call goes on a shared connection.
func (s *Client) sharesCluster(name []byte, args [][]byte, c *cluster.Call) bool {
	if changesAccess(name, args) {
		s.r.accessChanged()
	}
	return s.shares(name, c)
}

// shares is sharesCluster for a command that changes no access.
func (s *Client) shares(name []byte, c *cluster.Call) bool {
	return s.r.cfg.SharedConnections > 0 && c.Kind == cluster.CallPlain && c.One.Tx == nil &&
		c.Learn == nil && !c.Alone && c.One.Addr != "" && s.Txn == nil && s.Watch == nil &&
		s.h.ReplaysNothing() && !s.monitorOn && !s.h.Pinned() && s.trk.Load() == nil && !s.r.Paused() &&
		resp.Stateless(name) && resp.Lookup(name).Flags&(resp.Blocking|resp.Script) == 0
}

// RouteShared sends cmd on the shared connection to its slot's master if
// it goes there without waiting for anything (a reply owed, the slot map,
// the COMMAND table), for the reading loop (proxy/loop.go), and reports
// whether it did; otherwise it has sent nothing, and Route sends it.
func (s *Client) RouteShared(name []byte, cmd redcon.Command) bool {
	if s.blocking || s.ownUsed || s.quit || s.caching || s.monitorOn {
		return false
	}
	if SetsState(name, cmd.Args) || changesAccess(name, cmd.Args) {
		return false
	}
	c, ok := s.PlanShared(name, cmd)
	if !ok || !s.shares(name, &c) {
		return false
	}
	return s.routeShared(name, cmd, &c)
}

// TakeDirty appends to dst the connections the client sent to since the
// last flush, which the caller flushes, and returns it.
func (s *Client) TakeDirty(dst []*backend.Mux) []*backend.Mux {
	dst = append(dst, s.dirty...)
	clear(s.dirty)
	s.dirty = s.dirty[:0]
	return dst
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
func (s *Client) routeShared(name []byte, cmd redcon.Command, c *cluster.Call) bool {
	if s.ownUsed {
		s.Settle() // the replies on the client's own connections come first
	}
	var sh *backend.Mux
	for _, c2 := range s.sharedConns {
		if c2.Addr() == c.One.Addr {
			sh = c2
			break
		}
	}
	if sh == nil {
		sh = s.r.sharedConn(c.One.Addr, s.sharedIdx, s.access)
		s.sharedConns = append(s.sharedConns, sh)
	}
	ticket := s.order.Add(c.One.Raw, c.One.Slot, cluster.TicketOpts{Seq: c.Seq})
	s.h.Sending(name, cmd)
	if err := sh.Queue(s.h, ticket, nil, c.One.Raw, true); err != nil {
		s.order.Drop(ticket)
		return false
	}
	s.markShared(sh)
	s.sharedUsed = true
	if c.Seq != 0 {
		s.LastShared = true // see waitMark
	}
	s.r.cfg.Forwarded.Add(1)
	sh.Group().Forwarded.Add(1)
	return true
}

// markShared notes that sh has a command of the client's to write.
func (s *Client) markShared(sh *backend.Mux) {
	s.h.MarkOut()
	for _, d := range s.dirty {
		if d == sh {
			return
		}
	}
	s.dirty = append(s.dirty, sh)
}

// FlushDirty writes, or has the readers write, what the client queued on
// the masters' connections since the last flush.
func (s *Client) FlushDirty() {
	for i, sh := range s.dirty {
		sh.Flush()
		s.dirty[i] = nil
	}
	s.dirty = s.dirty[:0]
}

// Drained reports whether a cluster client is owed no reply now.
func (s *Client) Drained() bool { return s.order.Drained() }

// OrderedReply reads the reply to ticket from r, on a shared connection or
// one of the client's own, and puts it in its place in the client's
// replies. answered is false when the reply was a redirection: the command
// is sent again, and its reply comes later; with err, it is false when
// nothing of the reply reached the client. own is the master's address
// on a connection of the client's own, where the master may push
// (tracking.go), "" on a shared connection.
func (s *Client) OrderedReply(r *bufio.Reader, ticket uint64, w *bufio.Writer, sink *backend.Sink, ri *resp.ReplyInfo, own string) (answered bool, err error) {
	o := &s.order
	b, err := r.Peek(1)
	if err != nil {
		return false, err
	}
	if b[0] != '-' && o.Ahead(ticket) {
		// The usual case: straight to the client's sink.
		sink.W = s.w
		err = resp.CopyReply(w, r, ri)
		w.Flush()
		sink.W = nil
		if err == nil {
			if own != "" {
				err = s.pushesAfter(r, own, ticket)
			}
			o.Put(ticket, true, nil, s.w)
		}
		return true, err
	}
	sink.Capture, sink.Buf = true, sink.Buf[:0]
	err = resp.CopyReply(w, r, ri)
	w.Flush()
	sink.Capture = false
	if err == nil && own != "" {
		err = s.pushesAfter(r, own, ticket)
	}
	if err != nil {
		return false, err
	}
	reply := sink.Buf
	if ri.Type == '-' {
		if kind, target := cluster.Redirected(sink.Buf); kind != cluster.RedirNone {
			if !o.Stays(ticket) {
				s.redirect(redirect{ticket, kind, target})
				return false, nil
			}
			reply = replyMovedInTxn
		}
	}
	o.Put(ticket, false, reply, s.w)
	if cap(sink.Buf) > 64<<10 {
		sink.Buf = nil
	}
	return true, nil
}

// redirect is a redirection to follow.
type redirect struct {
	ticket uint64
	kind   cluster.Redirection
	target string
}

// redirect has d followed after the redirections of the client's that
// came before it, on a goroutine of the client's (counted in Config.Readers),
// as it may wait for the slot map: two commands of a pipeline redirected
// to the same node reach it in the client's order.
func (s *Client) redirect(d redirect) {
	s.redirMu.Lock()
	defer s.redirMu.Unlock()
	s.redirs = append(s.redirs, d)
	if len(s.redirs) == 1 {
		s.r.cfg.Readers.Add(1)
		go s.redirecting()
	}
}

// redirecting follows the client's redirections in turn until none is
// left.
func (s *Client) redirecting() {
	defer s.r.cfg.Readers.Done()
	for {
		s.redirMu.Lock()
		d := s.redirs[0]
		s.redirMu.Unlock()
		s.redirectShared(d.ticket, d.kind, d.target)
		s.redirMu.Lock()
		s.redirs = s.redirs[1:]
		left := len(s.redirs)
		if left == 0 {
			s.redirs = nil
		}
		s.redirMu.Unlock()
		if left == 0 {
			return
		}
	}
}

// redirectShared sends the command with ticket again where a redirection
// says, on that master's shared connection, or the client's own
// connection to it when it came on one.
func (s *Client) redirectShared(ticket uint64, kind cluster.Redirection, target string) {
	defer s.h.Recover()
	r := s.r
	raw, slot, opts, deadline, ok := s.order.Command(ticket, s.r.cfg.Retry)
	if !ok {
		return
	}
	if time.Now().After(deadline) || s.ctx.Err() != nil {
		s.h.Answer(ticket, s.r.cfg.ErrorReply(errRetriesSpent), opts.Own)
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
			s.h.Answer(ticket, s.r.cfg.ErrorReply(errRetriesSpent), opts.Own)
			return
		}
		addr = p.Addr
	}
	var sh *backend.Mux
	if opts.Own {
		sh = s.ownConn(addr)
	} else {
		sh = r.sharedConn(addr, s.sharedIdx, s.access)
	}
	if err := sh.Queue(s.h, ticket, pre, raw, false); err != nil {
		s.r.cfg.Unavailable.Add(1)
		s.h.Answer(ticket, s.r.cfg.ErrorReply(err), opts.Own)
		return
	}
	if opts.Seq != 0 {
		s.NoteMoved(opts.Seq, addr)
	}
	sh.Flush()
}
