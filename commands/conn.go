package commands

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tidwall/redcon"
	"go.uber.org/zap"

	"github.com/lockproxy/lockproxy/quorum"
)

// Conn is the state of one client connection: the locks it acquired and
// the KEEPALIVE extenders it owns. Serve must not be called concurrently for
// one Conn; Close may be called concurrently with Serve and more than once.
type Conn struct {
	h *Handler

	// holder is who acquires through this connection, for LOCKINFO:
	// "name@addr via proxy-id" (SetClient), nobody until the proxy says.
	// Used by Serve only.
	holder quorum.Holder

	mu     sync.Mutex
	held   map[string]*holding // resource -> the current holding; guarded by mu
	closed bool                // guarded by mu

	extenders sync.WaitGroup // running extenders; Add only under mu while !closed
	closeOnce sync.Once
}

// holding is one lock acquired on this connection.
type holding struct {
	token string
	// base carries the values of the LOCK command's context without its
	// cancellation, for work that outlives the command: extending and the
	// release in Close.
	base context.Context
	// keep reports whether the lock was taken with KEEPALIVE, so Close
	// releases it. It stays true after a failed UNLOCK stopped the extender.
	keep bool
	ext  *extender // nil without KEEPALIVE
	// until is the end of the validity known from LOCK and EXTEND on this
	// connection; the extender of a kept lock knows a later one. Guarded by
	// the Conn's mu.
	until time.Time
	// kept is the number of holds taken with KEEPALIVE on this connection
	// (1 for a kept lock without a count): Close gives up that many.
	// Guarded by the Conn's mu.
	kept int64
	ttl  time.Duration // of the last LOCK, for a restarted extender
}

// lost reports whether the keepalive of h gave the lock up. h may be nil.
func (h *holding) lost() bool { return h != nil && h.ext != nil && h.ext.lost.Load() }

// validAt reports whether the lock's last known validity lasts beyond now.
// The Conn's mu must be held.
func (h *holding) validAt(now time.Time) bool {
	if h.lost() {
		return false
	}
	until := h.until
	if h.ext != nil {
		if _, u := h.ext.state(); u.After(until) {
			until = u
		}
	}
	return now.Before(until)
}

// Serve answers one command and appends exactly one RESP reply to dst.
// args[0] is the command name as sent, in any case. resp3 selects RESP3
// encodings, which differ only for the null reply.
//
// ctx governs the calls to the lock nodes, including a WAIT; it should end
// when the client disconnects. A lock acquired when ctx has already ended is
// released at once and not recorded. Extenders started by LOCK ... KEEPALIVE
// keep ctx's values but not its cancellation: they run until UNLOCK, a lost
// extension or Close.
//
// A successful LOCK replaces what this connection recorded for the
// resource: an idempotent LOCK ... TOKEN by the holder keeps the lock alive
// from then on if it says KEEPALIVE, and stops keeping it alive if not.
func (c *Conn) Serve(ctx context.Context, dst []byte, args [][]byte, resp3 bool) []byte {
	if len(args) == 0 {
		return appendErr(dst, errUnknown)
	}
	s := lookup(args[0])
	if s == nil {
		return appendErr(dst, errUnknown)
	}
	return s.serve(c, ctx, dst, args, resp3)
}

