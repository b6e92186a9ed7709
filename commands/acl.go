package commands

import (
	"bytes"
	"strconv"

	"github.com/tidwall/redcon"
)

// Resources returns the resources a lock command names, which Redis's
// ACL at the proxy checks as keys of the same name, and whether the
// command changes them (LOCK, RLOCK, MLOCK, UNLOCK, EXTEND: write
// access) or only reads them (LOCKINFO: read access; LOCKS names none,
// and lists only the resources the user may read). ok is false when
// args is no lock command or its arity is wrong: the command answers
// that itself, before any ACL check, as Redis does. An MLOCK whose count
// is not a number names no resource; it is refused for its syntax.
func Resources(args [][]byte) (resources [][]byte, write, ok bool) {
	if len(args) == 0 {
		return nil, false, false
	}
	s := lookup(args[0])
	if s == nil || !arityOK(s.arity, len(args)) {
		return nil, false, false
	}
	if len(args) < 2 {
		return nil, true, true // a command of no resource
	}
	switch s.name {
	case "lockinfo":
		return args[1:2], false, true
	case "locks":
		// It names none: the resources it lists are checked as it
		// lists them (read access), and the others left out.
		return nil, false, true
	case "mlock":
		n, err := strconv.ParseInt(string(args[1]), 10, 64)
		if err != nil || n <= 0 || n > int64(len(args)-2) || len(args) < 3 {
			return nil, true, true
		}
		return args[2 : 2+n], true, true
	}
	return args[1:2], true, true
}

// arityOK reports whether n arguments (the name included) fit arity, as
// COMMAND INFO gives it.
func arityOK(arity, n int) bool {
	if arity < 0 {
		return n >= -arity
	}
	return n == arity
}

// Categories returns each lock command's ACL categories, as COMMAND INFO
// lists them without their "@": @lock, the lock commands' own, and
// @write or @read, and @slow.
func Categories() map[string][]string {
	out := make(map[string][]string, len(specs))
	for _, s := range specs {
		for _, c := range s.acl {
			out[s.name] = append(out[s.name], c[1:])
		}
	}
	return out
}

// FilterListed leaves out of a LOCKS reply the resources keep refuses
// (those the user may not read), and returns any other reply as it is.
// A page may then list fewer resources than COUNT, or none, as SCAN's
// may; the cursor is unchanged.
func FilterListed(args [][]byte, reply []byte, keep func(resource []byte) (bool, error)) ([]byte, error) {
	if len(args) == 0 || !equalFold(args[0], "locks") || len(reply) == 0 || reply[0] != '*' {
		return reply, nil
	}
	cursor, rest, ok := cutBulk(skipLine(reply)) // "*2"
	if !ok {
		return reply, nil
	}
	n, rest, ok := cutCount(rest)
	if !ok {
		return reply, nil
	}
	var kept [][]byte
	for range n {
		var res []byte
		if res, rest, ok = cutBulk(rest); !ok {
			return reply, nil
		}
		allowed, err := keep(res)
		if err != nil {
			return nil, err
		}
		if allowed {
			kept = append(kept, res)
		}
	}
	out := redcon.AppendArray(nil, 2)
	out = redcon.AppendBulk(out, cursor)
	out = redcon.AppendArray(out, len(kept))
	for _, r := range kept {
		out = redcon.AppendBulk(out, r)
	}
	return out, nil
}

// skipLine returns b after its first CRLF.
func skipLine(b []byte) []byte {
	if i := bytes.Index(b, []byte("\r\n")); i >= 0 {
		return b[i+2:]
	}
	return nil
}

// cutCount reads an array header "*<n>\r\n" at the start of b.
func cutCount(b []byte) (int, []byte, bool) {
	i := bytes.Index(b, []byte("\r\n"))
	if len(b) == 0 || b[0] != '*' || i < 0 {
		return 0, nil, false
	}
	n, err := strconv.Atoi(string(b[1:i]))
	return n, b[i+2:], err == nil && n >= 0
}

// cutBulk reads a bulk string "$<len>\r\n<data>\r\n" at the start of b.
func cutBulk(b []byte) ([]byte, []byte, bool) {
	i := bytes.Index(b, []byte("\r\n"))
	if len(b) == 0 || b[0] != '$' || i < 0 {
		return nil, nil, false
	}
	n, err := strconv.Atoi(string(b[1:i]))
	if err != nil || n < 0 || len(b) < i+2+n+2 {
		return nil, nil, false
	}
	return b[i+2 : i+2+n], b[i+2+n+2:], true
}
