package proxy

import (
	"bytes"
	"fmt"

	"github.com/tidwall/redcon"

	"github.com/lockproxy/lockproxy/proxy/internal/clusterclient"
	"github.com/lockproxy/lockproxy/proxy/internal/resp"
)

// Pub/sub in front of a Redis Cluster. A client that subscribes is pinned
// to one connection of its own to one node, and that connection is served
// as the connection of one of a client of one Redis is (backend.NewOne, read
// against the replyQueue and its connState): pushes, RESP2 and RESP3,
// the subscription counts, and a client disconnected when the node goes.
//
// Which node (clusterclient.Client.PinTarget): Redis Cluster 7 broadcasts
// PUBLISH to every node, so SUBSCRIBE and PSUBSCRIBE work on any; the
// first subscription pins the client to the master serving slot 0, unless
// it is an SSUBSCRIBE, which must reach the master of its channels' slot
// (SPUBLISH stays within the shard). Later subscriptions go to the pinned node; an SSUBSCRIBE for a
// channel of another shard is refused while the client holds other
// subscriptions (one connection cannot follow two shards).
//
// While the client is subscribed, what it sends goes to the pinned node,
// except that in RESP3 (where a subscribed client may run any command) the
// commands other than the connection state ones go through the cluster
// routing, and in RESP2 a command with keys gets Redis's error for a
// subscribed client (the node would answer MOVED for a key it does not
// serve). Replies keep their order across the two paths: the replies to
// the routed commands are written before a command goes to the pinned
// node (clusterclient.Client.Settle), and the pinned node has answered
// everything before a command is routed.
// Once the client has no subscription left, the pinned connection is
// closed and the state it learned (HELLO, AUTH, CLIENT SETNAME) is the
// cluster session's again.

// refuseOtherShard answers an SSUBSCRIBE or SUNSUBSCRIBE for channels of
// another shard than the node the client's subscriptions are on.
func refuseOtherShard(name string) []byte {
	return []byte(fmt.Sprintf("-ERR '%s' of a channel in another shard than the client's other subscriptions is not supported by lockproxy in front of a Redis Cluster\r\n", name))
}

// clusterPubsub decides whether cmd goes to the client's pinned pub/sub
// connection. It returns pinned true for that (the caller sends it there
// as to one Redis), a local reply when the proxy answers it, or neither:
// the command is routed through the cluster.
func (s *session) clusterPubsub(name []byte, cmd redcon.Command) (reply []byte, pinned bool) {
	cs := s.cl
	if resp.Lookup(name).Has(resp.Subscribes) {
		reply, pinned = s.pinFor(name, cmd)
		if pinned {
			s.cl.MirrorSubscriptions(name, cmd.Args) // internal/clusterclient, keyspace.go
		}
		return reply, pinned
	}
	if s.be == nil {
		return nil, false
	}
	// Everything the pinned node owes the client comes first.
	s.settlePinned()
	subscribed, resp3 := s.q.pubsub()
	if !subscribed {
		s.unpin()
		return nil, false
	}
	switch {
	case string(name) == "reset":
		// The node unsubscribes the client and answers +RESET; the
		// cluster side of the client is reset too.
		cs.ResetAll()
		return nil, true
	case clusterclient.SetsState(name, cmd.Args): // AUTH, HELLO, CLIENT SETNAME
		return nil, true
	}
	if resp3 {
		s.adoptPinned()
		return nil, false
	}
	// RESP2: only the subscription commands, PING, QUIT and RESET are
	// allowed, and the node says so for the others, except for a key it
	// does not serve, which it would redirect first.
	full, reply := cs.KeyedName(name, cmd)
	switch {
	case reply != nil:
		return reply, false
	case full == nil:
		return nil, true
	}
	return append(append([]byte(subscribedPrefix), full...), subscribedSuffix...), false
}

// pinFor chooses the node of a (un)subscribe command and pins the client
// to it.
func (s *session) pinFor(name []byte, cmd redcon.Command) (reply []byte, pinned bool) {
	// The commands routed before it are answered first: a HELLO among
	// them sets the protocol the new connection is brought to.
	s.cl.Settle()
	target, shard, reply := s.cl.PinTarget(name, cmd)
	if reply != nil {
		return reply, false
	}
	if s.be != nil && !s.q.dead(s.be) {
		if !shard || s.cl.PinAddr() == target {
			return nil, true
		}
		// A shard channel of another node: the client may move there
		// only if it holds no subscription on this one.
		s.settlePinned()
		if subscribed, _ := s.q.pubsub(); subscribed {
			return refuseOtherShard(string(name)), false
		}
	}
	if s.be != nil {
		s.unpin()
	}
	s.q.adopt(s.cst.st)
	s.cl.PinTo(target)
	return nil, true
}

// settlePinned sends what is written to the pinned connection and waits
// until the node has answered all of it.
func (s *session) settlePinned() {
	s.flush()
	s.q.waitEmpty()
}

// unpin closes the pinned connection of a client that holds no
// subscription, and takes back the state the client set on it.
func (s *session) unpin() {
	be := s.be
	s.be = nil
	s.cl.CloseMirrors()
	s.adoptPinned()
	be.NC.Close()
	<-be.Done
}

// adoptPinned makes the connection state the client set on its pinned
// connection the cluster session's; when it changed, the cluster
// connections are closed, to be opened again in the new state.
func (s *session) adoptPinned() {
	cs := &s.cst
	st := s.q.client()
	if bytes.Equal(st.replay.auth, cs.st.replay.auth) && bytes.Equal(st.replay.hello, cs.st.replay.hello) &&
		bytes.Equal(st.replay.name, cs.st.replay.name) && st.resp3() == cs.st.resp3() {
		return
	}
	cs.st = st
	cs.stateChanged()
	s.cl.DropAll()
}