func (c *Conn) lock(ctx context.Context, dst []byte, args [][]byte, resp3 bool) []byte {
	a, err := c.h.parseLock(args)
	if err != nil {
		c.h.count(lockBadRequest)
		return appendErr(dst, err)
	}
	resource := string(a.resource)
	start := time.Now()
	lk, err := c.h.locker.Lock(ctx, resource, a.ttl, quorum.Options{Wait: a.wait, Token: string(a.token), Reentrant: a.reentrant, Holder: c.holder})
	if hook := testHookLocked.Load(); hook != nil {
		(*hook)()
	}
	c.h.debug("lock", resource, start, err)
	switch {
	case errors.Is(err, quorum.ErrNotAcquired):
		c.h.count(lockNotAcquired)
		return appendNull(dst, resp3)
	case err != nil:
		c.h.countEngineErr(err, lockNoQuorum, lockError)
		return appendEngineErr(dst, err)
	}
	if err := ctx.Err(); err != nil {
		// The client is gone (or the command ran out of time) just after
		// the nodes granted the lock. Nobody will ever see the token, so
		// give the lock back now instead of blocking others for the ttl.
		c.h.count(lockError)
		c.h.release(ctx, resource, lk.Token)
		return appendEngineErr(dst, err)
	}
	h := c.record(ctx, resource, lk, a.ttl, lk.Expires, a.keepalive)
	if h == nil {
		c.h.count(lockError)
		c.h.release(ctx, resource, lk.Token)
		return appendErr(dst, errClosed)
	}
	// The validity is what is left of it now, as the reply is written: a
	// proxy that stalled since the grant (stopped, starved of CPU) must not
	// promise time that has passed. A grant with less than a millisecond
	// left is given back and answered as not acquired.
	ms := time.Until(lk.Expires).Milliseconds()
	if ms <= 0 {
		c.forget(resource, h)
		c.h.count(lockNotAcquired)
		c.h.release(ctx, resource, lk.Token)
		return appendNull(dst, resp3)
	}
	c.h.count(lockAcquired)
	if a.reentrant {
		dst = redcon.AppendArray(dst, 4)
	} else {
		dst = redcon.AppendArray(dst, 3)
	}
	dst = redcon.AppendBulkString(dst, lk.Token)
	dst = redcon.AppendInt(dst, ms)
	dst = redcon.AppendInt(dst, lk.Fence)
	if a.reentrant {
		dst = redcon.AppendInt(dst, lk.Holds)
	}
	return dst
}

// testHookLocked, when set, runs right after a LOCK's Lock call returns:
// tests stall the proxy there.
var testHookLocked atomic.Pointer[func()]

// record makes lk the holding of resource on this connection, replacing
// (and stopping the extender of) an earlier one, and starts an extender if
// keepalive is set. until is the end of lk's validity. A re-entry (lk has
// holds) of the holding recorded here keeps the holds that it took with
// KEEPALIVE, and their extender. It returns the holding, or nil if the
// connection is closed.
func (c *Conn) record(ctx context.Context, resource string, lk quorum.Lock, ttl time.Duration, until time.Time, keepalive bool) *holding {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	var kept int64
	if keepalive {
		kept = 1
	}
	if old := c.held[resource]; old != nil {
		if old.ext != nil {
			old.ext.stop()
		}
		if lk.Holds > 1 && old.token == lk.Token && !old.lost() {
			kept += old.kept
		}
	}
	keepalive = kept > 0
	h := &holding{token: lk.Token, base: context.WithoutCancel(ctx), keep: keepalive, until: until, kept: kept, ttl: ttl}
	if keepalive {
		h.ext = c.startExtender(h.base, resource, lk.Token, ttl, until)
	}
	c.held[resource] = h
	return h
}

// lookup returns the token to use for resource and, when that token is the
// one recorded on this connection, the holding. token is nil when the
// client left it out.
func (c *Conn) lookup(resource string, token []byte) (*holding, string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, "", errClosed
	}
	h := c.held[resource]
	switch {
	case token == nil && h == nil:
		return nil, "", errNoToken
	case token == nil:
		return h, h.token, nil
	case h != nil && h.token == string(token):
		return h, h.token, nil
	}
	return nil, string(token), nil
}

