package proxy

import (
	"bytes"
	"strings"

	"github.com/tidwall/redcon"
	"go.uber.org/zap"

	"github.com/lockproxy/lockproxy/proxy/internal/acl"
	"github.com/lockproxy/lockproxy/proxy/internal/resp"
)

// A client's side of Redis's ACL at the proxy (acl.go): who it is
// signed in as, and the hooks of its forwarder.

// aclClient is who a client is signed in as, under Redis's ACL at the
// proxy.
type aclClient struct {
	// user is the name of the ACL user the client is signed in as, ""
	// for the proxy's own backend identity (a password-only user, or
	// none yet).
	user string
	// name is the user's name for ACL WHOAMI: user, or the
	// password-only user's.
	name string
	// dirty: the client sent an ACL command that may change users; its
	// next lock command asks Redis again.
	dirty bool
}

// aclGate is forward's hook under Redis's ACL at the proxy: it answers or
// rewrites the commands that sign in (AUTH, HELLO ... AUTH, RESET), the
// ACL commands the proxy has its part in, and refuses every command
// before the client signed in. It returns done with the item to answer
// in cmd's place, or lets cmd go on (maybe rewritten).
func (s *session) aclGate(name []byte, cmd *redcon.Command) (localItem, bool) {
	args := cmd.Args
	switch string(name) {
	case "auth":
		if len(args) != 2 && len(args) != 3 {
			break // Redis's arity and syntax errors
		}
		user, pass := []byte("default"), args[len(args)-1]
		if len(args) == 3 {
			user = args[1]
		}
		return s.aclSignIn(name, cmd, user, pass)
	case "hello":
		for i := 2; i+2 < len(args); i++ {
			if strings.EqualFold(string(args[i]), "auth") {
				return s.aclSignIn(name, cmd, args[i+1], args[i+2])
			}
			if strings.EqualFold(string(args[i]), "setname") {
				i++
			}
		}
	case "reset":
		s.acl = aclClient{}
	case "acl":
		if !s.authed || len(args) < 2 {
			break
		}
		var sb [24]byte
		switch string(resp.Lower(&sb, args[1])) {
		case "whoami":
			if s.acl.user == "" && len(args) == 2 {
				return localItem{reply: redcon.AppendBulkString(nil, s.acl.name), silent: s.silent()}, true
			}
		case "setuser", "deluser", "load":
			s.p.acl.Changed()
			s.acl.dirty = true
		case "dryrun":
			if len(args) >= 4 && s.p.cfg.IsLocal != nil && s.p.cfg.IsLocal(args[3]) {
				return localItem{build: func(bool) ([]byte, error) { return s.aclDryrun(args), nil }, silent: s.silent()}, true
			}
		}
	}
	var reply, rewritten []byte
	reply, rewritten, s.authed = s.p.auth.Gate(s.authed, name, args)
	if reply != nil {
		return localItem{reply: reply, silent: s.silent()}, true
	}
	if rewritten != nil {
		cmd.Raw = rewritten
	}
	return localItem{}, false
}

// aclSignIn answers or forwards cmd, an AUTH or a HELLO with AUTH, which
// signs the client in as user.
func (s *session) aclSignIn(name []byte, cmd *redcon.Command, user, pass []byte) (localItem, bool) {
	p := s.p
	if p.auth.Has(user) {
		// A password-only user: the proxy's own identity, checked here.
		if !p.auth.Check(user, pass) {
			return localItem{reply: acl.ReplyWrongPass, silent: s.silent()}, true
		}
		was := s.acl.user
		s.authed, s.acl = true, aclClient{name: string(user)}
		if string(name) == "hello" {
			// HELLO goes on: signed in as the proxy on the client's
			// own connection.
			cmd.Raw = helloAs(cmd.Args, p.selfAuth())
			return localItem{}, false
		}
		if was == "" {
			return localItem{reply: replyOK, silent: s.silent()}, true
		}
		if s.aclMove("", nil) {
			return localItem{reply: replyOK, silent: s.silent()}, true
		}
		cmd.Raw = command(append([]string{"AUTH"}, p.selfAuth()...)...)
		return localItem{}, false
	}
	auth := command("AUTH", string(user), string(pass))
	refused, err := p.acl.authenticate(s.ctx, auth)
	if err != nil {
		p.m.unavailable.Add(1)
		return localItem{reply: resp.ErrorReply(&BackendError{Err: err}), silent: s.silent()}, true
	}
	if refused != nil {
		return localItem{reply: refused, silent: s.silent()}, true
	}
	s.authed, s.acl = true, aclClient{user: string(user), name: string(user)}
	if string(name) == "auth" && s.aclMove(string(user), auth) {
		return localItem{reply: replyOK, silent: s.silent()}, true
	}
	// On the client's own connection(s), Redis signs it in itself, and
	// the connection state learns the AUTH to replay.
	return localItem{}, false
}

