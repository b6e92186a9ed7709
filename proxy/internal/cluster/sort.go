package cluster

import (
	"bytes"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/tidwall/redcon"

	"github.com/lockproxy/lockproxy/proxy/internal/resp"
)

// SORT and SORT_RO with BY or GET patterns, in front of a Redis Cluster.
// A cluster node refuses them ("BY option of SORT denied in Cluster
// mode."), since the keys the patterns make may be anywhere; the proxy can
// reach every master, so it answers them as one Redis 7.0 does
// (sortCommandGeneric): it reads the key (TYPE, then its list, set or
// sorted set), then in one more round trip every key the patterns make
// (GET, or HGET for "pattern->field"; a missing key or one of another
// type is nothing, as in Redis), sorts (numerically by the weights, ties
// by the elements' bytes; ALPHA by bytes, as Redis in the C locale), and
// answers LIMIT and GET (# is the element). BY without a "*" keeps the
// key's own order, as Redis does. Not one snapshot: the key and the
// pattern keys are read one after the other. With STORE, SORT is a write
// and stays as the cluster answers it (CROSSSLOT, or the node's refusal
// of the patterns).

// sortOpts is a parsed SORT.
type sortOpts struct {
	desc, alpha, dontSort bool
	start, count          int64
	by                    []byte // nil: by the elements themselves
	gets                  [][]byte
	store                 bool
	patterns              bool   // a BY with "*" or a GET: the node would refuse it
	err                   []byte // the syntax error Redis answers
}

var replyNotInteger = []byte("-ERR value is not an integer or out of range\r\n")

// parseSort reads the options of SORT (readonly: SORT_RO) as Redis does,
// stopping at the first error.
func parseSort(args [][]byte, readonly bool) sortOpts {
	o := sortOpts{count: -1}
	for j := 2; j < len(args); j++ {
		left := len(args) - j - 1
		var sb [24]byte
		switch opt := string(resp.Lower(&sb, args[j])); {
		case opt == "asc":
			o.desc = false
		case opt == "desc":
			o.desc = true
		case opt == "alpha":
			o.alpha = true
		case opt == "limit" && left >= 2:
			var err1, err2 error
			o.start, err1 = strconv.ParseInt(string(args[j+1]), 10, 64)
			o.count, err2 = strconv.ParseInt(string(args[j+2]), 10, 64)
			if err1 != nil || err2 != nil {
				o.err = replyNotInteger
				return o
			}
			j += 2
		case !readonly && opt == "store" && left >= 1:
			o.store = true
			j++
		case opt == "by" && left >= 1:
			o.by = args[j+1]
			if bytes.IndexByte(o.by, '*') < 0 {
				o.dontSort = true
			} else {
				o.patterns = true
			}
			j++
		case opt == "get" && left >= 1:
			o.gets = append(o.gets, args[j+1])
			o.patterns = true
			j++
		default:
			o.err = resp.ReplySyntax
			return o
		}
	}
	return o
}

// sortCall plans a SORT or SORT_RO whose patterns a node would refuse; it
// reports false for every other command, which goes where its keys are.
func SortCall(m *SlotMap, name []byte, args [][]byte, resp3 bool, ask func([]Part) [][]byte) (Call, bool) {
	if !resp.Lookup(name).Has(resp.Patterns) || len(args) < 2 {
		return Call{}, false
	}
	o := parseSort(args, string(name) == "sort_ro")
	if !o.patterns || o.store {
		return Call{}, false
	}
	if o.err != nil {
		return LocalCall(o.err), true
	}
	key := args[1]
	sl := KeySlot(key)
	addr := m.Master(sl)
	c := Call{Kind: CallMerge, Alone: true}
	for _, raw := range [][]byte{command3("TYPE", key), command3("LRANGE", key, "0", "-1"),
		command3("SMEMBERS", key), command3("ZRANGE", key, "0", "-1")} {
		c.Parts = append(c.Parts, Part{Slot: sl, Addr: addr, Raw: raw})
	}
	c.Fold = func(replies [][]byte) ([]byte, bool) {
		b := sortReply(m, &o, replies, resp3, ask)
		return b, IsError(b)
	}
	return c, true
}

