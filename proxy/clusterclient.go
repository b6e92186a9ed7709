package proxy

import (
	"bytes"

	"github.com/lockproxy/lockproxy/proxy/internal/cluster"
)

// Connection state of a cluster client that one Redis keeps per
// connection and the proxy keeps for the client as a whole: CLIENT
// NO-EVICT and NO-TOUCH go on every connection of the client and are
// replayed on every new one (cluster.Client.everywhere, replayState); CLIENT
// REPLY is applied by the proxy itself, which holds back the replies the
// client turned off (cluster.Order.Mute): the masters answer every
// command the proxy sends them, and pushes (pub/sub messages,
// invalidations) are not replies, which CLIENT REPLY leaves alone.

// replayedClient returns the entry kind of a CLIENT subcommand that sets
// replayed connection state, or entryPlain.
func replayedClient(sub []byte) entryKind {
	switch {
	case bytes.EqualFold(sub, []byte("setname")):
		return entrySetName
	case bytes.EqualFold(sub, []byte("no-evict")):
		return entryNoEvict
	case bytes.EqualFold(sub, []byte("no-touch")):
		return entryNoTouch
	}
	return entryPlain
}

// clientReply applies CLIENT REPLY ON, OFF or SKIP to the client's reply
// mode, as Redis does: ON answers +OK, OFF and SKIP are not answered. A
// malformed one goes to a master, whose error is the client's.
func (s *session) clientReply(args [][]byte) (cluster.Call, bool) {
	if len(args) != 3 {
		return cluster.Call{}, false
	}
	e := entry{kind: entryReplyMode}
	switch {
	case bytes.EqualFold(args[2], []byte("on")):
		e.mode = replyOn
	case bytes.EqualFold(args[2], []byte("off")):
		e.mode = replyOff
	case bytes.EqualFold(args[2], []byte("skip")):
		e.mode = replySkip
	default:
		return cluster.Call{}, false
	}
	if s.q.silentFor(&e) {
		return cluster.Call{Kind: cluster.CallLocal}, true // no reply
	}
	return cluster.LocalCall(replyOK), true
}

// isClientReply reports whether a command is CLIENT REPLY, whose reply
// its own mode decides (clientReply).
func isClientReply(name []byte, args [][]byte) bool {
	return string(name) == "client" && len(args) > 1 && bytes.EqualFold(args[1], []byte("reply"))
}

// muteReplies has the replies of the command routed next held back from
// the client when CLIENT REPLY turned them off (or SKIP the next one);
// the caller calls the function returned once it is routed.
func (s *session) muteReplies(name []byte, args [][]byte) func() {
	if isClientReply(name, args) {
		return nil
	}
	if silent, _ := s.q.silent(); !silent {
		return nil
	}
	o := &s.cl.order
	o.Mute(true)
	return func() { o.Mute(false) }
}
