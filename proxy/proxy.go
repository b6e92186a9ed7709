package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tidwall/redcon"
	"go.uber.org/zap"

	"github.com/lockproxy/lockproxy/proxy/internal/acl"
	"github.com/lockproxy/lockproxy/proxy/internal/backend"
	"github.com/lockproxy/lockproxy/proxy/internal/clientid"
	"github.com/lockproxy/lockproxy/proxy/internal/guard"
	"github.com/lockproxy/lockproxy/proxy/internal/rawio"
	"github.com/lockproxy/lockproxy/proxy/internal/resp"
	"github.com/lockproxy/lockproxy/proxy/internal/sentinel"
)

// Local answers the proxy's own commands on one client connection. Serve
// appends exactly one RESP reply to dst; resp3 selects RESP3 encodings. ctx
// ends when the client disconnects or the proxy shuts down. Serve is never
// called concurrently for one Local. Close ends the connection's state and
// waits for whatever it started.
type Local interface {
	Serve(ctx context.Context, dst []byte, args [][]byte, resp3 bool) []byte
	Close()
}

// ClientLocal is a Local that wants to know its client (LOCKINFO shows
// who holds a lock): before a command, when the Local is new or the
// client's name changed since, the proxy calls SetClient with the name
// (CLIENT SETNAME or HELLO ... SETNAME, "" for none) and the client's
// address.
type ClientLocal interface {
	Local
	SetClient(name, addr string)
}

// Config configures a Proxy. Start from DefaultConfig, which holds every
// default, and change what you need; New rejects a Config that fails
// Validate, the one place of its rules.
type Config struct {
	// Backend is the Redis every ordinary command is forwarded to.
	Backend BackendConfig
	// Limits bound the clients; SetLimits changes them while running.
	Limits
	// CommandTimeout bounds one of the proxy's own commands: it ends
	// after at least CommandTimeout and at most a 64th more (see
	// session.commandContext). Default 2m.
	CommandTimeout time.Duration
	// IsLocal reports whether a command name (any case) is one the proxy
	// answers itself; NewLocal makes the per-connection state that answers
	// them. Both nil: everything is forwarded.
	IsLocal  func(name []byte) bool
	NewLocal func() Local
	// MayWait reports whether a local command may take longer than its
	// round trips to the lock nodes (a LOCK with WAIT). Such a command is
	// answered on a goroutine of its own, so that the client's hanging up
	// is seen while it waits; the others are answered on the client's own
	// goroutine when no reply is due before theirs. Nil: every local
	// command may wait.
	MayWait func(args [][]byte) bool
	// Users, when not empty, makes the proxy require authentication:
	// it answers AUTH (and HELLO ... AUTH) itself against these user
	// names and passwords, with Redis's replies; "default" is the user of
	// AUTH <password>. Clients' credentials never reach the backend. Empty:
	// AUTH is forwarded to the backend like any command.
	Users map[string]string
	// ACL, when it has users or Backend, makes the proxy require
	// authentication against Redis's ACL (acl.go): its users' forwarded
	// commands go over backend connections signed in as them, and their
	// lock commands are checked as Redis would check keys of the
	// resources' names.
	ACL ACLConfig
	// TLS, when set, makes clients connect with TLS. Set ClientAuth and
	// ClientCAs in it to verify client certificates.
	TLS *tls.Config
	// Info, when set, answers INFO lockproxy: it returns the section's
	// lines ("key:value\r\n"), which follow "# Lockproxy". Plain INFO and
	// every other section stay the backend's.
	Info func() string
	// Docs, when set, adds the proxy's own commands to COMMAND's replies.
	Docs *Docs
	// ArrivalOrder passes different clients' commands to the backend in
	// the order their bytes reached the proxy, as Redis, reading its
	// clients with one thread, runs them (internal/backend, Arrivals; Linux only).
	// It costs throughput when many clients send at once: 2-25% of the
	// commands per second of 50 clients without pipelining on 2 CPUs, up
	// to 13% with 16 commands per pipeline (README.md, Performance). Reads
	// that carry only the proxy's own commands wait for nobody. Default
	// true.
	ArrivalOrder bool
	// ReadLoop has one goroutine of the proxy's read the sockets of the
	// clients of one Redis while they send only commands that share a
	// backend connection, instead of a goroutine per client (loop.go). It
	// needs ArrivalOrder (Linux). Default true.
	ReadLoop bool
	// ProtectedPrefix, when set, refuses forwarded commands that name a key
	// with this prefix (the lock state, when the backend is also a lock
	// node).
	ProtectedPrefix string
	// Fencing, when set, makes the proxy run FENCED (fenced.go).
	Fencing *Fencing
}

