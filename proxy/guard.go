package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/proxy/internal/resp"
)

// GuardError refuses a forwarded command that would touch the lock state.
type GuardError struct{ Command, Key string }

func (e *GuardError) Error() string {
	if e.Key == "" {
		return fmt.Sprintf("'%s' is refused: the backend holds lock state", e.Command)
	}
	return fmt.Sprintf("key '%s' holds lock state and is not reachable through the proxy", e.Key)
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

	table resp.Table
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
	switch inf := resp.Lookup(name); {
	case inf.Has(resp.Wholesale):
		// FLUSHALL, FLUSHDB and SWAPDB wipe or move the lock state; the
		// replication stream (SYNC, PSYNC) is a copy of every key, the
		// lock state's tokens included.
		return &GuardError{Command: string(name)}
	case inf.Has(resp.Patterns):
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
	spec, ok := resp.LookupSpec(table, name, args)
	if !ok {
		return nil // Redis answers unknown commands with an error
	}
	if spec.Movable {
		return g.checkMovable(args)
	}
	if spec.First <= 0 {
		return nil
	}
	last := spec.Last
	if last < 0 {
		last += len(args)
	}
	step := max(spec.Step, 1)
	for i := spec.First; i <= last && i < len(args); i += step {
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
func (g *keyGuard) commands() (map[string]resp.KeySpec, error) {
	return g.table.Get(context.Background(), func(ctx context.Context) (any, error) {
		return g.client.Do(ctx, "COMMAND").Result()
	})
}
