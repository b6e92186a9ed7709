package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockproxy/lockproxy/proxy/internal/backend"
	"github.com/tidwall/redcon"
	"go.uber.org/zap"
)

// Redis's ACL at the proxy. The users are Redis's: their rules are Redis
// ACL rules, and every rule Redis knows is evaluated by Redis itself. A
// user signs in at the proxy (AUTH, HELLO ... AUTH), which asks the
// backend (AUTH on a connection of the proxy's), so the reply, and the
// ACL LOG entry of a failure, are Redis's own. From then on its forwarded
// commands go over backend connections signed in as that user with the
// password it gave: shared connections of the user's own (aclGroup), and
// its connection of one, whose replay state carries the user's AUTH. So
// Redis itself allows or refuses each command (commands, categories,
// subcommands, key patterns with %R~/%W~, channels, selectors) and its
// -NOPERM reply and ACL LOG entry are Redis's.
//
// The users the configuration defines (ACLConfig.Users, lines of an
// aclfile) are installed on the backend with ACL SETUSER <name> reset
// <rules> when the proxy first reaches a node (one Redis, the primary a
// Sentinel names after a failover, each cluster master), and again when
// a user's sign-in finds it missing there (a node restarted empty).
// Besides them, every user of the backend's own ACL may sign in.
//
// The lock commands are no Redis commands: they form the category @lock
// besides their @write or @read and @slow, and the proxy applies to them
// the rules the configuration gives on those categories, on the lock
// commands by name, +@all, -@all, allcommands, nocommands and reset, in
// order, as Redis applies rules to its own commands (a user of the
// backend's own ACL has them all). A lock command's resources are checked
// as keys of the same name by Redis: ACL DRYRUN <user> SET <resource> x
// for the commands that take or change a holding, GET <resource> for
// those that read (LOCKS lists only what passes), on control connections
// of the proxy's, cached per user, resource and access until an ACL
// command goes through the proxy or the users are set again (SetACL).

// ACLConfig is Redis's ACL at the proxy.
type ACLConfig struct {
	// Users are the users the proxy defines, one per line in Redis's
	// aclfile format: "user alice on >password ~app:* %R~shared:*
	// &events:* +@read +@write -@dangerous +@lock". They are installed on
	// the backend; the lock rules (+@lock, +lock, -unlock ...) stay at
	// the proxy.
	Users []string
	// Backend lets the users of the backend's own ACL sign in too; it is
	// implied by Users.
	Backend bool
	// LockCategories are the lock commands' ACL categories (without
	// "@"), by lower-case name, as COMMAND INFO lists them.
	LockCategories map[string][]string
	// LockResources returns the resources a lock command names and
	// whether it changes them (else it reads them); ok is false when the
	// command's arity is wrong, which the command answers itself.
	LockResources func(args [][]byte) (resources [][]byte, write, ok bool)
	// FilterListed leaves out of a lock command's reply that lists
	// resources (LOCKS) those keep refuses; other replies are returned
	// as they are.
	FilterListed func(args [][]byte, reply []byte, keep func(resource []byte) (bool, error)) ([]byte, error)
}

// enabled reports whether users sign in against Redis's ACL.
func (c *ACLConfig) enabled() bool { return c.Backend || len(c.Users) > 0 }

// aclUser is a user the configuration defines.
type aclUser struct {
	name string
	// setuser is the ACL SETUSER that installs the user: "reset" and
	// its rules other than the lock rules.
	setuser []byte
	// lock is the lock commands the user may run (lower case).
	lock map[string]bool
}

// lockAllowed reports whether u may run the lock command name (lower
// case).
func (u *aclUser) lockAllowed(name string) bool { return u.lock[name] }