// BackendConfig says how to reach the backend Redis: at Addr, or at the
// primary that Sentinel names (one of the two).
type BackendConfig struct {
	// Addr is host:port, or the path of a unix socket.
	Addr string
	// Sentinel, when its MasterName or Addrs are set, finds the backend
	// through Redis Sentinel and follows it through failovers; Addr must
	// then be empty. The credentials, TLS and timeouts below apply to the
	// primary it names.
	Sentinel SentinelConfig
	// Cluster, instead of Addr, is the seed addresses of a Redis Cluster:
	// each command goes to the master serving its keys' slot (see
	// clusterroute.go). The credentials, TLS and timeouts below apply to
	// every node, and SharedConnections to each master (internal/clusterclient, shared.go);
	// and SpareConnections to each master too: a client's own connection
	// to a master, made at its first command there that cannot share one,
	// is a spare one when there is one (clusterspare.go).
	Cluster []string
	// ClusterRetry bounds how long a command waits for a Redis Cluster to
	// serve its slot: redirections, a failover, a master that cannot be
	// reached. Default 10s.
	ClusterRetry time.Duration
	// Username and Password, when set, authenticate every backend
	// connection before the client's own commands.
	Username, Password string
	// DB is selected on every new backend connection. Default 0.
	DB int
	// TLS, when set, is used for every backend connection.
	TLS *tls.Config
	// DialTimeout bounds connecting and authenticating. Default 2s.
	DialTimeout time.Duration
	// SharedConnections is how many backend connections carry the
	// stateless commands of clients that have set no connection state
	// (see package doc). Default: one per thread running Go code
	// (runtime.GOMAXPROCS when DefaultConfig is called), so that their
	// readers can run side by side and no more connections than that split
	// the batches: with one thread, one connection forwarded 11-18% more
	// commands per second than two on a 2-CPU host (README.md,
	// Performance). Zero or negative: every client gets a dedicated
	// connection.
	SharedConnections int
	// SpareConnections is how many backend connections the proxy keeps
	// dialed and set up (TLS, Username and Password, DB), ready for the
	// clients that move to a dedicated connection, so that the move costs
	// no dial on the client's request path; one taken is replaced in the
	// background. Without them, a command another client sends right after
	// a client's first BLPOP can reach Redis before that BLPOP does.
	// Default 2; zero or negative: none, each dedicated connection is
	// dialed when it is needed. At most 1024.
	SpareConnections int
	// WriteTimeout bounds sending a batch of commands to the backend; a
	// backend that takes nothing for this long is treated as gone.
	// Default 10s.
	WriteTimeout time.Duration
}

// DefaultConfig returns the defaults, with no backend address.
func DefaultConfig() Config {
	return Config{
		Limits: Limits{
			MaxClients:      10000,
			MaxBulkLen:      512 << 20,
			MaxMultibulkLen: resp.MaxCount,
			MaxInlineLen:    64 << 10,
		},
		CommandTimeout: 2 * time.Minute,
		ArrivalOrder:   true,
		ReadLoop:       true,
		Backend: BackendConfig{
			SharedConnections: runtime.GOMAXPROCS(0),
			SpareConnections:  defaultSpares,
			DialTimeout:       2 * time.Second,
			WriteTimeout:      10 * time.Second,
			Sentinel: SentinelConfig{
				CheckInterval: time.Second,
				Timeout:       500 * time.Millisecond,
			},
			ClusterRetry: 10 * time.Second,
		},
	}
}