// sortReply answers the SORT from the key's replies (TYPE, LRANGE,
// SMEMBERS, ZRANGE).
func sortReply(m *SlotMap, o *sortOpts, replies [][]byte, resp3 bool, ask func([]Part) [][]byte) []byte {
	for _, r := range replies {
		if IsError(r) && !bytes.HasPrefix(r, []byte("-WRONGTYPE")) {
			return r
		}
	}
	var typ string
	if t, err := scalars(nil, replies[0]); err == nil && len(t) == 1 {
		typ = string(t[0])
	}
	var elems [][]byte
	var err error
	switch typ {
	case "none":
	case "list":
		elems, err = scalars(nil, replies[1])
	case "set":
		elems, err = scalars(nil, replies[2])
	case "zset":
		elems, err = scalars(nil, replies[3])
	default:
		return []byte("-WRONGTYPE Operation against a key holding the wrong kind of value\r\n")
	}
	if err != nil {
		return resp.ErrorReply(err)
	}

	// The range, as Redis clamps it.
	n := int64(len(elems))
	start := max(o.start, 0)
	end := n - 1
	if o.count >= 0 {
		end = start + o.count - 1
	}
	if start >= n {
		start, end = n-1, n-2
	}
	end = min(end, n-1)

	type item struct {
		elem  []byte
		score float64
		cmp   []byte // ALPHA BY: the weight; nil when missing
	}
	var vec []item
	if o.dontSort && (typ == "list" || typ == "zset") {
		// The key's own order (descending from the end with DESC), the
		// range taken directly.
		if end >= start {
			for i := start; i <= end; i++ {
				k := i
				if o.desc {
					k = n - 1 - i
				}
				vec = append(vec, item{elem: elems[k]})
			}
		}
		end -= start
		start = 0
	} else {
		for _, e := range elems {
			vec = append(vec, item{elem: e})
		}
	}

	// One round trip for every key the patterns make.
	var reqs []lookup
	index := map[string]int{}
	want := func(pattern, elem []byte) {
		if l, ok := patternKey(pattern, elem); ok {
			id := string(l.key) + "\x00" + string(l.field)
			if _, ok := index[id]; !ok {
				index[id] = len(reqs)
				reqs = append(reqs, l)
			}
		}
	}
	sortBy := !o.dontSort && o.by != nil
	for _, it := range vec {
		if sortBy {
			want(o.by, it.elem)
		}
		for _, g := range o.gets {
			want(g, it.elem)
		}
	}
	vals, errReply := fetchAll(m, reqs, ask)
	if errReply != nil {
		return errReply
	}
	value := func(pattern, elem []byte) ([]byte, bool) {
		if string(pattern) == "#" {
			return elem, true
		}
		l, ok := patternKey(pattern, elem)
		if !ok {
			return nil, false
		}
		v := vals[index[string(l.key)+"\x00"+string(l.field)]]
		return v, v != nil
	}

	if !o.dontSort {
		badScore := false
		for i := range vec {
			by, ok := vec[i].elem, true
			if sortBy {
				by, ok = value(o.by, vec[i].elem)
				if !ok {
					continue
				}
			}
			if o.alpha {
				if sortBy {
					vec[i].cmp = by
				}
				continue
			}
			f, ok := parseWeight(by)
			if !ok {
				badScore = true
			}
			vec[i].score = f
		}
		if badScore {
			return []byte("-ERR One or more scores can't be converted into double\r\n")
		}
		slices.SortStableFunc(vec, func(a, b item) int {
			var c int
			switch {
			case !o.alpha:
				switch {
				case a.score > b.score:
					c = 1
				case a.score < b.score:
					c = -1
				default:
					c = bytes.Compare(a.elem, b.elem)
				}
			case sortBy:
				switch {
				case a.cmp == nil && b.cmp == nil:
				case a.cmp == nil:
					c = -1
				case b.cmp == nil:
					c = 1
				default:
					c = bytes.Compare(a.cmp, b.cmp)
				}
			default:
				c = bytes.Compare(a.elem, b.elem)
			}
			if o.desc {
				return -c
			}
			return c
		})
	}

	out := end - start + 1
	if len(o.gets) > 0 {
		out *= int64(len(o.gets))
	}
	b := redcon.AppendArray(nil, int(max(out, 0)))
	for j := start; j <= end; j++ {
		if len(o.gets) == 0 {
			b = redcon.AppendBulk(b, vec[j].elem)
		}
		for _, g := range o.gets {
			if v, ok := value(g, vec[j].elem); ok {
				b = redcon.AppendBulk(b, v)
			} else if resp3 {
				b = append(b, "_\r\n"...)
			} else {
				b = append(b, "$-1\r\n"...)
			}
		}
	}
	return b
}

