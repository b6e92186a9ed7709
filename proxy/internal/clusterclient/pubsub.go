package clusterclient

import (
	"github.com/tidwall/redcon"

	"github.com/lockproxy/lockproxy/proxy/internal/cluster"
	"github.com/lockproxy/lockproxy/proxy/internal/resp"
)

// What the cluster decides for a client's pub/sub connection, which the
// session serves as a client of one Redis's (pinned to one node): the node
// a subscription goes to, and which commands of a subscribed RESP2 client
// have keys.

// PinTarget returns the node a (un)subscribe command name goes to: the
// master of slot 0 for SUBSCRIBE and PSUBSCRIBE (the cluster broadcasts
// PUBLISH), that of the channels' slot for SSUBSCRIBE and SUNSUBSCRIBE
// (shard set). reply is the client's instead when the slot map cannot be
// read or the shard channels are in several slots.
func (s *Client) PinTarget(name []byte, cmd redcon.Command) (target string, shard bool, reply []byte) {
	m, err := s.r.Current(s.ctx)
	if err != nil {
		return "", false, s.Unavailable(err)
	}
	target = m.Master(m.First[0])
	shard = (string(name) == "ssubscribe" || string(name) == "sunsubscribe") && len(cmd.Args) > 1
	if shard {
		slot := cluster.KeySlot(cmd.Args[1])
		for _, ch := range cmd.Args[2:] {
			if cluster.KeySlot(ch) != slot {
				return "", true, cluster.ReplyCrossSlot
			}
		}
		target = m.Master(slot)
	}
	return target, shard, nil
}

// KeyedName returns, for a command with keys by the cluster's COMMAND
// table, its full name (container|subcommand, lower case), nil for a
// command without keys; reply is the client's instead when the table
// cannot be read.
func (s *Client) KeyedName(name []byte, cmd redcon.Command) (full, reply []byte) {
	keys, err := s.r.Keys(s.ctx, s.Keys[:0], name, cmd.Args)
	s.Keys = keys
	if err != nil {
		return nil, s.Unavailable(err)
	}
	if len(keys) == 0 {
		return nil, nil
	}
	full = append([]byte(nil), name...)
	if t, err := s.r.Commands(s.ctx); err == nil && t[string(name)].Container && len(cmd.Args) > 1 {
		var sb [24]byte
		full = append(append(full, '|'), resp.Lower(&sb, cmd.Args[1])...)
	}
	return full, nil
}

// ResetAll follows a RESET on the client's pub/sub connection: the node
// unsubscribed the client, and the cluster side of the client is reset
// too (its mirrors, its own connections, the state it set, its
// transaction and WATCH).
func (s *Client) ResetAll() {
	s.CloseMirrors()
	s.DropAll()
	s.h.ForgetState()
	s.Txn, s.Watch = nil, nil
}
