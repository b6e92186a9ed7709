package cluster

import (
	"strconv"

	"github.com/tidwall/redcon"

	"github.com/lockproxy/lockproxy/proxy/internal/resp"
)

// LCS of two keys in different slots, in front of a Redis Cluster: both
// values are read (GET) on their masters and the proxy computes the
// longest common subsequence as Redis 7.0 does (the same dynamic
// programming table and the same walk back through it, so that among
// several subsequences of the same length it gives Redis's, and the same
// IDX ranges). The options are checked by a node, as for the set reads
// (join.go). Not one snapshot: the two values are read one after
// the other.

// lcsMaxCells bounds the table the proxy builds (4 bytes a cell): beyond
// it the client gets Redis's error for a table too big to allocate.
const lcsMaxCells = 64 << 20

var (
	replyLCSNotString = []byte("-ERR The specified keys must contain string values\r\n")
	replyLCSTooBig    = []byte("-ERR Insufficient memory, transient memory for LCS exceeds proto-max-bulk-len\r\n")
)

// lcsCall plans LCS key1 key2 [LEN] [IDX] [MINMATCHLEN n] [WITHMATCHLEN].
func lcsCall(m *SlotMap, args [][]byte, resp3 bool) Call {
	var getLen, getIdx, withLen bool
	var minLen int64
	for i := 3; i < len(args); i++ {
		var sb [24]byte
		switch string(resp.Lower(&sb, args[i])) {
		case "len":
			getLen = true
		case "idx":
			getIdx = true
		case "withmatchlen":
			withLen = true
		case "minmatchlen":
			if i+1 < len(args) {
				i++
				minLen, _ = strconv.ParseInt(string(args[i]), 10, 64)
			}
		}
	}
	c := Call{Kind: CallMerge}
	probe := len(args) > 3
	if probe {
		c.Parts = append(c.Parts, probePart(m, args, 1, 3))
	}
	for _, k := range args[1:3] {
		sl := KeySlot(k)
		c.Parts = append(c.Parts, Part{Slot: sl, Addr: m.Master(sl), Raw: command3("GET", k)})
	}
	c.Fold = func(replies [][]byte) ([]byte, bool) {
		var probeErr []byte
		if probe {
			if IsError(replies[0]) {
				probeErr = replies[0]
			}
			replies = replies[1:]
		}
		var vals [2][]byte
		for i, r := range replies {
			if IsError(r) {
				if len(r) > 10 && string(r[:10]) == "-WRONGTYPE" {
					return replyLCSNotString, true
				}
				return r, true
			}
			v, err := scalars(nil, r)
			if err != nil {
				return resp.ErrorReply(err), true
			}
			if len(v) == 1 {
				vals[i] = v[0]
			}
		}
		if probeErr != nil {
			return probeErr, true
		}
		if (len(vals[0])+1)*(len(vals[1])+1) > lcsMaxCells {
			return replyLCSTooBig, true
		}
		return lcsReply(vals[0], vals[1], getLen, getIdx, withLen, minLen, resp3), false
	}
	return c
}

// lcsReply answers LCS of a and b.
func lcsReply(a, b []byte, getLen, getIdx, withLen bool, minLen int64, resp3 bool) []byte {
	w := len(b) + 1
	dp := make([]uint32, (len(a)+1)*w)
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			switch {
			case a[i-1] == b[j-1]:
				dp[i*w+j] = dp[(i-1)*w+j-1] + 1
			default:
				dp[i*w+j] = max(dp[(i-1)*w+j], dp[i*w+j-1])
			}
		}
	}
	n := int(dp[len(a)*w+len(b)])
	if getLen && !getIdx {
		return redcon.AppendInt(nil, int64(n))
	}
	// Walk back from the end: a run of matches on both sides is one
	// range; it ends (and is reported, newest last in the walk, so from
	// the end of the strings) at a mismatch or at either string's start.
	out := make([]byte, n)
	var matches []byte
	count := 0
	idx := n
	none := len(a)
	aStart, aEnd, bStart, bEnd := none, 0, 0, 0
	for i, j := len(a), len(b); i > 0 && j > 0; {
		emit := false
		if a[i-1] == b[j-1] {
			out[idx-1] = a[i-1]
			switch {
			case aStart == none:
				aStart, aEnd, bStart, bEnd = i-1, i-1, j-1, j-1
			case aStart == i && bStart == j:
				aStart--
				bStart--
			default:
				emit = true
			}
			if aStart == 0 || bStart == 0 {
				emit = true
			}
			idx--
			i--
			j--
		} else {
			if dp[(i-1)*w+j] > dp[i*w+j-1] {
				i--
			} else {
				j--
			}
			if aStart != none {
				emit = true
			}
		}
		if emit {
			l := int64(aEnd - aStart + 1)
			if getIdx && (minLen == 0 || l >= minLen) {
				items := 2
				if withLen {
					items = 3
				}
				matches = redcon.AppendArray(matches, items)
				matches = redcon.AppendArray(matches, 2)
				matches = redcon.AppendInt(redcon.AppendInt(matches, int64(aStart)), int64(aEnd))
				matches = redcon.AppendArray(matches, 2)
				matches = redcon.AppendInt(redcon.AppendInt(matches, int64(bStart)), int64(bEnd))
				if withLen {
					matches = redcon.AppendInt(matches, l)
				}
				count++
			}
			aStart = none
		}
	}
	if !getIdx {
		return redcon.AppendBulk(nil, out)
	}
	var r []byte
	if resp3 {
		r = []byte("%2\r\n")
	} else {
		r = redcon.AppendArray(nil, 4)
	}
	r = redcon.AppendBulkString(r, "matches")
	r = append(redcon.AppendArray(r, count), matches...)
	r = redcon.AppendBulkString(r, "len")
	return redcon.AppendInt(r, int64(n))
}