// parseACLUser parses one aclfile line, "user <name> <rules...>".
// categories are the lock commands' ACL categories, by command: a rule
// on a category (+@write, -@lock, +@all ...) or on a lock command
// (+lock, -unlock) applies to the lock commands as Redis applies it to
// its own, in order; the rules on @lock and on the lock commands stay at
// the proxy, the others go to Redis.
func parseACLUser(line string, categories map[string][]string) (*aclUser, error) {
	args, err := splitACL(line)
	if err != nil {
		return nil, err
	}
	if len(args) < 2 || !strings.EqualFold(args[0], "user") {
		return nil, fmt.Errorf("acl: %q: a line is \"user <name> <rules...>\"", line)
	}
	u := &aclUser{name: args[1], lock: map[string]bool{}}
	if u.name == "" {
		return nil, fmt.Errorf("acl: %q: bad user name", line)
	}
	set := func(allow bool, match func(name string, cats []string) bool) {
		for name, cats := range categories {
			if match(name, cats) {
				u.lock[name] = allow
			}
		}
	}
	all := func(string, []string) bool { return true }
	rules := []string{"ACL", "SETUSER", u.name, "reset"}
	for _, r := range args[2:] {
		l := strings.ToLower(r)
		switch {
		case l == "reset" || l == "nocommands":
			set(false, all)
		case l == "allcommands":
			set(true, all)
		case len(l) > 2 && (l[0] == '+' || l[0] == '-') && l[1] == '@':
			cat := l[2:]
			set(l[0] == '+', func(_ string, cats []string) bool {
				return cat == "all" || slices.Contains(cats, cat)
			})
			if cat == "lock" {
				continue // Redis knows no such category
			}
		case len(l) > 1 && (l[0] == '+' || l[0] == '-'):
			name, _, sub := strings.Cut(l[1:], "|")
			if _, ok := categories[name]; ok {
				if sub {
					return nil, fmt.Errorf("acl: %q: the lock commands have no subcommands", r)
				}
				set(l[0] == '+', func(n string, _ []string) bool { return n == name })
				continue // Redis knows no such command
			}
		}
		rules = append(rules, r)
	}
	u.setuser = command(rules...)
	return u, nil
}

// splitACL splits an aclfile line into its arguments as Redis does:
// words separated by spaces, double or single quotes around a word, and a
// selector, "(...)", one argument however many spaces it holds.
func splitACL(line string) ([]string, error) {
	var out []string
	var cur strings.Builder
	in := false // a word has started
	depth := 0
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case depth == 0 && (c == '"' || c == '\''):
			j := strings.IndexByte(line[i+1:], c)
			if j < 0 {
				return nil, fmt.Errorf("acl: %q: unbalanced quotes", line)
			}
			cur.WriteString(line[i+1 : i+1+j])
			i += j + 1
			in = true
		case c == '(':
			depth++
			cur.WriteByte(c)
			in = true
		case c == ')':
			depth--
			if depth < 0 {
				return nil, fmt.Errorf("acl: %q: unbalanced parentheses", line)
			}
			cur.WriteByte(c)
		case depth == 0 && (c == ' ' || c == '\t' || c == '\r' || c == '\n'):
			if in {
				out = append(out, cur.String())
				cur.Reset()
				in = false
			}
		default:
			cur.WriteByte(c)
			in = true
		}
	}
	if depth != 0 {
		return nil, fmt.Errorf("acl: %q: unbalanced parentheses", line)
	}
	if in {
		out = append(out, cur.String())
	}
	return out, nil
}

// aclState is the proxy's side of Redis's ACL: the users it defines,
// the nodes they are installed on, the shared connections of each user
// signed in, and the cache of lock-resource checks.
type aclState struct {
	p *Proxy

	mu        sync.Mutex
	users     map[string]*aclUser                 // the configuration's
	userMap   atomic.Pointer[map[string]*aclUser] // users, read without mu
	userGen   uint64                              // counts SetACL calls
	installed map[string]uint64                   // node address -> userGen installed there
	groups    map[string]*aclGroup
	groupList atomic.Pointer[[]*muxGroup] // the groups, for writeQueued

	// gen counts ACL changes: a cached check of an older generation is
	// asked again.
	gen       atomic.Uint64
	settle    atomic.Int64             // until when (unix ns) no verdict is cached
	cache     atomic.Pointer[sync.Map] // user, access, resource -> aclVerdict
	cacheSize atomic.Int64

	ctlSlots  chan struct{} // one per control connection in use
	ctlMu     sync.Mutex
	ctlIdle   []*backendConn // control connections (ACL DRYRUN), signed in as the proxy
	ctlClosed bool
	// old: the backend words its refusals as Redis 7.0 does ("this
	// user has no permissions ..."), not as 7.2 and later ("User <name>
	// has no permissions ...", "No permissions to access a key").
	old       atomic.Bool
	versioned atomic.Bool // old is known
}

// aclVerdict is a cached ACL DRYRUN answer.
type aclVerdict struct {
	gen     uint64
	refused []byte // the -NOPERM reply; nil when allowed
	until   int64  // unix ns: asked again after
}

