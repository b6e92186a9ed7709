package proxy

import (
	"bufio"
	"bytes"
	"context"
	"sync"
	"sync/atomic"

	"github.com/tidwall/redcon"

	"github.com/lockproxy/lockproxy/proxy/internal/backend"
	"github.com/lockproxy/lockproxy/proxy/internal/cluster"
	"github.com/lockproxy/lockproxy/proxy/internal/clusterclient"
	"github.com/lockproxy/lockproxy/proxy/internal/resp"
)

// The session's side of a Redis Cluster. Routing is internal/clusterclient's
// (a Client per session, s.cl); the session is its Host: it keeps the
// client's socket, the order of what it is owed, and the connection
// state the client set (clusterState), which its pub/sub connection
// (clusterpubsub.go) shares; it dials the client's connections in that
// state, a master's own from its spares (clusterspare.go).

// router is the proxy's view of a Redis Cluster (clusterclient.Router),
// with each master's spare connections.
type router struct {
	*clusterclient.Router
	p *Proxy

	// spares are each master's spare connections (clusterspare.go),
	// under spMu; spClosed, that the proxy shut them down.
	spMu     sync.Mutex
	spares   map[string]*backend.Spares
	spClosed bool
}

func newRouter(p *Proxy) *router {
	b := &p.cfg.Backend
	r := &router{p: p}
	cr := cluster.NewRouter(cluster.RouterConfig{
		Seeds:   b.Cluster,
		Timeout: b.DialTimeout,
		TLS:     b.TLS != nil,
		Options: b.controlOptions,
		Masters: r.keepSpares, // clusterspare.go
	})
	r.Router = clusterclient.NewRouter(cr, clusterclient.Config{
		Retry:             b.ClusterRetry,
		DialTimeout:       b.DialTimeout,
		SharedConnections: b.SharedConnections,
		Unavailable:       &p.m.unavailable,
		Forwarded:         &p.m.forwarded,
		Readers:           &p.sharedWG,
		ErrorReply:        func(err error) []byte { return resp.ErrorReply(&BackendError{Err: err}) },
		NewGroup:          func(addr string, n int) *backend.Group { return p.newMuxGroup(addr, n, nil) },
		Clients:           p.clients.Load,
		Mux:               &p.mux,
	})
	return r
}

// ready reads the slot map and checks that every master answers PING.
func (r *router) ready(ctx context.Context) error {
	if err := r.Router.Ready(ctx); err != nil {
		return &BackendError{Err: err}
	}
	return nil
}

// clusterState is the connection state a cluster client set, which every
// connection of its own replays: the forwarder's (st), and the copy its
// connections are dialled with and the readers read (stateChanged).
type clusterState struct {
	st     clientState
	state  atomic.Pointer[replayState]
	proto3 atomic.Bool
}

// replay returns the connection state the client's own connections are
// dialled in. It is safe for concurrent use.
func (c *clusterState) replay() replayState {
	if st := c.state.Load(); st != nil {
		return *st
	}
	return replayState{}
}

// stateChanged makes the state the client set the one its connections
// are dialled in from now on.
func (c *clusterState) stateChanged() {
	st := c.st.replay
	c.state.Store(&st)
	c.proto3.Store(c.st.resp3())
}

// clusterUp is the upstream of a cluster client: its commands are routed
// by the slot map (s.cl), or go to its pub/sub connection.
type clusterUp struct{ s *session }

// forward is the cluster's upstream.forward: a command goes to the
// client's pub/sub connection when it is pinned (clusterpubsub.go), and
// is routed by its keys otherwise.
func (u clusterUp) forward(name []byte, cmd redcon.Command) (localItem, bool, bool) {
	s := u.s
	if string(name) == "quit" {
		s.cl.Quit() // nothing after it is run (session.forward)
		return localItem{reply: replyOK, quit: true, silent: s.silent()}, false, false
	}
	if s.be != nil || resp.Lookup(name).Has(resp.Subscribes) {
		// The pub/sub connection's replies must not pass the others.
		s.cl.Settle()
	}
	reply, pinned := s.clusterPubsub(name, cmd)
	switch {
	case reply != nil:
		return localItem{reply: reply}, false, false
	case !pinned:
		s.cl.Route(name, cmd)
		return localItem{}, true, false
	}
	// To the client's pub/sub connection, as to one Redis, after the
	// replies of the commands routed before it.
	s.cl.Settle()
	return localItem{}, false, true
}

// dial is the cluster's upstream.dial: the client's pub/sub connection,
// to the node it is pinned to.
func (u clusterUp) dial(st replayState) (*backendConn, error) {
	s := u.s
	be, err := s.p.dialAddr(s.ctx, s.cl.PinAddr(), st)
	if err != nil {
		// The node may have failed: the next subscription asks the
		// cluster again.
		r := s.p.router
		r.Reload(s.ctx, r.Gen.Load())
	}
	return be, err
}

// The session is its cluster client's Host (clusterclient.Host).

