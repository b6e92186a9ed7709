package quorum

import (
	"errors"
	"fmt"
	"time"
)

// Config tunes a Locker. Start from DefaultConfig and change what you need;
// New rejects a Config that fails Validate. A Config is a plain value and
// safe to share.
type Config struct {
	// NodeTimeout bounds one call to one lock node, from the moment it is
	// made: waiting for the node's batch in flight, connecting and the round
	// trip included. A node that does not answer in time counts as failed
	// for that call. Every acquisition may spend up to NodeTimeout of the lock's
	// ttl, so keep it much smaller than any ttl. The default is 50ms.
	NodeTimeout time.Duration

	// DriftFactor is the share of the ttl taken off a lock's validity to
	// allow for the nodes' clocks running at different rates; 2ms are taken
	// off on top of it. The default is 0.01.
	DriftFactor float64

	// KeyPrefix starts every key and channel the Locker uses on the lock
	// nodes: "<prefix>lock:<resource>", "<prefix>fence", "<prefix>intact",
	// "<prefix>recovery", "<prefix>clock" and "<prefix>released". Lockers
	// that share nodes and resources must use the same prefix. The default
	// is "lockproxy:".
	KeyPrefix string

	// ClockTolerance is how far a lock node's clock may move against the
	// others' (beyond DriftFactor) before it is taken for a clock jump: a
	// node whose clock jumped forward further has expired its locks early
	// and is handled as a node that lost its data (see clock.go). A jump
	// within it can go unnoticed, so every validity is shortened by it.
	// Half of it bounds how late a node may read its clock after a call was
	// sent for its vote to count, so keep it above the round trip to the
	// nodes under load: a vote that comes too late to be placed does not
	// count. Lockers that share nodes should use the same value. Zero, the
	// default, means NodeTimeout, at least 2ms and at most 100ms: a reply
	// that comes in time can then be judged when its way there took at
	// most half of that.
	ClockTolerance time.Duration

	// MaxTTL is the largest ttl that Lock and Extend accept. It also bounds
	// how long a node that lost its data stays out of the quorum when its
	// locks cannot be copied back from the other nodes: every lock it may
	// have held has expired MaxTTL after the loss (see recovery.go).
	// Lockers that share nodes must use the same MaxTTL (and NodeTimeout,
	// which sets how long a recovery waits for the rounds in flight at the
	// loss). The default is 1h.
	MaxTTL time.Duration

	// ProbeInterval is how often the Locker checks every node's state
	// (reachable, kept its data) in the background, so that a node that
	// lost its data is noticed and brought back without waiting for a call,
	// and a node that comes back is seen at once. The default is 100ms.
	ProbeInterval time.Duration

	// RetryMin and RetryMax bound the random delay after which a waiting
	// Lock tries again when neither a release notification arrived nor the
	// holder's ttl ran out. The notification is the normal wake-up; the
	// delay covers a lost one (a notification is at most once, for example
	// while a subscription reconnects) and spreads out contenders that
	// split the votes. The defaults are 5ms and 50ms.
	RetryMin, RetryMax time.Duration
}

// DefaultConfig returns the defaults documented on each Config field.
func DefaultConfig() Config {
	return Config{
		NodeTimeout:   50 * time.Millisecond,
		DriftFactor:   0.01,
		KeyPrefix:     "lockproxy:",
		MaxTTL:        time.Hour,
		ProbeInterval: 100 * time.Millisecond,
		RetryMin:      5 * time.Millisecond,
		RetryMax:      50 * time.Millisecond,
	}
}

// clockTolerance returns ClockTolerance, or for zero NodeTimeout within
// [2ms, 100ms].
func (c Config) clockTolerance() time.Duration {
	if c.ClockTolerance != 0 {
		return c.ClockTolerance
	}
	return min(max(c.NodeTimeout, 2*time.Millisecond), 100*time.Millisecond)
}

// Validate reports every field of c that New would reject, joined.
func (c Config) Validate() error {
	var errs []error
	if c.NodeTimeout <= 0 {
		errs = append(errs, fmt.Errorf("quorum: NodeTimeout must be positive, got %v", c.NodeTimeout))
	}
	if !(c.DriftFactor >= 0 && c.DriftFactor < 1) { // also rejects NaN
		errs = append(errs, fmt.Errorf("quorum: DriftFactor must be in [0, 1), got %v", c.DriftFactor))
	}
	if c.ClockTolerance != 0 && c.ClockTolerance < 2*time.Millisecond {
		errs = append(errs, fmt.Errorf("quorum: ClockTolerance must be 0 (NodeTimeout) or at least 2ms, got %v", c.ClockTolerance))
	}
	if c.KeyPrefix == "" {
		errs = append(errs, errors.New("quorum: KeyPrefix must not be empty"))
	}
	if c.MaxTTL < time.Millisecond {
		errs = append(errs, fmt.Errorf("quorum: MaxTTL must be at least 1ms, got %v", c.MaxTTL))
	}
	if c.ProbeInterval <= 0 {
		errs = append(errs, fmt.Errorf("quorum: ProbeInterval must be positive, got %v", c.ProbeInterval))
	}
	if c.RetryMin <= 0 {
		errs = append(errs, fmt.Errorf("quorum: RetryMin must be positive, got %v", c.RetryMin))
	}
	if c.RetryMax < c.RetryMin {
		errs = append(errs, fmt.Errorf("quorum: RetryMax (%v) must not be below RetryMin (%v)", c.RetryMax, c.RetryMin))
	}
	return errors.Join(errs...)
}