// aclVerdictTTL bounds how long a verdict is kept: a change made on the
// backend directly, not through the proxy, applies after it.
const aclVerdictTTL = 10 * time.Second

// maxACLCache bounds the cached verdicts; past it the cache starts over.
const maxACLCache = 1 << 16

// aclGroup is the shared connections of one user of Redis's ACL,
// signed in with the last password the user signed in with at the proxy.
type aclGroup struct {
	grp  *muxGroup
	auth atomic.Pointer[[]byte] // AUTH <user> <password>
	next atomic.Uint64
}

func newACLState(p *Proxy, users []*aclUser) *aclState {
	a := &aclState{p: p, ctlSlots: make(chan struct{}, maxControl), installed: map[string]uint64{}, groups: map[string]*aclGroup{}}
	a.cache.Store(&sync.Map{})
	a.setUsers(users)
	empty := []*muxGroup{}
	a.groupList.Store(&empty)
	return a
}

func (a *aclState) setUsers(users []*aclUser) {
	m := make(map[string]*aclUser, len(users))
	for _, u := range users {
		m[u.name] = u
	}
	a.mu.Lock()
	a.users = m
	a.userMap.Store(&m)
	a.userGen++
	a.mu.Unlock()
	a.gen.Add(1)
}

// changed records an ACL change: every cached verdict is asked again,
// and none is cached for aclSettle: a change sent through the proxy is
// on its way to Redis, and an ACL DRYRUN another connection sends meanwhile
// may reach Redis before it.
func (a *aclState) changed() {
	a.settle.Store(time.Now().Add(aclSettle).UnixNano())
	a.gen.Add(1)
}

// aclSettle is how long after an ACL change no verdict is cached.
const aclSettle = time.Second

// user returns the configuration's user name, nil for a user of the
// backend's own ACL.
func (a *aclState) user(name string) *aclUser {
	return (*a.userMap.Load())[name]
}

// parseACLUsers parses the configuration's users.
func parseACLUsers(c *Config) ([]*aclUser, error) {
	var users []*aclUser
	seen := map[string]bool{}
	for _, line := range c.ACL.Users {
		if strings.TrimSpace(line) == "" || strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		u, err := parseACLUser(line, c.ACL.LockCategories)
		if err != nil {
			return nil, err
		}
		if seen[u.name] {
			return nil, fmt.Errorf("acl: user %q is defined twice", u.name)
		}
		seen[u.name] = true
		if _, ok := c.Users[u.name]; ok {
			return nil, fmt.Errorf("acl: user %q is both a password-only user and an ACL user", u.name)
		}
		if self := c.Backend.Username; u.name == self || (self == "" && u.name == "default") {
			return nil, fmt.Errorf("acl: user %q is the proxy's own backend user (backend.username)", u.name)
		}
		users = append(users, u)
	}
	return users, nil
}

// SetACL replaces the users the configuration defines (a reload): they
// are installed again on every node, and every cached check is asked
// again. Clients signed in keep their user, whose new rules apply to
// their next command.
func (p *Proxy) SetACL(users []string) error {
	if p.acl == nil {
		return errors.New("proxy: ACL users were not configured at start")
	}
	c := p.cfg
	c.ACL.Users = users
	parsed, err := parseACLUsers(&c)
	if err != nil {
		return err
	}
	p.acl.setUsers(parsed)
	// Installed now where the proxy reaches, so that the change applies
	// to signed-in clients' next command.
	ctx, cancel := context.WithTimeout(p.root, 2*p.cfg.Backend.DialTimeout)
	defer cancel()
	err = p.acl.installEverywhere(ctx)
	// Again: a check made while the users were being installed saw the
	// rules before.
	p.acl.changed()
	return err
}

// installEverywhere installs the users on every node the proxy forwards
// to now.
func (a *aclState) installEverywhere(ctx context.Context) error {
	var errs []error
	for _, dial := range a.p.nodeDialers() {
		be, err := dial(ctx)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		errs = append(errs, a.prepare(ctx, be))
		be.NC.Close()
	}
	return errors.Join(errs...)
}