// aclMove moves a client of one Redis still on its shared connection to
// the shared connections of user (auth signs them in), or to the
// proxy's own for "". It reports false when the client has connections
// of its own, on which its AUTH is forwarded instead.
func (s *session) aclMove(user string, auth []byte) bool {
	if s.cl != nil || s.sh == nil || s.dedicated {
		return false
	}
	s.settleShared() // the replies of the user before
	if user == "" {
		s.sh = s.p.pickShared()
	} else {
		s.sh = s.p.acl.group(user, auth).pick()
	}
	s.q.setAuth(auth)
	return true
}

// selfAuth is the AUTH arguments that sign a connection in as the proxy.
func (p *Proxy) selfAuth() []string {
	b := &p.cfg.Backend
	switch {
	case b.Username != "":
		return []string{b.Username, b.Password}
	case b.Password != "":
		return []string{"default", b.Password}
	}
	// The default user without a password takes any.
	return []string{"default", "lockproxy"}
}

// helloAs is HELLO args with its AUTH replaced by user and password.
func helloAs(args [][]byte, auth []string) []byte {
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		if i >= 2 && strings.EqualFold(string(args[i]), "auth") && i+2 < len(args) {
			out = append(out, "AUTH", auth[0], auth[1])
			i += 2
			continue
		}
		out = append(out, string(args[i]))
	}
	return command(out...)
}

// setAuth makes auth the AUTH a new backend connection of the client
// replays (nil: none, the proxy's identity).
func (q *replyQueue) setAuth(auth []byte) {
	q.mu.Lock()
	q.st.replay.auth = auth
	q.mu.Unlock()
}

// lockDenied checks a lock command against the client's user, as Redis
// would check a command of the category @lock whose keys are its
// resources: it returns the -NOPERM reply, or nil.
func (s *session) lockDenied(args [][]byte) []byte {
	a := s.p.acl
	if a == nil || s.acl.user == "" {
		return nil
	}
	res, write, ok := [][]byte(nil), false, true
	if f := s.p.cfg.ACL.LockResources; f != nil {
		res, write, ok = f(args)
	}
	if !ok {
		return nil // the command's arity error comes first, as in Redis
	}
	if s.acl.dirty {
		s.acl.dirty = false
		a.Changed() // what the client's own ACL command changed
	}
	var nb [24]byte
	name := string(resp.Lower(&nb, args[0]))
	if u := a.User(s.acl.user); u != nil && !u.LockAllowed(name) {
		s.aclRefused(name, "command", nil)
		return acl.CommandRefusal(s.acl.user, name, a.Old())
	}
	for _, r := range res {
		refused, err := a.Verdict(s.ctx, s.acl.user, r, write)
		if err != nil {
			return resp.ErrorReply(&BackendError{Err: err})
		}
		if refused != nil {
			s.aclRefused(name, "key", r)
			return refused
		}
	}
	return nil
}

// lockListed leaves out of reply, a lock command's that lists resources
// (LOCKS), those the client's user may not read.
func (s *session) lockListed(args [][]byte, reply []byte) []byte {
	a, f := s.p.acl, s.p.cfg.ACL.FilterListed
	if a == nil || s.acl.user == "" || f == nil {
		return reply
	}
	out, err := f(args, reply, func(res []byte) (bool, error) {
		refused, err := a.Verdict(s.ctx, s.acl.user, res, false)
		return refused == nil, err
	})
	if err != nil {
		return resp.ErrorReply(&BackendError{Err: err})
	}
	return out
}

