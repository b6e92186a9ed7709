package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/proxy/internal/cluster"
	"github.com/lockproxy/lockproxy/proxy/internal/fenced"
	"github.com/lockproxy/lockproxy/proxy/internal/resp"
)

// FENCED resource fence [PERMIT slot] command [arg ...] runs command on the
// backend only when fence is not below the resource's fence record, a key
// of the proxy's in the database (and, in front of a cluster, the hash
// slot) the command runs in. A write raises the record to fence, a read
// only checks it. The transaction that does it is internal/fenced's
// (Exec); here the session checks what FENCED runs against the backend's
// COMMAND table, and keeps the connections it runs on, one per node, in
// the client's state.

// Fencing runs FENCED (Config.Fencing). Both functions are called
// concurrently by many clients and must be safe for that.
type Fencing struct {
	// Parse splits FENCED's arguments (args[0] is FENCED itself), or
	// returns the -ERR reply's text ("ERR ...") for arguments that are
	// wrong whatever the inner command.
	Parse func(args [][]byte) (FencedRequest, error)
	// Done is told the outcome of each FENCED.
	Done func(FencedOutcome)
}

// FencedRequest is a parsed FENCED.
type FencedRequest = fenced.Request

// FencedOutcome is what became of one FENCED.
type FencedOutcome = fenced.Outcome

// The outcomes of FENCED.
const (
	FencedAccepted   = fenced.Accepted   // the command ran
	FencedStale      = fenced.Stale      // -STALEFENCE, nothing ran
	FencedError      = fenced.Failed     // the backend was unavailable or refused the command before running it
	FencedBadRequest = fenced.BadRequest // -ERR before anything was sent
)

// FencePrefix starts the name of every fence record. Forwarded commands
// cannot reach keys with this prefix (guardRecords).
const FencePrefix = fenced.Prefix

// RecordError refuses a command that would change a fence record: only
// FENCED changes them.
type RecordError = fenced.RecordError

// fencedState is the proxy's part of FENCED: the backend's COMMAND table
// when the backend is one Redis (a cluster's is the router's).
type fencedState struct {
	table resp.Table
}

// fencedItem is the localItem of a FENCED, or ok false when the proxy
// does not run FENCED.
func (s *session) fencedItem(name []byte, args [][]byte) (localItem, bool) {
	if s.p.cfg.Fencing == nil || string(name) != "fenced" {
		return localItem{}, false
	}
	return localItem{fenced: args, silent: s.silent()}, true
}

// cmdName is the name of the command it answers.
func (it *localItem) cmdName() []byte {
	if it.fenced != nil {
		return it.fenced[0]
	}
	return it.args[0]
}

// fenced answers a FENCED once every reply before it has reached the
// client, which is when the commands sent before it have run.
func (s *session) fenced(args [][]byte) []byte {
	f := s.p.cfg.Fencing
	req, err := f.Parse(args)
	if err != nil {
		f.Done(FencedBadRequest)
		return errLine(err.Error())
	}
	if reply := s.fencedDenied(req); reply != nil {
		f.Done(FencedError)
		return reply
	}
	reply, outcome := s.runFenced(s.commandContext(), req)
	f.Done(outcome)
	// Its write went on another connection than the client's: a WAIT
	// after it marks the client's own first (see waitMark).
	s.waitStale = true
	return reply
}

// errLine is the error reply with the text msg ("ERR ...", "STALEFENCE ...").
func errLine(msg string) []byte {
	return append(append([]byte{'-'}, msg...), '\r', '\n')
}

