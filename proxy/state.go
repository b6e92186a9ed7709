package proxy

import (
	"strconv"

	"github.com/tidwall/redcon"
)

// entryKind says what a command changes on the connection, so that its
// reply can be matched and learned from. Most commands are entryPlain: one
// reply, no connection state.
type entryKind uint8

const (
	entryPlain entryKind = iota
	entrySubscribe
	entryUnsubscribe
	entrySelect
	entryAuth
	entryHello
	entrySetName
	entryMonitor
	entryReset
	entryQuit
	entryMulti
	entryExec
	entryDiscard
	// entryInternal is a command the proxy sent on its own behalf (its
	// AUTH after a client's RESET); its reply is not the client's.
	entryInternal
	// entryReplyMode is CLIENT REPLY ON, OFF or SKIP; mode says which.
	entryReplyMode
	// entrySync is SYNC or PSYNC. Unless Redis refuses it with an error,
	// what answers it is the replication stream, not a reply: the reader
	// then copies the connection's bytes as they come (connState.replica).
	entrySync
)

// Pub/sub families: channels, patterns, shard channels.
const (
	famChannel uint8 = iota
	famPattern
	famShard
)

// replyMode is what CLIENT REPLY set: whether the client gets replies.
type replyMode uint8

const (
	replyOn replyMode = iota
	replyOff
	replySkip // suppress the next reply only
)

// entry is a forwarded command whose reply has not reached the client yet.
type entry struct {
	kind entryKind
	fam  uint8
	mode replyMode // of an entryReplyMode
	// n is the number of subscription confirmations still expected for a
	// (un)subscribe; 0 on an UNSUBSCRIBE without arguments until its first
	// confirmation tells how many there will be.
	n int64
	// arg is HELLO's protocol version, or, for a MULTI that opened a
	// transaction, that transaction's number (see connState.txn).
	arg int64
	at  int64  // when it was sent, from metrics.stamp; 0 when not sampled
	raw []byte // the request, for state replayed on reconnect
	// replace, when set, is what the client gets instead of the reply:
	// EXECABORT for an EXEC sent to the backend as DISCARD.
	replace []byte
}

// replayState is the connection state a client set on its backend
// connection. When the backend connection is lost, the next one is brought
// to the same state before the client's next command.
type replayState struct {
	auth, hello, name, db []byte
}

// commands appends the commands that bring a new connection to the state.
func (r replayState) commands(dst [][]byte) [][]byte {
	for _, raw := range [][]byte{r.auth, r.hello, r.name, r.db} {
		if raw != nil {
			dst = append(dst, raw)
		}
	}
	return dst
}

// classify returns the entry for a command; name is its lower-case name.
// It looks at the command only, not at any state.
func classify(name []byte, cmd redcon.Command) entry {
	args := cmd.Args
	switch string(name) {
	case "subscribe", "psubscribe", "ssubscribe":
		return entry{kind: entrySubscribe, fam: family(name), n: int64(len(args) - 1)}
	case "unsubscribe", "punsubscribe", "sunsubscribe":
		return entry{kind: entryUnsubscribe, fam: family(name), n: int64(len(args) - 1)}
	case "select":
		return entry{kind: entrySelect, raw: cmd.Raw}
	case "auth":
		return entry{kind: entryAuth, raw: cmd.Raw}
	case "hello":
		e := entry{kind: entryHello, raw: cmd.Raw}
		if len(args) > 1 {
			e.arg, _ = strconv.ParseInt(string(args[1]), 10, 64)
		}
		return e
	case "monitor":
		return entry{kind: entryMonitor}
	case "sync", "psync":
		return entry{kind: entrySync}
	case "reset":
		return entry{kind: entryReset}
	case "quit":
		return entry{kind: entryQuit}
	case "multi":
		return entry{kind: entryMulti}
	case "exec":
		return entry{kind: entryExec}
	case "discard":
		return entry{kind: entryDiscard}
	case "client":
		if len(args) < 2 {
			break
		}
		var sb [24]byte
		switch string(lower(&sb, args[1])) {
		case "setname":
			return entry{kind: entrySetName, raw: cmd.Raw}
		case "reply":
			if len(args) != 3 {
				break
			}
			switch string(lower(&sb, args[2])) {
			case "on":
				return entry{kind: entryReplyMode, mode: replyOn}
			case "off":
				return entry{kind: entryReplyMode, mode: replyOff}
			case "skip":
				return entry{kind: entryReplyMode, mode: replySkip}
			}
		}
	}
	return entry{}
}