var _ clusterclient.Host = (*session)(nil)

// Ordered reports whether the client's replies take tickets in its
// cluster.Order: a cluster client's.
func (s *session) Ordered() bool { return s.cl != nil }

func (s *session) OrderedReply(r *bufio.Reader, ticket uint64, w *bufio.Writer, sink *backend.Sink, ri *resp.ReplyInfo, own string) (bool, error) {
	return s.cl.OrderedReply(r, ticket, w, sink, ri, own)
}

func (s *session) Drained() bool { return s.cl.Drained() }

// Answer gives the client reply, an error of the proxy's own, for the
// command with ticket on a shared connection, or on one of a cluster
// client's own when own is set (whose replies its replyQueue does not
// count).
func (s *session) Answer(ticket uint64, reply []byte, own bool) {
	if s.cl != nil {
		s.cl.Order().Put(ticket, false, reply, &s.w)
	} else {
		s.w.Write(reply)
	}
	if !own {
		s.Replied(&resp.ReplyInfo{Type: '-'})
	}
	s.PushOut()
}

func (s *session) Go(f func()) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer s.Recover()
		f()
	}()
}

func (s *session) LockOutput() *bufio.Writer { return s.w.lockOutput() }
func (s *session) Unlock()                   { s.w.unlock() }
func (s *session) Write(reply []byte)        { s.w.write(reply) }
func (s *session) Drain()                    { s.w.drain() }

func (s *session) MarkOut() { s.sharedOut = true }

func (s *session) FlushShared() {
	if s.sharedOut {
		s.flushShared()
	}
}

func (s *session) WaitShared() { s.q.waitEmpty() }

func (s *session) Sending(name []byte, cmd redcon.Command) { s.queuing = classify(name, cmd) }

func (s *session) Pinned() bool { return s.be != nil }

func (s *session) PubSub() (subscribed, resp3 bool) { return s.q.pubsub() }

func (s *session) Resp3() bool          { return s.cst.st.resp3() }
func (s *session) Proto3() bool         { return s.cst.proto3.Load() }
func (s *session) ReplaysNothing() bool { return s.cst.st.replay.empty() }

func (s *session) Learned(kind string, raw []byte, proto int64) {
	k := entryAuth
	switch kind {
	case "hello":
		k = entryHello
	case "setname", "no-evict", "no-touch":
		k = replayedClient([]byte(kind))
	}
	s.cst.st.learn(k, raw, proto)
	s.cst.stateChanged()
}

func (s *session) ForgetState() {
	s.cst.st = clientState{}
	s.cst.stateChanged()
}

func (s *session) Silent() bool {
	silent, _ := s.q.silent()
	return silent
}

// ClientReply applies CLIENT REPLY ON, OFF or SKIP to the client's reply
// mode, as Redis does: ON answers +OK, OFF and SKIP are not answered. A
// malformed one goes to a master, whose error is the client's. CLIENT
// REPLY is applied by the proxy itself, which holds back the replies the
// client turned off (cluster.Order.Mute): the masters answer every
// command the proxy sends them, and pushes (pub/sub messages,
// invalidations) are not replies, which CLIENT REPLY leaves alone.
func (s *session) ClientReply(args [][]byte) (cluster.Call, bool) {
	if len(args) != 3 {
		return cluster.Call{}, false
	}
	e := entry{kind: entryReplyMode}
	switch {
	case bytes.EqualFold(args[2], []byte("on")):
		e.mode = replyOn
	case bytes.EqualFold(args[2], []byte("off")):
		e.mode = replyOff
	case bytes.EqualFold(args[2], []byte("skip")):
		e.mode = replySkip
	default:
		return cluster.Call{}, false
	}
	if s.q.silentFor(&e) {
		return cluster.Call{Kind: cluster.CallLocal}, true // no reply
	}
	return cluster.LocalCall(replyOK), true
}

// replayedClient returns the entry kind of a CLIENT subcommand that sets
// replayed connection state, or entryPlain.
func replayedClient(sub []byte) entryKind {
	switch {
	case bytes.EqualFold(sub, []byte("setname")):
		return entrySetName
	case bytes.EqualFold(sub, []byte("no-evict")):
		return entryNoEvict
	case bytes.EqualFold(sub, []byte("no-touch")):
		return entryNoTouch
	}
	return entryPlain
}

// Dial dials a connection of the client's to the master at addr.
func (s *session) Dial(ctx context.Context, addr string, as clusterclient.DialAs) (*backendConn, error) {
	switch as {
	case clusterclient.AsOwn:
		return s.p.router.dedicated(ctx, addr, s.cst.replay())
	case clusterclient.AsUser:
		return s.p.dialAddr(ctx, addr, replayState{auth: s.cst.replay().auth})
	case clusterclient.AsPinned:
		return s.p.dialAddr(ctx, addr, s.q.client().replay)
	}
	return s.p.dialAddr(ctx, addr, s.cst.st.replay)
}
