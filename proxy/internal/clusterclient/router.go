package clusterclient

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockproxy/lockproxy/proxy/internal/backend"
	"github.com/lockproxy/lockproxy/proxy/internal/clientid"
	"github.com/lockproxy/lockproxy/proxy/internal/cluster"
)

// Router is the proxy's view of a Redis Cluster: the slot map and the
// COMMAND table (cluster.Router), the shared connections to each master,
// and the clients by the id CLIENT ID gave them.
type Router struct {
	*cluster.Router
	cfg Config

	// The shared connections to each master (shared.go), by master and
	// access generation, all of them, and all the groups for the order
	// kept across them (Groups).
	shMu      sync.Mutex
	shared    map[groupKey]*backend.Group
	sharedAll atomic.Pointer[[]*backend.Mux]
	groups    atomic.Pointer[[]*backend.Group]
	// access counts the commands that may have changed who the masters
	// let in (CONFIG SET requirepass, ACL SETUSER ...): a generation of
	// shared connections serves the clients that connected during it
	// (see accessChanged). sessions counts each generation's clients;
	// under shMu.
	access   atomic.Uint64
	sessions map[uint64]int

	// next hands out the index of a client's shared connection at every
	// master.
	next atomic.Uint64
	// clientIDs are the clients by the id CLIENT ID gave them, for
	// CLIENT TRACKING ... REDIRECT (tracking.go), CLIENT UNBLOCK and CLIENT
	// KILL ID (unblock.go).
	clientIDs clientid.Registry[*Client]
	// txnLost is the reply of a command of a transaction whose
	// connection was lost (ErrTxnLost).
	txnLost []byte
}

// Config is what a Router needs of the proxy.
type Config struct {
	// Retry bounds the following of a command's redirections
	// (BackendConfig.ClusterRetry); DialTimeout, a dial and the setup of
	// a connection.
	Retry, DialTimeout time.Duration
	// SharedConnections is the number of shared connections to each
	// master; 0 sends every command on the clients' own.
	SharedConnections int
	// Unavailable counts the commands answered with an error because the
	// cluster could not be reached; Forwarded, the commands sent.
	Unavailable, Forwarded *atomic.Uint64
	// Readers counts the goroutines that follow redirections (with the
	// shared connections' readers).
	Readers *sync.WaitGroup
	// ErrorReply is the reply of a command the cluster could not take
	// for err.
	ErrorReply func(err error) []byte
	// NewGroup makes n shared connections to the master at addr.
	NewGroup func(addr string, n int) *backend.Group
	// Clients is the number of clients connected to the proxy.
	Clients func() int64
	// Mux is what the proxy's multiplexed connections share.
	Mux *backend.Env
}

// NewRouter returns the router of the cluster cr knows.
func NewRouter(cr *cluster.Router, cfg Config) *Router {
	return &Router{Router: cr, cfg: cfg, txnLost: cfg.ErrorReply(ErrTxnLost)}
}

// SharedList returns the shared connections to the masters.
func (r *Router) SharedList() []*backend.Mux {
	if l := r.sharedAll.Load(); l != nil {
		return *l
	}
	return nil
}

// Groups returns the masters' groups of shared connections.
func (r *Router) Groups() []*backend.Group {
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
func (r *Router) sharedConn(addr string, i, gen uint64) *backend.Mux {
	r.shMu.Lock()
	defer r.shMu.Unlock()
	if r.shared == nil {
		r.shared = map[groupKey]*backend.Group{}
	}
	k := groupKey{addr, gen}
	g := r.shared[k]
	if g == nil {
		g = r.cfg.NewGroup(addr, max(r.cfg.SharedConnections, 1))
		g.Forwarded = r.Counter(addr)
		r.shared[k] = g
		all := append(append([]*backend.Mux(nil), r.SharedList()...), g.List()...)
		r.sharedAll.Store(&all)
		groups := append(append([]*backend.Group(nil), r.Groups()...), g)
		r.groups.Store(&groups)
	}
	list := g.List()
	return list[i%uint64(len(list))]
}

// joined counts a new client in the current access generation, which it
// returns.
func (r *Router) joined() uint64 {
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
func (r *Router) left(gen uint64) {
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
func (r *Router) accessChanged() {
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
func (r *Router) retire(gen uint64) {
	var all []*backend.Mux
	var groups []*backend.Group
	for _, g := range r.Groups() {
		if r.shared[groupKey{g.Addr(), gen}] == g {
			delete(r.shared, groupKey{g.Addr(), gen})
			for _, sh := range g.List() {
				sh.Retire()
			}
			continue
		}
		groups = append(groups, g)
		all = append(all, g.List()...)
	}
	r.sharedAll.Store(&all)
	r.groups.Store(&groups)
}

// CloseShared closes the shared connections to the masters; their readers
// end.
func (r *Router) CloseShared() {
	for _, sh := range r.SharedList() {
		sh.Close()
	}
}
