package commands

import (
	"cmp"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/lockproxy/lockproxy/quorum"
)

// Config bounds the arguments the commands accept. The zero value is not
// useful; start from DefaultConfig.
type Config struct {
	// MaxTTL is the largest ttl-ms that LOCK and EXTEND accept. A larger one
	// is rejected with an ERR reply before any lock node is asked. The
	// default is 1h.
	MaxTTL time.Duration
	// MaxWait is the largest WAIT timeout-ms that LOCK accepts. Zero allows
	// only WAIT 0. The default is 60s.
	MaxWait time.Duration
	// MaxResources is the most resources one MLOCK takes, from 1 to
	// quorum.MaxResources; zero means the default, 64.
	MaxResources int
	// MaxPermits is the largest k of LOCK ... PERMITS k, at most
	// quorum.MaxPermits. Zero means the default, 1024.
	MaxPermits int64
}

// DefaultConfig returns the defaults: MaxTTL 1h, MaxWait 60s,
// MaxResources 64, MaxPermits 1024.
func DefaultConfig() Config {
	return Config{MaxTTL: time.Hour, MaxWait: time.Minute, MaxResources: 64, MaxPermits: defaultMaxPermits}
}

// defaultMaxPermits is MaxPermits's default.
const defaultMaxPermits = 1024

// Validate reports whether c can be used: MaxTTL must be at least 1ms,
// MaxWait must not be negative and MaxResources must be from 0 to
// quorum.MaxResources.
func (c Config) Validate() error {
	if c.MaxResources < 0 || c.MaxResources > quorum.MaxResources {
		return fmt.Errorf("commands: MaxResources %d is not from 1 to %d", c.MaxResources, quorum.MaxResources)
	}
	if c.MaxTTL < time.Millisecond {
		return fmt.Errorf("commands: MaxTTL %v is below 1ms", c.MaxTTL)
	}
	if c.MaxWait < 0 {
		return fmt.Errorf("commands: MaxWait %v is negative", c.MaxWait)
	}
	if c.MaxPermits < 0 || c.MaxPermits > quorum.MaxPermits {
		return fmt.Errorf("commands: MaxPermits %d is not between 1 and %d", c.MaxPermits, quorum.MaxPermits)
	}
	return nil
}

// releaseTimeout bounds the release of a lock whose client is gone (Close,
// or a LOCK that succeeded after the client disconnected). Each node round in
// quorum is already bounded by its NodeTimeout, so this only guards against
// a release that would otherwise wait forever on a context that never ends.
const releaseTimeout = 2 * time.Second

// Errors in replies to bad arguments. Their texts follow Redis and redcon,
// so client libraries show them like any other Redis error.
var (
	errSyntax       = errors.New("ERR syntax error")
	errNotInteger   = errors.New("ERR value is not an integer or out of range")
	errEmptyToken   = errors.New("ERR token must not be empty")
	errWaitNegative = errors.New("ERR WAIT timeout-ms is negative")
	errNoToken      = errors.New("ERR no token given and this connection does not hold the lock")
	errClosed       = errors.New("ERR connection closed")
	errUnknown      = errors.New("ERR unknown command")
	errHold         = errors.New("ERR HOLD n must be a positive integer")
	errHoldPlain    = errors.New("ERR HOLD needs a lock taken with REENTRANT or re-entered")

	errArityLock   = errors.New("ERR wrong number of arguments for 'lock' command")
	errArityUnlock = errors.New("ERR wrong number of arguments for 'unlock' command")
	errArityExtend = errors.New("ERR wrong number of arguments for 'extend' command")

	errExpireLock   = errors.New("ERR invalid expire time in 'lock' command")
	errExpireExtend = errors.New("ERR invalid expire time in 'extend' command")
)

// Replies for errors from the lock engine other than NoQuorumError.
const (
	msgTimedOut   = "ERR command timed out"
	msgCancelled  = "ERR command cancelled"
	msgUnexpected = "ERR unexpected error from the lock engine"
)