// installMissing installs the users on the cluster's masters that do
// not have them yet (at this generation of the users).
func (a *aclState) installMissing(ctx context.Context) {
	for _, addr := range a.p.router.masterAddrs() {
		a.mu.Lock()
		done := a.installed[addr] == a.userGen
		a.mu.Unlock()
		if done {
			continue
		}
		be, err := a.p.dialAddr(ctx, addr, replayState{})
		if err != nil {
			continue // its connections install them when they sign in
		}
		if err := a.prepare(ctx, be); err != nil {
			a.p.log.Warn("acl: installing users", zap.String("node", addr), zap.Error(err))
		}
		be.NC.Close()
	}
}

// nodeDialers returns how to dial each node the users live on: the
// backend, or each master of a cluster.
func (p *Proxy) nodeDialers() []func(context.Context) (*backendConn, error) {
	if p.router == nil {
		return []func(context.Context) (*backendConn, error){func(ctx context.Context) (*backendConn, error) {
			return p.dial(ctx, replayState{})
		}}
	}
	var out []func(context.Context) (*backendConn, error)
	for _, addr := range p.router.masterAddrs() {
		out = append(out, func(ctx context.Context) (*backendConn, error) {
			return p.dialAddr(ctx, addr, replayState{})
		})
	}
	return out
}

// prepare installs the configuration's users on be's node if they have
// not been since the proxy started or they last changed. be is signed in
// as the proxy.
func (a *aclState) prepare(ctx context.Context, be *backendConn) error {
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
		if err := a.install(ctx, be, u); err != nil {
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
func (a *aclState) userList() []*aclUser {
	out := make([]*aclUser, 0, len(a.users))
	for _, u := range a.users {
		out = append(out, u)
	}
	return out
}

// install runs u's ACL SETUSER on be.
func (a *aclState) install(ctx context.Context, be *backendConn, u *aclUser) error {
	r, err := be.Call(ctx, u.setuser)
	if err != nil {
		return err
	}
	if r[0] == '-' {
		return fmt.Errorf("acl: installing user %q: %s", u.name, strings.TrimSpace(string(r[1:])))
	}
	return nil
}

// ensure installs on be's node the configuration's users it lacks (it
// restarted empty, or a user was deleted there): a user's sign-in found
// it missing.
func (a *aclState) ensure(ctx context.Context, be *backendConn, name string) error {
	u := a.user(name)
	if u == nil {
		return nil
	}
	r, err := be.Call(ctx, command("ACL", "GETUSER", name))
	if err != nil {
		return err
	}
	if r[0] != '*' || bytes.HasPrefix(r, []byte("*-1")) {
		return a.install(ctx, be, u)
	}
	return nil
}

// signIn sends the user's AUTH on be, a connection signed in as the
// proxy, installing the user first where it is missing. It returns the
// backend's reply.
func (a *aclState) signIn(ctx context.Context, be *backendConn, auth []byte) ([]byte, error) {
	if err := a.prepare(ctx, be); err != nil {
		a.p.log.Warn("acl: installing users", zap.Error(err))
	}
	r, err := be.Call(ctx, auth)
	if err != nil || !bytes.HasPrefix(r, []byte("-WRONGPASS")) {
		return r, err
	}
	user := authUser(auth)
	if a.user(user) == nil {
		return r, nil
	}
	if err := a.ensure(ctx, be, user); err != nil {
		a.p.log.Warn("acl: installing a user", zap.Error(err))
		return r, nil
	}
	return be.Call(ctx, auth)
}

// setup brings be, a new connection signed in as the proxy, to state,
// whose first command is a user's AUTH (under Redis's ACL at the proxy).
func (a *aclState) setup(ctx context.Context, be *backendConn, cmds [][]byte) error {
	if len(cmds) == 0 {
		return nil
	}
	r, err := a.signIn(ctx, be, cmds[0])
	if err != nil {
		return err
	}
	if r[0] == '-' {
		return &userRefusedError{backend.RefusedError{Command: "AUTH", Reply: strings.TrimSpace(string(r[1:]))}}
	}
	if len(cmds) == 1 {
		return nil
	}
	return be.Setup(ctx, cmds[1:])
}

// dialSetup brings be, just dialled, to state under Redis's ACL: the
// proxy's own setup, then the user's AUTH and the rest.
func (a *aclState) dialSetup(ctx context.Context, be *backendConn, own [][]byte, state replayState) error {
	if len(own) > 0 {
		if err := be.Setup(ctx, own); err != nil {
			return err
		}
	}
	return a.setup(ctx, be, state.commands(nil))
}

// userRefusedError is a backend.RefusedError of a user's AUTH: the backend is up,
// and the other clients' connections need no backoff.
type userRefusedError struct{ backend.RefusedError }

func (e *userRefusedError) Unwrap() error { return &e.RefusedError }

// userRefused reports whether err is a user's AUTH the backend refused.
func userRefused(err error) bool {
	var u *userRefusedError
	return errors.As(err, &u)
}

// authenticate checks a user's password with the backend: nil when it
// signs in, else Redis's reply.
func (a *aclState) authenticate(ctx context.Context, auth []byte) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, a.p.cfg.Backend.DialTimeout)
	defer cancel()
	be, err := a.p.dialAny(ctx, replayState{})
	if err != nil {
		return nil, err
	}
	defer be.NC.Close()
	if a.p.router != nil {
		a.installMissing(ctx)
	}
	a.learnVersion(ctx, be)
	r, err := a.signIn(ctx, be, auth)
	if err != nil {
		return nil, err
	}
	if r[0] == '-' {
		return r, nil
	}
	return nil, nil
}

