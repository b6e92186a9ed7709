package backend

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Backoff spaces out connection attempts to a backend that is down:
// after a failed dial, clients get the same error at once until the wait
// (25ms, doubling up to 250ms) has passed; then the next command tries
// again. A backend that comes back is used again within that wait. The
// zero Backoff is ready to use; its methods are safe for concurrent use.
type Backoff struct {
	// Spare, when set, reports errors that say nothing of the backend's
	// health (nothing was dialled, or the backend is up and refused one
	// user): they are not recorded. Set before first use.
	Spare func(error) bool

	mu    sync.Mutex
	err   error
	until time.Time
	wait  time.Duration
}

// Check returns the error of the last failed dial while its wait lasts,
// nil otherwise.
func (b *Backoff) Check() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.err != nil && time.Now().Before(b.until) {
		return b.err
	}
	return nil
}

// Record records the outcome of a dial: nil (or a cancelled context)
// ends the wait, another error starts or doubles it.
func (b *Backoff) Record(err error) {
	if err != nil && b.Spare != nil && b.Spare(err) {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err == nil || errors.Is(err, context.Canceled) {
		b.err, b.wait = nil, 0
		return
	}
	b.wait = min(max(2*b.wait, 25*time.Millisecond), 250*time.Millisecond)
	b.err, b.until = err, time.Now().Add(b.wait)
}