// family tells the pub/sub family of a (un)subscribe command name.
func family(name []byte) uint8 {
	switch string(name) {
	case "psubscribe", "punsubscribe":
		return famPattern
	case "ssubscribe", "sunsubscribe":
		return famShard
	}
	return famChannel
}

// outcome is what a reply frame did to the commands owed a reply.
type outcome uint8

const (
	// unsolicited: a push, a pub/sub message or a MONITOR line; it
	// answers no command.
	unsolicited outcome = iota
	// confirming: a subscription confirmation; the (un)subscribe awaits
	// more of them.
	confirming
	// confirmed: the last confirmation of the oldest (un)subscribe.
	confirmed
	// answered: the reply to the oldest command.
	answered
	// answeredQuit: the reply to a QUIT; the backend closes next.
	answeredQuit
)

// connState is the state of one client's backend connection, tracked once:
// every command as it is sent (sent) and every reply frame as it arrives
// (replied), in the order they happen, plus the loss of the connection
// (lost). It decides whether a command gets a reply at all (CLIENT REPLY),
// whether a transaction is open, the protocol, the subscriptions, MONITOR
// and the replication stream, and what a new connection must replay.
//
// connState is a plain value with no locks: it must only ever be used by
// one goroutine at a time. The session's replyQueue owns it and calls it
// with its own lock held, so the machine sees one ordered stream of events.
type connState struct {
	// proto is the protocol HELLO set (2 or 3).
	proto int64
	// Subscriptions, as the backend's confirmations count them.
	nChan, nPat, nShard int64
	monitor             bool
	// replica: a SYNC or PSYNC was answered with the replication stream.
	// From then on the connection is no request/reply exchange: both ways
	// carry bytes the proxy passes on as they are (see session.relay).
	replica bool
	// multi: a MULTI was sent and no EXEC, DISCARD or RESET since, nor a
	// refusal of that MULTI, nor the loss of the connection. The backend
	// queues what comes next.
	multi bool
	// txn numbers the transactions, so that a refused MULTI closes the
	// transaction it opened and not a later one.
	txn int64
	// txnFailed: the proxy refused a command of the open transaction (a
	// LOCK, or a command its key guard stopped), so EXEC must abort, as it
	// does in Redis after an error while queuing.
	txnFailed bool
	mode      replyMode
	replay    replayState
}

func newConnState() connState { return connState{proto: 2} }

// sent records that e is sent to the backend, and reports whether a reply
// will come for it. An EXEC of a transaction the proxy refused a command
// of gets e.replace set: the caller sends DISCARD in its place.
func (c *connState) sent(e *entry) (replies bool) {
	switch e.kind {
	case entryInternal:
		return true // the proxy's own: CLIENT REPLY is not about it
	case entrySync:
		// The stream that answers it is not a reply: CLIENT REPLY does not
		// hold it back, and the reader must know where it starts.
		return true
	case entryReset:
		c.multi, c.txnFailed = false, false
	case entryMulti:
		if !c.multi {
			c.multi = true
			c.txn++
			e.arg = c.txn
		}
	case entryExec, entryDiscard:
		if e.kind == entryExec && c.multi && c.txnFailed {
			e.replace = replyExecAbort
		}
		c.multi, c.txnFailed = false, false
	}
	return c.replies(e)
}

// replies applies what e does to the reply mode, and reports whether e
// gets a reply. A command that never reached the backend (it could not be
// reached) still sets the reply mode, as the client asked.
func (c *connState) replies(e *entry) bool {
	switch e.kind {
	case entryReplyMode:
		if e.mode != replySkip || c.mode != replyOff {
			c.mode = e.mode // Redis ignores a SKIP while replies are off
		}
		return e.mode == replyOn
	case entryReset:
		c.mode = replyOn
	}
	return !c.silent()
}

// silent reports whether the reply to the next command is suppressed by
// CLIENT REPLY, and consumes a SKIP. Commands the proxy answers itself call
// it instead of sent.
func (c *connState) silent() bool {
	switch c.mode {
	case replyOff:
		return true
	case replySkip:
		c.mode = replyOn
		return true
	}
	return false
}

// refused records that the proxy refused a command; inside a transaction,
// that makes EXEC abort.
func (c *connState) refused() {
	if c.multi {
		c.txnFailed = true
	}
}

