package proxy

import (
	"strconv"

	"github.com/tidwall/redcon"

	"github.com/lockproxy/lockproxy/proxy/internal/resp"
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
	entryWatch
	entryUnwatch
	// entryTracking is CLIENT TRACKING; mode is replyOn for ON, replyOff
	// for OFF.
	entryTracking
	entryNoEvict // CLIENT NO-EVICT
	entryNoTouch // CLIENT NO-TOUCH
	// entryClientID is CLIENT ID; entryKill is CLIENT KILL with an ID
	// filter, arg its id. The replyQueue tells the session their
	// replies (replyQueue.identity).
	entryClientID
	entryKill
)

// Pub/sub families: channels, patterns, shard channels.
const (
	famChannel = resp.FamChannel
	famPattern = resp.FamPattern
	famShard   = resp.FamShard
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
	// hidden: the reply is read and learned from, but not the client's:
	// a command that sets replayed state, sent while CLIENT REPLY keeps
	// its reply from the client (see connState.reveal).
	hidden bool
}

// replayState is the connection state a client set on its backend
// connection. When the backend connection is lost, the next one is brought
// to the same state before the client's next command. Each piece is one
// command, replayed in this order: the user (AUTH, or a HELLO with AUTH),
// the protocol (HELLO), the name (CLIENT SETNAME, or HELLO's SETNAME as
// CLIENT SETNAME), the database, then CLIENT NO-EVICT and NO-TOUCH. A HELLO
// with AUTH or SETNAME is split so that a later AUTH, HELLO or SETNAME
// replaces only what it sets, as it does on Redis.
type replayState struct {
	auth, hello, name, db, noEvict, noTouch []byte
}

// commands appends the commands that bring a new connection to the state.
func (r replayState) commands(dst [][]byte) [][]byte {
	for _, raw := range [][]byte{r.auth, r.hello, r.name, r.db, r.noEvict, r.noTouch} {
		if raw != nil {
			dst = append(dst, raw)
		}
	}
	return dst
}

// piece returns the piece of the state a command of kind k sets as it
// is, nil for the others.
func (r *replayState) piece(k entryKind) *[]byte {
	switch k {
	case entrySelect:
		return &r.db
	case entryAuth:
		return &r.auth
	case entrySetName:
		return &r.name
	case entryNoEvict:
		return &r.noEvict
	case entryNoTouch:
		return &r.noTouch
	}
	return nil
}

// replayedKind reports whether a command of kind k sets what a new
// connection replays: one of piece's kinds, or HELLO.
func replayedKind(k entryKind) bool {
	switch k {
	case entrySelect, entryAuth, entrySetName, entryNoEvict, entryNoTouch, entryHello:
		return true
	}
	return false
}

// empty reports whether the client set nothing to replay.
func (r *replayState) empty() bool {
	return r.auth == nil && r.hello == nil && r.name == nil && r.db == nil && r.noEvict == nil && r.noTouch == nil
}

// clientState is what a client set on its connection that every backend
// connection it uses must carry: the commands a new one replays, and the
// protocol. A client of one Redis learns it from the replies on its
// dedicated connection (connState), a client of a cluster from the
// replies to the commands it sends on all of its own (clusterState);
// both learn it here. The zero value is RESP2 with nothing to replay.
type clientState struct {
	replay replayState
	// proto is the protocol HELLO set (3, or 2; 0 before any HELLO).
	proto int64
}

// learn records that a command of kind k, raw, succeeded; arg is a
// HELLO's protocol version. It reports whether the command sets state
// that is replayed.
func (c *clientState) learn(k entryKind, raw []byte, arg int64) bool {
	if piece := c.replay.piece(k); piece != nil {
		*piece = raw
		return true
	}
	if k != entryHello {
		return false
	}
	c.replay.learnHello(raw)
	if arg == 2 || arg == 3 {
		c.proto = arg
	}
	return true
}

// resp3 reports whether the client speaks RESP3.
func (c *clientState) resp3() bool { return c.proto == 3 }

