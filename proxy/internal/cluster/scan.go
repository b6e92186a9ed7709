package cluster

import (
	"bytes"
	"strconv"
)

// SCAN in front of a cluster fills its COUNT across the masters in one
// call, as one Redis holding every key would: when a master's keyspace is
// walked to its end (its cursor comes back 0) and the reply holds fewer
// keys than COUNT (10 when not given), the call goes on with the next
// master from its cursor 0, and the keys are put together in one reply
// (the session's scanAll, proxy/clusterscan.go). So a keyspace that fits
// in one reply comes back in one, cursor 0; the cursor the client gets
// names the master the next call starts on and that master's own cursor
// (ScanCall).

// ScanCount returns SCAN's COUNT, or Redis's default 10 (a malformed one
// is refused by the first master).
func ScanCount(args [][]byte) int64 {
	n := int64(10)
	for i := 2; i+1 < len(args); i += 2 {
		if bytes.EqualFold(args[i], []byte("count")) {
			if v, err := strconv.ParseInt(string(args[i+1]), 10, 64); err == nil && v > 0 {
				n = v
			}
		}
	}
	return n
}

// ScanParts splits a master's SCAN reply into its cursor, its keys'
// bytes and their number; ok is false for an error.
func ScanParts(b []byte) (cur uint64, elems []byte, n int64, ok bool) {
	if !bytes.HasPrefix(b, []byte("*2\r\n$")) {
		return 0, nil, 0, false
	}
	k, err := valueLen(b[4:])
	if err != nil {
		return 0, nil, 0, false
	}
	_, c, _ := bytes.Cut(b[4:4+k-2], []byte("\r\n"))
	if cur, err = strconv.ParseUint(string(c), 10, 64); err != nil {
		return 0, nil, 0, false
	}
	count, elems, err := elements(b[4+k:])
	if err != nil {
		return 0, nil, 0, false
	}
	return cur, elems, int64(count), true
}

// ScanNext is the client's cursor after master idx of n answered cur:
// that master's cursor, the next master's start, or 0 at the end.
func ScanNext(cur uint64, idx, n int) uint64 {
	switch {
	case cur != 0:
		return cur<<scanBits | uint64(idx)
	case idx+1 < n:
		return uint64(idx + 1)
	}
	return 0
}
