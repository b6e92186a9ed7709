package commands

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/tidwall/redcon"

	"github.com/lockproxy/lockproxy/quorum"
)

// LOCKS cursor [MATCH pattern] [COUNT count] iterates over the resources
// held on a majority of the lock nodes, as SCAN iterates over keys (see
// quorum.Locker.Locks for how, and docs/PROTOCOL.md for the cursor).

var (
	errArityLocks    = errors.New("ERR wrong number of arguments for 'locks' command")
	errInvalidCursor = errors.New("ERR invalid cursor")
)

// locksSpec is the row of LOCKS in specs.
var locksSpec = spec{
	name: "locks", arity: -2, flags: []string{"readonly"}, acl: []string{"@read", "@slow", "@lock"},
	summary: "Iterates over the resources held on a majority of the lock nodes, as SCAN iterates over keys. Never shows a token.",
	args: []arg{
		{name: "cursor", typ: "integer"},
		{name: "pattern", typ: "pattern", token: "MATCH", optional: true},
		{name: "count", typ: "integer", token: "COUNT", optional: true},
	},
	outcomes: []outcome{locksAnswered, locksNoQuorum, locksError, locksBadRequest},
	serve:    (*Conn).locks,
}

// locksArgs are LOCKS's parsed arguments.
type locksArgs struct {
	cursor  uint64
	pattern string
	count   int
}

// parseLocks parses LOCKS's arguments as Redis parses SCAN's: an
// unsigned cursor, MATCH and COUNT in any order (the last of each wins),
// COUNT at least 1.
func parseLocks(args [][]byte) (locksArgs, error) {
	if len(args) < 2 {
		return locksArgs{}, errArityLocks
	}
	a := locksArgs{pattern: "*", count: 10}
	var err error
	if a.cursor, err = strconv.ParseUint(string(args[1]), 10, 64); err != nil {
		return locksArgs{}, errInvalidCursor
	}
	for i := 2; i < len(args); i += 2 {
		if i+1 >= len(args) {
			return locksArgs{}, errSyntax
		}
		switch v := args[i+1]; {
		case equalFold(args[i], "match"):
			a.pattern = string(v)
		case equalFold(args[i], "count"):
			n, err := strconv.ParseInt(string(v), 10, 64)
			if err != nil {
				return locksArgs{}, errNotInteger
			}
			if n < 1 {
				return locksArgs{}, errSyntax
			}
			a.count = int(min(n, 1<<30))
		default:
			return locksArgs{}, errSyntax
		}
	}
	return a, nil
}

func (c *Conn) locks(ctx context.Context, dst []byte, args [][]byte, resp3 bool) []byte {
	a, err := parseLocks(args)
	if err != nil {
		c.h.count(locksBadRequest)
		return appendErr(dst, err)
	}
	start := time.Now()
	next, found, err := c.h.locker.Locks(ctx, a.cursor, a.pattern, a.count)
	c.h.debug("locks", a.pattern, start, err)
	if errors.Is(err, quorum.ErrInvalidCursor) {
		c.h.count(locksBadRequest)
		return appendErr(dst, errInvalidCursor)
	}
	if err != nil {
		c.h.countEngineErr(err, locksNoQuorum, locksError)
		return appendEngineErr(dst, err)
	}
	c.h.count(locksAnswered)
	dst = redcon.AppendArray(dst, 2)
	dst = redcon.AppendBulkString(dst, strconv.FormatUint(next, 10))
	dst = redcon.AppendArray(dst, len(found))
	for _, f := range found {
		dst = redcon.AppendBulkString(dst, f.Resource)
	}
	return dst
}