// learnHello records a HELLO that succeeded: the protocol it set, and the
// user and name when it set them too.
func (r *replayState) learnHello(raw []byte) {
	cmd, err := redcon.Parse(raw)
	if err != nil || len(cmd.Args) < 2 {
		r.hello = raw
		return
	}
	var auth bool
	var name []byte
	for i := 2; i < len(cmd.Args); i++ {
		var sb [24]byte
		switch string(resp.Lower(&sb, cmd.Args[i])) {
		case "auth":
			auth = true
			i += 2
		case "setname":
			if i+1 < len(cmd.Args) {
				name = cmd.Args[i+1]
			}
			i++
		}
	}
	if !auth && name == nil {
		r.hello = raw
		return
	}
	r.hello = command("HELLO", string(cmd.Args[1]))
	if auth {
		r.auth = raw // HELLO v AUTH user pass: its protocol is set again after it
	}
	if name != nil {
		r.name = command("CLIENT", "SETNAME", string(name))
	}
}

// classify returns the entry for a command; name is its lower-case name.
// It looks at the command only, not at any state: what the command does
// to the connection is the command table's (resp.Effect); its arguments
// say the rest.
func classify(name []byte, cmd redcon.Command) entry {
	if !resp.Affects(name) {
		return entry{} // most commands
	}
	args := cmd.Args
	effect, fam := resp.EffectOf(name, args)
	switch effect {
	case resp.NoEffect:
	case resp.EffectSubscribe:
		return entry{kind: entrySubscribe, fam: fam, n: int64(len(args) - 1)}
	case resp.EffectUnsubscribe:
		return entry{kind: entryUnsubscribe, fam: fam, n: int64(len(args) - 1)}
	case resp.EffectSelect:
		return entry{kind: entrySelect, raw: cmd.Raw}
	case resp.EffectAuth:
		return entry{kind: entryAuth, raw: cmd.Raw}
	case resp.EffectHello:
		e := entry{kind: entryHello, raw: cmd.Raw}
		if len(args) > 1 {
			e.arg, _ = strconv.ParseInt(string(args[1]), 10, 64)
		}
		return e
	case resp.EffectMonitor:
		return entry{kind: entryMonitor}
	case resp.EffectSync:
		return entry{kind: entrySync}
	case resp.EffectReset:
		return entry{kind: entryReset}
	case resp.EffectQuit:
		return entry{kind: entryQuit}
	case resp.EffectMulti:
		return entry{kind: entryMulti}
	case resp.EffectExec:
		return entry{kind: entryExec}
	case resp.EffectDiscard:
		return entry{kind: entryDiscard}
	case resp.EffectWatch:
		return entry{kind: entryWatch}
	case resp.EffectUnwatch:
		return entry{kind: entryUnwatch}
	case resp.EffectSetName:
		return entry{kind: entrySetName, raw: cmd.Raw}
	case resp.EffectNoEvict:
		return entry{kind: entryNoEvict, raw: cmd.Raw}
	case resp.EffectNoTouch:
		return entry{kind: entryNoTouch, raw: cmd.Raw}
	case resp.EffectTracking:
		if len(args) < 3 {
			break
		}
		var sb [24]byte
		e := entry{kind: entryTracking, mode: replyOff}
		if string(resp.Lower(&sb, args[2])) == "on" {
			e.mode = replyOn
		}
		return e
	case resp.EffectClientID:
		if len(args) == 2 {
			return entry{kind: entryClientID}
		}
	case resp.EffectKill:
		if id, ok := resp.KillID(args); ok {
			return entry{kind: entryKill, arg: id}
		}
	case resp.EffectReplyMode:
		if len(args) != 3 {
			break
		}
		var sb [24]byte
		switch string(resp.Lower(&sb, args[2])) {
		case "on":
			return entry{kind: entryReplyMode, mode: replyOn}
		case "off":
			return entry{kind: entryReplyMode, mode: replyOff}
		case "skip":
			return entry{kind: entryReplyMode, mode: replySkip}
		}
	}
	return entry{}
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
	// The state a new connection replays, and the protocol.
	clientState
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
	// txnLost: the backend connection was lost while a transaction was
	// open, and with it what the backend had queued. The transaction
	// stays open for the client, failed as a whole: until its EXEC or
	// DISCARD nothing of it reaches the backend (see doomed), and EXEC
	// aborts.
	txnLost bool
	// watching: a WATCH was sent and no UNWATCH, EXEC or DISCARD of a
	// transaction, nor RESET, since. A WATCH that Redis refused counts
	// too: erring this way costs an aborted EXEC at worst.
	watching bool
	// watchLost: the connection that held the watched keys was lost, so
	// nothing can tell whether they changed: the next EXEC aborts, as
	// Redis aborts it after a change of a watched key.
	watchLost bool
	// tracking: CLIENT TRACKING ON succeeded. The invalidations the lost
	// connection owed cannot be had, so the client is disconnected.
	tracking bool
	// quit: a QUIT was sent. Redis closes the connection after it, and
	// the proxy closes the client's with it, also when CLIENT REPLY kept
	// QUIT's +OK from coming (which otherwise tells, see answeredQuit).
	quit bool
	mode replyMode
}

