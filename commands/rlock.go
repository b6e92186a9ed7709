package commands

import (
	"context"
	"errors"
)

// RLOCK resource ttl-ms [WAIT timeout-ms] [TOKEN token] [KEEPALIVE] takes
// a shared (read) holding; LOCK is the write lock. LOCK ... PERMITS k
// takes one of k permits of a semaphore. Both are served by the LOCK path
// (Conn.acquire) with their own outcomes.

var (
	errArityRLock       = errors.New("ERR wrong number of arguments for 'rlock' command")
	errRLockReentrant   = errors.New("ERR RLOCK does not take REENTRANT: a read hold is counted per token")
	errReentrantPermits = errors.New("ERR REENTRANT does not take PERMITS k above 1")
	errExpireRLock      = errors.New("ERR invalid expire time in 'rlock' command")
	errPermitsRange     = errors.New("ERR PERMITS must be a positive integer")
)

// acquireOutcomes are the outcomes that Conn.acquire counts, and the
// command's name for the log.
type acquireOutcomes struct {
	name                                 string
	acquired, notAcquired, noQuorum, err outcome
}

var (
	lockOutcomes  = acquireOutcomes{"lock", lockAcquired, lockNotAcquired, lockNoQuorum, lockError}
	rlockOutcomes = acquireOutcomes{"rlock", rlockAcquired, rlockNotAcquired, rlockNoQuorum, rlockError}
)

// rlockSpec is the row of RLOCK in specs.
var rlockSpec = spec{
	name: "rlock", arity: -3, flags: []string{"write"}, acl: []string{"@write", "@slow", "@lock"},
	summary: "Acquires a shared (read) lock on the resource for ttl-ms: any number of readers at once, never with a LOCK holder.",
	args: []arg{
		{name: "resource", typ: "string"},
		{name: "ttl-ms", typ: "integer"},
		{name: "timeout-ms", typ: "integer", token: "WAIT", optional: true},
		{name: "token", typ: "string", token: "TOKEN", optional: true},
		{name: "keepalive", typ: "pure-token", token: "KEEPALIVE", optional: true},
	},
	outcomes: []outcome{rlockAcquired, rlockNotAcquired, rlockNoQuorum, rlockError, rlockBadRequest},
	serve:    (*Conn).rlock,
	mayWait:  lockMayWait,
}

func (c *Conn) rlock(ctx context.Context, dst []byte, args [][]byte, resp3 bool) []byte {
	a, err := c.h.parseRLock(args)
	if err != nil {
		c.h.count(rlockBadRequest)
		return appendErr(dst, err)
	}
	return c.acquire(ctx, dst, a, resp3, rlockOutcomes, c.h.locker.RLock)
}

// parseRLock parses an RLOCK command: LOCK's arguments without PERMITS.
func (h *Handler) parseRLock(args [][]byte) (lockArgs, error) {
	if len(args) < 3 {
		return lockArgs{}, errArityRLock
	}
	a, err := h.parseLock(args)
	switch {
	case errors.Is(err, errExpireLock):
		return a, errExpireRLock
	case err != nil:
		return a, err
	case a.permits != 0:
		return a, errSyntax
	case a.reentrant:
		return a, errRLockReentrant
	}
	return a, nil
}

// parsePermits parses the k of PERMITS k: from 1 to the configured
// maximum.
func (h *Handler) parsePermits(b []byte) (int64, error) {
	k, ok := parseInt(b)
	switch {
	case !ok:
		return 0, errNotInteger
	case k < 1:
		return 0, errPermitsRange
	case k > h.maxPerm:
		return 0, h.errPermMax
	}
	return k, nil
}