// parseWeight reads a weight as Redis's strtod check does: leading spaces
// skipped, nothing after the number, no overflow, no NaN; an empty string
// is 0.
func parseWeight(b []byte) (float64, bool) {
	s := strings.TrimLeft(string(b), " \t\n\v\f\r")
	if s == "" {
		return 0, true
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(f) {
		return 0, false
	}
	return f, true
}

// lookup is a key (and hash field) a SORT pattern makes.
type lookup struct {
	key, field []byte
}

// patternKey makes the key a pattern names for elem, as Redis's
// lookupKeyByPattern: the first "*" replaced by elem, and a "->field"
// after it naming a hash field. A pattern without "*" names nothing.
func patternKey(pattern, elem []byte) (lookup, bool) {
	star := bytes.IndexByte(pattern, '*')
	if star < 0 || string(pattern) == "#" {
		return lookup{}, false
	}
	rest := pattern[star+1:]
	var field []byte
	if f := bytes.Index(rest, []byte("->")); f >= 0 && f+2 < len(rest) {
		field = rest[f+2:]
		rest = rest[:f]
	}
	key := make([]byte, 0, len(pattern)+len(elem))
	key = append(append(append(key, pattern[:star]...), elem...), rest...)
	return lookup{key: key, field: field}, true
}

// fetchAll reads the values of reqs on their masters in one round trip (ask): nil
// for a missing key, or one of another type than a string (a hash with a
// field). An error that is not the data's is returned as the reply.
func fetchAll(m *SlotMap, reqs []lookup, ask func([]Part) [][]byte) ([][]byte, []byte) {
	if len(reqs) == 0 {
		return nil, nil
	}
	parts := make([]Part, len(reqs))
	for i, l := range reqs {
		sl := KeySlot(l.key)
		raw := command3("GET", l.key)
		if l.field != nil {
			raw = redcon.AppendArray(nil, 3)
			raw = redcon.AppendBulkString(raw, "HGET")
			raw = redcon.AppendBulk(redcon.AppendBulk(raw, l.key), l.field)
		}
		parts[i] = Part{Slot: sl, Addr: m.Master(sl), Raw: raw}
	}
	replies := ask(parts)
	if replies == nil {
		return nil, resp.ReplyConnLost // the client has gone
	}
	vals := make([][]byte, len(reqs))
	var failed []byte
	for i, b := range replies {
		switch {
		case failed != nil:
		case bytes.HasPrefix(b, []byte("-WRONGTYPE")):
		case IsError(b):
			failed = append([]byte(nil), b...)
		default:
			if v, err := scalars(nil, b); err == nil && len(v) == 1 {
				vals[i] = append([]byte{}, v[0]...)
			}
		}
	}
	return vals, failed
}