func newConnState() connState { return connState{clientState: clientState{proto: 2}} }

// sent records that e is sent to the backend, and reports whether a reply
// will come for it. An EXEC of a transaction the proxy refused a command
// of gets e.replace set: the caller sends DISCARD in its place.
func (c *connState) sent(e *entry) (replies bool) {
	if e.hidden {
		c.silent() // the client's SKIP is spent on it, as on Redis
		return true
	}
	switch e.kind {
	case entryInternal:
		return true // the proxy's own: CLIENT REPLY is not about it
	case entrySync:
		// The stream that answers it is not a reply: CLIENT REPLY does not
		// hold it back, and the reader must know where it starts.
		return true
	case entryReset:
		c.multi, c.txnFailed, c.txnLost = false, false, false
		c.watching, c.watchLost = false, false
	case entryQuit:
		c.quit = true
	case entryMulti:
		if !c.multi {
			c.multi = true
			c.txn++
			e.arg = c.txn
		}
	case entryExec, entryDiscard:
		if !c.multi {
			break // Redis's "without MULTI" error; the keys stay watched
		}
		if e.kind == entryExec {
			switch {
			case c.txnFailed:
				e.replace = replyExecAbort
			case c.watchLost:
				e.replace = replyNullArray(c.proto)
			}
		}
		c.multi, c.txnFailed = false, false
		c.watching, c.watchLost = false, false
	case entryWatch:
		c.watching = c.watching || !c.multi
	case entryUnwatch:
		if !c.multi {
			c.watching, c.watchLost = false, false
		}
	}
	return c.replies(e)
}

// reveal reports whether e, a command that sets state a new connection
// replays (SELECT, AUTH, HELLO, CLIENT SETNAME, NO-EVICT, NO-TOUCH), is
// sent while CLIENT REPLY keeps its reply from the client, and marks it
// hidden then: the proxy must still read that reply, or it cannot tell
// whether the state was set, and a new connection would be brought back
// without it (the client's writes would go to another database). The
// caller turns replies on for it with a CLIENT REPLY ON of its own, whose
// reply is not the client's, and, when they were off, off again after
// it; off tells that. Not inside a transaction, where both would be
// queued, nor while subscribed in RESP2, monitoring or a replica, where
// Redis refuses them.
func (c *connState) reveal(e *entry) (ok, off bool) {
	e.hidden = false
	if c.mode == replyOn || c.multi || (c.subscribed() && c.proto != 3) || c.monitor || c.replica {
		return false, false
	}
	if !replayedKind(e.kind) {
		return false, false
	}
	e.hidden = true
	return true, c.mode == replyOff
}

// doomed is what the client gets in place of e, which must not reach the
// backend, when the connection of an open transaction was lost; nil when
// e may be sent. It applies what e does to the transaction: EXEC aborts it
// and DISCARD ends it, as Redis does with a transaction that failed to
// queue a command, and both unwatch the keys. Inside the lost transaction
// MULTI and WATCH get Redis's own errors, RESET and QUIT go to the backend,
// and every other command the error of one that failed to queue.
func (c *connState) doomed(e *entry) []byte {
	if !c.holds(e) {
		return nil
	}
	switch e.kind {
	case entryExec, entryDiscard:
		c.multi, c.txnFailed, c.txnLost = false, false, false
		c.watching, c.watchLost = false, false
		if e.kind == entryDiscard {
			return replyOK
		}
		return replyExecAbort
	case entryMulti:
		return replyNestedMulti
	case entryWatch:
		return replyWatchInMulti
	}
	c.txnFailed = true
	return replyTxnLost
}

// unsent records that e could not be sent: no backend connection could
// be had. A MULTI opens a transaction lost at once, and a WATCH counts as
// watched keys lost, so that a client that goes on after the error (a
// pipeline of MULTI ... EXEC does) never has the rest run outside the
// transaction, nor an EXEC succeed unwatched.
func (c *connState) unsent(e *entry) {
	if c.multi {
		return
	}
	switch e.kind {
	case entryMulti:
		c.multi, c.txnLost = true, true
		c.txn++
	case entryWatch:
		c.watching, c.watchLost = true, true
	}
}