// runFenced checks what FENCED runs, refusing before anything is sent
// what it never runs, and runs it.
func (s *session) runFenced(ctx context.Context, req FencedRequest) ([]byte, FencedOutcome) {
	pl := fenced.Plan{Req: req, Slot: cluster.NoSlot}
	var nb [24]byte
	name := resp.Lower(&nb, req.Command[0])
	pl.Name = string(name)
	if why, ok := fenced.Refuses(pl.Name); ok || (s.p.cfg.IsLocal != nil && s.p.cfg.IsLocal(req.Command[0])) {
		if !ok {
			why = "the proxy's own command"
		}
		return errLine(fmt.Sprintf("ERR FENCED cannot run '%s': %s", pl.Name, why)), FencedBadRequest
	}
	pl.Raw = resp.Encode(req.Command)
	table, err := s.p.fencedCommands(ctx)
	if err != nil {
		return s.p.fencedUnavailable(err), FencedError
	}
	spec, known := resp.LookupSpec(table, name, req.Command)
	if !known || !fenced.ArityOK(spec.Arity, len(req.Command)) {
		// Redis's own error for an unknown command, subcommand or a
		// wrong number of arguments.
		return fenced.Probe(ctx, s.fencedEnv(), &pl)
	}
	if fenced.Blocking(pl.Name, spec, req.Command) {
		return errLine(fmt.Sprintf("ERR FENCED cannot run '%s': a command that can block", pl.Name)), FencedBadRequest
	}
	switch pl.Name {
	case "eval", "evalsha", "fcall":
		pl.Write = true
	case "eval_ro", "evalsha_ro", "fcall_ro":
	default:
		pl.Write = spec.Write
	}
	keys, reply := s.fencedKeys(ctx, &pl, spec)
	if reply != nil {
		return reply, FencedBadRequest
	}
	if len(keys) == 0 {
		return errLine(fmt.Sprintf("ERR FENCED needs a command with keys: '%s' has none here", pl.Name)), FencedBadRequest
	}
	pl.Keys = keys
	for _, k := range keys {
		if bytes.HasPrefix(k, []byte(FencePrefix)) && (pl.Write || !spec.Readonly) {
			return resp.ErrorReply(&RecordError{Key: string(k)}), FencedBadRequest
		}
	}
	if s.p.guard != nil {
		if err := s.p.guardCheck(name, req.Command); err != nil {
			return resp.ErrorReply(err), FencedBadRequest
		}
	}
	if s.cl != nil {
		pl.Slot = cluster.KeySlot(keys[0])
		for _, k := range keys[1:] {
			if cluster.KeySlot(k) != pl.Slot {
				return cluster.ReplyCrossSlot, FencedError
			}
		}
	}
	pl.Record = fenced.RecordKey(req.Resource, req.Slot, pl.Slot)
	return fenced.Exec(ctx, s.fencedEnv(), &pl)
}

// fencedKeys returns the inner command's keys, or the reply to give
// instead (Redis's own errors for a script's bad numkeys).
func (s *session) fencedKeys(ctx context.Context, pl *fenced.Plan, spec resp.KeySpec) ([][]byte, []byte) {
	args := pl.Req.Command
	if resp.Lookup([]byte(pl.Name)).Has(resp.NumKeys) {
		n, err := strconv.ParseInt(string(args[2]), 10, 64)
		switch {
		case err != nil:
			return nil, []byte("-ERR value is not an integer or out of range\r\n")
		case n < 0:
			return nil, []byte("-ERR Number of keys can't be negative\r\n")
		case n > int64(len(args)-3):
			return nil, []byte("-ERR Number of keys can't be greater than number of args\r\n")
		}
		return args[3 : 3+n], nil
	}
	if s.cl != nil || spec.Movable {
		keys, err := s.p.commandKeys(ctx, pl.Name, args, spec)
		if err != nil {
			return nil, s.p.fencedUnavailable(err)
		}
		return keys, nil
	}
	return spec.Keys(nil, args), nil
}

// fencedCommands returns the backend's COMMAND table.
func (p *Proxy) fencedCommands(ctx context.Context) (map[string]resp.KeySpec, error) {
	if p.router != nil {
		return p.router.Commands(ctx)
	}
	return p.fence.table.Get(ctx, func(ctx context.Context) (any, error) {
		c, err := p.controlClient()
		if err != nil {
			return nil, err
		}
		defer c.Close()
		return c.Do(ctx, "COMMAND").Result()
	})
}

// controlClient returns a client of the backend (the primary a Sentinel
// names), for the COMMAND table and COMMAND GETKEYS; the caller closes it.
func (p *Proxy) controlClient() (*redis.Client, error) {
	addr := p.cfg.Backend.Addr
	if p.follow != nil {
		a, _, err := p.follow.Target()
		if err != nil {
			return nil, err
		}
		addr = a
	}
	opt := p.cfg.Backend.controlOptions(addr)
	opt.DB = p.cfg.Backend.DB
	return redis.NewClient(opt), nil
}

