package acl

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tidwall/redcon"
	"go.uber.org/zap"

	"github.com/lockproxy/lockproxy/proxy/internal/backend"
	"github.com/lockproxy/lockproxy/proxy/internal/resp"
)

// Engine is the proxy's side of Redis's ACL that knows no client: the
// users the configuration defines, the nodes they are installed on, the
// cache of lock-resource checks (Verdict) and the control connections
// that ask them. Its methods are safe for concurrent use.
type Engine struct {
	cfg Config

	mu        sync.Mutex
	users     map[string]*User                 // the configuration's
	userMap   atomic.Pointer[map[string]*User] // users, read without mu
	userGen   uint64                           // counts SetUsers calls
	installed map[string]uint64                // node address -> userGen installed there

	// gen counts ACL changes: a cached check of an older generation is
	// asked again.
	gen       atomic.Uint64
	settle    atomic.Int64             // until when (unix ns) no verdict is cached
	cache     atomic.Pointer[sync.Map] // user, access, resource -> verdict
	cacheSize atomic.Int64

	ctlSlots  chan struct{} // one per control connection in use
	ctlMu     sync.Mutex
	ctlIdle   []*backend.Conn // control connections (ACL DRYRUN), signed in as the proxy
	ctlClosed bool
	// old: the backend words its refusals as Redis 7.0 does ("this
	// user has no permissions ..."), not as 7.2 and later ("User <name>
	// has no permissions ...", "No permissions to access a key").
	old       atomic.Bool
	versioned atomic.Bool // old is known
}

// Config is what an Engine needs of the proxy.
type Config struct {
	// Dial opens a connection to a node the users live on (the backend,
	// or any node of a cluster), signed in as the proxy, for the control
	// commands (ACL DRYRUN, ACL SETUSER).
	Dial func(ctx context.Context) (*backend.Conn, error)
	// Timeout bounds each control command, its dial included.
	Timeout time.Duration
	// Log gets the warnings of users that could not be installed.
	Log *zap.Logger
}

// verdict is a cached ACL DRYRUN answer.
type verdict struct {
	gen     uint64
	refused []byte // the -NOPERM reply; nil when allowed
	until   int64  // unix ns: asked again after
}

// verdictTTL bounds how long a verdict is kept: a change made on the
// backend directly, not through the proxy, applies after it.
const verdictTTL = 10 * time.Second

// maxCache bounds the cached verdicts; past it the cache starts over.
const maxCache = 1 << 16

// settleTime is how long after an ACL change no verdict is cached.
const settleTime = time.Second

// maxControl bounds the control connections in use at once.
const maxControl = 4

// New returns an Engine for users.
func New(users []*User, cfg Config) *Engine {
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	a := &Engine{cfg: cfg, ctlSlots: make(chan struct{}, maxControl), installed: map[string]uint64{}}
	a.cache.Store(&sync.Map{})
	a.SetUsers(users)
	return a
}

// SetUsers replaces the users the configuration defines: they are
// installed again on each node (Prepare), and every cached check is
// asked again.
func (a *Engine) SetUsers(users []*User) {
	m := make(map[string]*User, len(users))
	for _, u := range users {
		m[u.Name] = u
	}
	a.mu.Lock()
	a.users = m
	a.userMap.Store(&m)
	a.userGen++
	a.mu.Unlock()
	a.gen.Add(1)
}

// Changed records an ACL change: every cached verdict is asked again,
// and none is cached for a second: a change sent through the proxy is
// on its way to Redis, and an ACL DRYRUN another connection sends
// meanwhile may reach Redis before it.
func (a *Engine) Changed() {
	a.settle.Store(time.Now().Add(settleTime).UnixNano())
	a.gen.Add(1)
}

// User returns the configuration's user name, nil for a user of the
// backend's own ACL.
func (a *Engine) User(name string) *User {
	return (*a.userMap.Load())[name]
}

// Installed reports whether the users have been installed on the node at
// addr since they last changed.
func (a *Engine) Installed(addr string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.installed[addr] == a.userGen
}

// Prepare installs the configuration's users on be's node if they have
// not been since the proxy started or they last changed. be is signed in
// as the proxy.
func (a *Engine) Prepare(ctx context.Context, be *backend.Conn) error {
	node := be.NC.RemoteAddr().String()
	a.mu.Lock()
	gen := a.userGen
	done := a.installed[node] == gen
	users := a.userList()
	a.mu.Unlock()
	if done {
		return nil
	}
	for _, u := range users {
		if err := install(ctx, be, u); err != nil {
			return err
		}
	}
	a.mu.Lock()
	if a.userGen == gen {
		a.installed[node] = gen
	}
	a.mu.Unlock()
	return nil
}

// userList returns the configuration's users; a.mu is held.
func (a *Engine) userList() []*User {
	out := make([]*User, 0, len(a.users))
	for _, u := range a.users {
		out = append(out, u)
	}
	return out
}

// install runs u's ACL SETUSER on be.
func install(ctx context.Context, be *backend.Conn, u *User) error {
	r, err := be.Call(ctx, u.setuser)
	if err != nil {
		return err
	}
	if r[0] == '-' {
		return fmt.Errorf("acl: installing user %q: %s", u.Name, strings.TrimSpace(string(r[1:])))
	}
	return nil
}

// ensure installs on be's node the configuration's users it lacks (it
// restarted empty, or a user was deleted there): a user's sign-in found
// it missing.
func (a *Engine) ensure(ctx context.Context, be *backend.Conn, name string) error {
	u := a.User(name)
	if u == nil {
		return nil
	}
	r, err := be.Call(ctx, resp.Command("ACL", "GETUSER", name))
	if err != nil {
		return err
	}
	if r[0] != '*' || bytes.HasPrefix(r, []byte("*-1")) {
		return install(ctx, be, u)
	}
	return nil
}

