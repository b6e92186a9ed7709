package commands

import (
	"strconv"

	"github.com/tidwall/redcon"
)

// AppendCommandInfo appends name's entry of COMMAND INFO, in the shape of
// Redis 7: name, arity, flags, first key, last key, step, ACL categories,
// tips, key specifications, subcommands. The resource is not a key of the
// backend, so no key positions are declared. name must be one of Names; for
// any other, it appends a null, as Redis does for an unknown command.
func AppendCommandInfo(dst []byte, name string, resp3 bool) []byte {
	d := find(name)
	if d == nil {
		return appendNull(dst, resp3)
	}
	dst = redcon.AppendArray(dst, 10)
	dst = redcon.AppendBulkString(dst, name)
	dst = redcon.AppendInt(dst, int64(d.arity))
	dst = appendSet(dst, resp3, d.flags...)
	dst = redcon.AppendInt(dst, 0)
	dst = redcon.AppendInt(dst, 0)
	dst = redcon.AppendInt(dst, 0)
	dst = appendSet(dst, resp3, d.acl...)
	dst = redcon.AppendArray(dst, 0)
	dst = redcon.AppendArray(dst, 0)
	return redcon.AppendArray(dst, 0)
}

// AppendCommandDocs appends the value of name in COMMAND DOCS: a map of
// summary, since, group, complexity and arguments, which redis-cli uses
// for its hints. name must be one of Names; for any other, it appends a
// null.
func AppendCommandDocs(dst []byte, name string, resp3 bool) []byte {
	d := find(name)
	if d == nil {
		return appendNull(dst, resp3)
	}
	dst = appendMap(dst, resp3, 5)
	dst = appendPair(dst, "summary", d.summary)
	dst = appendPair(dst, "since", "1.0.0")
	dst = appendPair(dst, "group", "generic")
	dst = appendPair(dst, "complexity", "O(N) where N is the number of lock nodes")
	dst = redcon.AppendBulkString(dst, "arguments")
	dst = redcon.AppendArray(dst, len(d.args))
	for _, a := range d.args {
		n := 2
		if a.token != "" {
			n++
		}
		if a.optional || a.multiple {
			n++
		}
		dst = appendMap(dst, resp3, n)
		dst = appendPair(dst, "name", a.name)
		dst = appendPair(dst, "type", a.typ)
		if a.token != "" {
			dst = appendPair(dst, "token", a.token)
		}
		switch {
		case a.optional:
			dst = redcon.AppendBulkString(dst, "flags")
			dst = appendSet(dst, resp3, "optional")
		case a.multiple:
			dst = redcon.AppendBulkString(dst, "flags")
			dst = appendSet(dst, resp3, "multiple")
		}
	}
	return dst
}

func appendPair(dst []byte, k, v string) []byte {
	return redcon.AppendBulkString(redcon.AppendBulkString(dst, k), v)
}

// appendMap starts a map of n pairs: %n in RESP3, a flat array in RESP2.
func appendMap(dst []byte, resp3 bool, n int) []byte {
	if !resp3 {
		return redcon.AppendArray(dst, 2*n)
	}
	dst = append(dst, '%')
	dst = strconv.AppendInt(dst, int64(n), 10)
	return append(dst, '\r', '\n')
}

// appendSet writes status strings as a set (~ in RESP3, an array in RESP2),
// as Redis writes command flags.
func appendSet(dst []byte, resp3 bool, items ...string) []byte {
	if resp3 {
		dst = append(dst, '~')
		dst = strconv.AppendInt(dst, int64(len(items)), 10)
		dst = append(dst, '\r', '\n')
	} else {
		dst = redcon.AppendArray(dst, len(items))
	}
	for _, it := range items {
		dst = redcon.AppendString(dst, it)
	}
	return dst
}
