package quorum

import (
	"errors"
	"fmt"
)

// ErrNotAcquired is returned by Lock when another owner holds the resource:
// at once without Options.Wait, or when the wait ran out.
var ErrNotAcquired = errors.New("quorum: not acquired")

// ErrNotHeld is returned by Unlock and Extend when the token does not own
// the resource on a majority of nodes: the lock expired, was released, or
// belongs to someone else.
var ErrNotHeld = errors.New("quorum: not held")

// errClosed is returned by calls on a Locker that Close has stopped.
var errClosed = errors.New("quorum: locker closed")

// NoQuorumError is returned when fewer than a majority of the lock nodes
// answered, so the outcome could not be decided. Nothing is left locked
// behind. Match it with errors.As.
type NoQuorumError struct {
	Answered int // nodes that gave a usable reply
	Total    int // configured nodes
}

// Error returns, for example, "quorum: 1 of 3 lock nodes answered".
func (e *NoQuorumError) Error() string {
	return fmt.Sprintf("quorum: %d of %d lock nodes answered", e.Answered, e.Total)
}
