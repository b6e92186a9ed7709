package commands

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/tidwall/redcon"

	"github.com/lockproxy/lockproxy/quorum"
)

// Errors of MLOCK's arguments.
var (
	errArityMLock    = errors.New("ERR wrong number of arguments for 'mlock' command")
	errExpireMLock   = errors.New("ERR invalid expire time in 'mlock' command")
	errNumResources  = errors.New("ERR numresources should be greater than 0")
	errFewResources  = errors.New("ERR fewer resources than numresources, or no ttl-ms after them")
	errMLockReentant = errors.New("ERR MLOCK does not take REENTRANT")
	errMLockPermits  = errors.New("ERR MLOCK does not take PERMITS")
)

// mlockArgs are the parsed arguments of MLOCK numresources resource
// [resource ...] ttl-ms [WAIT timeout-ms] [TOKEN token] [KEEPALIVE]. The
// byte slices alias the command's arguments.
type mlockArgs struct {
	resources [][]byte
	lockArgs  // the ttl and the options; its resource is the first one
}

// parseMLock parses an MLOCK command. After the resources and the ttl it
// takes LOCK's options, parsed by parseLock, except REENTRANT and PERMITS.
// A resource named twice is an error: the same set in another order is the
// same set, and a set with a repeated name is no set.
func (h *Handler) parseMLock(args [][]byte) (mlockArgs, error) {
	var a mlockArgs
	if len(args) < 4 {
		return a, errArityMLock
	}
	n, ok := parseInt(args[1])
	switch {
	case !ok:
		return a, errNotInteger
	case n <= 0:
		return a, errNumResources
	case n > h.maxResources:
		return a, h.errResourcesMax
	case int64(len(args)) < 3+n:
		return a, errFewResources
	}
	a.resources = args[2 : 2+n]
	seen := make(map[string]struct{}, n)
	for _, r := range a.resources {
		if _, dup := seen[string(r)]; dup {
			return a, fmt.Errorf("ERR resource '%s' is named twice", r)
		}
		seen[string(r)] = struct{}{}
	}
	opts := args[3+n:]
	for i := 0; i < len(opts); i++ {
		switch o := opts[i]; {
		case equalFold(o, "wait"), equalFold(o, "token"):
			i++ // its value may be any word
		case equalFold(o, "reentrant"):
			return a, errMLockReentant
		case equalFold(o, "permits"):
			return a, errMLockPermits
		}
	}
	// LOCK's parser on "LOCK <first resource> ttl-ms options...".
	lock := make([][]byte, 0, 3+len(opts))
	lock = append(lock, args[0], a.resources[0], args[2+n])
	la, err := h.parseLock(append(lock, opts...))
	if errors.Is(err, errExpireLock) {
		err = errExpireMLock
	}
	a.lockArgs = la
	return a, err
}

// mlockMayWait reports whether an MLOCK may wait: whether it has a WAIT
// option. It errs towards yes, as lockMayWait does.
func mlockMayWait(args [][]byte) bool { return hasWait(args, 4) }

func (c *Conn) mlock(ctx context.Context, dst []byte, args [][]byte, resp3 bool) []byte {
	a, err := c.h.parseMLock(args)
	if err != nil {
		c.h.count(mlockBadRequest)
		return appendErr(dst, err)
	}
	resources := make([]string, len(a.resources))
	for i, r := range a.resources {
		resources[i] = string(r)
	}
	start := time.Now()
	ml, err := c.h.locker.MLock(ctx, resources, a.ttl, quorum.Options{Wait: a.wait, Token: string(a.token), Holder: c.holder})
	c.h.debug("mlock", strings.Join(resources, " "), start, err)
	switch {
	case errors.Is(err, quorum.ErrNotAcquired):
		c.h.count(mlockNotAcquired)
		return appendNull(dst, resp3)
	case err != nil:
		c.h.countEngineErr(err, mlockNoQuorum, mlockError)
		return appendEngineErr(dst, err)
	}
	if err := ctx.Err(); err != nil {
		// As for LOCK: the client is gone, nobody will see the token.
		c.h.count(mlockError)
		c.h.releaseAll(ctx, resources, ml.Token)
		return appendEngineErr(dst, err)
	}
	// Each resource is recorded as a LOCK of it would be: UNLOCK and
	// EXTEND without a token, KEEPALIVE and Close work per resource.
	held := make([]*holding, len(resources))
	for i, r := range resources {
		lk := quorum.Lock{Token: ml.Token, Validity: ml.Validity, Expires: ml.Expires, Fence: ml.Fences[i]}
		if held[i] = c.record(ctx, r, lk, a.ttl, ml.Expires, a.keepalive, true); held[i] == nil {
			c.h.count(mlockError)
			c.h.releaseAll(ctx, resources, ml.Token)
			return appendErr(dst, errClosed)
		}
	}
	ms := time.Until(ml.Expires).Milliseconds()
	if ms <= 0 {
		for i, r := range resources {
			c.forget(r, held[i])
		}
		c.h.count(mlockNotAcquired)
		c.h.releaseAll(ctx, resources, ml.Token)
		return appendNull(dst, resp3)
	}
	c.h.count(mlockAcquired)
	dst = redcon.AppendArray(dst, 3)
	dst = redcon.AppendBulkString(dst, ml.Token)
	dst = redcon.AppendInt(dst, ms)
	dst = redcon.AppendArray(dst, len(ml.Fences))
	for _, f := range ml.Fences {
		dst = redcon.AppendInt(dst, f)
	}
	return dst
}

// releaseAll gives up the locks of token on resources, all at once, as
// release does for one.
func (h *Handler) releaseAll(ctx context.Context, resources []string, token string) {
	var wg sync.WaitGroup
	for _, r := range resources {
		wg.Go(func() { h.release(ctx, r, token) })
	}
	wg.Wait()
}
