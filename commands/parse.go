package commands

import (
	"math"
	"time"
)

// lockArgs are the parsed arguments of
// LOCK resource ttl-ms [WAIT timeout-ms] [TOKEN token] [KEEPALIVE]
// [PERMITS k] [REENTRANT]. The byte slices alias the command's arguments.
type lockArgs struct {
	resource  []byte
	ttl       time.Duration
	wait      time.Duration
	token     []byte // nil: let quorum generate one
	keepalive bool
	permits   int64 // 0: not given
	reentrant bool
}

// unlockArgs are the parsed arguments of UNLOCK resource [token [HOLD n]].
type unlockArgs struct {
	resource []byte
	token    []byte // nil: use the token recorded on this connection
	hold     int64  // n of HOLD n; 0 without HOLD
}

// extendArgs are the parsed arguments of EXTEND resource ttl-ms [token].
type extendArgs struct {
	resource []byte
	ttl      time.Duration
	token    []byte // nil: use the token recorded on this connection
}

// parseLock parses a LOCK command. Options may come in any order and any
// case; each may appear once. Like Redis's SET, an option missing its value
// is a syntax error.
func (h *Handler) parseLock(args [][]byte) (lockArgs, error) {
	var a lockArgs
	if len(args) < 3 {
		return a, errArityLock
	}
	a.resource = args[1]
	ttl, err := h.parseTTL(args[2], errExpireLock)
	if err != nil {
		return a, err
	}
	a.ttl = ttl
	var wait, token bool
	for i := 3; i < len(args); i++ {
		opt, more := args[i], i+1 < len(args)
		switch {
		case !wait && more && equalFold(opt, "wait"):
			wait = true
			i++
			ms, ok := parseInt(args[i])
			if !ok {
				return a, errNotInteger
			}
			if ms < 0 {
				return a, errWaitNegative
			}
			if ms > h.maxWait {
				return a, h.errWaitMax
			}
			a.wait = time.Duration(ms) * time.Millisecond
		case !token && more && equalFold(opt, "token"):
			token = true
			i++
			if len(args[i]) == 0 {
				return a, errEmptyToken
			}
			a.token = args[i]
		case !a.keepalive && equalFold(opt, "keepalive"):
			a.keepalive = true
		case a.permits == 0 && more && equalFold(opt, "permits"):
			i++
			if a.permits, err = h.parsePermits(args[i]); err != nil {
				return a, err
			}
		case !a.reentrant && equalFold(opt, "reentrant"):
			// RLOCK and MLOCK refuse it (parseRLock, parseMLock).
			a.reentrant = true
		default:
			return a, errSyntax
		}
	}
	if a.reentrant && a.permits > 1 {
		return a, errReentrantPermits
	}
	return a, nil
}

// parseUnlock parses an UNLOCK command. HOLD needs the token before it.
func parseUnlock(args [][]byte) (unlockArgs, error) {
	var a unlockArgs
	switch {
	case len(args) < 2 || len(args) == 4 || len(args) > 5:
		return a, errArityUnlock
	case len(args) == 5 && !equalFold(args[3], "hold"):
		return a, errSyntax
	}
	a.resource = args[1]
	if len(args) >= 3 {
		if len(args[2]) == 0 {
			return a, errEmptyToken
		}
		a.token = args[2]
	}
	if len(args) == 5 {
		n, ok := parseInt(args[4])
		if !ok || n <= 0 {
			return a, errHold
		}
		a.hold = n
	}
	return a, nil
}

// parseExtend parses an EXTEND command.
func (h *Handler) parseExtend(args [][]byte) (extendArgs, error) {
	var a extendArgs
	if len(args) != 3 && len(args) != 4 {
		return a, errArityExtend
	}
	a.resource = args[1]
	ttl, err := h.parseTTL(args[2], errExpireExtend)
	if err != nil {
		return a, err
	}
	a.ttl = ttl
	if len(args) == 4 {
		if len(args[3]) == 0 {
			return a, errEmptyToken
		}
		a.token = args[3]
	}
	return a, nil
}

// parseTTL parses a ttl-ms argument: a positive integer no larger than the
// configured maximum. errExpire names the command, as Redis's SET does.
func (h *Handler) parseTTL(b []byte, errExpire error) (time.Duration, error) {
	ms, ok := parseInt(b)
	switch {
	case !ok:
		return 0, errNotInteger
	case ms <= 0:
		return 0, errExpire
	case ms > h.maxTTL:
		return 0, h.errTTLMax
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// parseInt parses a decimal int64 the way Redis's string2ll does: an
// optional minus sign, no plus sign, no spaces, no leading zeros, no
// overflow. Unlike strconv.ParseInt it never allocates.
func parseInt(b []byte) (int64, bool) {
	if len(b) == 1 && b[0] == '0' {
		return 0, true
	}
	neg := len(b) > 0 && b[0] == '-'
	if neg {
		b = b[1:]
	}
	if len(b) == 0 || b[0] < '1' || b[0] > '9' {
		return 0, false
	}
	var n uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		if n > (math.MaxUint64-9)/10 {
			return 0, false
		}
		n = n*10 + uint64(c-'0')
	}
	switch {
	case neg && n <= 1<<63:
		return int64(-n), true // -(1<<63) wraps to MinInt64, as intended
	case !neg && n <= math.MaxInt64:
		return int64(n), true
	}
	return 0, false
}
