package commands

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/lockproxy/lockproxy/quorum"
)

// extender keeps one lock alive for a KEEPALIVE: it extends the lock about
// every ttl/3 (sooner when half the validity left is less) with the lock's
// current ttl. It gives the lock up at once when
// the nodes say the token no longer owns it, and after failed extensions
// (no quorum, timeouts) once the last known validity has run out. Its Conn
// starts it, stops it and waits for it.
type extender struct {
	resource string
	token    string

	ctx    context.Context // ends when the extender must stop
	cancel context.CancelFunc
	done   chan struct{} // closed when run has returned
	kick   chan struct{} // buffered(1): ttl or until changed by an EXTEND

	lost atomic.Bool // set before done is closed when the lock was given up

	mu     sync.Mutex
	ttl    time.Duration // the ttl every extension asks for
	until  time.Time     // end of the last known validity (monotonic)
	exited bool
}

// errValidityOver is logged when a keepalive is lost because extensions
// kept failing until the lock's validity had run out.
var errValidityOver = errors.New("validity ran out before an extension succeeded")

// errPanic is logged when a keepalive is lost to a panic in its extender.
var errPanic = errors.New("the extender panicked")

// testHookExtend, when set, is called with the resource before each
// extension (tests inject a panic with it).
var testHookExtend atomic.Pointer[func(resource string)]

// startExtender starts the extender of one kept lock. base must not be
// cancelled by the end of the command. c.mu must be held and c must not be
// closed, so that Close waits for it.
func (c *Conn) startExtender(base context.Context, resource, token string, ttl time.Duration, until time.Time) *extender {
	ctx, cancel := context.WithCancel(base)
	e := &extender{
		resource: resource,
		token:    token,
		ctx:      ctx,
		cancel:   cancel,
		done:     make(chan struct{}),
		kick:     make(chan struct{}, 1),
		ttl:      ttl,
		until:    until,
	}
	c.extenders.Add(1)
	go func() {
		defer c.extenders.Done()
		defer close(e.done)
		defer e.recoverPanic(c.h)
		e.run(c.h)
	}()
	return e
}

// recoverPanic contains a panic in the extender to its own lock: the
// keepalive counts as lost (the lock runs out with its ttl, and the
// client's next UNLOCK or EXTEND says so) and the process carries on.
func (e *extender) recoverPanic(h *Handler) {
	p := recover()
	if p == nil {
		return
	}
	h.logger.Error("panic keeping a lock alive; the keepalive is given up",
		zap.String("resource", e.resource), zap.Any("panic", p), zap.StackSkip("stack", 1))
	e.mu.Lock()
	e.exited = true
	e.mu.Unlock()
	if !e.lost.Load() {
		e.lose(h, errPanic)
	}
}

// stop stops the extender and waits until it has returned. It is
// idempotent. An extension under way is cancelled.
func (e *extender) stop() {
	e.cancel()
	<-e.done
}

// update records the ttl and validity of a successful EXTEND by the client.
// It reports false if the extender has already returned.
func (e *extender) update(ttl time.Duration, until time.Time) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.exited {
		return false
	}
	e.ttl = ttl
	if until.After(e.until) {
		e.until = until
	}
	select {
	case e.kick <- struct{}{}:
	default:
	}
	return true
}

func (e *extender) state() (time.Duration, time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.ttl, e.until
}

func (e *extender) run(h *Handler) {
	l := h.locker
	defer func() {
		e.mu.Lock()
		e.exited = true
		e.mu.Unlock()
	}()
	t := time.NewTimer(e.nextExtension())
	defer t.Stop()
	for {
		select {
		case <-e.ctx.Done():
			return
		case <-e.kick:
			t.Reset(e.nextExtension())
			continue
		case <-t.C:
		}

		ttl, until := e.state()
		if !time.Now().Before(until) {
			e.lose(h, errValidityOver)
			return
		}
		if hook := testHookExtend.Load(); hook != nil {
			(*hook)(e.resource)
		}
		// An extension that ends after the validity is useless: by then
		// another client may hold the lock.
		ctx, cancel := context.WithDeadline(e.ctx, until)
		validity, err := l.Extend(ctx, e.resource, e.token, ttl)
		cancel()
		if e.ctx.Err() != nil {
			return // stopped by UNLOCK, a new LOCK or Close
		}
		switch {
		case err == nil && validity > 0:
			e.mu.Lock()
			if v := time.Now().Add(validity); v.After(e.until) { // validity counts from Extend's return
				e.until = v
			}
			e.mu.Unlock()
			h.keepaliveExtensions.Add(1)
			t.Reset(e.nextExtension())
		case err == nil || errors.Is(err, quorum.ErrNotHeld):
			e.lose(h, quorum.ErrNotHeld)
			return
		default:
			// No quorum or a timeout: the lock may well still be held.
			// Try again sooner, while the validity lasts.
			_, until := e.state()
			left := time.Until(until)
			if left <= 0 {
				e.lose(h, err)
				return
			}
			t.Reset(retryDelay(ttl, left))
		}
	}
}

// nextExtension is the wait before the next extension: a third of the
// ttl, but at most half of the validity left, which the drift and the
// clock tolerance can make much shorter than the ttl.
func (e *extender) nextExtension() time.Duration {
	ttl, until := e.state()
	return max(min(ttl/3, time.Until(until)/2), time.Millisecond)
}

// retryDelay is the wait before another try after a failed extension, with
// left of the validity remaining: a tenth of the ttl, but at most half of
// what is left, so that a few tries fit before the validity runs out.
func retryDelay(ttl, left time.Duration) time.Duration {
	return max(min(ttl/10, left/2), time.Millisecond)
}

func (e *extender) lose(h *Handler, err error) {
	e.lost.Store(true)
	h.keepaliveLost.Add(1)
	h.logger.Warn("keepalive lost", zap.String("resource", e.resource), zap.Error(err))
}