// controlOptions are the go-redis options of a small client that asks a
// backend node about itself (the key guard's COMMAND table, a Redis
// Cluster's slot map), outside the forwarding path: the backend's
// credentials and TLS, every call bounded by DialTimeout, no retries. An
// address starting with "/" or "unix:" is a unix socket.
func (b *BackendConfig) controlOptions(addr string) *redis.Options {
	opt := &redis.Options{
		Addr:                  addr,
		Username:              b.Username,
		Password:              b.Password,
		TLSConfig:             b.TLS,
		DialTimeout:           b.DialTimeout,
		ReadTimeout:           b.DialTimeout,
		WriteTimeout:          b.DialTimeout,
		MaxRetries:            -1,
		ContextTimeoutEnabled: true,
		PoolSize:              4,
	}
	if strings.HasPrefix(addr, "/") || strings.HasPrefix(addr, "unix:") {
		opt.Network, opt.Addr = "unix", strings.TrimPrefix(addr, "unix:")
	}
	return opt
}

// defaultSpares is BackendConfig.SpareConnections's default: two clients
// may move at once before one waits for a dial.
const defaultSpares = 2

// Validate reports the first invalid field of c.
func (c Config) Validate() error {
	sentinel := c.Backend.Sentinel.Enabled()
	if sentinel {
		if err := c.Backend.Sentinel.Validate(); err != nil {
			return err
		}
	}
	switch {
	case c.Backend.Addr == "" && !sentinel && len(c.Backend.Cluster) == 0:
		return errors.New("proxy: backend address is empty")
	case c.Backend.Addr != "" && sentinel:
		return errors.New("proxy: a backend address and a sentinel master are mutually exclusive")
	case len(c.Backend.Cluster) > 0 && (c.Backend.Addr != "" || sentinel):
		return errors.New("proxy: cluster seeds exclude a backend address and a sentinel master")
	case len(c.Backend.Cluster) > 0 && c.ProtectedPrefix != "":
		return errors.New("proxy: the key guard does not cover a cluster backend")
	case len(c.Backend.Cluster) > 0 && c.Backend.DB != 0:
		return errors.New("proxy: a cluster has only db 0")
	case c.Backend.ClusterRetry <= 0 && len(c.Backend.Cluster) > 0:
		return errors.New("proxy: backend cluster retry must be positive")
	case c.MaxClients <= 0:
		return errors.New("proxy: max clients must be positive")
	case c.MaxBulkLen <= 0:
		return errors.New("proxy: max bulk length must be positive")
	case c.MaxMultibulkLen <= 0:
		return errors.New("proxy: max multibulk length must be positive")
	case c.MaxInlineLen <= 0:
		return errors.New("proxy: max inline length must be positive")
	case c.IdleTimeout < 0:
		return errors.New("proxy: idle timeout must not be negative")
	case c.CommandTimeout <= 0:
		return errors.New("proxy: command timeout must be positive")
	case c.Backend.DialTimeout <= 0 || c.Backend.WriteTimeout <= 0:
		return errors.New("proxy: backend timeouts must be positive")
	case c.Backend.DB < 0:
		return errors.New("proxy: backend db must not be negative")
	case c.Backend.SpareConnections > 1024:
		return errors.New("proxy: backend spare connections must be at most 1024")
	case (c.IsLocal == nil) != (c.NewLocal == nil):
		return errors.New("proxy: IsLocal and NewLocal go together")
	}
	return nil
}

