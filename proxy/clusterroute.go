package proxy

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tidwall/redcon"

	"github.com/lockproxy/lockproxy/proxy/internal/cluster"
	"github.com/lockproxy/lockproxy/proxy/internal/resp"
)

// Cluster routing. Where each command of a client of a Redis Cluster
// (BackendConfig.Cluster) goes is decided by internal/cluster (the slot
// map, the plan of each command, the merges of the replies); the
// cluster*.go files here carry the parts it plans: route hands each call
// to the batching of shared.go and cluster.Order, on the masters' shared
// connections (clustershared.go) or the client's own (clustercall.go);
// clustertx.go ties a transaction or WATCH to its connection;
// clusterpubsub.go and clustermonitor.go serve the clients pinned to
// nodes (clusterkeyspace.go mirrors their keyspace notifications from
// every master); clusterhost.go is what a plan asks of the session, with
// the CLIENT state it keeps (clusterclient.go, clustertracking.go,
// clusterunblock.go); clusterscan.go fills SCAN's COUNT across the
// masters; clusterspare.go keeps each master's spare connections. A reply that
// redirects (MOVED, ASK) or says the slot is not served yet (TRYAGAIN,
// CLUSTERDOWN) is never the client's: the command is sent again where the
// cluster says, within BackendConfig.ClusterRetry.

var (
	replyMovedInTxn  = []byte("-TRYAGAIN the slot moved while the transaction was queued\r\n")
	cmdAsking        = []byte("*1\r\n$6\r\nASKING\r\n")
	errRetriesSpent  = errors.New("the cluster did not serve the slot in time")
	errClusterClosed = errors.New("connection closed")
)

// clusterSession is one client's part of the cluster: its connections and
// the connection state it set. Only the forwarder uses it, except close,
// own (also under mu) and replay.
type clusterSession struct {
	r *router
	s *session // the session it routes for

	mu     sync.Mutex          // guards own, monitors and closed against close
	own    map[string]*muxConn // the client's own connection to each master (clustercall.go)
	closed bool
	// monitors are the MONITOR connections, one per master, while the
	// client monitors (clustermonitor.go).
	monitors []*backendConn
	monWG    sync.WaitGroup // their readers
	// monitorOn: the client is in MONITOR mode; the forwarder's own.
	monitorOn bool

	// redirs are the redirections waiting to be followed, in the order
	// they came (session.redirect); the first is being followed.
	redirMu sync.Mutex
	redirs  []redirect

	// blocking: a command that may block was sent; what follows waits
	// for its reply (session.handle).
	blocking bool
	// quit: the client sent QUIT; the commands after it are not run, as
	// Redis closes the connection after it.
	quit bool

	// The place of every reply the client is owed, the shared
	// connections used so far, and the index of the client's connection
	// at every master.
	order       cluster.Order
	sharedConns []*muxConn // one per master, found by its addr
	sharedIdx   uint64
	access      uint64 // the access generation of its shared connections
	// sharedUsed, ownUsed: replies may be owed on the shared connections,
	// on the client's own (see session.settleCluster).
	sharedUsed, ownUsed bool
	// The state the client set, sent to every new connection: the
	// forwarder's, and state, the copy its connections are dialled with
	// (stateChanged).
	st    clientState
	state atomic.Pointer[replayState]

	// pinAddr is the node of the client's pub/sub connection (session.be;
	// clusterpubsub.go); mirrors, its keyspace subscriptions on the
	// other masters (clusterkeyspace.go).
	pinAddr string
	mirrors mirrors

	// trk is the client's CLIENT TRACKING (clustertracking.go), nil when
	// it does not track; ids, under mu, the ids CLIENT ID gave it;
	// proto3, that it speaks RESP3 (st, for the sinks' readers).
	trk atomic.Pointer[tracking]
	// sinks are its connections to the masters while it is a REDIRECT
	// target (clustertracking.go).
	sinks sinks
	// caching: a CLIENT CACHING went to every master's connection, and
	// the command after it to some (clustertracking.go).
	caching bool
	ids     []int64
	proto3  atomic.Bool
	// listen: the masters push on the client's own connections (tracking
	// without REDIRECT), whose readers then read while no reply is owed
	// (muxConn.stopIdle) and give the pushes in place (ownPush).
	listen atomic.Bool

	// clusterClient is where the client's commands are routed: its
	// transaction, WATCH, and the master of its last command with keys.
	cluster.Client
}

func newClusterSession(r *router, s *session) *clusterSession {
	// The map is made on first use: most clients use only the shared
	// connections, and an idle one nothing.
	cs := &clusterSession{r: r, s: s}
	cs.Router = r.Router
	cs.order.Init()
	cs.sharedIdx = r.p.nextShared.Add(1)
	cs.access = r.joined()
	return cs
}

// replay returns the connection state the client's own connections are
// dialled in. It is safe for concurrent use.
func (cs *clusterSession) replay() replayState {
	if st := cs.state.Load(); st != nil {
		return *st
	}
	return replayState{}
}