// fencedDenied checks, for a user of Redis's ACL, FENCED's inner command
// as Redis would check it sent alone (ACL DRYRUN <user> <command>): it
// returns Redis's -NOPERM reply, or nil. The resource was checked as any
// lock command's (lockDenied). An inner command Redis does not know is
// left to FENCED's own error.
func (s *session) fencedDenied(req FencedRequest) []byte {
	a := s.p.acl
	if a == nil || s.acl.user == "" {
		return nil
	}
	args := append([][]byte{[]byte("ACL"), []byte("DRYRUN"), []byte(s.acl.user)}, req.Command...)
	r, err := a.Control(s.ctx, resp.Encode(args))
	if err != nil {
		return resp.ErrorReply(&BackendError{Err: err})
	}
	if r[0] != '$' {
		return nil // +OK, or no such command: FENCED answers that
	}
	text := r[bytes.Index(r, []byte("\r\n"))+2 : len(r)-2]
	var nb [24]byte
	s.aclRefused(string(resp.Lower(&nb, req.Command[0])), "fenced command", req.Resource)
	return acl.DryrunNoperm(text, a.Old())
}

// fencedAs signs a FENCED connection of a user of Redis's ACL in as the
// proxy, which reads and writes the fence records the user may not
// reach: the inner command was checked as the user's (fencedDenied).
func (s *session) fencedAs(st *replayState) {
	if s.p.acl != nil && s.acl.user != "" {
		st.auth = nil
	}
}

// aclRefused records a refused lock command where an operator looks: a
// log line and the refusals counter.
func (s *session) aclRefused(name, reason string, resource []byte) {
	s.p.m.aclRefused.Add(1)
	s.log.Info("acl: lock command refused", zap.String("user", s.acl.user),
		zap.String("command", name), zap.String("reason", reason), zap.ByteString("resource", resource))
}

// aclDryrun answers ACL DRYRUN <user> <lock command> ... as Redis answers
// it for its own commands: +OK, or why the user may not run it.
func (s *session) aclDryrun(args [][]byte) []byte {
	a := s.p.acl
	user := string(args[2])
	if s.acl.user != "" {
		// The caller needs ACL DRYRUN itself, as Redis tells.
		r, err := a.Control(s.ctx, command("ACL", "DRYRUN", s.acl.user, "ACL", "DRYRUN", user, "PING"))
		if err != nil {
			return resp.ErrorReply(&BackendError{Err: err})
		}
		if !bytes.HasPrefix(r, replyOK) {
			s.aclRefused("acl|dryrun", "command", nil)
			return acl.CommandRefusal(s.acl.user, "acl|dryrun", a.Old())
		}
	}
	// Redis's error for a user it does not know.
	r, err := a.Control(s.ctx, command("ACL", "DRYRUN", user, "PING"))
	if err != nil {
		return resp.ErrorReply(&BackendError{Err: err})
	}
	if r[0] == '-' {
		return r
	}
	var nb [24]byte
	name := string(resp.Lower(&nb, args[3]))
	if u := a.User(user); u != nil && !u.LockAllowed(name) {
		return acl.DryrunText(a.Old(), user, "run the '"+name+"' command")
	}
	res, write, ok := [][]byte(nil), false, true
	if f := s.p.cfg.ACL.LockResources; f != nil {
		res, write, ok = f(args[3:])
	}
	if !ok {
		return []byte("-ERR wrong number of arguments for '" + name + "' command\r\n")
	}
	for _, r := range res {
		refused, err := a.Verdict(s.ctx, user, r, write)
		if err != nil {
			return resp.ErrorReply(&BackendError{Err: err})
		}
		if refused != nil {
			return acl.DryrunText(a.Old(), user, "access the '"+string(r)+"' key")
		}
	}
	if f := s.p.cfg.Fencing; f != nil && name == "fenced" {
		// Its command, as Redis would answer for it alone.
		req, err := f.Parse(args[3:])
		if err != nil {
			return errLine(err.Error())
		}
		r, err := a.Control(s.ctx, resp.Encode(append([][]byte{[]byte("ACL"), []byte("DRYRUN"), []byte(user)}, req.Command...)))
		if err != nil {
			return resp.ErrorReply(&BackendError{Err: err})
		}
		return r
	}
	return replyOK
}