// commandKeys returns a command's keys as Redis finds them: in front of a
// cluster as the router routes it; else at the table's positions, or with
// COMMAND GETKEYS for a command whose keys move. Arguments Redis would
// refuse have no keys.
func (p *Proxy) commandKeys(ctx context.Context, name string, args [][]byte, spec resp.KeySpec) ([][]byte, error) {
	if p.router != nil {
		return p.router.Keys(ctx, nil, []byte(name), args)
	}
	if !spec.Movable {
		return spec.Keys(nil, args), nil
	}
	if keys, ok := resp.MovableKeys([]byte(name), args); ok {
		return keys, nil // MIGRATE: no password to COMMAND GETKEYS
	}
	c, err := p.controlClient()
	if err != nil {
		return nil, err
	}
	defer c.Close()
	q := make([]any, 0, len(args)+2)
	q = append(q, "COMMAND", "GETKEYS")
	for _, a := range args {
		q = append(q, a)
	}
	keys, err := c.Do(ctx, q...).StringSlice()
	var rerr redis.Error
	if errors.As(err, &rerr) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	out := make([][]byte, len(keys))
	for i, k := range keys {
		out[i] = []byte(k)
	}
	return out, nil
}

// guardRecords refuses a forwarded command that may change a fence record
// (a command that is not read-only, naming one as a key), whatever
// guard_backend says. Arguments are scanned for the prefix first, so
// that a command that names none costs no table lookup; a command whose
// keys move and that has such an argument is refused without asking
// where its keys are.
func (p *Proxy) guardRecords(name []byte, args [][]byte) error {
	hit := -1
	for i := 1; i < len(args); i++ {
		if len(args[i]) >= len(FencePrefix) && bytes.HasPrefix(args[i], []byte(FencePrefix)) {
			hit = i
			break
		}
	}
	if hit < 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(p.root, p.cfg.Backend.DialTimeout)
	defer cancel()
	table, err := p.fencedCommands(ctx)
	if err != nil {
		return &BackendError{Err: err}
	}
	spec, ok := resp.LookupSpec(table, name, args)
	if !ok {
		return nil // Redis answers it with its error
	}
	return fenced.GuardSpec(spec, args, hit)
}

// fencedConn is a connection a session runs its FENCED transactions on,
// and the client's state it was brought to.
type fencedConn struct {
	*fenced.Conn
	st replayState
}

// fencedConns are a session's fencedConns, by address ("" for one Redis
// or the Sentinel's primary). Only the session's forwarder uses them.
type fencedConns map[string]*fencedConn

func (fc fencedConns) close() {
	for _, c := range fc {
		c.Close()
	}
}

// fencedConn returns the session's connection to addr in its current
// state, dialling one if it has none, or none in that state.
func (s *session) fencedConn(ctx context.Context, addr string) (*fenced.Conn, bool, error) {
	var st replayState
	if s.cl != nil {
		st = s.cst.st.replay
	} else {
		st = s.q.replay()
	}
	s.fencedAs(&st)
	if c := s.fc[addr]; c != nil {
		if sameReplay(&c.st, &st) {
			return c.Conn, true, nil
		}
		c.Close()
		delete(s.fc, addr)
	}
	var be *backendConn
	var err error
	if s.cl != nil {
		be, err = s.p.dialAddr(ctx, addr, st)
	} else {
		be, err = s.p.dial(ctx, st)
	}
	if err != nil {
		return nil, false, err
	}
	if s.fc == nil {
		s.fc = fencedConns{}
	}
	c := &fencedConn{Conn: fenced.NewConn(be), st: st}
	s.fc[addr] = c
	return c.Conn, false, nil
}

// dropFenced closes the session's FENCED connection to addr.
func (s *session) dropFenced(addr string) {
	if c := s.fc[addr]; c != nil {
		c.Close()
		delete(s.fc, addr)
	}
}

// sameReplay reports whether two replay states are the same state.
func sameReplay(a, b *replayState) bool {
	return bytes.Equal(a.auth, b.auth) && bytes.Equal(a.hello, b.hello) && bytes.Equal(a.name, b.name) &&
		bytes.Equal(a.db, b.db) && bytes.Equal(a.noEvict, b.noEvict) && bytes.Equal(a.noTouch, b.noTouch)
}

// fencedEnv is what internal/fenced needs of the session to run a FENCED,
// made once per session.
func (s *session) fencedEnv() *fenced.Env {
	if s.fenv != nil {
		return s.fenv
	}
	env := &fenced.Env{
		Follow:      s.p.follow,
		Conn:        s.fencedConn,
		Drop:        s.dropFenced,
		Unavailable: s.p.fencedUnavailable,
		Retry:       s.p.cfg.Backend.ClusterRetry,
	}
	if s.cl != nil {
		env.Router = s.p.router.Router.Router
	}
	s.fenv = env
	return env
}

// fencedUnavailable counts a FENCED the backend could not be reached for,
// and returns its reply.
func (p *Proxy) fencedUnavailable(err error) []byte {
	p.m.unavailable.Add(1)
	return resp.ErrorReply(&BackendError{Err: err})
}
