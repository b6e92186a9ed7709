package clusterclient

import (
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tidwall/redcon"

	"github.com/lockproxy/lockproxy/proxy/internal/backend"
	"github.com/lockproxy/lockproxy/proxy/internal/clientid"
	"github.com/lockproxy/lockproxy/proxy/internal/cluster"
	"github.com/lockproxy/lockproxy/proxy/internal/resp"
)

var (
	replyMovedInTxn   = []byte("-TRYAGAIN the slot moved while the transaction was queued\r\n")
	replyNestedMulti  = []byte("-ERR MULTI calls can not be nested\r\n")
	replyWatchInMulti = []byte("-ERR WATCH inside MULTI is not allowed\r\n")
	replyNull2        = []byte("*-1\r\n")
	replyNull3        = []byte("_\r\n")
	cmdAsking         = []byte("*1\r\n$6\r\nASKING\r\n")
	errRetriesSpent   = errors.New("the cluster did not serve the slot in time")
)

// ErrTxnLost is why a command of a transaction whose backend connection
// was lost is refused: what the backend had queued is gone, so the
// transaction fails as a whole.
var ErrTxnLost = errors.New("connection lost inside MULTI, EXEC will abort")

// Client is one client's part of the cluster: its connections and the
// state of its routing. Only the forwarder uses it, except Close, own
// (also under mu) and what the connections' readers call.
type Client struct {
	r   *Router
	h   Host            // the session it routes for
	ctx context.Context // the session's
	w   io.Writer       // the client's sink, h.Sink()

	mu     sync.Mutex              // guards own, monitors and closed against close
	own    map[string]*backend.Mux // the client's own connection to each master (call.go)
	closed bool
	// monitors are the MONITOR connections, one per master, while the
	// client monitors (monitor.go).
	monitors []*backend.Conn
	monWG    sync.WaitGroup // their readers
	// monitorOn: the client is in MONITOR mode; the forwarder's own.
	monitorOn bool

	// redirs are the redirections waiting to be followed, in the order
	// they came (redirect); the first is being followed.
	redirMu sync.Mutex
	redirs  []redirect

	// blocking: a command that may block was sent; what follows waits
	// for its reply (Blocking).
	blocking bool
	// quit: the client sent QUIT; the commands after it are not run, as
	// Redis closes the connection after it.
	quit bool

	// The place of every reply the client is owed, the shared
	// connections used so far, and the index of the client's connection
	// at every master.
	order       cluster.Order
	sharedConns []*backend.Mux // one per master, found by its addr
	sharedIdx   uint64
	access      uint64 // the access generation of its shared connections
	// sharedUsed, ownUsed: replies may be owed on the shared connections,
	// on the client's own (see Settle).
	sharedUsed, ownUsed bool
	// dirty are the connections the client sent to since the last flush
	// (FlushDirty).
	dirty []*backend.Mux

	// pinAddr is the node of the client's pub/sub connection (the
	// session's connection of one; PinTo); mirrors, its keyspace
	// subscriptions on the other masters (keyspace.go).
	pinAddr string
	mirrors mirrors

	// trk is the client's CLIENT TRACKING (tracking.go), nil when it does
	// not track; ids, the ids CLIENT ID gave it (Router.clientIDs).
	trk atomic.Pointer[tracking]
	// sinks are its connections to the masters while it is a REDIRECT
	// target (tracking.go).
	sinks sinks
	// caching: a CLIENT CACHING went to every master's connection, and
	// the command after it to some (tracking.go).
	caching bool
	ids     clientid.Held[*Client]
	// listen: the masters push on the client's own connections (tracking
	// without REDIRECT), whose readers then read while no reply is owed
	// (backend.Pusher) and give the pushes in place (Push).
	listen atomic.Bool

	// Client is where the client's commands are routed: its
	// transaction, WATCH, and the master of its last command with keys.
	cluster.Client
}

