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
	Answered   int // nodes that gave a usable reply
	Total      int // configured nodes
	Recovering int // of those that answered, nodes that lost their data and do not count yet
	// Unmarked is, of those that answered, the nodes of a deployment never
	// used, which count once every node has answered once.
	Unmarked int
	// Evicting is, of those that answered, the nodes that may evict keys
	// (a memory limit with a policy other than noeviction): they never
	// count.
	Evicting int
	// Unplaced is, of those that answered, the nodes whose clock reading
	// could not be placed against the reference clock (a round trip longer
	// than half the clock tolerance, or no reference yet): their replies
	// cannot count, as nothing bounds how far their clocks moved.
	Unplaced int
}

// Error returns, for example, "quorum: 1 of 3 lock nodes answered", with
// ", 1 recovering from lost data" after it when nodes that answered could
// not count.
func (e *NoQuorumError) Error() string {
	return "quorum: " + e.Reply()
}

// Reply returns the error without the package prefix, as LOCK, UNLOCK and
// EXTEND answer it after "NOQUORUM ": for example "1 of 3 lock nodes
// answered", with ", 1 recovering from lost data" or ", 2 new: a new
// deployment is used once every node has answered" after it when nodes
// that answered could not count (also ", 1 may evict keys ..." and ", 1
// with a clock reading not placed ...").
func (e *NoQuorumError) Reply() string {
	s := fmt.Sprintf("%d of %d lock nodes answered", e.Answered, e.Total)
	if e.Recovering > 0 {
		s += fmt.Sprintf(", %d recovering from lost data", e.Recovering)
	}
	if e.Evicting > 0 {
		s += fmt.Sprintf(", %d may evict keys (maxmemory-policy is not noeviction)", e.Evicting)
	}
	if e.Unplaced > 0 {
		s += fmt.Sprintf(", %d with a clock reading not placed (a round trip over half the clock tolerance, or no reference yet)", e.Unplaced)
	}
	if e.Unmarked > 0 {
		s += fmt.Sprintf(", %d new: a new deployment is used once every node has answered", e.Unmarked)
	}
	return s
}

// ModeError is returned when the resource is held in another mode than the
// request's (exclusive or shared against a semaphore, a semaphore against
// either, or a semaphore of another k), as a majority of the nodes that
// count report it. Nothing was changed. Match it with errors.As.
type ModeError struct {
	// Held says what holds the resource, as the reply shows it after
	// "LOCKMODE ": for example "held as a semaphore of 3 permits".
	Held string
}

func (e *ModeError) Error() string { return "quorum: " + e.Held }

// DeadlockError is returned for a request by the token of a current
// holding that could only wait for itself (an upgrade of a read hold, a
// read hold by the exclusive holder, an MLOCK of a set the token holds in
// part). Nothing was changed. Match it with errors.As.
type DeadlockError struct {
	// Why is the reply's text after "DEADLOCK ".
	Why string
}

func (e *DeadlockError) Error() string { return "quorum: " + e.Why }
