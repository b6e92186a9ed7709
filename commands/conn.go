package commands

import (
	"context"
	"errors"
	"fmt"
	"slices"
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

	mu sync.Mutex
	// held maps a resource to its holdings on this connection: one for an
	// exclusive lock, any number of readers or permits; guarded by mu.
	held   map[string][]*holding
	closed bool // guarded by mu

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
	// gone reports that the holding was released through another
	// connection (Handler.released). Guarded by the Conn's mu.
	gone bool
	seq  uint64 // the Handler's count of records, this one included
}

// lost reports whether the keepalive of h gave the lock up. h may be nil.
func (h *holding) lost() bool { return h != nil && h.ext != nil && h.ext.lost.Load() }

// validAt reports whether the lock's last known validity lasts beyond now.
// The Conn's mu must be held.
func (h *holding) validAt(now time.Time) bool {
	if h.lost() || h.gone {
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
// from then on if it says KEEPALIVE, and stops keeping it alive if not. A
// successful RLOCK or LOCK ... PERMITS k (k > 1) adds a holding, replacing
// only the record of the same token; a token-less UNLOCK or EXTEND on a
// connection with more than one valid holding of the resource is an
// error that names their number. A holding whose last hold was released
// through another connection of the Handler (by its token) is no longer
// valid here (Handler.released).
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
	return c.acquire(ctx, dst, a, resp3, lockOutcomes, c.h.locker.Lock)
}

// acquire runs a parsed LOCK (or RLOCK, with its outcomes o and acquire
// function) and replies.
func (c *Conn) acquire(ctx context.Context, dst []byte, a lockArgs, resp3 bool, o acquireOutcomes,
	lock func(context.Context, string, time.Duration, quorum.Options) (quorum.Lock, error)) []byte {
	resource := string(a.resource)
	start := time.Now()
	lk, err := lock(ctx, resource, a.ttl, quorum.Options{Wait: a.wait, Token: string(a.token), Permits: int(a.permits), Reentrant: a.reentrant, Holder: c.holder})
	if hook := testHookLocked.Load(); hook != nil {
		(*hook)()
	}
	c.h.debug(o.name, resource, start, err)
	switch {
	case errors.Is(err, quorum.ErrNotAcquired):
		c.h.count(o.notAcquired)
		return appendNull(dst, resp3)
	case err != nil:
		c.h.countEngineErr(err, o.noQuorum, o.err)
		return appendEngineErr(dst, err)
	}
	if err := ctx.Err(); err != nil {
		// The client is gone (or the command ran out of time) just after
		// the nodes granted the lock. Nobody will ever see the token, so
		// give the lock back now instead of blocking others for the ttl.
		c.h.count(o.err)
		c.h.release(ctx, resource, lk.Token)
		return appendEngineErr(dst, err)
	}
	h := c.record(ctx, resource, lk, a.ttl, lk.Expires, a.keepalive, o.name == "lock" && a.permits <= 1)
	if h == nil {
		c.h.count(o.err)
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
		c.h.count(o.notAcquired)
		c.h.release(ctx, resource, lk.Token)
		return appendNull(dst, resp3)
	}
	c.h.count(o.acquired)
	if a.permits > 1 || a.reentrant {
		dst = redcon.AppendArray(dst, 4)
	} else {
		dst = redcon.AppendArray(dst, 3)
	}
	dst = redcon.AppendBulkString(dst, lk.Token)
	dst = redcon.AppendInt(dst, ms)
	dst = redcon.AppendInt(dst, lk.Fence)
	switch {
	case a.permits > 1:
		dst = redcon.AppendInt(dst, int64(lk.Slot))
	case a.reentrant:
		dst = redcon.AppendInt(dst, lk.Holds)
	}
	return dst
}

// testHookLocked, when set, runs right after a LOCK's Lock call returns:
// tests stall the proxy there.
var testHookLocked atomic.Pointer[func()]

// record adds lk to the holdings of resource on this connection and
// starts an extender if keepalive is set. It replaces (and stops the
// extender of) an earlier holding of the same token, every earlier holding
// when exclusive (an exclusive grant proves that they ended), and those
// whose validity has run out. until is the end of lk's validity. A
// re-entry (lk has holds) of a holding recorded here keeps the holds that
// it took with KEEPALIVE, and their extender. It returns the holding, or
// nil if the connection is closed.
func (c *Conn) record(ctx context.Context, resource string, lk quorum.Lock, ttl time.Duration, until time.Time, keepalive, exclusive bool) *holding {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	var kept int64
	if keepalive {
		kept = 1
	}
	now := time.Now()
	rest := c.held[resource][:0]
	for _, old := range c.held[resource] {
		if lk.Holds > 1 && old.token == lk.Token && !old.lost() {
			kept += old.kept
		}
		if !exclusive && old.token != lk.Token && old.validAt(now) {
			rest = append(rest, old)
			continue
		}
		if old.ext != nil {
			old.ext.stop()
		}
		if old.token != lk.Token {
			c.h.holders.remove(lockID{resource, old.token}, c)
		}
	}
	c.h.holders.add(lockID{resource, lk.Token}, c)
	keepalive = kept > 0
	h := &holding{token: lk.Token, base: context.WithoutCancel(ctx), keep: keepalive, until: until, kept: kept, ttl: ttl, seq: c.h.records.Add(1)}
	if keepalive {
		h.ext = c.startExtender(h.base, resource, lk.Token, ttl, until)
	}
	c.held[resource] = append(rest, h)
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
	hs := c.held[resource]
	if token != nil {
		for _, h := range hs {
			if h.token == string(token) {
				return h, h.token, nil
			}
		}
		return nil, string(token), nil
	}
	if len(hs) == 0 {
		return nil, "", errNoToken
	}
	if n := validCount(hs, time.Now()); n > 1 {
		return nil, "", fmt.Errorf("ERR this connection holds '%s' %d times; give the token", resource, n)
	}
	for _, h := range hs {
		if h.validAt(time.Now()) {
			return h, h.token, nil
		}
	}
	h := hs[len(hs)-1] // none valid: the last one answers that it is gone
	return h, h.token, nil
}

// validCount returns how many of hs are valid at now. The Conn's mu must
// be held.
func validCount(hs []*holding, now time.Time) int {
	n := 0
	for _, h := range hs {
		if h.validAt(now) {
			n++
		}
	}
	return n
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
	hs := c.held[resource]
	if i := slices.Index(hs, h); i >= 0 {
		c.h.holders.remove(lockID{resource, h.token}, c)
		hs = slices.Delete(hs, i, i+1)
		if len(hs) == 0 {
			delete(c.held, resource)
		} else {
			c.held[resource] = hs
		}
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
	start, seq := time.Now(), c.h.recordSeq()
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
		c.h.released(lockID{resource, token}, c, seq)
		return redcon.AppendInt(dst, 1)
	case errors.Is(err, quorum.ErrNotReentrant):
		c.h.count(unlockBadRequest)
		c.keepHolds(resource, h, -1)
		return appendErr(dst, errHoldPlain)
	case errors.Is(err, quorum.ErrNotHeld):
		c.h.count(unlockNotHeld)
		c.forget(resource, h)
		c.h.released(lockID{resource, token}, c, seq)
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
	if c.closed || !slices.Contains(c.held[resource], h) {
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
	if c.closed || !slices.Contains(c.held[resource], h) {
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
	for resource, hs := range held {
		for _, h := range hs {
			c.h.holders.remove(lockID{resource, h.token}, c)
		}
	}

	for _, hs := range held {
		for _, h := range hs {
			if h.ext != nil {
				h.ext.cancel()
			}
		}
	}
	c.extenders.Wait()

	var wg sync.WaitGroup
	for resource, hs := range held {
		for _, h := range hs {
			if !h.keep || h.lost() {
				continue
			}
			// One release per hold taken with KEEPALIVE (a lock without
			// a count has one).
			wg.Go(func() {
				for range max(h.kept, 1) {
					c.h.release(h.base, resource, h.token)
				}
			})
		}
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