// Limits are the settings SetLimits can change while the proxy runs.
type Limits struct {
	// MaxClients bounds the connected clients. Default 10000.
	MaxClients int
	// MaxBulkLen bounds one argument of a request. Default 512 MB, Redis's
	// proto-max-bulk-len.
	MaxBulkLen int64
	// MaxMultibulkLen bounds the arguments of a request. Default and most
	// 2147483647, the bound of Redis 7.0.
	MaxMultibulkLen int64
	// MaxInlineLen bounds an inline (telnet-style) request, and the count
	// and length lines of a multibulk one. Default 64 KB, as in Redis.
	MaxInlineLen int64
	// IdleTimeout closes a client that sent nothing for this long, unless
	// it waits on a blocking command, a subscription, MONITOR or the
	// replication stream. Default 0: never.
	IdleTimeout time.Duration
}

// SetLimits changes the limits for clients that connect from now on (and
// the client count for all). Connected clients keep the request limits and
// idle timeout they started with. It is safe to call at any time.
func (p *Proxy) SetLimits(l Limits) error {
	c := p.cfg
	c.Limits = l
	if err := c.Validate(); err != nil {
		return err
	}
	p.limits.Store(&l)
	return nil
}

// BackendError is the reply to a forwarded command when the backend cannot
// be reached.
type BackendError struct{ Err error }

func (e *BackendError) Error() string { return "backend unavailable: " + e.Err.Error() }
func (e *BackendError) Unwrap() error { return e.Err }

// errClosed ends work for a client that has gone.
var errClosed = errors.New("proxy: connection closed")

// Proxy is a Redis endpoint that forwards ordinary commands to the backend
// and answers its own. Its methods are safe for concurrent use.
type Proxy struct {
	cfg   Config
	log   *zap.Logger
	srv   *redcon.Server
	guard *guard.Guard
	fence fencedState
	auth  *acl.Passwords // nil: no password required
	acl   *aclState      // nil unless Config.ACL is enabled
	// setup is what every new backend connection is sent first: the
	// proxy's own AUTH and SELECT.
	setup [][]byte

	root   context.Context
	cancel context.CancelFunc

	clients atomic.Int64
	m       *metrics
	backoff backend.Backoff

	// follow finds the backend through Sentinel; nil for a fixed address.
	follow *sentinel.Follower

	// clientIDs are the sessions by the ids CLIENT ID gave them
	// (identity.go).
	clientIDs clientid.Registry[clientID]

	shared     []*backend.Mux // the backend's, group.List()
	group      *backend.Group // nil in front of a cluster (see router)
	router     *router        // set for a cluster backend
	nextShared atomic.Uint64
	// mux is what the multiplexed connections share (batching.go).
	mux      backend.Env
	spares   *backend.Spares   // nil when there are none
	order    *backend.Arrivals // nil where the platform keeps no arrival order
	looping  atomic.Bool       // the reading loop runs (loop.go); set before Serve accepts
	loopWG   sync.WaitGroup
	sharedWG sync.WaitGroup // the shared connections' readers
	limits   atomic.Pointer[Limits]
	wg       sync.WaitGroup // one per session, until its cleanup is done

	mu       sync.Mutex
	sessions map[*session]struct{}
	closing  bool
	inner    net.Listener  // set by Serve, which also starts the spares' filler
	release  chan struct{} // closed when redcon may drop the connections
	served   chan struct{} // closed when Serve returns
}

var _ redcon.Handler = (*Proxy)(nil)