// group returns the shared connections of a user signed in with auth
// (AUTH <user> <password>), made at its first sign-in.
func (a *aclState) group(name string, auth []byte) *muxGroup {
	a.mu.Lock()
	defer a.mu.Unlock()
	g := a.groups[name]
	if g == nil {
		n := len(a.p.shared)
		g = &aclGroup{grp: newMuxGroup(a.p, "", n)}
		g.grp.acl = g
		a.groups[name] = g
		list := append(append([]*muxGroup(nil), *a.groupList.Load()...), g.grp)
		a.groupList.Store(&list)
	}
	g.auth.Store(&auth)
	return g.grp
}

// pick hands out g's connections in turn.
func (g *aclGroup) pick() *muxConn {
	return g.grp.list[g.next.Add(1)%uint64(len(g.grp.list))]
}

// closeGroups closes the users' shared connections.
func (a *aclState) closeGroups() {
	for _, g := range *a.groupList.Load() {
		for _, sh := range g.list {
			sh.close()
		}
	}
	a.ctlMu.Lock()
	a.ctlClosed = true
	for _, be := range a.ctlIdle {
		be.NC.Close()
	}
	a.ctlIdle = nil
	a.ctlMu.Unlock()
}

// queued counts the commands waiting on the shared connections to one
// Redis, every user's.
func (a *aclState) queued(g *muxGroup) int64 {
	n := g.queued.Load()
	if g != a.p.group && g.acl == nil {
		return n // a cluster master's
	}
	if g != a.p.group {
		n += a.p.group.queued.Load()
	}
	for _, o := range *a.groupList.Load() {
		if o != g {
			n += o.queued.Load()
		}
	}
	return n
}

// writeQueued writes what waits on the shared connections to one Redis,
// every user's, the batch that waited longest first.
func (a *aclState) writeQueued(limit uint64) {
	for {
		oldest, first := oldestIn(a.p.group, nil, limit+1)
		for _, g := range *a.groupList.Load() {
			oldest, first = oldestIn(g, oldest, first)
		}
		if oldest == nil {
			return
		}
		oldest.writeWaiting(limit)
	}
}

// oldestIn returns the connection of g whose batch waits since before
// first, the longest-waiting, or oldest and first when none does.
func oldestIn(g *muxGroup, oldest *muxConn, first uint64) (*muxConn, uint64) {
	if g.queued.Load() == 0 {
		return oldest, first
	}
	for _, sh := range g.list {
		if since := sh.since.Load(); since != 0 && since < first {
			oldest, first = sh, since
		}
	}
	return oldest, first
}

// verdict returns the refusal of user's access to resource (write or
// read) as Redis's ACL DRYRUN tells, nil when allowed.
func (a *aclState) verdict(ctx context.Context, user string, resource []byte, write bool) ([]byte, error) {
	key := make([]byte, 0, len(user)+len(resource)+2)
	key = append(append(key, user...), 0, 'r')
	if write {
		key[len(key)-1] = 'w'
	}
	key = append(key, resource...)
	gen := a.gen.Load()
	cache := a.cache.Load()
	now := time.Now().UnixNano()
	if v, ok := cache.Load(string(key)); ok && v.(aclVerdict).gen == gen && now < v.(aclVerdict).until {
		return v.(aclVerdict).refused, nil
	}
	cmd := command("ACL", "DRYRUN", user, "GET", string(resource))
	if write {
		cmd = command("ACL", "DRYRUN", user, "SET", string(resource), "x")
	}
	r, err := a.control(ctx, cmd)
	if err != nil {
		return nil, err
	}
	refused := dryrunRefusal(r, a.old.Load())
	if a.gen.Load() == gen && time.Now().UnixNano() > a.settle.Load() {
		if a.cacheSize.Add(1) > maxACLCache {
			// Full: start over.
			a.cacheSize.Store(1)
			cache = &sync.Map{}
			a.cache.Store(cache)
		}
		cache.Store(string(key), aclVerdict{gen: gen, refused: refused, until: time.Now().Add(aclVerdictTTL).UnixNano()})
	}
	return refused, nil
}