// SignIn sends the user's AUTH on be, a connection signed in as the
// proxy, installing the user first where it is missing. It returns the
// backend's reply.
func (a *Engine) SignIn(ctx context.Context, be *backend.Conn, auth []byte) ([]byte, error) {
	if err := a.Prepare(ctx, be); err != nil {
		a.cfg.Log.Warn("acl: installing users", zap.Error(err))
	}
	r, err := be.Call(ctx, auth)
	if err != nil || !bytes.HasPrefix(r, []byte("-WRONGPASS")) {
		return r, err
	}
	user := AuthUser(auth)
	if a.User(user) == nil {
		return r, nil
	}
	if err := a.ensure(ctx, be, user); err != nil {
		a.cfg.Log.Warn("acl: installing a user", zap.Error(err))
		return r, nil
	}
	return be.Call(ctx, auth)
}

// Verdict returns the refusal of user's access to resource (write or
// read) as Redis's ACL DRYRUN tells, nil when allowed. Verdicts are
// cached for 10 seconds, and until the next ACL change (Changed).
func (a *Engine) Verdict(ctx context.Context, user string, resource []byte, write bool) ([]byte, error) {
	key := make([]byte, 0, len(user)+len(resource)+2)
	key = append(append(key, user...), 0, 'r')
	if write {
		key[len(key)-1] = 'w'
	}
	key = append(key, resource...)
	gen := a.gen.Load()
	cache := a.cache.Load()
	now := time.Now().UnixNano()
	if v, ok := cache.Load(string(key)); ok && v.(verdict).gen == gen && now < v.(verdict).until {
		return v.(verdict).refused, nil
	}
	cmd := resp.Command("ACL", "DRYRUN", user, "GET", string(resource))
	if write {
		cmd = resp.Command("ACL", "DRYRUN", user, "SET", string(resource), "x")
	}
	r, err := a.Control(ctx, cmd)
	if err != nil {
		return nil, err
	}
	refused := dryrunRefusal(r, a.old.Load())
	if a.gen.Load() == gen && time.Now().UnixNano() > a.settle.Load() {
		if a.cacheSize.Add(1) > maxCache {
			// Full: start over.
			a.cacheSize.Store(1)
			cache = &sync.Map{}
			a.cache.Store(cache)
		}
		cache.Store(string(key), verdict{gen: gen, refused: refused, until: time.Now().Add(verdictTTL).UnixNano()})
	}
	return refused, nil
}

// Control sends cmd on a control connection, signed in as the proxy,
// and returns the reply. Up to maxControl of them are in use at once;
// one that fails is closed, and the command is tried once more on a new
// one.
func (a *Engine) Control(ctx context.Context, cmd []byte) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, a.cfg.Timeout)
	defer cancel()
	select {
	case a.ctlSlots <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-a.ctlSlots }()
	for attempt := 0; ; attempt++ {
		be, err := a.controlConn(ctx)
		if err != nil {
			return nil, err
		}
		r, err := be.Call(ctx, cmd)
		if err == nil {
			if bytes.HasPrefix(r, []byte("-ERR User '")) && attempt == 0 {
				// Missing on a node that restarted empty?
				if c, perr := redcon.Parse(cmd); perr == nil && len(c.Args) > 2 && a.User(string(c.Args[2])) != nil {
					if err := a.ensure(ctx, be, string(c.Args[2])); err == nil {
						a.putControl(be)
						continue
					}
				}
			}
			a.putControl(be)
			return r, nil
		}
		be.NC.Close()
		if attempt > 0 || ctx.Err() != nil {
			return nil, err
		}
	}
}

// controlConn returns an idle control connection, or dials one.
func (a *Engine) controlConn(ctx context.Context) (*backend.Conn, error) {
	a.ctlMu.Lock()
	if n := len(a.ctlIdle); n > 0 {
		be := a.ctlIdle[n-1]
		a.ctlIdle = a.ctlIdle[:n-1]
		a.ctlMu.Unlock()
		return be, nil
	}
	a.ctlMu.Unlock()
	be, err := a.cfg.Dial(ctx)
	if err != nil {
		return nil, err
	}
	if err := a.Prepare(ctx, be); err != nil {
		a.cfg.Log.Warn("acl: installing users", zap.Error(err))
	}
	a.LearnVersion(ctx, be)
	return be, nil
}

// LearnVersion learns from be how the backend words its refusals, once.
func (a *Engine) LearnVersion(ctx context.Context, be *backend.Conn) {
	if a.versioned.Load() {
		return
	}
	if info, err := be.Call(ctx, resp.Command("INFO", "server")); err == nil && info[0] != '-' {
		a.old.Store(oldWording(info))
		a.versioned.Store(true)
	}
}

// Old reports whether the backend words its refusals as Redis 7.0 does,
// before Redis 7.2 (learnt with the first control connection).
func (a *Engine) Old() bool { return a.old.Load() }

// putControl keeps be for the next control command, or closes it once
// the proxy is shutting down.
func (a *Engine) putControl(be *backend.Conn) {
	a.ctlMu.Lock()
	defer a.ctlMu.Unlock()
	if a.ctlClosed {
		be.NC.Close()
		return
	}
	a.ctlIdle = append(a.ctlIdle, be)
}

// Close closes the idle control connections, and those put back later.
func (a *Engine) Close() {
	a.ctlMu.Lock()
	a.ctlClosed = true
	for _, be := range a.ctlIdle {
		be.NC.Close()
	}
	a.ctlIdle = nil
	a.ctlMu.Unlock()
}