// New returns a proxy for cfg. logger may be nil.
func New(cfg Config, logger *zap.Logger) (*Proxy, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = zap.NewNop()
	}
	p := &Proxy{
		cfg:      cfg,
		log:      logger,
		sessions: make(map[*session]struct{}),
		release:  make(chan struct{}),
		served:   make(chan struct{}),
		m:        newMetrics(),
	}
	limits := cfg.Limits
	p.limits.Store(&limits)
	if len(cfg.Backend.Cluster) > 0 {
		p.router = newRouter(p)
	} else {
		p.group = p.newMuxGroup("", max(cfg.Backend.SharedConnections, 0), nil)
		p.shared = p.group.List()
		p.spares = backend.NewSpares(cfg.Backend.SpareConnections, func(ctx context.Context) (*backend.Conn, error) {
			return p.spare(ctx, "")
		})
	}
	p.auth = acl.NewPasswords(cfg.Users)
	if cfg.ACL.enabled() {
		users, err := parseACLUsers(&cfg)
		if err != nil {
			return nil, err
		}
		p.acl = newACLState(p, users)
		p.auth = acl.Required(cfg.Users)
	}
	p.initMux()
	b := &cfg.Backend
	switch {
	case b.Password != "" && b.Username != "":
		p.setup = append(p.setup, command("AUTH", b.Username, b.Password))
	case b.Password != "":
		p.setup = append(p.setup, command("AUTH", b.Password))
	}
	if b.DB != 0 {
		p.setup = append(p.setup, command("SELECT", strconv.Itoa(b.DB)))
	}
	if cfg.ProtectedPrefix != "" {
		p.guard = newKeyGuard(cfg.ProtectedPrefix, p)
	}
	p.backoff.Spare = func(err error) bool {
		// Nothing was dialled, or the backend is up and refused one user.
		return errors.Is(err, sentinel.ErrNoPrimary) || userRefused(err)
	}
	p.root, p.cancel = context.WithCancel(context.Background())
	if cfg.Backend.Sentinel.Enabled() {
		p.follow = sentinel.NewFollower(cfg.Backend.Sentinel, logger.Named("sentinel"), p.role, func() { p.backoff.Record(nil) })
		p.follow.Start(p.root)
	}
	if cfg.ArrivalOrder {
		order, err := backend.NewArrivals()
		if err != nil {
			return nil, fmt.Errorf("proxy: arrival order: %w", err)
		}
		p.order = order
	}
	p.srv = redcon.NewServerNetwork("tcp", "", p.ServeRESP, p.accept, p.closed)
	p.srv.AcceptError = func(err error) {
		p.log.Warn("accept", zap.Error(err))
		time.Sleep(10 * time.Millisecond) // like net/http: back off on EMFILE and friends
	}
	return p, nil
}

// Serve accepts clients on ln until Shutdown. It returns nil after a
// Shutdown.
func (p *Proxy) Serve(ln net.Listener) error {
	p.mu.Lock()
	if p.closing || p.inner != nil {
		p.mu.Unlock()
		return errors.New("proxy: Serve called twice or after Shutdown")
	}
	p.inner = ln
	p.mu.Unlock()
	defer close(p.served)
	p.spares.Start(p.root)
	// The forwarding path's system calls leave the scheduler's monitor
	// asleep (internal/rawio); a heartbeat bounds its sleep, so that a
	// goroutine computing for long on the proxy's thread is preempted.
	p.loopWG.Add(1)
	go func() {
		defer p.loopWG.Done()
		rawio.Heartbeat(p.root, rawio.HeartbeatPeriod)
	}()
	p.startLoop()
	return p.srv.Serve(&listener{Listener: ln, p: p})
}

// Shutdown stops accepting clients, waits until the commands in flight are
// answered or ctx ends, then closes every client connection and waits for
// their cleanup (which releases KEEPALIVE locks). It returns ctx.Err() when
// ctx ended first.
func (p *Proxy) Shutdown(ctx context.Context) error {
	p.mu.Lock()
	if p.closing {
		p.mu.Unlock()
		return errors.New("proxy: Shutdown called twice")
	}
	p.closing = true
	ln := p.inner
	p.mu.Unlock()
	if ln != nil {
		ln.Close()
	}
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	var err error
drain:
	for p.busy() {
		select {
		case <-ctx.Done():
			err = ctx.Err()
			break drain
		case <-tick.C:
		}
	}
	close(p.release)
	p.cancel()
	if p.guard != nil {
		defer p.guard.Close()
	}
	if p.router != nil {
		defer p.router.Close()
	}
	if ln != nil {
		<-p.served
	}
	done := make(chan struct{})
	go func() {
		p.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		err = ctx.Err()
	}
	for _, sh := range p.shared {
		sh.Close()
	}
	if p.acl != nil {
		p.acl.closeGroups()
	}
	if p.router != nil {
		p.router.CloseShared()
		p.router.closeSpares()
	}
	p.sharedWG.Wait()
	p.spares.Close(ln != nil)
	p.order.Close()
	p.loopWG.Wait()
	if p.follow != nil {
		p.follow.Close()
	}
	return err
}

