package clusterclient

import (
	"bytes"
	"context"
	"math/rand/v2"
	"time"

	"github.com/lockproxy/lockproxy/proxy/internal/backend"
	"github.com/lockproxy/lockproxy/proxy/internal/cluster"
)

// Sending a cluster client's calls on its own connections. A client of a
// Redis Cluster has, besides the masters' shared connections
// (shared.go), a connection of its own to each master it sends a
// command to that cannot share one (in a transaction, after AUTH, a
// blocking command, a command split per slot, ...). Each is a backend.Mux
// (NewOwn) with one client: a group of one, dialled in the client's
// connection state, its commands batched by backend.Mux and its replies
// read by its reader into the client's cluster.Order, as on the shared
// connections. So the forwarder never reads a backend connection: it
// takes a ticket per reply and goes on. Unlike a shared connection's,
// the reader of one of the client's own runs only while replies are owed
// on it (backend.Mux, NewOwn): an idle client keeps a connection per master it
// used, but no goroutine or buffer to read it, and a connection the node
// closed meanwhile is found when the next command is about to go on it
// (backend.Mux.Ready).
//
// A call whose reply is made from several parts (a command split per
// slot, a fan-out to every master, SCAN's cursor, the proxy's own joins)
// takes one ticket for the client's reply and one per part, whose reply
// is gathered rather than written; the last part to come makes the
// client's reply (gather.transform, call.result) in the call's place, and
// runs the call's learn. Only the calls that send more commands to make
// their reply (RANDOMKEY, SORT with BY or GET patterns) are completed by
// the forwarder, which waits for them (ask); and, as for one Redis, the
// forwarder waits for the reply of a command that sets connection state
// (AUTH, HELLO, CLIENT SETNAME) or may block before it goes on.
//
// A redirection on a client's own connection is followed there too
// (redirectShared), on its own connection to the node named,
// except inside a transaction, where the command's reply becomes
// replyMovedInTxn. A lost connection answers what was pending on it with
// replyConnLost (backend.Mux's reader); the next command dials again, in the
// client's state, and tx.go keeps a transaction or WATCH tied to
// the connection it went on.
//
// Within one client, its commands on the shared connections and on its
// own ones go to different connections of the same masters: before one
// goes on the other kind, the replies owed on the first kind are waited
// for (Settle), as a blocking command's reply is before the next
// command leaves, and a command routed by no slot (cluster.Client.keyless) waits
// for them too: a redirection among them may send one to where it goes.

// ownConn returns the client's own connection to addr, made on first use.
func (s *Client) ownConn(addr string) *backend.Mux {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sh := s.own[addr]; sh != nil {
		return sh
	}
	ctx := s.ctx
	sh := backend.NewOwn(s.r.cfg.Mux, addr, func() (*backend.Conn, error) { return s.dialOwn(ctx, addr) }, s)
	sh.Group().Forwarded = s.r.Counter(addr)
	if s.closed {
		sh.Retire()
	}
	if s.own == nil {
		s.own = map[string]*backend.Mux{}
	}
	s.own[addr] = sh
	return sh
}

// dialOwn dials the client's own connection to addr, in its connection
// state: a failure is the client's, and it retries as the cluster says
// (again), not after a backoff.
func (s *Client) dialOwn(ctx context.Context, addr string) (*backend.Conn, error) {
	be, err := s.h.Dial(ctx, addr, AsOwn)
	if cmd := s.trackingFor(addr); err == nil && cmd != nil {
		// Tracking on again (tracking.go).
		ctx, cancel := context.WithTimeout(ctx, s.r.cfg.DialTimeout)
		if err = be.Setup(ctx, [][]byte{cmd}); err != nil {
			be.NC.Close()
		}
		cancel()
	}
	if err != nil {
		return nil, err
	}
	return be, nil
}

// ownAddrs returns the masters the client has a connection of its own to.
func (s *Client) ownAddrs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	addrs := make([]string, 0, len(s.own))
	for a := range s.own {
		addrs = append(addrs, a)
	}
	return addrs
}

// sendCall sends c's parts on the client's own connections and takes the
// place of its reply in the client's order.
func (s *Client) sendCall(c *cluster.Call) {
	if c.Kind == cluster.CallLocal {
		if c.Reply != nil {
			s.place(c.Reply, cluster.TicketOpts{})
		}
		return
	}
	if s.sharedUsed {
		s.Settle() // the replies on the shared connections come first
	}
	deadline := time.Now().Add(s.r.cfg.Retry)
	switch {
	case c.Kind == cluster.CallScan:
		s.scanAll(c) // scan.go
		return
	case c.Kind == cluster.CallRandom:
		s.randomKey(c)
		return
	case (c.Kind == cluster.CallPlain || c.Kind == cluster.CallSkip) && c.Learn == nil:
		opts := cluster.TicketOpts{Own: true, Stay: inTxn(&c.One), Seq: c.Seq}
		if c.Kind == cluster.CallSkip {
			opts.Replace = c.Reply
		}
		s.sendPart(&c.One, opts, deadline)
		return
	}
	s.sendParts(c, deadline)
}

