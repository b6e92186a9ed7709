package clusterclient

import (
	"strconv"

	"github.com/tidwall/redcon"

	"github.com/lockproxy/lockproxy/proxy/internal/cluster"
	"github.com/lockproxy/lockproxy/proxy/internal/resp"
)

// SCAN in front of a cluster fills its COUNT across the masters in one
// call (internal/cluster/scan.go): scanAll asks them in turn.

// scanAll answers a SCAN call (cluster.ScanCall): it asks its master, then, while
// the one asked is at its end and COUNT is not filled, the next master,
// and gives the client the keys of all of them with the cursor to go on
// from.
func (s *Client) scanAll(c *cluster.Call) {
	ticket := s.order.Add(nil, cluster.NoSlot, cluster.TicketOpts{})
	answer := func(b []byte) {
		s.order.Put(ticket, false, b, s.w)
		s.h.PushOut()
	}
	cmd, err := redcon.Parse(c.One.Raw)
	if err != nil {
		answer(resp.ErrorReply(err))
		return
	}
	count := cluster.ScanCount(cmd.Args)
	var keys []byte
	var n int64
	idx, p := c.Scan, c.One
	for {
		r := s.ask([]cluster.Part{p})
		if r == nil {
			return // the client has gone
		}
		cur, elems, count2, ok := cluster.ScanParts(r[0])
		if !ok {
			answer(r[0]) // an error: the first one's is Redis's own
			return
		}
		keys = append(keys, elems...)
		n += count2
		m := s.r.Slots.Load()
		if cur != 0 || idx+1 >= c.N || n >= count || m == nil || len(m.Masters) != c.N {
			out := redcon.AppendArray(nil, 2)
			out = redcon.AppendBulkString(out, strconv.FormatUint(cluster.ScanNext(cur, idx, c.N), 10))
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
		p = cluster.Part{Slot: m.First[idx], Addr: m.Masters[idx], Raw: raw}
	}
}