// holds reports whether e must not reach the backend: it is part of a
// transaction whose backend connection was lost.
func (c *connState) holds(e *entry) bool {
	return c.txnLost && e.kind != entryReset && e.kind != entryQuit
}

// replyNullArray is the null array of the protocol: what EXEC answers
// when a watched key changed.
func replyNullArray(proto int64) []byte {
	if proto == 3 {
		return replyNull3
	}
	return replyNull2
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
		// RESET turns replies back on, but a SKIP still covers RESET
		// itself: Redis clears CLIENT REPLY OFF and a SKIP set for the
		// command after next, not the skip of the command it runs.
		skipped := c.mode == replySkip
		c.mode = replyOn
		return !skipped
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
func (c *connState) replied(ri *resp.ReplyInfo, head *entry) outcome {
	if o, ok := c.pubsubFrame(ri, head); ok {
		return o
	}
	if ri.Type == '>' {
		return unsolicited // another push, such as a client-tracking invalidation
	}
	if c.monitor && ri.Type == '+' && isMonitorLine(ri.Line()) {
		return unsolicited
	}
	if head == nil {
		return unsolicited
	}
	ok := ri.Type != '-' && ri.Type != '!'
	if ok && c.learn(head.kind, head.raw, head.arg) {
		return answered
	}
	switch head.kind {
	case entryTracking:
		if ok {
			c.tracking = head.mode == replyOn
		}
	case entryMonitor:
		c.monitor = c.monitor || ok
	case entryReset:
		// The transaction and reply mode were reset when RESET was sent;
		// what was sent after it is not undone here.
		c.replay = replayState{}
		c.proto, c.nChan, c.nPat, c.nShard, c.monitor = 2, 0, 0, 0, false
		c.tracking = false
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
func (c *connState) pubsubFrame(ri *resp.ReplyInfo, e *entry) (outcome, bool) {
	switch ri.Type {
	case '>':
	case '*':
		awaiting := e != nil && (e.kind == entrySubscribe || e.kind == entryUnsubscribe)
		if c.proto != 2 || (!c.subscribed() && !awaiting) {
			return 0, false
		}
	default:
		return 0, false
	}
	head := ri.Head()
	var fam uint8
	switch string(head) {
	case "message", "smessage":
		return unsolicited, ri.N == 3
	case "pmessage":
		return unsolicited, ri.N == 4
	case "subscribe", "unsubscribe":
		fam = famChannel
	case "psubscribe", "punsubscribe":
		fam = famPattern
	case "ssubscribe", "sunsubscribe":
		fam = famShard
	default:
		return 0, false
	}
	if ri.N != 3 || !ri.HasInt {
		return 0, false
	}
	var before int64
	switch fam {
	case famChannel:
		before = c.nChan
		c.nChan = max(0, ri.Third-c.nPat)
	case famPattern:
		before = c.nPat
		c.nPat = max(0, ri.Third-c.nChan)
	case famShard:
		before = c.nShard
		c.nShard = ri.Third
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
// held. It reports whether the client must be disconnected to notice:
// it was listening (subscribed, monitoring or a replica), or tracking
// keys for its cache; or it sent QUIT, after which Redis closed it. The replay state and the protocol stay: a new
// connection is brought back to them. An open transaction stays open and
// failed (txnLost), and watched keys make the next EXEC abort (watchLost).
func (c *connState) lost() (disconnect bool) {
	disconnect = c.listening() || c.tracking || c.quit
	c.nChan, c.nPat, c.nShard, c.monitor, c.replica = 0, 0, 0, false, false
	c.tracking = false
	c.txnLost = c.txnLost || c.multi
	c.watchLost = c.watchLost || c.watching
	return disconnect
}

func (c *connState) subscribed() bool { return c.nChan+c.nPat+c.nShard > 0 }

// listening reports whether the backend sends the client messages that
// answer no command: it is subscribed, monitoring or a replica.
func (c *connState) listening() bool { return c.subscribed() || c.monitor || c.replica }

// isMonitorLine recognises the line of MONITOR's
// "+1700000000.123456 [0 127.0.0.1:5] ...", with or without its "+" (a
// resp.ReplyInfo's line starts after the type byte).
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