// pickShared hands out the shared connections in turn.
func (p *Proxy) pickShared() *backend.Mux {
	if len(p.shared) == 0 {
		return nil
	}
	return p.shared[p.nextShared.Add(1)%uint64(len(p.shared))]
}

func (p *Proxy) busy() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for s := range p.sessions {
		if s.inflight() {
			return true
		}
	}
	return false
}

// ServeRESP handles the commands redcon parsed from one read of a client:
// the whole pipeline goes to the backend in one write.
func (p *Proxy) ServeRESP(conn redcon.Conn, cmd redcon.Command) {
	s := conn.Context().(*session)
	defer s.Recover()
	s.handle(cmd)
	for _, c := range conn.ReadPipeline() {
		s.handle(c)
	}
	s.endBatch()
}

func (p *Proxy) accept(conn redcon.Conn) bool {
	cc := conn.NetConn().(*clientConn)
	p.mu.Lock()
	closing := p.closing
	p.mu.Unlock()
	if closing {
		return false
	}
	if n := p.clients.Add(1); n > int64(p.limits.Load().MaxClients) {
		p.clients.Add(-1)
		p.m.maxClients.Add(1)
		cc.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
		cc.Conn.Write(replyMaxClients)
		return false
	}
	p.m.connections.Add(1)
	// Lazily: most connections never log, and an eager With encodes the
	// field into a buffer of about 1 KB that the connection keeps.
	s := newSession(p, cc, p.log.WithLazy(zap.String("remote", conn.RemoteAddr())))
	s.addr = conn.RemoteAddr()
	cc.sess = s
	conn.SetContext(s)
	p.mu.Lock()
	p.sessions[s] = struct{}{}
	p.mu.Unlock()
	p.wg.Add(1)
	if ce := s.log.Check(zap.DebugLevel, "client connected"); ce != nil {
		ce.Write()
	}
	p.loop(s, cc)
	return true
}

// closed runs under redcon's server lock: it signals the session and
// leaves the waiting to a goroutine that Shutdown waits for.
func (p *Proxy) closed(conn redcon.Conn, err error) {
	s, ok := conn.Context().(*session)
	if !ok {
		return
	}
	s.nc.order.Remove()
	s.close()
	go func() {
		defer p.wg.Done()
		s.wait()
		p.mu.Lock()
		delete(p.sessions, s)
		p.mu.Unlock()
		p.clients.Add(-1)
		if ce := s.log.Check(zap.DebugLevel, "client disconnected"); ce != nil {
			ce.Write(zap.Error(err))
		}
	}()
}

// listener hands redcon clientConns, and after Shutdown closed the real
// listener, holds redcon's accept loop until the commands in flight are
// answered: redcon drops every connection as soon as its loop returns.
type listener struct {
	net.Listener
	p *Proxy
}

func (l *listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		l.p.mu.Lock()
		closing := l.p.closing
		l.p.mu.Unlock()
		if closing {
			<-l.p.release
			return nil, net.ErrClosed
		}
		return nil, err
	}
	// The socket is read in arrival order (internal/backend, Arrivals) below TLS,
	// so that a partial TLS record never holds other clients up.
	oc, a, err := l.p.order.Wrap(c)
	if err != nil {
		l.p.log.Warn("arrival order", zap.Error(err))
	} else {
		c = oc
	}
	if l.p.cfg.TLS != nil {
		c = tls.Server(c, l.p.cfg.TLS)
	}
	cfg := l.p.limits.Load()
	return &clientConn{
		order: a,
		Conn:  c,
		idle:  cfg.IdleTimeout,
		sc: resp.Scanner{
			MaxBulk:      cfg.MaxBulkLen,
			MaxMultibulk: cfg.MaxMultibulkLen,
			MaxInline:    cfg.MaxInlineLen,
		},
	}, nil
}

