package proxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tidwall/redcon"

	"github.com/lockproxy/lockproxy/proxy/internal/cluster"
	"github.com/lockproxy/lockproxy/proxy/internal/resp"
)

// FENCED resource fence [PERMIT slot] command [arg ...] runs command on the
// backend only when fence is not below the resource's fence record, a key
// of the proxy's in the database (and, in front of a cluster, the hash
// slot) the command runs in. A write raises the record to fence, a read
// only checks it.
//
// How: the check, the record's update and the command are one
// optimistic transaction on a backend connection of the proxy's own,
// brought to the client's state (user, protocol, database, name):
//
//	WATCH record; GET record            (one round trip)
//	MULTI; SET record fence; command; EXEC   (a second one)
//
// or UNWATCH after a GET that shows a larger record (-STALEFENCE). EXEC's
// null reply (the record changed after WATCH) sends it all again. The
// command's reply is the element of EXEC's reply that answers it, which
// Redis encodes exactly as it would answer the command alone, in the
// connection's protocol: no reply is converted, unlike a Lua script's
// (RESP3 maps reordered, arrays cut at a nil, integers past 2^53
// rounded, EVAL and FCALL impossible inside a script). The client's own
// connection never sees WATCH, MULTI or EXEC, so its own WATCH and
// transaction state stay as they are. docs/PROTOCOL.md argues the choice.

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
type FencedRequest struct {
	Resource []byte
	Fence    int64
	Slot     int64    // the PERMIT slot, -1 without PERMIT
	Command  [][]byte // the command to run, its name first
}

// FencedOutcome is what became of one FENCED.
type FencedOutcome int

// The outcomes of FENCED.
const (
	FencedAccepted   FencedOutcome = iota // the command ran
	FencedStale                           // -STALEFENCE, nothing ran
	FencedError                           // the backend was unavailable or refused the command before running it
	FencedBadRequest                      // -ERR before anything was sent
)

// FencePrefix starts the name of every fence record. Forwarded commands
// cannot reach keys with this prefix (guardRecords).
const FencePrefix = "lockproxy:fence:"

// fencedTries bounds how often a FENCED is sent again after its EXEC
// found the record changed by another FENCED meanwhile.
const fencedTries = 64

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

// refusedInner are the commands FENCED never runs, whatever the COMMAND
// table says, and why.
var refusedInner = map[string]string{
	"multi": "a transaction command", "exec": "a transaction command", "discard": "a transaction command",
	"watch": "a transaction command", "unwatch": "a transaction command",
	"subscribe": "a subscription", "psubscribe": "a subscription", "ssubscribe": "a subscription",
	"unsubscribe": "a subscription", "punsubscribe": "a subscription", "sunsubscribe": "a subscription",
	"monitor": "MONITOR", "sync": "replication", "psync": "replication", "replconf": "replication",
	"wait": "a command that can block", "waitaof": "a command that can block",
	"fenced": "the proxy's own command",
}

// fencedPlan is what a FENCED runs, once its arguments are checked.
type fencedPlan struct {
	req    FencedRequest
	name   string // the inner command's, lower case
	raw    []byte // the inner command, encoded
	write  bool
	keys   [][]byte
	slot   int // the keys' hash slot in front of a cluster, else cluster.NoSlot
	record []byte
	// refusedReply is set to the error that refused the command before
	// it ran.
	refusedReply []byte
}

