package guard

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"

	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/proxy/internal/resp"
)

// Error refuses a forwarded command that would touch the lock state.
type Error struct{ Command, Key string }

// Error says which command or key is refused.
func (e *Error) Error() string {
	if e.Key == "" {
		return fmt.Sprintf("'%s' is refused: the backend holds lock state", e.Command)
	}
	return fmt.Sprintf("key '%s' holds lock state and is not reachable through the proxy", e.Key)
}

// Guard keeps forwarded commands away from the lock state when the
// backend is also a lock node. It finds a command's keys where Redis itself
// says they are: the positions in the COMMAND table, or COMMAND GETKEYS for
// commands whose keys move (EVAL, SORT ... STORE, XREAD, MIGRATE ...).
//
// What it cannot see: a script that builds key names at run time, KEYS,
// SCAN and RANDOMKEY (they show names, not tokens), and a PUBLISH on the
// release channel (it only wakes waiters early). FLUSHALL, FLUSHDB and
// SWAPDB would wipe or move the lock state wholesale, and SYNC and PSYNC
// would copy it out: they are refused.
//
// Its methods are safe for concurrent use.
type Guard struct {
	prefix  []byte
	client  *redis.Client
	timeout time.Duration

	table resp.Table
}

// New returns a Guard of the keys that start with prefix, which asks the
// backend opt reaches where a command's keys are, each question bounded
// by timeout. Close releases its client.
func New(prefix string, opt *redis.Options, timeout time.Duration) *Guard {
	return &Guard{prefix: []byte(prefix), client: redis.NewClient(opt), timeout: timeout}
}

// Close closes the Guard's client of the backend.
func (g *Guard) Close() { g.client.Close() }

// Check returns an *Error when args would reach a protected key, or
// another error when the backend cannot say where the keys are.
func (g *Guard) Check(name []byte, args [][]byte) error {
	switch inf := resp.Lookup(name); {
	case inf.Has(resp.Wholesale):
		// FLUSHALL, FLUSHDB and SWAPDB wipe or move the lock state; the
		// replication stream (SYNC, PSYNC) is a copy of every key, the
		// lock state's tokens included.
		return &Error{Command: string(name)}
	case inf.Has(resp.Patterns):
		// BY and GET patterns read other keys by name.
		for _, a := range args[1:] {
			if bytes.Contains(a, g.prefix) {
				return &Error{Command: string(name), Key: string(a)}
			}
		}
	}
	table, err := g.commands()
	if err != nil {
		return err
	}
	spec, ok := resp.LookupSpec(table, name, args)
	if !ok {
		return nil // Redis answers unknown commands with an error
	}
	if keys, ok := resp.MovableKeys(name, args); ok {
		// MIGRATE: its password must not reach COMMAND GETKEYS, which
		// the backend's SLOWLOG and MONITOR show unredacted.
		for _, k := range keys {
			if bytes.HasPrefix(k, g.prefix) {
				return &Error{Key: string(k)}
			}
		}
		return nil
	}
	if spec.Movable {
		return g.checkMovable(args)
	}
	for k := range spec.All(args) {
		if bytes.HasPrefix(k, g.prefix) {
			return &Error{Key: string(k)}
		}
	}
	return nil
}

// checkMovable asks the backend where the keys of a command whose keys
// move are (COMMAND GETKEYS).
func (g *Guard) checkMovable(args [][]byte) error {
	ctx, cancel := context.WithTimeout(context.Background(), g.timeout)
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
		return err
	}
	for _, k := range keys {
		if strings.HasPrefix(k, string(g.prefix)) {
			return &Error{Key: k}
		}
	}
	return nil
}

// commands returns the backend's COMMAND table.
func (g *Guard) commands() (map[string]resp.KeySpec, error) {
	return g.table.Get(context.Background(), func(ctx context.Context) (any, error) {
		return g.client.Do(ctx, "COMMAND").Result()
	})
}