// New returns the cluster client of the session h, whose context is ctx.
func New(ctx context.Context, r *Router, h Host) *Client {
	// The map is made on first use: most clients use only the shared
	// connections, and an idle one nothing.
	c := &Client{r: r, h: h, ctx: ctx, w: h.Sink()}
	c.Router = r.Router
	c.order.Init()
	c.sharedIdx = r.next.Add(1)
	c.access = r.joined()
	return c
}

// Close closes every connection; it runs when the client has gone.
func (s *Client) Close() {
	s.r.left(s.access)
	s.CloseMirrors()
	s.stopTracking()
	s.r.clientIDs.Forget(&s.ids)
	s.closeSinks()
	s.mu.Lock()
	s.closed = true
	s.stopMonitor()
	own := s.own
	s.own = nil
	s.mu.Unlock()
	for _, sh := range own {
		sh.Retire()
	}
	s.order.Close()
}

// DropAll closes the client's own connections (after RESET, or when the
// state they were dialled in changed); the replies owed on them have
// been written.
func (s *Client) DropAll() {
	s.endMonitor()
	s.mu.Lock()
	own := s.own
	s.own = nil
	s.mu.Unlock()
	for _, sh := range own {
		sh.Retire()
	}
}

// Route sends cmd where the slot map says, or gives it the proxy's own
// reply in its place when the cluster cannot take it.
func (s *Client) Route(name []byte, cmd redcon.Command) {
	if s.blocking {
		// Held back behind a command that may block (see Blocking).
		s.Settle()
	}
	if resp.Lookup(name).Has(resp.Blocking) {
		s.blocking = true
	}
	state := SetsState(name, cmd.Args)
	if state {
		// It goes on every connection the client has, and every one
		// opened after it replays it: what came before it must have
		// opened its connections, and what follows must open them
		// knowing whether it succeeded.
		s.Settle()
	}
	if unmute := s.muteReplies(name, cmd.Args); unmute != nil {
		defer unmute()
	}
	txn, watch := s.Txn, s.Watch
	c := s.Plan(s, name, cmd)
	s.tagTx(&c, name, txn, watch)
	if s.sharesCluster(name, cmd.Args, &c) && s.routeShared(name, cmd, &c) {
		return
	}
	s.sendCall(&c)
	if s.caching && !isCaching(name, cmd.Args) {
		s.endCaching(&c) // tracking.go
	}
	if state {
		s.Settle()
	}
}

// Quit records the client's QUIT: the commands after it are not run, as
// Redis closes the connection after it; Quitting reports it.
func (s *Client) Quit() {
	s.quit = true
	// No client can redirect its invalidations here any more: a
	// tracker's next one gets tracking-redir-broken, as from Redis once
	// it has read QUIT, not only once the connection has gone.
	s.r.clientIDs.Forget(&s.ids)
	s.closeSinks()
}
func (s *Client) Quitting() bool { return s.quit }

// Blocking reports whether a command that may block was sent: what
// follows waits for its reply, on a goroutine of the session's.
func (s *Client) Blocking() bool { return s.blocking }

// PinTo makes addr the node of the client's pub/sub connection; PinAddr
// returns it.
func (s *Client) PinTo(addr string) { s.pinAddr = addr }
func (s *Client) PinAddr() string   { return s.pinAddr }

// Order is the order of the client's replies.
func (s *Client) Order() *cluster.Order { return &s.order }

// setsState reports whether a command sets connection state that every
// connection of a cluster client carries (see cluster.Client.everywhere).
func SetsState(name []byte, args [][]byte) bool {
	return resp.Of(name, args).Has(resp.EveryConn)
}

// again waits a little, reads the slot map again and routes p by its slot
// once more; it reports false when it is too late to try again.
func (s *Client) again(p *cluster.Part, deadline time.Time) bool {
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
	r := s.r
	r.Reload(s.ctx, r.Gen.Load())
	if m := r.Slots.Load(); m != nil {
		if a := m.Master(p.Slot); a != "" {
			p.Addr = a
		}
	}
	return true
}