// replied learns from one reply frame. head is the oldest command still
// owed a reply, nil when none is. On confirming, head.n counts down.
func (c *connState) replied(ri *replyInfo, head *entry) outcome {
	if o, ok := c.pubsubFrame(ri, head); ok {
		return o
	}
	if ri.typ == '>' {
		return unsolicited // another push, such as a client-tracking invalidation
	}
	if c.monitor && ri.typ == '+' && isMonitorLine(ri.lineBytes()) {
		return unsolicited
	}
	if head == nil {
		return unsolicited
	}
	ok := ri.typ != '-' && ri.typ != '!'
	switch head.kind {
	case entrySelect:
		if ok {
			c.replay.db = head.raw
		}
	case entryAuth:
		if ok {
			c.replay.auth = head.raw
		}
	case entrySetName:
		if ok {
			c.replay.name = head.raw
		}
	case entryHello:
		if ok {
			c.replay.hello = head.raw
			if head.arg == 2 || head.arg == 3 {
				c.proto = head.arg
			}
		}
	case entryMonitor:
		c.monitor = c.monitor || ok
	case entryReset:
		// The transaction and reply mode were reset when RESET was sent;
		// what was sent after it is not undone here.
		c.replay = replayState{}
		c.proto, c.nChan, c.nPat, c.nShard, c.monitor = 2, 0, 0, 0, false
	case entryMulti:
		if !ok && head.arg != 0 && head.arg == c.txn {
			c.multi = false // the MULTI that opened it was refused
		}
	case entryQuit:
		return answeredQuit
	}
	return answered
}

// pubsubFrame recognises subscription confirmations and messages. In RESP3
// they are pushes; in RESP2 they are arrays, recognised only while the
// client is subscribed or a (un)subscribe awaits its confirmations, since
// an ordinary array reply may happen to start with "message".
func (c *connState) pubsubFrame(ri *replyInfo, e *entry) (outcome, bool) {
	switch ri.typ {
	case '>':
	case '*':
		awaiting := e != nil && (e.kind == entrySubscribe || e.kind == entryUnsubscribe)
		if c.proto != 2 || (!c.subscribed() && !awaiting) {
			return 0, false
		}
	default:
		return 0, false
	}
	head := ri.headString()
	var fam uint8
	switch string(head) {
	case "message", "smessage":
		return unsolicited, ri.n == 3
	case "pmessage":
		return unsolicited, ri.n == 4
	case "subscribe", "unsubscribe":
		fam = famChannel
	case "psubscribe", "punsubscribe":
		fam = famPattern
	case "ssubscribe", "sunsubscribe":
		fam = famShard
	default:
		return 0, false
	}
	if ri.n != 3 || !ri.hasInt {
		return 0, false
	}
	var before int64
	switch fam {
	case famChannel:
		before = c.nChan
		c.nChan = max(0, ri.third-c.nPat)
	case famPattern:
		before = c.nPat
		c.nPat = max(0, ri.third-c.nChan)
	case famShard:
		before = c.nShard
		c.nShard = ri.third
	}
	if e == nil || (e.kind != entrySubscribe && e.kind != entryUnsubscribe) || e.fam != fam {
		return unsolicited, true
	}
	if e.n == 0 {
		e.n = max(1, before) // an UNSUBSCRIBE of everything in the family
	}
	e.n--
	if e.n == 0 {
		return confirmed, true
	}
	return confirming, true
}

// lost records that the backend connection is gone, with everything it
// held. It reports whether the client was listening (subscribed,
// monitoring or a replica): such a client must be disconnected to notice. The replay
// state and the protocol stay: a new connection is brought back to them.
func (c *connState) lost() (listening bool) {
	listening = c.listening()
	c.nChan, c.nPat, c.nShard, c.monitor, c.replica = 0, 0, 0, false, false
	c.multi, c.txnFailed = false, false
	return listening
}

func (c *connState) subscribed() bool { return c.nChan+c.nPat+c.nShard > 0 }

// listening reports whether the backend sends the client messages that
// answer no command: it is subscribed, monitoring or a replica.
func (c *connState) listening() bool { return c.subscribed() || c.monitor || c.replica }

// isMonitorLine recognises the line of MONITOR's
// "+1700000000.123456 [0 127.0.0.1:5] ...", with or without its "+" (a
// replyInfo's line starts after the type byte).
func isMonitorLine(b []byte) bool {
	if len(b) > 0 && b[0] == '+' {
		b = b[1:]
	}
	i := 0
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	return i > 0 && i < len(b) && b[i] == '.'
}
