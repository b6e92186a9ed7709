package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// GuardError refuses a forwarded command that would touch the lock state.
type GuardError struct{ Command, Key string }

func (e *GuardError) Error() string {
	if e.Key == "" {
		return fmt.Sprintf("'%s' is refused: the backend holds lock state", e.Command)
	}
	return fmt.Sprintf("key '%s' holds lock state and is not reachable through the proxy", e.Key)
}

// keySpec is where a command's keys stand, as COMMAND reports it.
type keySpec struct {
	first, last, step int
	movable           bool // only COMMAND GETKEYS can tell
	container         bool // the keys depend on the subcommand
	keyspace          bool // flagged readonly, write or may_replicate
	write, blocking   bool // flagged write, blocking (fenced.go)
	readonly          bool // flagged readonly
	arity             int  // as COMMAND reports it
}

// keyGuard keeps forwarded commands away from the lock state when the
// backend is also a lock node. It finds a command's keys where Redis itself
// says they are: the positions in the COMMAND table, or COMMAND GETKEYS for
// commands whose keys move (EVAL, SORT ... STORE, XREAD, MIGRATE ...).
//
// What it cannot see: a script that builds key names at run time, KEYS,
// SCAN and RANDOMKEY (they show names, not tokens), and a PUBLISH on the
// release channel (it only wakes waiters early). FLUSHALL, FLUSHDB and
// SWAPDB would wipe or move the lock state wholesale, and SYNC and PSYNC
// would copy it out: they are refused.
type keyGuard struct {
	prefix []byte
	p      *Proxy
	client *redis.Client

	table commandTable
}

func newKeyGuard(prefix string, p *Proxy) *keyGuard {
	b := &p.cfg.Backend
	opt := b.controlOptions(b.Addr)
	opt.DB = b.DB
	return &keyGuard{prefix: []byte(prefix), p: p, client: redis.NewClient(opt)}
}

func (g *keyGuard) close() { g.client.Close() }

// check returns a *GuardError when args would reach a protected key, or
// a *BackendError when the backend cannot say where the keys are.
func (g *keyGuard) check(name []byte, args [][]byte) error {
	switch string(name) {
	case "flushall", "flushdb", "swapdb":
		return &GuardError{Command: string(name)}
	case "sync", "psync":
		// The replication stream is a copy of every key, the lock
		// state's tokens included.
		return &GuardError{Command: string(name)}
	case "sort", "sort_ro":
		// BY and GET patterns read other keys by name.
		for _, a := range args[1:] {
			if bytes.Contains(a, g.prefix) {
				return &GuardError{Command: string(name), Key: string(a)}
			}
		}
	}
	table, err := g.commands()
	if err != nil {
		return &BackendError{Err: err}
	}
	spec, ok := lookupSpec(table, name, args)
	if !ok {
		return nil // Redis answers unknown commands with an error
	}
	if spec.movable {
		return g.checkMovable(args)
	}
	if spec.first <= 0 {
		return nil
	}
	last := spec.last
	if last < 0 {
		last += len(args)
	}
	step := max(spec.step, 1)
	for i := spec.first; i <= last && i < len(args); i += step {
		if bytes.HasPrefix(args[i], g.prefix) {
			return &GuardError{Key: string(args[i])}
		}
	}
	return nil
}

func (g *keyGuard) checkMovable(args [][]byte) error {
	ctx, cancel := context.WithTimeout(context.Background(), g.p.cfg.Backend.DialTimeout)
	defer cancel()
	q := make([]any, 0, len(args)+2)
	q = append(q, "COMMAND", "GETKEYS")
	for _, a := range args {
		q = append(q, a)
	}
	keys, err := g.client.Do(ctx, q...).StringSlice()
	var rerr redis.Error
	if errors.As(err, &rerr) {
		return nil // no keys, or bad arguments that Redis will refuse itself
	}
	if err != nil {
		return &BackendError{Err: err}
	}
	for _, k := range keys {
		if strings.HasPrefix(k, string(g.prefix)) {
			return &GuardError{Key: k}
		}
	}
	return nil
}

// commands returns the backend's COMMAND table.
func (g *keyGuard) commands() (map[string]keySpec, error) {
	return g.table.get(context.Background(), func(ctx context.Context) (any, error) {
		return g.client.Do(ctx, "COMMAND").Result()
	})
}

// commandTable is a backend's COMMAND table, loaded once, at its first use;
// a load that fails is tried again at the next.
type commandTable struct {
	// table is read without a lock by every forwarded command. It is
	// never changed once stored.
	table atomic.Pointer[map[string]keySpec]
	// load serialises loading the table, so that clients arriving before
	// it is loaded wait for one COMMAND instead of each sending their own.
	load sync.Mutex
}

// get returns the table, loading it with command (which sends COMMAND)
// when it has none yet.
func (t *commandTable) get(ctx context.Context, command func(context.Context) (any, error)) (map[string]keySpec, error) {
	if m := t.table.Load(); m != nil {
		return *m, nil
	}
	t.load.Lock()
	defer t.load.Unlock()
	if m := t.table.Load(); m != nil {
		return *m, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	v, err := command(ctx)
	if err != nil {
		return nil, fmt.Errorf("COMMAND: %w", err)
	}
	reply, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("COMMAND: a %T instead of an array", v)
	}
	m := make(map[string]keySpec, len(reply)*2)
	for _, c := range reply {
		addSpec(m, c)
	}
	t.table.Store(&m)
	return m, nil
}

// lookupSpec finds the entry of the command args (named name, in lower
// case) in a COMMAND table: a container command's (CONFIG, XINFO, ...) is
// its subcommand's.
func lookupSpec(table map[string]keySpec, name []byte, args [][]byte) (keySpec, bool) {
	spec, ok := table[string(name)]
	if ok && spec.container && len(args) > 1 {
		var sb [24]byte
		sub := lower(&sb, args[1])
		spec, ok = table[string(name)+"|"+string(sub)]
	}
	return spec, ok
}

// addSpec adds one COMMAND entry: name, arity, flags, first key, last key,
// step, and from Redis 7 on, the subcommands as entries of the same shape.
func addSpec(table map[string]keySpec, c any) {
	e, ok := c.([]any)
	if len(e) < 6 || !ok {
		return
	}
	name, _ := e[0].(string)
	first, _ := e[3].(int64)
	last, _ := e[4].(int64)
	step, _ := e[5].(int64)
	arity, _ := e[1].(int64)
	spec := keySpec{first: int(first), last: int(last), step: int(step), arity: int(arity)}
	if flags, ok := e[2].([]any); ok {
		for _, f := range flags {
			switch f {
			case "movablekeys":
				spec.movable = true
			case "readonly", "write", "may_replicate":
				spec.keyspace = true
			}
			switch f {
			case "write":
				spec.write = true
			case "readonly":
				spec.readonly = true
			case "blocking":
				spec.blocking = true
			}
		}
	}
	if len(e) >= 10 {
		if subs, ok := e[9].([]any); ok && len(subs) > 0 {
			spec.container = true
			for _, s := range subs {
				addSpec(table, s)
			}
		}
	}
	table[strings.ToLower(name)] = spec
}
