package proxy

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

// txPart is what a part of a transaction or WATCH carries: the transaction
// or WATCH, and, once it is sent or refused, what the client gets instead
// of the part's reply (nil: the reply).
type txPart struct {
	txn   *txnState
	watch *pin
	role  txRole
	reply []byte
}

// tagTx ties the parts of c, the call planned for name, to the transaction
// or WATCH they belong to, for txConn to check when they are sent. txn and
// watch are the client's transaction and WATCH before c was planned.
func (s *session) tagTx(c *call, name []byte, txn *txnState, watch *pin) {
	cs := s.cl
	if c.kind == callLocal || (c.kind == callMerge && c.op != opLast) {
		// The proxy's own reply, or AUTH, HELLO or CLIENT SETNAME, which
		// go to every connection of the client, inside a transaction or
		// not (everywhere).
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
			c.part(i).tx = &txPart{txn: txn, role: role}
		}
		if c.kind == callMerge && c.op == opLast {
			// The transaction moves to the master of its first key: the
			// MULTI sent there opens it on that connection.
			c.parts[1].tx.role = txOpens
		}
	case cs.txn != nil:
		cs.txn.watched, cs.txn.lost = watch, false // lost was the WATCH's
		c.one.tx = &txPart{txn: cs.txn, role: txOpens}
	case cs.watch != nil && string(name) == "watch":
		c.one.tx = &txPart{watch: cs.watch}
	}
}

// txConn checks p, about to be written on be, against the connection of
// its transaction or WATCH, and reports false when it must not be written:
// p then answers p.tx.reply (p.err, in a call whose replies merge).
func (s *session) txConn(p *part, be *backend) bool {
	x := p.tx
	if w := x.watch; w != nil {
		w.lost = w.lost || (w.conn != nil && w.conn != be)
		w.conn = be
		return true
	}
	t := x.txn
	switch {
	case x.role == txOpens && !t.lost:
		t.conn = be
		if w := t.watched; w != nil && (w.lost || w.conn != be) {
			t.watchLost = true
		}
	case t.conn != be || t.lost:
		// Once lost, a transaction that moves to the master of its first
		// key does not open again there.
		t.lost = true
		p.err = errTxnLost
		switch x.role {
		case txExec:
			x.reply = replyExecAbort
		case txDiscard:
			x.reply = replyOK
		case txMulti:
			x.reply = replyNestedMulti
		case txWatch:
			x.reply = replyWatchInMulti
		default:
			t.failed.Store(true)
			x.reply = replyTxnLost
		}
		return false
	case x.role == txExec && (t.failed.Load() || t.watchLost):
		// The transaction is queued on be: throw it away.
		p.raw = cmdDiscard
		x.reply = replyExecAbort
		if !t.failed.Load() {
			x.reply = replyNull2
			if s.cl.st.resp3() {
				x.reply = replyNull3
			}
		}
	}
	return true
}

// txUnsent records that p, of a transaction or WATCH, could not be sent:
// its master could not be reached. The transaction fails; the keys of the
// WATCH count as lost.
func (s *session) txUnsent(p *part) {
	if w := p.tx.watch; w != nil {
		w.lost = true
	} else {
		p.tx.txn.failed.Store(true)
	}
}
