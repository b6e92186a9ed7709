package proxy

import (
	"bytes"
	"strconv"

	"github.com/tidwall/redcon"
)

// SCAN in front of a cluster fills its COUNT across the masters in one
// call, as one Redis holding every key would: when a master's keyspace is
// walked to its end (its cursor comes back 0) and the reply holds fewer
// keys than COUNT (10 when not given), the call goes on with the next
// master from its cursor 0, and the keys are put together in one reply.
// So a keyspace that fits in one reply comes back in one, cursor 0; the
// cursor the client gets names the master the next call starts on and
// that master's own cursor (scanCall).

// scanCount returns SCAN's COUNT, or Redis's default 10 (a malformed one
// is refused by the first master).
func scanCount(args [][]byte) int64 {
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

// scanAll answers a SCAN call (scanCall): it asks its master, then, while
// the one asked is at its end and COUNT is not filled, the next master,
// and gives the client the keys of all of them with the cursor to go on
// from.
func (s *session) scanAll(c *call) {
	cs := s.cl
	ticket := cs.order.add(nil, noSlot, ticketOpts{})
	answer := func(b []byte) {
		cs.order.put(ticket, false, b, &s.w)
		s.pushOut()
	}
	cmd, err := redcon.Parse(c.one.raw)
	if err != nil {
		answer(errorReply(err))
		return
	}
	count := scanCount(cmd.Args)
	var keys []byte
	var n int64
	idx, p := c.scan, c.one
	for {
		r := s.ask([]part{p})
		if r == nil {
			return // the client has gone
		}
		cur, elems, count2, ok := scanParts(r[0])
		if !ok {
			answer(r[0]) // an error: the first one's is Redis's own
			return
		}
		keys = append(keys, elems...)
		n += count2
		m := cs.r.slots.Load()
		if cur != 0 || idx+1 >= c.n || n >= count || m == nil || len(m.masters) != c.n {
			out := redcon.AppendArray(nil, 2)
			out = redcon.AppendBulkString(out, strconv.FormatUint(scanNext(cur, idx, c.n), 10))
			out = redcon.AppendArray(out, int(n))
			answer(append(out, keys...))
			return
		}
		idx++
		args := append([][]byte(nil), cmd.Args...)
		args[1] = []byte("0")
		raw := redcon.AppendArray(nil, len(args))
		for _, a := range args {
			raw = redcon.AppendBulk(raw, a)
		}
		p = part{slot: m.first[idx], addr: m.masters[idx], raw: raw}
	}
}

// scanParts splits a master's SCAN reply into its cursor, its keys'
// bytes and their number; ok is false for an error.
func scanParts(b []byte) (cur uint64, elems []byte, n int64, ok bool) {
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

// scanNext is the client's cursor after master idx of n answered cur:
// that master's cursor, the next master's start, or 0 at the end.
func scanNext(cur uint64, idx, n int) uint64 {
	switch {
	case cur != 0:
		return cur<<scanBits | uint64(idx)
	case idx+1 < n:
		return uint64(idx + 1)
	}
	return 0
}
