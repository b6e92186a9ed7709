package clusterclient

import (
	"github.com/lockproxy/lockproxy/proxy/internal/backend"
	"github.com/lockproxy/lockproxy/proxy/internal/cluster"
	"github.com/lockproxy/lockproxy/proxy/internal/resp"
)

// What a lost connection does to a transaction or WATCH in front of a
// Redis Cluster, as it does to one Redis (connState.doomed): a MULTI is
// tied to the connection it was sent on, and so are the keys a WATCH
// watches. A command of the transaction that would go out on another
// connection (the first was lost, and a new one dialed) is refused and
// fails the transaction, EXEC aborts with EXECABORT, and DISCARD ends it
// without reaching the cluster. A transaction opened on another connection
// than the one its WATCH went on ends with EXEC sent as DISCARD and the
// null array of the client's protocol, as when a watched key changed.

// tagTx ties the parts of c, the call planned for name, to the transaction
// or WATCH they belong to, for txConn to check when they are sent. txn and
// watch are the client's transaction and WATCH before c was planned.
func (s *Client) tagTx(c *cluster.Call, name []byte, txn *cluster.TxnState, watch *cluster.Pin) {
	if c.Kind == cluster.CallLocal || (c.Kind == cluster.CallMerge && c.Op != cluster.OpLast) {
		// The proxy's own reply, or AUTH, HELLO or CLIENT SETNAME, which
		// go to every connection of the client, inside a transaction or
		// not (cluster.Client.everywhere).
		return
	}
	switch {
	case txn != nil:
		role := cluster.TxQueued
		switch string(name) {
		case "exec":
			role = cluster.TxExec
		case "discard":
			role = cluster.TxDiscard
		case "multi":
			role = cluster.TxMulti
		case "watch":
			role = cluster.TxWatch
		}
		for i := range c.Count() {
			c.Part(i).Tx = &cluster.TxPart{Txn: txn, Role: role}
		}
		if c.Kind == cluster.CallMerge && c.Op == cluster.OpLast {
			// The transaction opens with its first command, or moves to
			// the master of its first key: the MULTI sent there opens it
			// on that connection.
			c.Parts[c.Opens].Tx.Role = cluster.TxOpens
		}
	case s.Txn != nil:
		s.Txn.Watched, s.Txn.Lost = watch, false // lost was the WATCH's
		c.One.Tx = &cluster.TxPart{Txn: s.Txn, Role: cluster.TxOpens}
	case s.Watch != nil && string(name) == "watch":
		c.One.Tx = &cluster.TxPart{Watch: s.Watch}
	}
}

// txConn checks p, about to be written on be, against the connection of
// its transaction or WATCH, and reports false when it must not be written:
// p then answers p.tx.reply (p.err, in a call whose replies merge).
func (s *Client) txConn(p *cluster.Part, be *backend.Conn) bool {
	x := p.Tx
	if w := x.Watch; w != nil {
		w.Lost = w.Lost || (w.Conn != nil && w.Conn != be)
		w.Conn = be
		return true
	}
	t := x.Txn
	switch {
	case x.Role == cluster.TxOpens && !t.Lost:
		t.Conn = be
		if w := t.Watched; w != nil && (w.Lost || w.Conn != be) {
			t.WatchLost = true
		}
	case t.Conn != be || t.Lost:
		// Once lost, a transaction that moves to the master of its first
		// key does not open again there.
		t.Lost = true
		p.Err = ErrTxnLost
		switch x.Role {
		case cluster.TxExec:
			x.Reply = resp.ReplyExecAbort
		case cluster.TxDiscard:
			x.Reply = resp.ReplyOK
		case cluster.TxMulti:
			x.Reply = replyNestedMulti
		case cluster.TxWatch:
			x.Reply = replyWatchInMulti
		default:
			t.Failed.Store(true)
			x.Reply = s.r.txnLost
		}
		return false
	case x.Role == cluster.TxExec && (t.Failed.Load() || t.WatchLost):
		// The transaction is queued on be: throw it away.
		p.Raw = resp.CmdDiscard
		x.Reply = resp.ReplyExecAbort
		if !t.Failed.Load() {
			x.Reply = replyNull2
			if s.h.Resp3() {
				x.Reply = replyNull3
			}
		}
	}
	return true
}

// txUnsent records that p, of a transaction or WATCH, could not be sent:
// its master could not be reached. The transaction fails; the keys of the
// WATCH count as lost.
func (s *Client) txUnsent(p *cluster.Part) {
	if w := p.Tx.Watch; w != nil {
		w.Lost = true
	} else {
		p.Tx.Txn.Failed.Store(true)
	}
}
