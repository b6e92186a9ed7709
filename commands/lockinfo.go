package commands

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strconv"
	"time"

	"github.com/tidwall/redcon"

	"github.com/lockproxy/lockproxy/quorum"
)

var errArityLockinfo = errors.New("ERR wrong number of arguments for 'lockinfo' command")

// newProxyID returns a proxy id: random, unique per process for every
// practical purpose, shown in INFO lockproxy and in LOCKINFO's holder.
func newProxyID() string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand does not fail on supported platforms
	}
	return hex.EncodeToString(b[:])
}

// ID returns the Handler's proxy id, the one INFO lockproxy shows as
// proxy_id and LOCKINFO names in "name@addr via proxy-id".
func (h *Handler) ID() string { return h.id }

// SetClient records the client's name and address, which LOCKINFO shows
// as the holder of the locks this connection acquires from then on. It
// must not be called concurrently with Serve.
func (c *Conn) SetClient(name, addr string) {
	c.holder = quorum.NewHolder(name + "@" + addr + " via " + c.h.id)
}

// ownToken returns the token of the holding of resource recorded on this
// connection while its validity lasts, "" otherwise.
func (c *Conn) ownToken(resource string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	for _, h := range c.held[resource] {
		if h.validAt(now) {
			return h.token
		}
	}
	return ""
}

// holdsValid reports whether this connection acquired a holding of
// resource whose validity lasts (a reader, a permit, an exclusive lock).
func (c *Conn) holdsValid(resource string) bool {
	return c.ownToken(resource) != ""
}

func (c *Conn) lockinfo(ctx context.Context, dst []byte, args [][]byte, resp3 bool) []byte {
	if len(args) != 2 {
		c.h.count(lockinfoBadRequest)
		return appendErr(dst, errArityLockinfo)
	}
	resource := string(args[1])
	start := time.Now()
	in, err := c.h.locker.Info(ctx, resource, c.ownToken(resource))
	c.h.debug("lockinfo", resource, start, err)
	if err != nil {
		c.h.countEngineErr(err, lockinfoNoQuorum, lockinfoError)
		return appendEngineErr(dst, err)
	}
	if in.Mode == "shared" || in.Mode == "semaphore" {
		in.Owned = c.holdsValid(resource)
	}
	c.h.count(lockinfoAnswered)
	return appendInfo(dst, in, resp3)
}

// appendInfo appends LOCKINFO's reply: a map in RESP3, a flat array of
// names and values in RESP2 (as HELLO answers), the fields in the
// contract's order.
func appendInfo(dst []byte, in quorum.Info, resp3 bool) []byte {
	validity := int64(-1)
	if in.Validity >= 0 {
		validity = in.Validity.Milliseconds()
	}
	owned := int64(0)
	if in.Owned {
		owned = 1
	}
	const fields = 10
	if resp3 {
		dst = append(dst, "%"+strconv.Itoa(fields)+"\r\n"...)
	} else {
		dst = redcon.AppendArray(dst, 2*fields)
	}
	str := func(k, v string) {
		dst = redcon.AppendBulkString(dst, k)
		dst = redcon.AppendBulkString(dst, v)
	}
	num := func(k string, v int64) {
		dst = redcon.AppendBulkString(dst, k)
		dst = redcon.AppendInt(dst, v)
	}
	str("mode", in.Mode)
	num("holders", in.Holders)
	num("permits", in.Permits)
	num("holds", in.Holds)
	num("fence", in.Fence)
	num("validity-ms", validity)
	num("waiters", int64(in.Waiters))
	num("owned", owned)
	str("holder", in.Holder)
	num("nodes", int64(in.Nodes))
	return dst
}
