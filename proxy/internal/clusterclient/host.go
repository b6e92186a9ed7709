package clusterclient

import (
	"bufio"
	"bytes"
	"context"

	"github.com/tidwall/redcon"

	"github.com/lockproxy/lockproxy/proxy/internal/backend"
	"github.com/lockproxy/lockproxy/proxy/internal/cluster"
)

// Host is what a Client asks of the session it routes for: the client's
// socket, the order of what it is owed outside the cluster's Order, and
// the connection state it set. The session keeps that state (AUTH,
// HELLO, CLIENT SETNAME, CLIENT REPLY) because it also serves the
// client's pub/sub connection, as it serves a client of one Redis. It is
// also the backend.Client the masters' connections hand its replies to.
type Host interface {
	backend.Client

	// Recover contains a panic of a goroutine working for the client: it
	// is deferred at the top of each (it calls recover itself).
	Recover()
	// Go runs f on a goroutine of the session's, which the session waits
	// for when the client has gone, with a panic contained.
	Go(f func())

	// LockOutput returns the client's buffered output between two
	// replies, for a push, a MONITOR line or a keyspace message; Unlock
	// gives it back. Write writes a reply of the proxy's own.
	LockOutput() *bufio.Writer
	Unlock()
	Write(reply []byte)
	// Drain waits until what the client was sent has been written.
	Drain()

	// MarkOut notes that the client queued commands on a shared
	// connection or one of its own since the last flush; FlushShared
	// writes them, when there are any; WaitShared waits for the replies
	// the session's queue counts (those on the shared connections).
	MarkOut()
	FlushShared()
	WaitShared()
	// Sending records name, the command queued next with a note
	// (backend.Mux.Queue), in the session's queue.
	Sending(name []byte, cmd redcon.Command)

	// Pinned reports whether the client has a pub/sub connection
	// (pub/sub, in the session); PubSub, whether it is subscribed there
	// and in RESP3. Safe for concurrent use.
	Pinned() bool
	PubSub() (subscribed, resp3 bool)

	// Resp3 reports whether the client speaks RESP3, for the forwarder;
	// Proto3, for the readers (safe for concurrent use). ReplaysNothing
	// reports whether the client set no state a new connection replays.
	Resp3() bool
	Proto3() bool
	ReplaysNothing() bool
	// Learned records that AUTH, HELLO or CLIENT SETNAME, NO-EVICT or
	// NO-TOUCH (kind) raw succeeded; ForgetState forgets what the client
	// set (RESET).
	Learned(kind string, raw []byte, proto int64)
	ForgetState()
	// Silent reports whether CLIENT REPLY keeps the next reply from the
	// client; ClientReply answers CLIENT REPLY (ok false for a malformed
	// one).
	Silent() bool
	ClientReply(args [][]byte) (c cluster.Call, ok bool)

	// Dial dials a connection of the client's to the master at addr,
	// brought to the state as says.
	Dial(ctx context.Context, addr string, as DialAs) (*backend.Conn, error)
}

// DialAs is the state a connection of the client's is brought to.
type DialAs uint8

const (
	// AsOwn: a connection of the client's own to a master (a spare one
	// when there is one), in the state the client set.
	AsOwn DialAs = iota
	// AsState: a new connection in the state the client set (MONITOR).
	AsState
	// AsUser: a new connection signed in as the client's user only (a
	// tracking sink).
	AsUser
	// AsPinned: a new connection in the state the client set on its
	// pub/sub connection (a keyspace mirror).
	AsPinned
)

// The Client is the host of its plans (cluster.Host): the barriers and
// the state the plan of a command asks for.

var _ cluster.Host = (*Client)(nil)

func (s *Client) Context() context.Context { return s.ctx }

func (s *Client) Owed() bool {
	return (s.sharedUsed || s.ownUsed) && !s.order.Drained()
}

func (s *Client) Unavailable(err error) []byte {
	s.r.cfg.Unavailable.Add(1)
	return s.r.cfg.ErrorReply(err)
}

func (s *Client) Resp3() bool { return s.h.Resp3() }

func (s *Client) Ask(parts []cluster.Part) [][]byte { return s.ask(parts) }

func (s *Client) Clients() int64 { return s.r.cfg.Clients() }

func (s *Client) Monitor(m *cluster.SlotMap) cluster.Call { return s.monitorCall(m) }

func (s *Client) MonitorRefuses(name []byte, args [][]byte) bool {
	return s.monitorRefuses(name, args)
}

func (s *Client) Reset() {
	s.stopTracking()
	s.DropAll()
	s.h.ForgetState()
}

func (s *Client) OwnAddrs() []string { return s.ownAddrs() }

func (s *Client) Learned(kind string, raw []byte, proto int64) {
	s.h.Learned(kind, raw, proto)
}

// ClientState plans the CLIENT subcommands whose state the client keeps
// (tracking.go, unblock.go) or the session does (CLIENT REPLY).
func (s *Client) ClientState(m *cluster.SlotMap, sub string, cmd redcon.Command) (cluster.Call, bool) {
	args := cmd.Args
	switch sub {
	case "reply":
		return s.h.ClientReply(args)
	case "id":
		if len(args) == 2 {
			return s.clientIDCall(m, cmd), true
		}
	case "kill":
		return s.killCall(m, cmd)
	case "tracking":
		return s.trackingCall(m, cmd)
	case "getredir":
		if len(args) == 2 {
			return s.getRedir(), true
		}
	case "trackinginfo":
		if len(args) == 2 {
			return s.trackingInfoCall(m, cmd), true
		}
	case "unblock":
		if s.unblockCall(args) {
			return cluster.Call{Kind: cluster.CallLocal}, true // answered in its place
		}
	case "caching":
		if s.trk.Load() != nil {
			return s.cachingCall(m, cmd), true
		}
		// Redis's error: not tracking (on the first master).
	}
	return cluster.Call{}, false
}

// muteReplies has the replies of the command routed next held back from
// the client when CLIENT REPLY turned them off (or SKIP the next one);
// the caller calls the function returned once it is routed.
func (s *Client) muteReplies(name []byte, args [][]byte) func() {
	if isClientReply(name, args) {
		return nil
	}
	if !s.h.Silent() {
		return nil
	}
	o := &s.order
	o.Mute(true)
	return func() { o.Mute(false) }
}

// isClientReply reports whether a command is CLIENT REPLY, whose reply
// its own mode decides (Host.ClientReply).
func isClientReply(name []byte, args [][]byte) bool {
	return string(name) == "client" && len(args) > 1 && bytes.EqualFold(args[1], []byte("reply"))
}