// forget removes h from the connection if it is still the holding of
// resource, stopping its extender.
func (c *Conn) forget(resource string, h *holding) {
	if h == nil {
		return
	}
	if h.ext != nil {
		h.ext.stop()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.held[resource] == h {
		delete(c.held, resource)
	}
}

func (c *Conn) unlock(ctx context.Context, dst []byte, args [][]byte, _ bool) []byte {
	a, err := parseUnlock(args)
	if err != nil {
		c.h.count(unlockBadRequest)
		return appendErr(dst, err)
	}
	resource := string(a.resource)
	h, token, err := c.lookup(resource, a.token)
	if err != nil {
		c.h.count(argOutcome(err, unlockBadRequest, unlockError))
		return appendErr(dst, err)
	}
	if h != nil && h.ext != nil {
		// Stop extending first, so that the extender does not report the
		// release as a lost lock.
		h.ext.stop()
		if h.lost() {
			c.h.count(unlockNotHeld)
			c.forget(resource, h)
			return redcon.AppendInt(dst, 0)
		}
	}
	start := time.Now()
	left, err := c.h.locker.Release(ctx, resource, token, a.hold)
	c.h.debug("unlock", resource, start, err)
	switch {
	case err == nil && left > 0:
		// Holds remain: the lock stays, kept alive for the holds this
		// connection took with KEEPALIVE.
		c.h.count(unlockReleased)
		c.keepHolds(resource, h, left)
		return redcon.AppendInt(dst, 1)
	case err == nil:
		c.h.count(unlockReleased)
		c.forget(resource, h)
		return redcon.AppendInt(dst, 1)
	case errors.Is(err, quorum.ErrNotReentrant):
		c.h.count(unlockBadRequest)
		c.keepHolds(resource, h, -1)
		return appendErr(dst, errHoldPlain)
	case errors.Is(err, quorum.ErrNotHeld):
		c.h.count(unlockNotHeld)
		c.forget(resource, h)
		return redcon.AppendInt(dst, 0)
	}
	// The lock may still be held: keep the record, so that the client can
	// retry without a token and Close still releases a kept lock.
	c.h.countEngineErr(err, unlockNoQuorum, unlockError)
	return appendEngineErr(dst, err)
}

// keepHolds keeps h, the holding of resource on this connection (nil:
// none), after an UNLOCK left holds of it (-1: unknown, nothing changed):
// this connection keeps at most that many holds alive, with a new
// extender when it keeps any.
func (c *Conn) keepHolds(resource string, h *holding, left int64) {
	if h == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.held[resource] != h {
		return
	}
	if left >= 0 {
		h.kept = min(h.kept, left)
	}
	h.keep = h.kept > 0
	if !h.keep || h.lost() {
		return
	}
	until := h.until
	if h.ext != nil {
		if _, u := h.ext.state(); u.After(until) {
			until = u
		}
	}
	h.ext = c.startExtender(h.base, resource, h.token, h.ttl, until)
}

func (c *Conn) extend(ctx context.Context, dst []byte, args [][]byte, _ bool) []byte {
	a, err := c.h.parseExtend(args)
	if err != nil {
		c.h.count(extendBadRequest)
		return appendErr(dst, err)
	}
	resource := string(a.resource)
	h, token, err := c.lookup(resource, a.token)
	if err != nil {
		c.h.count(argOutcome(err, extendBadRequest, extendError))
		return appendErr(dst, err)
	}
	if h.lost() {
		c.h.count(extendNotHeld)
		c.forget(resource, h)
		return redcon.AppendInt(dst, 0)
	}
	start := time.Now()
	validity, err := c.h.locker.Extend(ctx, resource, token, a.ttl)
	until := time.Now().Add(validity) // validity counts from Extend's return
	c.h.debug("extend", resource, start, err)
	ms := time.Until(until).Milliseconds() // what is left as the reply is written
	switch {
	case err == nil && ms > 0:
		c.h.count(extendExtended)
		if h != nil {
			c.setUntil(h, until)
		}
		if h != nil && h.ext != nil {
			c.rekeep(resource, h, a.ttl, until)
		}
		return redcon.AppendInt(dst, ms)
	case err == nil || errors.Is(err, quorum.ErrNotHeld):
		// Less than a millisecond of validity left is as good as gone; a
		// reply of 0 must mean that the lock is not held, so an extension
		// whose validity ran out before the reply (a stalled proxy) is
		// given back.
		c.h.count(extendNotHeld)
		c.forget(resource, h)
		if err == nil {
			c.h.release(ctx, resource, token)
		}
		return redcon.AppendInt(dst, 0)
	}
	c.h.countEngineErr(err, extendNoQuorum, extendError)
	return appendEngineErr(dst, err)
}

// setUntil records until as the end of h's validity.
func (c *Conn) setUntil(h *holding, until time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	h.until = until
}

// rekeep hands the new ttl and validity of a kept lock to its extender. If
// the extender gave the lock up (or was stopped) while the EXTEND was under
// way, the EXTEND proved the lock held again, so a new extender takes over.
func (c *Conn) rekeep(resource string, h *holding, ttl time.Duration, until time.Time) {
	if h.ext.update(ttl, until) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.held[resource] != h {
		return
	}
	h.ext = c.startExtender(h.base, resource, h.token, ttl, until)
}

// Close stops every KEEPALIVE extender of the connection, waits for them,
// and then releases the locks they kept, concurrently, each bounded by a
// short timeout. Locks taken without KEEPALIVE stay until their ttl, as in
// Redis: the client may still release them with their token from another
// connection. Close is idempotent and safe to call concurrently with Serve;
// a LOCK that completes after Close releases its lock and replies with an
// error.
func (c *Conn) Close() {
	c.closeOnce.Do(c.close)
}

func (c *Conn) close() {
	c.mu.Lock()
	c.closed = true
	held := c.held
	c.held = nil
	c.mu.Unlock()
	c.h.mu.Lock()
	delete(c.h.conns, c)
	c.h.mu.Unlock()

	for _, h := range held {
		if h.ext != nil {
			h.ext.cancel()
		}
	}
	c.extenders.Wait()

	var wg sync.WaitGroup
	for resource, h := range held {
		if !h.keep || h.lost() {
			continue
		}
		// One release per hold taken with KEEPALIVE (a lock without a
		// count has one).
		wg.Go(func() {
			for range max(h.kept, 1) {
				c.h.release(h.base, resource, h.token)
			}
		})
	}
	wg.Wait()
}

// release gives up a lock whose client cannot be told about it. It must
// not reuse a context that has ended, so it keeps only ctx's values.
func (h *Handler) release(ctx context.Context, resource, token string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	start := time.Now()
	err := h.locker.Unlock(ctx, resource, token)
	h.debug("release", resource, start, err)
}

// debug logs one command at Debug level. It never logs tokens.
func (h *Handler) debug(op, resource string, start time.Time, err error) {
	if ce := h.logger.Check(zap.DebugLevel, "lock command"); ce != nil {
		ce.Write(zap.String("op", op), zap.String("resource", resource),
			zap.Duration("elapsed", time.Since(start)), zap.Error(err))
	}
}

// appendErr appends an argument error, whose text is the whole reply.
func appendErr(dst []byte, err error) []byte {
	return redcon.AppendError(dst, err.Error())
}

// appendNull appends the null reply: RESP2's null array or RESP3's null.
func appendNull(dst []byte, resp3 bool) []byte {
	if resp3 {
		return append(dst, "_\r\n"...)
	}
	return append(dst, "*-1\r\n"...)
}

// appendEngineErr appends the reply for an error from quorum. Their texts
// are not passed on: they are for logs, and only this short reply reaches
// the client.
func appendEngineErr(dst []byte, err error) []byte {
	var (
		nq *quorum.NoQuorumError
		me *quorum.ModeError
		de *quorum.DeadlockError
	)
	switch {
	case errors.As(err, &nq):
		dst = append(dst, "-NOQUORUM "...)
		dst = append(dst, nq.Reply()...)
		return append(dst, "\r\n"...)
	case errors.As(err, &me):
		return redcon.AppendError(dst, "LOCKMODE "+me.Held)
	case errors.As(err, &de):
		return redcon.AppendError(dst, "DEADLOCK "+de.Why)
	case errors.Is(err, context.DeadlineExceeded):
		return redcon.AppendError(dst, msgTimedOut)
	case errors.Is(err, context.Canceled):
		return redcon.AppendError(dst, msgCancelled)
	}
	return redcon.AppendError(dst, msgUnexpected)
}