// dial opens a backend connection and brings it to state: the proxy's own
// credentials and database first, then what the client had set. The
// address is the fixed one, or the primary the follower knows, which then
// owns the connection and closes it when the primary changes.
func (p *Proxy) dial(ctx context.Context, state replayState) (*backendConn, error) {
	if p.follow == nil {
		return p.dialAddr(ctx, p.cfg.Backend.Addr, state)
	}
	addr, gen, err := p.follow.Target()
	if err != nil {
		return nil, err
	}
	be, err := p.dialAddr(ctx, addr, state)
	if err != nil {
		p.follow.Trouble(false)
		return nil, err
	}
	nc, err := p.follow.Track(be.NC, gen)
	if err != nil {
		be.NC.Close()
		return nil, err
	}
	be.NC = nc
	return be, nil
}

// dialAddr opens a backend connection to addr and brings it to state.
func (p *Proxy) dialAddr(ctx context.Context, addr string, state replayState) (*backendConn, error) {
	b := &p.cfg.Backend
	ctx, cancel := context.WithTimeout(ctx, b.DialTimeout)
	defer cancel()
	c, err := backend.Dial(ctx, addr, b.TLS)
	if err != nil {
		return nil, err
	}
	be := c
	nc := be.NC
	if p.acl != nil && state.auth != nil {
		// A user of Redis's ACL signs in after the proxy's own setup.
		if err := p.acl.dialSetup(ctx, be, p.setup, state); err != nil {
			nc.Close()
			return nil, err
		}
		return be, nil
	}
	setup := state.commands(append([][]byte(nil), p.setup...))
	if len(setup) > 0 {
		if err := be.Setup(ctx, setup); err != nil {
			nc.Close()
			return nil, err
		}
	}
	return be, nil
}

// dedicated returns a backend connection of one client's own, brought to
// state: a spare one when there is one, a new one otherwise.
func (p *Proxy) dedicated(ctx context.Context, state replayState) (*backendConn, error) {
	if c := p.spares.Take(); c != nil {
		be := c
		if cmds := state.commands(nil); len(cmds) > 0 {
			ctx, cancel := context.WithTimeout(ctx, p.cfg.Backend.DialTimeout)
			defer cancel()
			setup := be.Setup
			if p.acl != nil && state.auth != nil {
				setup = func(ctx context.Context, cmds [][]byte) error { return p.acl.setup(ctx, be, cmds) }
			}
			if err := setup(ctx, cmds); err != nil {
				be.NC.Close()
				return nil, err
			}
		}
		return be, nil
	}
	if err := p.backoff.Check(); err != nil {
		return nil, err
	}
	be, err := p.dial(ctx, state)
	p.backoff.Record(err)
	return be, err
}

// spare dials a spare connection to addr ("" for the backend), in no
// client's state, for the spares' filler.
func (p *Proxy) spare(ctx context.Context, addr string) (*backend.Conn, error) {
	var be *backendConn
	var err error
	if addr != "" {
		be, err = p.dialAddr(ctx, addr, replayState{})
	} else {
		be, err = p.dial(ctx, replayState{})
	}
	if err != nil {
		return nil, err
	}
	return be, nil
}

// Ready reports whether the backend answers: it opens a connection as
// the proxy would, sends PING and waits for the reply, all within ctx.
func (p *Proxy) Ready(ctx context.Context) error {
	if p.router != nil {
		return p.router.ready(ctx)
	}
	be, err := p.dial(ctx, replayState{})
	if err != nil {
		return &BackendError{Err: err}
	}
	defer be.NC.Close()
	if err := be.Setup(ctx, [][]byte{command("PING")}); err != nil {
		return &BackendError{Err: err}
	}
	return nil
}

// command encodes args as a RESP request.
func command(args ...string) []byte { return resp.Command(args...) }