// runFenced checks what FENCED runs, refusing before anything is sent
// what it never runs, and runs it.
func (s *session) runFenced(ctx context.Context, req FencedRequest) ([]byte, FencedOutcome) {
	pl := fencedPlan{req: req, slot: cluster.NoSlot}
	var nb [24]byte
	name := resp.Lower(&nb, req.Command[0])
	pl.name = string(name)
	if why, ok := refusedInner[pl.name]; ok || (s.p.cfg.IsLocal != nil && s.p.cfg.IsLocal(req.Command[0])) {
		if !ok {
			why = "the proxy's own command"
		}
		return errLine(fmt.Sprintf("ERR FENCED cannot run '%s': %s", pl.name, why)), FencedBadRequest
	}
	pl.raw = encodeCommand(req.Command)
	table, err := s.p.fencedCommands(ctx)
	if err != nil {
		s.p.m.unavailable.Add(1)
		return resp.ErrorReply(&BackendError{Err: err}), FencedError
	}
	spec, known := resp.LookupSpec(table, name, req.Command)
	if !known || !arityOK(spec.Arity, len(req.Command)) {
		// Redis's own error for an unknown command, subcommand or a
		// wrong number of arguments.
		return s.fencedProbe(ctx, pl)
	}
	if blockingCall(pl.name, spec, req.Command) {
		return errLine(fmt.Sprintf("ERR FENCED cannot run '%s': a command that can block", pl.name)), FencedBadRequest
	}
	switch pl.name {
	case "eval", "evalsha", "fcall":
		pl.write = true
	case "eval_ro", "evalsha_ro", "fcall_ro":
	default:
		pl.write = spec.Write
	}
	keys, reply := s.fencedKeys(ctx, &pl, spec)
	if reply != nil {
		return reply, FencedBadRequest
	}
	if len(keys) == 0 {
		return errLine(fmt.Sprintf("ERR FENCED needs a command with keys: '%s' has none here", pl.name)), FencedBadRequest
	}
	pl.keys = keys
	for _, k := range keys {
		if bytes.HasPrefix(k, []byte(FencePrefix)) && (pl.write || !spec.Readonly) {
			return resp.ErrorReply(&RecordError{Key: string(k)}), FencedBadRequest
		}
	}
	if s.p.guard != nil {
		if err := s.p.guard.check(name, req.Command); err != nil {
			return resp.ErrorReply(err), FencedBadRequest
		}
	}
	if s.cl != nil {
		pl.slot = cluster.KeySlot(keys[0])
		for _, k := range keys[1:] {
			if cluster.KeySlot(k) != pl.slot {
				return cluster.ReplyCrossSlot, FencedError
			}
		}
	}
	pl.record = recordKey(req.Resource, req.Slot, pl.slot)
	return s.execFenced(ctx, &pl)
}

// arityOK reports whether n arguments (the name included) fit arity as
// COMMAND reports it: exactly arity, or at least -arity.
func arityOK(arity, n int) bool {
	if arity >= 0 {
		return n == arity
	}
	return n >= -arity
}

// blockingCall reports whether a command can block: flagged so, except
// XREAD and XREADGROUP, which block only with BLOCK.
func blockingCall(name string, spec resp.KeySpec, args [][]byte) bool {
	switch name {
	case "xread", "xreadgroup":
		for _, a := range args[1:] {
			if bytes.EqualFold(a, []byte("streams")) {
				return false
			}
			if bytes.EqualFold(a, []byte("block")) {
				return true
			}
		}
		return false
	}
	return spec.Blocking
}

// fencedKeys returns the inner command's keys, or the reply to give
// instead (Redis's own errors for a script's bad numkeys).
func (s *session) fencedKeys(ctx context.Context, pl *fencedPlan, spec resp.KeySpec) ([][]byte, []byte) {
	args := pl.req.Command
	if resp.Lookup([]byte(pl.name)).Has(resp.NumKeys) {
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
		keys, err := s.p.commandKeys(ctx, pl.name, args, spec)
		if err != nil {
			s.p.m.unavailable.Add(1)
			return nil, resp.ErrorReply(&BackendError{Err: err})
		}
		return keys, nil
	}
	return specKeys(nil, spec, args), nil
}