// sendParts sends the parts of a call whose reply is made from theirs.
func (s *Client) sendParts(src *cluster.Call, deadline time.Time) {
	// A copy of its own: the readers make its reply after the forwarder
	// has moved on, and src stays on the caller's stack.
	c := new(cluster.Call)
	*c = *src
	g := cluster.NewGather(c.Count())
	ticket := s.order.Add(nil, cluster.NoSlot, cluster.TicketOpts{})
	if !c.Alone {
		g.Ticket, g.Transform = ticket, c.Result
	}
	for i := range c.Count() {
		p := c.Part(i)
		s.sendPart(p, cluster.TicketOpts{Own: true, Stay: inTxn(p), G: g, Part: i}, deadline)
	}
	if !c.Alone {
		return
	}
	// Making its reply sends more (SORT's patterns): the forwarder makes
	// it before it goes on.
	s.FlushDirty()
	select {
	case <-g.Done:
	case <-s.ctx.Done():
		return // the client has gone
	}
	reply, _ := c.Result(g.Replies)
	s.order.Put(ticket, false, reply, s.w)
	s.h.PushOut()
}

// inTxn reports whether p is a command of a transaction, where a
// redirection cannot be followed.
func inTxn(p *cluster.Part) bool { return p.Tx != nil && p.Tx.Txn != nil }

// sendPart queues p on the client's own connection to its master, its
// reply taking a ticket with opts. When the master cannot be reached, it
// waits for the cluster to name another one, until deadline; then, or
// when p's transaction must not go on that connection (txConn), the ticket
// gets the proxy's own reply.
func (s *Client) sendPart(p *cluster.Part, opts cluster.TicketOpts, deadline time.Time) {
	for {
		sh := s.ownConn(p.Addr)
		be, err := sh.Ready()
		if err != nil {
			if backend.Refused(err) || !s.again(p, deadline) {
				p.Err = err
				if p.Tx != nil {
					s.txUnsent(p)
				}
				s.unsent(p, opts)
				return
			}
			continue
		}
		if p.Tx != nil && !s.txConn(p, be) {
			s.unsent(p, opts)
			return
		}
		if p.Tx != nil && p.Tx.Reply != nil {
			opts.Replace = p.Tx.Reply // sent as DISCARD (txConn)
		}
		t := s.order.Add(p.Raw, p.Slot, opts)
		if !sh.QueueOn(be, s.h, t, p.Raw) {
			s.order.Drop(t) // lost meanwhile: ready dials again
			continue
		}
		s.markShared(sh)
		s.ownUsed = true
		s.r.cfg.Forwarded.Add(1)
		sh.Group().Forwarded.Add(1)
		return
	}
}

// unsent gives p, which was not sent, its reply: the one its transaction
// gives (txConn), or the error that kept it from its master.
func (s *Client) unsent(p *cluster.Part, opts cluster.TicketOpts) {
	var reply []byte
	switch {
	case opts.G != nil:
		reply = s.r.cfg.ErrorReply(p.Err)
	case p.Tx != nil && p.Tx.Reply != nil:
		reply = p.Tx.Reply
	default:
		err := p.Err
		if err == nil {
			err = errRetriesSpent
		}
		s.r.cfg.Unavailable.Add(1)
		reply = s.r.cfg.ErrorReply(err)
	}
	opts.Replace = nil
	s.place(reply, opts)
}

// place takes a ticket with opts and puts reply, the proxy's own, in it.
func (s *Client) place(reply []byte, opts cluster.TicketOpts) {
	o := &s.order
	o.Put(o.Add(nil, cluster.NoSlot, opts), false, reply, s.w)
	s.h.MarkOut() // a client whose replies are not pushed writes them in flush
	s.h.PushOut()
}

// Settle sends what the client queued and waits until every reply it is
// owed has been written to it: what the forwarder sends next (on another
// kind of connection, after a blocking command, or to its pub/sub
// connection) must not pass them.
func (s *Client) Settle() {
	s.h.FlushShared()
	if s.sharedUsed {
		s.h.WaitShared()
	}
	s.order.Wait()
	s.h.Drain()
	s.sharedUsed, s.ownUsed, s.blocking = false, false, false
}

// ask sends parts on the client's own connections and returns their
// replies, or nil when the client has gone. The forwarder waits for them:
// RANDOMKEY and SORT's patterns decide what to send next from them.
func (s *Client) ask(parts []cluster.Part) [][]byte {
	g := cluster.NewGather(len(parts))
	deadline := time.Now().Add(s.r.cfg.Retry)
	for i := range parts {
		s.sendPart(&parts[i], cluster.TicketOpts{Own: true, G: g, Part: i}, deadline)
	}
	s.FlushDirty()
	select {
	case <-g.Done:
		return g.Replies
	case <-s.ctx.Done():
		return nil
	}
}

// randomKey asks the masters in a random order until one has a key.
func (s *Client) randomKey(c *cluster.Call) {
	ticket := s.order.Add(nil, cluster.NoSlot, cluster.TicketOpts{})
	answer := func(b []byte) {
		s.order.Put(ticket, false, b, s.w)
		s.h.PushOut()
	}
	m, err := s.r.Current(s.ctx)
	if err != nil {
		s.r.cfg.Unavailable.Add(1)
		answer(s.r.cfg.ErrorReply(err))
		return
	}
	var last []byte
	for _, i := range rand.Perm(len(m.Masters)) {
		r := s.ask([]cluster.Part{{Slot: m.First[i], Addr: m.Masters[i], Raw: c.One.Raw}})
		if r == nil {
			return // the client has gone
		}
		if b := r[0]; !bytes.Equal(b, []byte("$-1\r\n")) && !bytes.Equal(b, []byte("_\r\n")) {
			answer(b)
			return
		}
		last = r[0]
	}
	answer(last)
}
