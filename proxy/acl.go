package proxy

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/lockproxy/lockproxy/proxy/internal/acl"
	"github.com/lockproxy/lockproxy/proxy/internal/backend"
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

// aclState is the proxy's side of Redis's ACL: the rules, users and
// checks of internal/acl's Engine, and the shared connections of each
// user signed in.
type aclState struct {
	*acl.Engine
	p *Proxy

	mu        sync.Mutex
	groups    map[string]*aclGroup
	groupList atomic.Pointer[[]*backend.Group] // the groups, for writeQueued
}

// aclGroup is the shared connections of one user of Redis's ACL,
// signed in with the last password the user signed in with at the proxy.
type aclGroup struct {
	grp  *backend.Group
	auth atomic.Pointer[[]byte] // AUTH <user> <password>
	next atomic.Uint64
}

func newACLState(p *Proxy, users []*acl.User) *aclState {
	a := &aclState{p: p, groups: map[string]*aclGroup{}}
	a.Engine = acl.New(users, acl.Config{
		Dial: func(ctx context.Context) (*backend.Conn, error) {
			be, err := p.dialAny(ctx, replayState{})
			if err != nil {
				return nil, err
			}
			return be, nil
		},
		Timeout: p.cfg.Backend.DialTimeout,
		Log:     p.log,
	})
	empty := []*backend.Group{}
	a.groupList.Store(&empty)
	return a
}

// parseACLUsers parses the configuration's users.
func parseACLUsers(c *Config) ([]*acl.User, error) {
	var users []*acl.User
	seen := map[string]bool{}
	for _, line := range c.ACL.Users {
		if strings.TrimSpace(line) == "" || strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		u, err := acl.ParseUser(line, c.ACL.LockCategories)
		if err != nil {
			return nil, err
		}
		if seen[u.Name] {
			return nil, fmt.Errorf("acl: user %q is defined twice", u.Name)
		}
		seen[u.Name] = true
		if _, ok := c.Users[u.Name]; ok {
			return nil, fmt.Errorf("acl: user %q is both a password-only user and an ACL user", u.Name)
		}
		if self := c.Backend.Username; u.Name == self || (self == "" && u.Name == "default") {
			return nil, fmt.Errorf("acl: user %q is the proxy's own backend user (backend.username)", u.Name)
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
	p.acl.SetUsers(parsed)
	// Installed now where the proxy reaches, so that the change applies
	// to signed-in clients' next command.
	ctx, cancel := context.WithTimeout(p.root, 2*p.cfg.Backend.DialTimeout)
	defer cancel()
	err = p.acl.installEverywhere(ctx)
	// Again: a check made while the users were being installed saw the
	// rules before.
	p.acl.Changed()
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
		errs = append(errs, a.Prepare(ctx, be))
		be.NC.Close()
	}
	return errors.Join(errs...)
}

// installMissing installs the users on the cluster's masters that do
// not have them yet (at this generation of the users).
func (a *aclState) installMissing(ctx context.Context) {
	for _, addr := range a.p.router.masterAddrs() {
		if a.Installed(addr) {
			continue
		}
		be, err := a.p.dialAddr(ctx, addr, replayState{})
		if err != nil {
			continue // its connections install them when they sign in
		}
		if err := a.Prepare(ctx, be); err != nil {
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

// setup brings be, a new connection signed in as the proxy, to state,
// whose first command is a user's AUTH (under Redis's ACL at the proxy).
func (a *aclState) setup(ctx context.Context, be *backendConn, cmds [][]byte) error {
	if len(cmds) == 0 {
		return nil
	}
	r, err := a.SignIn(ctx, be, cmds[0])
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
	a.LearnVersion(ctx, be)
	r, err := a.SignIn(ctx, be, auth)
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
func (a *aclState) group(name string, auth []byte) *aclGroup {
	a.mu.Lock()
	defer a.mu.Unlock()
	g := a.groups[name]
	if g == nil {
		n := len(a.p.shared)
		g = &aclGroup{}
		g.grp = a.p.newMuxGroup("", n, g)
		a.groups[name] = g
		list := append(append([]*backend.Group(nil), *a.groupList.Load()...), g.grp)
		a.groupList.Store(&list)
	}
	g.auth.Store(&auth)
	return g
}

// pick hands out g's connections in turn.
func (g *aclGroup) pick() *backend.Mux {
	list := g.grp.List()
	return list[g.next.Add(1)%uint64(len(list))]
}

// closeGroups closes the users' shared connections.
func (a *aclState) closeGroups() {
	for _, g := range *a.groupList.Load() {
		for _, sh := range g.List() {
			sh.Close()
		}
	}
	a.Close()
}

// queued counts the commands waiting on the shared connections to one
// Redis, every user's.
func (a *aclState) queued(g *backend.Group) int64 {
	n := g.Queued()
	if g.Addr() != "" {
		return n // a cluster master's
	}
	if g != a.p.group {
		n += a.p.group.Queued()
	}
	for _, o := range *a.groupList.Load() {
		if o != g {
			n += o.Queued()
		}
	}
	return n
}

// writeQueued writes what waits on the shared connections to one Redis,
// every user's, the batch that waited longest first.
func (a *aclState) writeQueued(limit uint64) {
	for {
		oldest, first := a.p.group.Oldest(nil, limit+1)
		for _, g := range *a.groupList.Load() {
			oldest, first = g.Oldest(oldest, first)
		}
		if oldest == nil {
			return
		}
		oldest.WriteWaiting(limit)
	}
}

// masterAddrs returns the masters of the slot map the proxy knows, the
// seeds before it has read one.
func (r *router) masterAddrs() []string {
	if m := r.Slots.Load(); m != nil {
		return append([]string(nil), m.Masters...)
	}
	return r.Candidates()
}
