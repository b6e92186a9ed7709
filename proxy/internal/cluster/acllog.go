package cluster

import (
	"bytes"
	"slices"
	"strconv"

	"github.com/tidwall/redcon"

	"github.com/lockproxy/lockproxy/proxy/internal/resp"
)

// ACL LOG in front of a Redis Cluster. A command refused by the ACL is
// logged by the master that refused it, the master of its key, so the
// masters' logs together are the log one Redis would hold: ACL LOG reads
// every master and merges their entries, and ACL LOG RESET empties every
// master's log.

// cmdACLLogAll reads a master's whole ACL log (acllog-max-len entries, 128
// by default).
var cmdACLLogAll = []byte("*3\r\n$3\r\nACL\r\n$3\r\nLOG\r\n$7\r\n1000000\r\n")

// aclLogCall routes ACL LOG [count | RESET].
func aclLogCall(m *SlotMap, args [][]byte, raw []byte) Call {
	c := Fan(m, raw, OpFirst)
	if len(args) > 2 && bytes.EqualFold(args[2], []byte("reset")) {
		return c
	}
	count := int64(10) // Redis's default
	if len(args) > 2 {
		var err error
		if count, err = strconv.ParseInt(string(args[2]), 10, 64); err != nil || count < 0 {
			return c // the masters' own error
		}
	}
	// The masters' whole logs: the newest entries of one are not all
	// newer than another's, and a refusal's count is the sum of all.
	for i := range c.Parts {
		c.Parts[i].Raw = cmdACLLogAll
	}
	c.Fold = func(replies [][]byte) ([]byte, bool) {
		return allOK(replies, func() []byte { return mergeACLLog(replies, count) })
	}
	return c
}

// mergeACLLog merges the masters' ACL LOG replies: their entries, those of
// the same refusal (reason, context, object, username) made one with the
// masters' counts summed, as one Redis groups them, newest first (by
// age-seconds), count of them at most.
func mergeACLLog(replies [][]byte, count int64) []byte {
	type entry struct {
		age   float64
		count int64
		raw   []byte
	}
	var all []entry
	same := map[string]int{} // reason, context, object, username -> index in all
	for _, r := range replies {
		n, elems, err := elements(r)
		if err != nil {
			return resp.ErrorReply(err)
		}
		for range n {
			k, err := valueLen(elems)
			if err != nil {
				return resp.ErrorReply(err)
			}
			e := entry{raw: elems[:k]}
			var key []byte
			if fields, err := scalars(nil, e.raw); err == nil {
				for i := 0; i+1 < len(fields); i += 2 {
					switch string(fields[i]) {
					case "age-seconds":
						e.age, _ = strconv.ParseFloat(string(fields[i+1]), 64)
					case "count":
						e.count, _ = strconv.ParseInt(string(fields[i+1]), 10, 64)
					case "reason", "context", "object", "username":
						key = append(append(key, fields[i+1]...), 0)
					}
				}
			}
			elems = elems[k:]
			// One Redis keeps one entry, counted, for the same refusal
			// of the same user: each master has its own.
			if j, ok := same[string(key)]; ok && key != nil {
				o := &all[j]
				o.count += e.count
				if e.age < o.age {
					o.age, o.raw = e.age, e.raw
				}
				continue
			}
			if key != nil {
				same[string(key)] = len(all)
			}
			all = append(all, e)
		}
	}
	slices.SortStableFunc(all, func(a, b entry) int {
		switch {
		case a.age < b.age:
			return -1
		case a.age > b.age:
			return 1
		}
		return 0
	})
	if count >= 0 && int64(len(all)) > count {
		all = all[:count]
	}
	b := redcon.AppendArray(nil, len(all))
	for _, e := range all {
		b = append(b, withCount(e.raw, e.count)...)
	}
	return b
}

var aclCountField = []byte("$5\r\ncount\r\n:")

// withCount returns the entry raw with its count field set to n.
func withCount(raw []byte, n int64) []byte {
	i := bytes.Index(raw, aclCountField)
	if i < 0 {
		return raw
	}
	i += len(aclCountField)
	j := bytes.IndexByte(raw[i:], '\r')
	if j < 0 {
		return raw
	}
	out := append([]byte(nil), raw[:i]...)
	out = strconv.AppendInt(out, n, 10)
	return append(out, raw[i+j:]...)
}