// stateChanged makes the state the client set the one its connections
// are dialled in from now on.
func (cs *clusterSession) stateChanged() {
	st := cs.st.replay
	cs.state.Store(&st)
	cs.proto3.Store(cs.st.resp3())
}

// close closes every connection; it runs when the client has gone.
func (cs *clusterSession) close() {
	cs.r.left(cs.access)
	cs.closeMirrors()
	cs.stopTracking()
	cs.forgetIDs()
	cs.closeSinks()
	cs.mu.Lock()
	cs.closed = true
	cs.stopMonitor()
	own := cs.own
	cs.own = nil
	cs.mu.Unlock()
	for _, sh := range own {
		sh.retire()
	}
	cs.order.Close()
}

// dropAll closes the client's own connections (after RESET, whose state
// is gone); the replies owed on them have been written.
func (cs *clusterSession) dropAll() {
	cs.endMonitor()
	cs.mu.Lock()
	own := cs.own
	cs.own = nil
	cs.mu.Unlock()
	for _, sh := range own {
		sh.retire()
	}
}

// route sends cmd where the slot map says, or gives it the proxy's own
// reply in its place when the cluster cannot take it.
func (s *session) route(name []byte, cmd redcon.Command) {
	cs := s.cl
	if cs.blocking {
		// Held back behind a command that may block (see handle).
		s.settleCluster()
	}
	if resp.Lookup(name).Has(resp.Blocking) {
		cs.blocking = true
	}
	state := setsState(name, cmd.Args)
	if state {
		// It goes on every connection the client has, and every one
		// opened after it replays it: what came before it must have
		// opened its connections, and what follows must open them
		// knowing whether it succeeded.
		s.settleCluster()
	}
	if unmute := s.muteReplies(name, cmd.Args); unmute != nil {
		defer unmute()
	}
	txn, watch := cs.Txn, cs.Watch
	c := cs.Plan(s, name, cmd)
	s.tagTx(&c, name, txn, watch)
	if s.sharesCluster(name, cmd.Args, &c) && s.routeShared(name, cmd, &c) {
		return
	}
	s.sendCall(&c)
	if cs.caching && !isCaching(name, cmd.Args) {
		s.endCaching(&c) // clustertracking.go
	}
	if state {
		s.settleCluster()
	}
}

// forward is the cluster's upstream.forward: a command goes to the
// client's pub/sub connection when it is pinned (clusterpubsub.go), and
// is routed by its keys otherwise.
func (cs *clusterSession) forward(name []byte, cmd redcon.Command) (localItem, bool, bool) {
	s := cs.s
	if string(name) == "quit" {
		cs.quit = true // nothing after it is run (session.forward)
		// No client can redirect its invalidations here any more: a
		// tracker's next one gets tracking-redir-broken, as from Redis
		// once it has read QUIT, not only once the connection has gone.
		cs.forgetIDs()
		cs.closeSinks()
		return localItem{reply: replyOK, quit: true, silent: s.silent()}, false, false
	}
	if s.be != nil || resp.Lookup(name).Has(resp.Subscribes) {
		// The pub/sub connection's replies must not pass the others.
		s.settleCluster()
	}
	reply, pinned := s.clusterPubsub(name, cmd)
	switch {
	case reply != nil:
		return localItem{reply: reply}, false, false
	case !pinned:
		s.route(name, cmd)
		return localItem{}, true, false
	}
	// To the client's pub/sub connection, as to one Redis, after the
	// replies of the commands routed before it.
	s.settleCluster()
	return localItem{}, false, true
}

// dial is the cluster's upstream.dial: the client's pub/sub connection,
// to the node it is pinned to.
func (cs *clusterSession) dial(st replayState) (*backendConn, error) {
	s := cs.s
	be, err := s.p.dialAddr(s.ctx, cs.pinAddr, st)
	if err != nil {
		// The node may have failed: the next subscription asks the
		// cluster again.
		cs.r.Reload(s.ctx, cs.r.Gen.Load())
	}
	return be, err
}

// setsState reports whether a command sets connection state that every
// connection of a cluster client carries (see cluster.Client.everywhere).
func setsState(name []byte, args [][]byte) bool {
	return resp.Of(name, args).Has(resp.EveryConn)
}

// again waits a little, reads the slot map again and routes p by its slot
// once more; it reports false when it is too late to try again.
func (s *session) again(p *cluster.Part, deadline time.Time) bool {
	if p.Slot == cluster.NoSlot || s.ctx.Err() != nil || time.Now().After(deadline) {
		return false
	}
	t := time.NewTimer(50 * time.Millisecond)
	select {
	case <-t.C:
	case <-s.ctx.Done():
		t.Stop()
		return false
	}
	r := s.cl.r
	r.Reload(s.ctx, r.Gen.Load())
	if m := r.Slots.Load(); m != nil {
		if a := m.Master(p.Slot); a != "" {
			p.Addr = a
		}
	}
	return true
}
