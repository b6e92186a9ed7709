package commands

import (
	"strconv"

	"github.com/tidwall/redcon"
)

// Names are the commands a Handler answers, in lower case.
var Names = []string{"lock", "unlock", "extend"}

// arg is one argument in COMMAND DOCS.
type arg struct {
	name, typ, token string
	optional         bool
}

type doc struct {
	summary string
	arity   int
	args    []arg
}

var docs = map[string]doc{
	"lock": {"Acquires a distributed lock on the resource for ttl-ms, as Redlock across the lock nodes.", -3, []arg{
		{name: "resource", typ: "string"},
		{name: "ttl-ms", typ: "integer"},
		{name: "timeout-ms", typ: "integer", token: "WAIT", optional: true},
		{name: "token", typ: "string", token: "TOKEN", optional: true},
		{name: "keepalive", typ: "pure-token", token: "KEEPALIVE", optional: true},
	}},
	"unlock": {"Releases the lock on the resource where the token still owns it.", -2, []arg{
		{name: "resource", typ: "string"},
		{name: "token", typ: "string", optional: true},
	}},
	"extend": {"Resets the lock's ttl to ttl-ms where the token still owns it.", -3, []arg{
		{name: "resource", typ: "string"},
		{name: "ttl-ms", typ: "integer"},
		{name: "token", typ: "string", optional: true},
	}},
}

// AppendCommandInfo appends name's entry of COMMAND INFO, in the shape of
// Redis 7: name, arity, flags, first key, last key, step, ACL categories,
// tips, key specifications, subcommands. The resource is not a key of the
// backend, so no key positions are declared.
func AppendCommandInfo(dst []byte, name string, resp3 bool) []byte {
	d := docs[name]
	dst = redcon.AppendArray(dst, 10)
	dst = redcon.AppendBulkString(dst, name)
	dst = redcon.AppendInt(dst, int64(d.arity))
	dst = appendSet(dst, resp3, "write")
	dst = redcon.AppendInt(dst, 0)
	dst = redcon.AppendInt(dst, 0)
	dst = redcon.AppendInt(dst, 0)
	dst = appendSet(dst, resp3, "@write", "@slow")
	dst = redcon.AppendArray(dst, 0)
	dst = redcon.AppendArray(dst, 0)
	return redcon.AppendArray(dst, 0)
}

// AppendCommandDocs appends the value of name in COMMAND DOCS: a map of
// summary, since, group, complexity and arguments, which redis-cli uses
// for its hints.
func AppendCommandDocs(dst []byte, name string, resp3 bool) []byte {
	d := docs[name]
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
		if a.optional {
			n++
		}
		dst = appendMap(dst, resp3, n)
		dst = appendPair(dst, "name", a.name)
		dst = appendPair(dst, "type", a.typ)
		if a.token != "" {
			dst = appendPair(dst, "token", a.token)
		}
		if a.optional {
			dst = redcon.AppendBulkString(dst, "flags")
			dst = appendSet(dst, resp3, "optional")
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
