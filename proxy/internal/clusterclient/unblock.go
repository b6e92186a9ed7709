package clusterclient

import (
	"bytes"
	"strconv"

	"github.com/tidwall/redcon"

	"github.com/lockproxy/lockproxy/proxy/internal/cluster"
	"github.com/lockproxy/lockproxy/proxy/internal/resp"
)

// CLIENT UNBLOCK in front of a cluster. The id a client has is the one
// CLIENT ID through the proxy gave it: its connection's to the slot-0
// master (tracking.go, Router.clientIDs); its blocking command waits on
// its connection to the master of its key. So the proxy finds, on every
// master the named client has a connection of its own to, that
// connection's id (CLIENT LIST, by the connection's address) and sends
// CLIENT UNBLOCK there: :1 when one of them was blocked, as from one
// Redis.

// unblockCall answers CLIENT UNBLOCK id [TIMEOUT|ERROR]; it reports false
// for one the proxy leaves to the first master (a malformed one, or an id
// no client of the proxy has).
func (s *Client) unblockCall(args [][]byte) bool {
	if len(args) < 3 || len(args) > 4 {
		return false
	}
	id, err := strconv.ParseInt(string(args[2]), 10, 64)
	if err != nil {
		return false
	}
	target, ok := s.r.clientIDs.Load(id)
	if !ok {
		return false
	}
	if len(args) == 4 && !bytes.EqualFold(args[3], []byte("timeout")) && !bytes.EqualFold(args[3], []byte("error")) {
		return false // Redis's syntax error
	}
	type conn struct{ addr, local string }
	var conns []conn
	target.mu.Lock()
	for addr, sh := range target.own {
		if local := sh.LocalAddr(); local != "" {
			conns = append(conns, conn{addr, local})
		}
	}
	target.mu.Unlock()

	s.Settle()
	ticket := s.order.Add(nil, cluster.NoSlot, cluster.TicketOpts{})
	answer := func(b []byte) {
		s.order.Put(ticket, false, b, s.w)
		s.h.PushOut()
	}
	m := s.r.Slots.Load()
	unblocked := int64(0)
	for _, c := range conns {
		slot := cluster.NoSlot
		if m != nil {
			for i, a := range m.Masters {
				if a == c.addr {
					slot = m.First[i]
				}
			}
		}
		r := s.ask([]cluster.Part{{Slot: slot, Addr: c.addr, Raw: cmdClientList}})
		if r == nil {
			return true // the client has gone
		}
		cid := connID(r[0], c.local)
		if cid == "" {
			continue
		}
		cmd := [][]byte{[]byte("CLIENT"), []byte("UNBLOCK"), []byte(cid)}
		if len(args) == 4 {
			cmd = append(cmd, args[3])
		}
		r = s.ask([]cluster.Part{{Slot: slot, Addr: c.addr, Raw: resp.Encode(cmd)}})
		if r == nil {
			return true
		}
		if bytes.Equal(r[0], []byte(":1\r\n")) {
			unblocked = 1
		}
	}
	answer(redcon.AppendInt(nil, unblocked))
	return true
}

var cmdClientList = []byte("*2\r\n$6\r\nCLIENT\r\n$4\r\nLIST\r\n")

// connID returns the id of the connection from local in a CLIENT LIST
// reply, or "".
func connID(list []byte, local string) string {
	want := []byte(" addr=" + local + " ")
	for _, line := range bytes.Split(list, []byte("\n")) {
		if !bytes.Contains(line, want) {
			continue
		}
		for _, f := range bytes.Fields(line) {
			if v, ok := bytes.CutPrefix(f, []byte("id=")); ok {
				return string(v)
			}
		}
	}
	return ""
}

// CLIENT KILL with an ID filter in front of a cluster. The id is the one
// CLIENT ID through the proxy gave a client: its connection's to the
// slot-0 master. Killing that connection alone would leave the client
// connected to the proxy (its next command dials again), where Redis
// closes the client's connection. So when the slot-0 master answers that
// it killed the connection (:1), the proxy closes that client's
// connection too. The other filters (ADDR, LADDR, TYPE, USER, MAXAGE)
// name the proxy's connections to the master, and are the master's alone.
// A client that kills itself (SKIPME no) keeps its connection to the
// proxy, as with one Redis (README, "Connection identity").

// killCall answers CLIENT KILL ... ID id ... for the client id names; it
// reports false for any other CLIENT KILL, which goes to the first master
// as before.
func (s *Client) killCall(m *cluster.SlotMap, cmd redcon.Command) (cluster.Call, bool) {
	id, ok := resp.KillID(cmd.Args)
	if !ok {
		return cluster.Call{}, false
	}
	target, ok := s.r.clientIDs.Load(id)
	if !ok || target == s {
		return cluster.Call{}, false
	}
	c := cluster.Call{Kind: cluster.CallMerge, Op: cluster.OpFirst, Parts: []cluster.Part{{Slot: m.First[0], Addr: m.Master(m.First[0]), Raw: cmd.Raw}}}
	c.Fold = func(replies [][]byte) ([]byte, bool) {
		b := replies[0]
		if n, ok := resp.IntegerReply(b); ok && n > 0 {
			target.h.Disconnect()
		}
		return b, cluster.IsError(b)
	}
	return c, true
}