// specKeys appends the keys at the positions spec gives.
func specKeys(dst [][]byte, spec resp.KeySpec, args [][]byte) [][]byte {
	if spec.First <= 0 {
		return dst
	}
	last := spec.Last
	if last < 0 {
		last += len(args)
	}
	step := max(spec.Step, 1)
	for i := spec.First; i <= last && i < len(args); i += step {
		dst = append(dst, args[i])
	}
	return dst
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
		return specKeys(nil, spec, args), nil
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

// recordKey is the name of a fence record: the resource's, or one of its
// semaphore slots' (permit >= 0); in front of a cluster (slot >= 0) with
// a hash tag that puts it in the hash slot of the command's keys.
func recordKey(resource []byte, permit int64, slot int) []byte {
	b := make([]byte, 0, len(FencePrefix)+len(resource)+16)
	b = append(b, FencePrefix...)
	if slot >= 0 {
		b = append(b, '{')
		b = append(b, slotTags()[slot]...)
		b = append(b, '}')
	}
	if permit >= 0 {
		b = append(b, 'p')
		b = strconv.AppendInt(b, permit, 10)
	} else {
		b = append(b, 'r')
	}
	b = append(b, ':')
	return append(b, resource...)
}

// slotTags are, for each hash slot, a short string whose hash slot it is.
var slotTags = sync.OnceValue(func() *[cluster.NumSlots]string {
	var tags [cluster.NumSlots]string
	left := cluster.NumSlots
	for i := 0; left > 0; i++ {
		t := strconv.FormatInt(int64(i), 36)
		slot := cluster.KeySlot([]byte(t))
		if tags[slot] == "" {
			tags[slot] = t
			left--
		}
	}
	return &tags
})

// encodeCommand encodes args as a RESP request.
func encodeCommand(args [][]byte) []byte {
	n := 16
	for _, a := range args {
		n += len(a) + 16
	}
	b := redcon.AppendArray(make([]byte, 0, n), len(args))
	for _, a := range args {
		b = redcon.AppendBulk(b, a)
	}
	return b
}

// RecordError refuses a command that would change a fence record: only
// FENCED changes them.
type RecordError struct{ Key string }

func (e *RecordError) Error() string {
	return fmt.Sprintf("key '%s' is a fence record: only FENCED changes it", e.Key)
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
	return guardSpec(spec, args, hit)
}

// guardSpec refuses args, whose argument hit has the records' prefix,
// unless the command only reads or names no record as a key.
func guardSpec(spec resp.KeySpec, args [][]byte, hit int) error {
	if spec.Readonly {
		return nil
	}
	if spec.Movable {
		return &RecordError{Key: string(args[hit])}
	}
	for _, k := range specKeys(nil, spec, args) {
		if bytes.HasPrefix(k, []byte(FencePrefix)) {
			return &RecordError{Key: string(k)}
		}
	}
	return nil
}

// fencedConn is a backend connection of the proxy's own that runs a
// client's FENCED transactions, in the client's state.
type fencedConn struct {
	be *backendConn
	st replayState
	// watched is the WATCH in effect after the last FENCED, whose GET
	// read prefetch (nil: no record), or nil; watching: a WATCH may be in
	// effect.
	watched, prefetch []byte
	watching          bool
	// The replies read last (readReplies), reused.
	buf     bytes.Buffer
	w       *bufio.Writer
	ends    []int
	replies [][]byte
}

// fencedConns are a session's fencedConns, by address ("" for one Redis
// or the Sentinel's primary). Only the session's forwarder uses them.
type fencedConns map[string]*fencedConn

func (fc fencedConns) close() {
	for _, c := range fc {
		c.be.NC.Close()
	}
}

// fencedConn returns the session's connection to addr in its current
// state, dialling one if it has none, or none in that state.
func (s *session) fencedConn(ctx context.Context, addr string) (*fencedConn, bool, error) {
	var st replayState
	if s.cl != nil {
		st = s.cl.st.replay
	} else {
		st = s.q.replay()
	}
	s.fencedAs(&st)
	if c := s.fc[addr]; c != nil {
		if sameReplay(&c.st, &st) {
			return c, true, nil
		}
		c.be.NC.Close()
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
	c := &fencedConn{be: be, st: st}
	s.fc[addr] = c
	return c, false, nil
}

func (s *session) dropFenced(addr string) {
	if c := s.fc[addr]; c != nil {
		c.be.NC.Close()
		delete(s.fc, addr)
	}
}

// sameReplay reports whether two replay states are the same state.
func sameReplay(a, b *replayState) bool {
	return bytes.Equal(a.auth, b.auth) && bytes.Equal(a.hello, b.hello) && bytes.Equal(a.name, b.name) &&
		bytes.Equal(a.db, b.db) && bytes.Equal(a.noEvict, b.noEvict) && bytes.Equal(a.noTouch, b.noTouch)
}

// Commands of the transaction.
var (
	cmdExec    = command("EXEC")
	cmdUnwatch = command("UNWATCH")
)

// fenceResult is what one attempt of a FENCED transaction came to.
type fenceResult int

const (
	fenceDone     fenceResult = iota // reply is the client's
	fenceStale                       // record is above the fence
	fenceAgain                       // EXEC found the record changed: try again
	fenceRedirect                    // the cluster sent it elsewhere (redirect)
	fenceLost                        // the connection failed before anything of it ran
)

// execFenced runs the plan's transaction until it is done, refused, or
// out of tries or time.
func (s *session) execFenced(ctx context.Context, pl *fencedPlan) ([]byte, FencedOutcome) {
	deadline := time.Now().Add(s.p.cfg.Backend.ClusterRetry)
	addr, asking := "", false
	var gen uint64
	lost := false
	for again := 0; again < fencedTries; {
		if s.cl != nil && !asking {
			m, err := s.cl.r.Current(ctx)
			if err != nil {
				s.p.m.unavailable.Add(1)
				return resp.ErrorReply(&BackendError{Err: err}), FencedError
			}
			gen = m.Gen
			if addr = m.Master(pl.slot); addr == "" {
				if !s.fencedPause(ctx, deadline) {
					return []byte("-CLUSTERDOWN Hash slot not served\r\n"), FencedError
				}
				s.cl.r.Reload(ctx, gen)
				continue
			}
		}
		c, reused, err := s.fencedConn(ctx, addr)
		if err != nil {
			s.p.m.unavailable.Add(1)
			if s.cl != nil {
				s.cl.r.Reload(ctx, gen)
			}
			return resp.ErrorReply(&BackendError{Err: err}), FencedError
		}
		res, reply, record, redir, err := s.attempt(ctx, c, pl, asking)
		if err != nil {
			s.dropFenced(addr)
			if res == fenceLost && reused && !lost {
				// A connection that broke while unused (a failover, a
				// restart): nothing of this FENCED ran; once more on a
				// new one.
				lost = true
				continue
			}
			s.p.m.unavailable.Add(1)
			return resp.ErrorReply(&BackendError{Err: err}), FencedError
		}
		asking = false
		switch res {
		case fenceDone:
			if len(reply) > 0 && reply[0] == '-' && !pl.ran(reply) {
				if bytes.HasPrefix(reply, readonlyReply) && s.p.follow != nil {
					// The primary was demoted and nothing ran: the
					// follower looks for the new one.
					s.p.follow.Trouble(true)
					s.dropFenced(addr)
					if s.fencedPause(ctx, deadline) {
						continue
					}
					s.p.m.unavailable.Add(1)
					return resp.ErrorReply(&BackendError{Err: errReplica}), FencedError
				}
				return reply, FencedError
			}
			return reply, FencedAccepted
		case fenceStale:
			msg := fmt.Sprintf("STALEFENCE fence %d is below %s for '%s'", pl.req.Fence, record, pl.req.Resource)
			if pl.req.Slot >= 0 {
				msg += " slot " + strconv.FormatInt(pl.req.Slot, 10)
			}
			return errLine(msg), FencedStale
		case fenceAgain:
			again++
			continue
		case fenceRedirect:
			if s.cl == nil {
				return reply, FencedError
			}
			switch redir.kind {
			case cluster.RedirMoved:
				s.cl.r.Moved.Add(1)
				s.cl.r.Reload(ctx, gen)
				if s.cl.r.Gen.Load() == gen && !s.fencedPause(ctx, deadline) {
					// The slot map was read moments ago: wait for the
					// next reading rather than spin.
					return reply, FencedError
				}
			case cluster.RedirAsk:
				s.cl.r.Asked.Add(1)
				addr, asking = redir.addr, true
			default: // TRYAGAIN, CLUSTERDOWN
				if !s.fencedPause(ctx, deadline) {
					return reply, FencedError
				}
				s.cl.r.Reload(ctx, gen)
			}
			if time.Now().After(deadline) {
				return reply, FencedError
			}
		}
	}
	return errLine("ERR FENCED gave up: the fence record kept changing"), FencedError
}

// ran reports whether reply, an error a FENCED transaction ended with, is
// the command's own reply from EXEC (it ran) rather than a refusal before
// it ran. attempt marks the latter with pl.refused.
func (pl *fencedPlan) ran(reply []byte) bool { return !bytes.Equal(reply, pl.refusedReply) }

// readonlyReply starts a replica's refusal of a write.
var readonlyReply = []byte("-READONLY ")

// errReplica is why a FENCED could not run while the backend it reached
// was a replica until the retries ran out.
var errReplica = errors.New("the backend is a replica and no primary took its place in time")

// fencedPause waits a little before trying a cluster that is changing
// again; false when deadline or ctx ends first.
func (s *session) fencedPause(ctx context.Context, deadline time.Time) bool {
	if time.Now().Add(20 * time.Millisecond).After(deadline) {
		return false
	}
	t := time.NewTimer(20 * time.Millisecond)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// fencedRedirect is a cluster's cluster.Redirection of a FENCED's commands.
type fencedRedirect struct {
	kind cluster.Redirection
	addr string
}

// parseRedirect returns the cluster.Redirection an error reply is, if any.
func parseRedirect(reply []byte) (fencedRedirect, bool) {
	kind, addr := cluster.Redirected(reply)
	return fencedRedirect{kind: kind, addr: addr}, kind != cluster.RedirNone
}

// attempt runs the transaction once on c. err is set when the connection
// failed: res is then fenceLost when nothing of the transaction had been
// written yet beyond WATCH and GET.
//
// The record is read under WATCH (round one), then MULTI ... EXEC runs
// (round two). Round two ends with the next FENCED's round one, WATCH and
// GET of the same record again (prefetch): a client that fences the same
// resource again finds the record read and watched, and its FENCED takes
// one round trip. A record that changed since makes that EXEC abort, and
// the attempt is made again with the record read after it.
func (s *session) attempt(ctx context.Context, c *fencedConn, pl *fencedPlan, asking bool) (res fenceResult, reply []byte, record []byte, redir fencedRedirect, err error) {
	be := c.be
	deadline, _ := ctx.Deadline()
	be.NC.SetDeadline(deadline)
	defer be.NC.SetDeadline(time.Time{})
	stop := context.AfterFunc(ctx, func() { be.NC.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	// In front of a cluster the command's keys are watched too: WATCH is
	// a command of several keys, which a master that is migrating the
	// slot answers TRYAGAIN while the record and the keys are split
	// between it and the other master (or ASK when all have gone), so
	// that the record read is the one beside the keys.
	w := append(make([][]byte, 0, 2+len(pl.keys)), []byte("WATCH"), pl.record)
	if s.cl != nil {
		w = append(w, pl.keys...)
	}
	watch := encodeCommand(w)
	get := encodeCommand([][]byte{[]byte("GET"), pl.record})

	var cur []byte
	prefetched := !asking && c.watched != nil && bytes.Equal(c.watched, watch)
	if prefetched {
		cur = c.prefetch
		if rec, _ := strconv.ParseInt(string(cur), 10, 64); cur != nil && pl.req.Fence < rec {
			// Refused only on a record read now: a FLUSHDB may have
			// removed it since.
			prefetched = false
		}
	}
	c.watched = nil
	if !prefetched {
		// Round one: WATCH record, GET record (after UNWATCH of what
		// another record's prefetch watched).
		n := 2
		if c.watching {
			be.W.Write(cmdUnwatch)
			n++
		}
		if asking {
			be.W.Write(cmdAsking)
		}
		be.W.Write(watch)
		if asking {
			be.W.Write(cmdAsking)
		}
		be.W.Write(get)
		if asking {
			n += 2
		}
		c.watching = true
		if err := be.W.Flush(); err != nil {
			return fenceLost, nil, nil, fencedRedirect{}, err
		}
		replies, err := c.readReplies(n)
		if err != nil {
			return fenceLost, nil, nil, fencedRedirect{}, err
		}
		replies = replies[n-2-btoi(asking)*2:]
		if asking {
			replies = [][]byte{replies[1], replies[3]}
		}
		for _, r := range replies {
			if len(r) > 0 && r[0] == '-' {
				r = bytes.Clone(r) // unwatch reads into the same buffer
				s.unwatch(c)
				if rd, ok := parseRedirect(r); ok {
					return fenceRedirect, r, nil, rd, nil
				}
				pl.refusedReply = r
				return fenceDone, r, nil, fencedRedirect{}, nil
			}
		}
		var ok bool
		if cur, ok = bulkValue(replies[1]); !ok {
			s.unwatch(c)
			pl.refusedReply = []byte("-ERR FENCED found the fence record not an integer\r\n")
			return fenceDone, pl.refusedReply, nil, fencedRedirect{}, nil
		}
	}
	if cur != nil {
		rec, err := strconv.ParseInt(string(cur), 10, 64)
		if err != nil {
			s.unwatch(c)
			pl.refusedReply = []byte("-ERR FENCED found the fence record not an integer\r\n")
			return fenceDone, pl.refusedReply, nil, fencedRedirect{}, nil
		}
		if pl.req.Fence < rec {
			// The WATCH stays, with the record read: the next FENCED
			// of this record may use it.
			cur = bytes.Clone(cur)
			if !asking {
				c.watched, c.prefetch = watch, cur
			}
			return fenceStale, nil, cur, fencedRedirect{}, nil
		}
	}

	// Round two: MULTI, SET record fence (a write), the command, EXEC;
	// then the prefetch, WATCH and GET, unless following an ASK.
	if asking {
		be.W.Write(cmdAsking)
	}
	be.W.Write(resp.CmdMulti)
	n := 3
	if pl.write {
		be.W.Write(encodeCommand([][]byte{[]byte("SET"), pl.record, strconv.AppendInt(nil, pl.req.Fence, 10)}))
		n++
	}
	be.W.Write(pl.raw)
	be.W.Write(cmdExec)
	if asking {
		n++
	} else {
		be.W.Write(watch)
		be.W.Write(get)
		n += 2
	}
	c.watching = !asking
	if err := be.W.Flush(); err != nil {
		if errors.Is(err, net.ErrClosed) {
			// Closed before anything was written (the follower closes
			// the connections to a primary that was replaced).
			return fenceLost, nil, nil, fencedRedirect{}, err
		}
		return fenceDone, nil, nil, fencedRedirect{}, err
	}
	replies, err := c.readReplies(n)
	if err != nil {
		return fenceDone, nil, nil, fencedRedirect{}, err
	}
	if asking {
		replies = replies[1:]
	} else {
		c.keepPrefetch(watch, replies[len(replies)-2], replies[len(replies)-1])
		replies = replies[:len(replies)-2]
	}
	exec := replies[len(replies)-1]
	queued := replies[1 : len(replies)-1] // SET's (a write) and the command's
	switch {
	case len(exec) == 0:
	case exec[0] == '-':
		// EXECABORT: a command failed to queue; its error is the
		// reply, the command's own first.
		for i := len(queued) - 1; i >= 0; i-- {
			if q := queued[i]; len(q) > 0 && q[0] == '-' {
				if rd, ok := parseRedirect(q); ok {
					return fenceRedirect, q, nil, rd, nil
				}
				pl.refusedReply = q
				return fenceDone, q, nil, fencedRedirect{}, nil
			}
		}
		if rd, ok := parseRedirect(exec); ok {
			return fenceRedirect, exec, nil, rd, nil
		}
		pl.refusedReply = exec
		return fenceDone, exec, nil, fencedRedirect{}, nil
	case bytes.Equal(exec, replyNull2) || bytes.Equal(exec, replyNull3):
		return fenceAgain, nil, nil, fencedRedirect{}, nil
	case exec[0] == '*':
		body, ok := execBody(exec, pl.write)
		if ok {
			return fenceDone, body, nil, fencedRedirect{}, nil
		}
	}
	return fenceDone, nil, nil, fencedRedirect{}, fmt.Errorf("unexpected EXEC reply %q", truncate(exec, 64))
}

// keepPrefetch keeps the record read by the WATCH and GET that followed an
// EXEC, when both succeeded.
func (c *fencedConn) keepPrefetch(watch, watchReply, getReply []byte) {
	v, ok := bulkValue(getReply)
	if !ok || !bytes.Equal(watchReply, replyOK) {
		return
	}
	if v != nil {
		if _, err := strconv.ParseInt(string(v), 10, 64); err != nil {
			return
		}
	}
	c.watched, c.prefetch = watch, bytes.Clone(v)
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// unwatch ends the WATCH of a transaction that will not run.
func (s *session) unwatch(c *fencedConn) error {
	c.watched, c.watching = nil, false
	c.be.W.Write(cmdUnwatch)
	if err := c.be.W.Flush(); err != nil {
		return err
	}
	_, err := c.readReplies(1)
	return err
}

// readReplies reads n whole replies from be into c's buffer; they are
// valid until the next call.
func (c *fencedConn) readReplies(n int) ([][]byte, error) {
	if c.w == nil {
		c.w = bufio.NewWriterSize(&c.buf, 512)
	}
	c.buf.Reset()
	c.ends = c.ends[:0]
	var ri resp.ReplyInfo
	for range n {
		if err := resp.CopyReply(c.w, c.be.R, &ri); err != nil {
			return nil, err
		}
		c.w.Flush()
		c.ends = append(c.ends, c.buf.Len())
	}
	b := c.buf.Bytes()
	out := c.replies[:0]
	start := 0
	for _, end := range c.ends {
		out = append(out, b[start:end:end])
		start = end
	}
	c.replies = out
	return out, nil
}

// bulkValue returns a GET's value, nil for none; ok false when the reply
// is neither.
func bulkValue(reply []byte) ([]byte, bool) {
	if bytes.Equal(reply, []byte("$-1\r\n")) || bytes.Equal(reply, replyNull3) {
		return nil, true
	}
	if len(reply) < 4 || reply[0] != '$' {
		return nil, false
	}
	i := bytes.Index(reply, []byte("\r\n"))
	n, err := strconv.Atoi(string(reply[1:i]))
	if err != nil || i+2+n+2 != len(reply) {
		return nil, false
	}
	return reply[i+2 : i+2+n], true
}

// execBody returns the command's reply inside EXEC's: the last of one
// element (a read) or of two, after SET's +OK (a write).
func execBody(exec []byte, write bool) ([]byte, bool) {
	i := bytes.Index(exec, []byte("\r\n"))
	if i < 0 {
		return nil, false
	}
	want := "*1"
	if write {
		want = "*2"
	}
	if string(exec[:i]) != want {
		return nil, false
	}
	body := exec[i+2:]
	if write {
		if !bytes.HasPrefix(body, replyOK) {
			return nil, false
		}
		body = body[len(replyOK):]
	}
	return body, true
}

func truncate(b []byte, n int) []byte {
	if len(b) > n {
		return b[:n]
	}
	return b
}

// fencedProbe answers a FENCED whose command Redis does not know or would
// refuse for its number of arguments with Redis's own error: the command
// is queued in a transaction that is then discarded, so it never runs.
func (s *session) fencedProbe(ctx context.Context, pl fencedPlan) ([]byte, FencedOutcome) {
	addr := ""
	if s.cl != nil {
		m, err := s.cl.r.Current(ctx)
		if err != nil {
			s.p.m.unavailable.Add(1)
			return resp.ErrorReply(&BackendError{Err: err}), FencedError
		}
		if addr = m.Master(0); addr == "" && len(m.Masters) > 0 {
			addr = m.Masters[0]
		}
	}
	c, _, err := s.fencedConn(ctx, addr)
	if err != nil {
		s.p.m.unavailable.Add(1)
		return resp.ErrorReply(&BackendError{Err: err}), FencedError
	}
	be := c.be
	deadline, _ := ctx.Deadline()
	be.NC.SetDeadline(deadline)
	defer be.NC.SetDeadline(time.Time{})
	be.W.Write(resp.CmdMulti)
	be.W.Write(pl.raw)
	be.W.Write(cmdDiscard) // which ends any WATCH too
	c.watched, c.watching = nil, false
	var replies [][]byte
	if err = be.W.Flush(); err == nil {
		replies, err = c.readReplies(3)
	}
	if err != nil {
		s.dropFenced(addr)
		s.p.m.unavailable.Add(1)
		return resp.ErrorReply(&BackendError{Err: err}), FencedError
	}
	if r := replies[1]; len(r) > 0 && r[0] == '-' {
		return r, FencedError
	}
	return errLine(fmt.Sprintf("ERR FENCED cannot tell the keys of '%s'", pl.name)), FencedError
}