// control sends cmd on a control connection, signed in as the proxy,
// and returns the reply. Up to maxControl of them are in use at once;
// one that fails is closed, and the command is tried once more on a new
// one.
func (a *aclState) control(ctx context.Context, cmd []byte) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, a.p.cfg.Backend.DialTimeout)
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
				if c, perr := redcon.Parse(cmd); perr == nil && len(c.Args) > 2 && a.user(string(c.Args[2])) != nil {
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

// maxControl bounds the control connections in use at once.
const maxControl = 4

// controlConn returns an idle control connection, or dials one.
func (a *aclState) controlConn(ctx context.Context) (*backendConn, error) {
	a.ctlMu.Lock()
	if n := len(a.ctlIdle); n > 0 {
		be := a.ctlIdle[n-1]
		a.ctlIdle = a.ctlIdle[:n-1]
		a.ctlMu.Unlock()
		return be, nil
	}
	a.ctlMu.Unlock()
	be, err := a.p.dialAny(ctx, replayState{})
	if err != nil {
		return nil, err
	}
	if err := a.prepare(ctx, be); err != nil {
		a.p.log.Warn("acl: installing users", zap.Error(err))
	}
	a.learnVersion(ctx, be)
	return be, nil
}

// learnVersion learns from be how the backend words its refusals, once.
func (a *aclState) learnVersion(ctx context.Context, be *backendConn) {
	if a.versioned.Load() {
		return
	}
	if info, err := be.Call(ctx, command("INFO", "server")); err == nil && info[0] != '-' {
		a.old.Store(oldWording(info))
		a.versioned.Store(true)
	}
}

// putControl keeps be for the next control command, or closes it once
// the proxy is shutting down.
func (a *aclState) putControl(be *backendConn) {
	a.ctlMu.Lock()
	defer a.ctlMu.Unlock()
	if a.ctlClosed {
		be.NC.Close()
		return
	}
	a.ctlIdle = append(a.ctlIdle, be)
}

// oldWording reports whether INFO server names a Redis older than 7.2,
// which words its ACL refusals differently.
func oldWording(info []byte) bool {
	_, v, ok := bytes.Cut(info, []byte("redis_version:"))
	if !ok {
		return false
	}
	var major, minor int
	fmt.Sscanf(string(v), "%d.%d", &major, &minor)
	return major < 7 || (major == 7 && minor < 2)
}

// dryrunRefusal turns the reply to ACL DRYRUN <user> SET|GET <resource>
// into Redis's -NOPERM reply to a command refused one of its keys; nil
// for +OK. The user may lack the key, the command SET or GET, or be gone
// (ACL DELUSER): the resource is refused alike.
func dryrunRefusal(r []byte, old bool) []byte {
	if bytes.HasPrefix(r, []byte("+OK")) {
		return nil
	}
	if old {
		return []byte("-NOPERM this user has no permissions to access one of the keys used as arguments\r\n")
	}
	return []byte("-NOPERM No permissions to access a key\r\n")
}

// commandRefusal is Redis's -NOPERM reply to a command user may not run,
// in the wording of the backend's version (old: before Redis 7.2).
func commandRefusal(user, name string, old bool) []byte {
	if old {
		return []byte("-NOPERM this user has no permissions to run the '" + name + "' command\r\n")
	}
	return []byte("-NOPERM User " + user + " has no permissions to run the '" + name + "' command\r\n")
}

// masterAddrs returns the masters of the slot map the proxy knows, the
// seeds before it has read one.
func (r *router) masterAddrs() []string {
	if m := r.Slots.Load(); m != nil {
		return append([]string(nil), m.Masters...)
	}
	return r.Candidates()
}