// Handler serves LOCK, UNLOCK, EXTEND and MLOCK for any number of connections. It
// is safe for concurrent use; per-connection state lives in Conn. It counts
// the commands' outcomes and the locks its connections hold: see Collect
// and Stats.
type Handler struct {
	locker *quorum.Locker
	logger *zap.Logger
	id     string // the proxy id (ID)

	maxTTL  int64 // milliseconds
	maxWait int64 // milliseconds
	// maxResources is the most resources one MLOCK takes.
	maxResources int64
	maxPerm      int64 // PERMITS k
	// The texts naming the maxima are built once so that parsing never
	// allocates.
	errTTLMax  error
	errWaitMax error
	// errResourcesMax names maxResources.
	errResourcesMax error
	errPermMax      error

	mu    sync.Mutex
	conns map[*Conn]struct{} // open connections; guarded by mu
	// holders indexes the connections that record each holding;
	// records counts the holdings ever recorded (holding.seq).
	holders *holders
	records atomic.Uint64

	// Serving a command costs one atomic add here; the rest of the
	// metrics is computed when they are collected.
	outcomes            [numOutcomes]atomic.Uint64
	keepaliveExtensions atomic.Uint64
	keepaliveLost       atomic.Uint64
}

// New returns a Handler that runs the commands on l. It rejects a cfg that
// fails Validate. A nil logger logs nothing. Per-command events are logged
// at Debug level, a lost KEEPALIVE at Warn. Tokens are never logged.
func New(l *quorum.Locker, cfg Config, logger *zap.Logger) (*Handler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = zap.NewNop()
	}
	h := &Handler{
		locker:  l,
		logger:  logger,
		id:      newProxyID(),
		maxTTL:  cfg.MaxTTL.Milliseconds(),
		maxWait: cfg.MaxWait.Milliseconds(),

		maxResources: int64(cmp.Or(cfg.MaxResources, DefaultConfig().MaxResources)),
		maxPerm:      cfg.MaxPermits,
		conns:        make(map[*Conn]struct{}),
		holders:      newHolders(),
	}
	if h.maxPerm == 0 {
		h.maxPerm = defaultMaxPermits
	}
	h.errTTLMax = fmt.Errorf("ERR ttl-ms exceeds the maximum of %d", h.maxTTL)
	h.errWaitMax = fmt.Errorf("ERR WAIT timeout-ms exceeds the maximum of %d", h.maxWait)
	h.errResourcesMax = fmt.Errorf("ERR numresources exceeds the maximum of %d", h.maxResources)
	h.errPermMax = fmt.Errorf("ERR PERMITS exceeds the maximum of %d", h.maxPerm)
	return h, nil
}

// Is reports whether name, in any case, is one of the commands the Handler
// serves (see Names). It does not allocate.
func (h *Handler) Is(name []byte) bool {
	return lookup(name) != nil
}

// MayWait reports whether the command in args may take longer than its
// round trips to the lock nodes: a LOCK with a WAIT option.
func (h *Handler) MayWait(args [][]byte) bool {
	if len(args) == 0 {
		return false
	}
	s := lookup(args[0])
	return s != nil && s.mayWait != nil && s.mayWait(args)
}

// lockMayWait reports whether a LOCK may wait: whether it has a WAIT
// option. It errs towards yes: a TOKEN named "wait" counts too.
func lockMayWait(args [][]byte) bool { return hasWait(args, 3) }

// hasWait reports whether an argument from args[from] on is "wait", in any
// case.
func hasWait(args [][]byte, from int) bool {
	if len(args) <= from {
		return false
	}
	for _, a := range args[from:] {
		if equalFold(a, "wait") {
			return true
		}
	}
	return false
}

// NewConn returns the state of one new client connection. The caller must
// call Conn.Close when the connection ends; until then the Handler counts
// the connection's locks in lockproxy_locks_held.
func (h *Handler) NewConn() *Conn {
	c := &Conn{h: h, held: make(map[string][]*holding)}
	h.mu.Lock()
	h.conns[c] = struct{}{}
	h.mu.Unlock()
	return c
}

// equalFold reports whether b equals lower, ignoring ASCII case. lower must
// consist of lower-case ASCII letters.
func equalFold(b []byte, lower string) bool {
	if len(b) != len(lower) {
		return false
	}
	for i := range len(b) {
		if b[i]|0x20 != lower[i] {
			return false
		}
	}
	return true
}
