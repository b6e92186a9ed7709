package proxy

import "time"

// What a lost connection does to a transaction or WATCH in front of a
// Redis Cluster, as it does to one Redis (connState.doomed): a MULTI is
// tied to the connection it was sent on, and so are the keys a WATCH
// watches. A command of the transaction that would go out on another
// connection (the first was lost, and a new one dialed) is refused and
// fails the transaction, EXEC aborts with EXECABORT, and DISCARD ends it
// without reaching the cluster. A transaction opened on another connection
// than the one its WATCH went on ends with EXEC sent as DISCARD and the
// null array of the client's protocol, as when a watched key changed.

// txRole is what a part does to the transaction or WATCH it belongs to.
type txRole uint8

const (
	txQueued  txRole = iota // a command queued in the transaction
	txOpens                 // the MULTI that opens the transaction on its connection
	txExec                  // the transaction's EXEC
	txDiscard               // the transaction's DISCARD
	txMulti                 // a MULTI inside it: Redis refuses it and queues nothing
	txWatch                 // a WATCH inside it: the same
)

// tagTx ties the parts of c, the call planned for name, to the transaction
// or WATCH they belong to, for txConn to check when they are sent. txn and
// watch are the client's transaction and WATCH before c was planned.
func (s *session) tagTx(c *call, name []byte, txn *txnState, watch *pin) {
	cs := s.cl
	if c.kind == callLocal {
		return
	}
	switch {
	case txn != nil:
		role := txQueued
		switch string(name) {
		case "exec":
			role = txExec
		case "discard":
			role = txDiscard
		case "multi":
			role = txMulti
		case "watch":
			role = txWatch
		}
		for i := range c.count() {
			p := c.part(i)
			p.txn, p.txRole = txn, role
		}
		if c.kind == callMerge && c.op == opLast {
			// The transaction moves to the master of its first key: the
			// MULTI sent there opens it on that connection.
			c.parts[1].txRole = txOpens
		}
	case cs.txn != nil:
		cs.txn.watched, cs.txn.lost = watch, false // lost was the WATCH's
		c.one.txn, c.one.txRole = cs.txn, txOpens
	case cs.watch != nil && string(name) == "watch":
		c.one.watch = cs.watch
	}
}

// txConn checks p, about to be written on be, against the connection of
// its transaction or WATCH, and reports false when it must not be written:
// p then answers p.reply, or the error p.err.
func (s *session) txConn(p *part, be *backend) bool {
	if w := p.watch; w != nil {
		w.lost = w.lost || (w.conn != nil && w.conn != be)
		w.conn = be
		return true
	}
	t := p.txn
	switch {
	case p.txRole == txOpens && !t.lost:
		t.conn = be
		if w := t.watched; w != nil && (w.lost || w.conn != be) {
			t.watchLost = true
		}
	case t.conn != be || t.lost:
		// Once lost, a transaction that moves to the master of its first
		// key does not open again there.
		t.lost = true
		p.err = errTxnLost
		switch p.txRole {
		case txExec:
			p.reply = replyExecAbort
		case txDiscard:
			p.reply = replyOK
		case txMulti:
			p.reply = replyNestedMulti
		case txWatch:
			p.reply = replyWatchInMulti
		default:
			t.failed = true
		}
		return false
	case p.txRole == txExec && (t.failed || t.watchLost):
		// The transaction is queued on be: throw it away.
		p.raw = cmdDiscard
		p.reply = replyExecAbort
		if !t.failed {
			p.reply = replyNull2
			if s.cl.resp3 {
				p.reply = replyNull3
			}
		}
	}
	return true
}

// txUnsent records that p, of a transaction or WATCH, could not be sent:
// its master could not be reached. The transaction fails; the keys of the
// WATCH count as lost.
func (s *session) txUnsent(p *part) {
	if p.watch != nil {
		p.watch.lost = true
	} else {
		p.txn.failed = true
	}
}

// replaced answers p with p.reply, after reading and dropping the reply
// to what was sent in its place, if anything was.
func (s *session) replaced(p *part, deadline time.Time) {
	if p.be != nil {
		var ri replyInfo
		s.readReply(p, s.w.discard, &ri, deadline, false)
	}
	s.writeReply(p.reply)
}
