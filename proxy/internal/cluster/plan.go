package cluster

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"sync"

	"github.com/tidwall/redcon"

	"github.com/lockproxy/lockproxy/proxy/internal/resp"
)

var (
	ReplyCrossSlot = []byte("-CROSSSLOT Keys in request don't hash to the same slot\r\n")
	replyReset     = []byte("+RESET\r\n")
)

// clusterClient is one client's routing state in front of a cluster:
// where its transaction and WATCH are tied, the master of its last command
// with keys, the slot map its commands in flight were routed by. Only the
// forwarder uses it, except noteMoved.
type Client struct {
	Router *Router

	Txn   *TxnState
	Watch *Pin // the node and slot of the keys WATCHed, nil when none
	// OwnIdentity: the client signed in to the masters itself (AUTH, or
	// HELLO with AUTH, forwarded, and accepted): its ACL may refuse a
	// MULTI, which is then not held (TxnState.Held). Set by the call's
	// learn, which the forwarder waits for.
	OwnIdentity bool
	// last is the master the client's last command with keys in one slot
	// was routed to, whose replicas WAIT waits for; lastSeq numbers those
	// commands (call.seq). movedSeq and movedTo, under movedMu, are the
	// number of the last of them a redirection sent elsewhere, and where.
	last     string
	lastSeq  uint32
	movedMu  sync.Mutex
	movedSeq uint32
	movedTo  string
	// lastSlot is the slot of that last command; lastShared whether it
	// went on a master's shared connection, where WAIT, which goes on a
	// connection of the client's own, does not see it (waitMark).
	lastSlot   int
	LastShared bool
	// mapGen is the slot map reading the client's last command was
	// routed by (see plan).
	mapGen uint64

	Keys [][]byte
}

// clusterHost is what planning a command asks of the session it plans
// for: the barriers (Settle: every reply the client is owed is in), and
// what the session owns (its connections, the state it replays, its
// MONITOR).
type Host interface {
	Context() context.Context
	// Settle waits for every reply the client is owed; Owed reports
	// whether any may be.
	Settle()
	Owed() bool
	// Unavailable counts a command the cluster could not take and returns
	// its reply.
	Unavailable(err error) []byte
	Resp3() bool
	// Ask sends parts on the client's own connections and returns their
	// replies, or nil when the client has gone.
	Ask(parts []Part) [][]byte
	// Clients is the number of clients connected to the proxy.
	Clients() int64
	// Monitor starts MONITOR on every master; MonitorRefuses reports
	// whether a monitoring client's command touches the keyspace.
	Monitor(m *SlotMap) Call
	MonitorRefuses(name []byte, args [][]byte) bool
	// Reset closes the client's own connections and forgets the state it
	// set (RESET).
	Reset()
	// OwnAddrs are the masters the client has connections of its own to.
	OwnAddrs() []string
	// Learned records that AUTH, HELLO or CLIENT SETNAME, NO-EVICT or
	// NO-TOUCH (kind: the command's name, or the CLIENT subcommand's)
	// raw succeeded: every connection dialled from now on replays it.
	Learned(kind string, raw []byte, proto int64)
	// ClientState plans the CLIENT subcommands sub (lower case) whose
	// state the session keeps: REPLY, ID, TRACKING, CACHING, GETREDIR,
	// TRACKINGINFO, UNBLOCK. It reports false for a malformed one, which
	// goes to a master, whose error is the client's.
	ClientState(m *SlotMap, sub string, cmd redcon.Command) (Call, bool)
}

// noteMoved records that a redirection sent the client's command seq to
// the master at addr.
func (cl *Client) NoteMoved(seq uint32, addr string) {
	cl.movedMu.Lock()
	cl.movedSeq, cl.movedTo = seq, addr
	cl.movedMu.Unlock()
}

// plan decides where cmd goes.
func (cl *Client) Plan(h Host, name []byte, cmd redcon.Command) Call {
	args := cmd.Args
	m, err := cl.Router.Current(h.Context())
	if err != nil {
		return LocalCall(h.Unavailable(err))
	}
	if m.Gen != cl.mapGen {
		// The map changed since the client's commands in flight were
		// routed: one may be redirected from its old master to where
		// this one goes, and must reach it first, as one Redis runs a
		// client's commands in order. They are answered before this
		// one leaves (a redirection among them may read the map again).
		if cl.mapGen != 0 {
			h.Settle()
			m = cl.Router.Slots.Load()
		}
		cl.mapGen = m.Gen
	}
	if c, ok := cl.planState(h, m, name, cmd); ok {
		return c
	}

	// By the keys.
	cl.Keys, err = cl.Router.Keys(h.Context(), cl.Keys[:0], name, args)
	if err != nil {
		return LocalCall(h.Unavailable(err))
	}
	if len(cl.Keys) == 0 {
		return cl.keyless(h, m, name, cmd)
	}
	slot, one := oneSlot(cl.Keys)
	cross := !one
	if string(name) == "watch" {
		if cross || (cl.Watch != nil && cl.Watch.Slot != slot) {
			return LocalCall(ReplyCrossSlot)
		}
		if cl.Watch == nil {
			cl.Watch = &Pin{Slot: slot}
		}
		cl.Watch.Addr = m.Master(slot)
		return Call{Kind: CallPlain, One: Part{Slot: slot, Addr: cl.Watch.Addr, Raw: cmd.Raw}}
	}
	if resp.Lookup(name).Has(resp.Patterns) {
		if c, ok := SortCall(m, name, args, h.Resp3(), h.Ask); ok {
			return c
		}
	}
	if !cross {
		return cl.keyed(m.Master(slot), slot, cmd.Raw)
	}
	if c, ok := CrossRead(h.Context(), cl.Router, h.Resp3(), m, name, args); ok {
		return c
	}
	inf := resp.Lookup(name)
	if !inf.Has(resp.Splits) {
		return LocalCall(ReplyCrossSlot)
	}
	return Split(m, name, inf.Merge, args)
}

// planState plans the commands that set or depend on the client's
// connection state (MONITOR, RESET, AUTH, HELLO, CLIENT SETNAME, MULTI and
// what it queues, ...); it reports false for the others. It is a function
// of its own so that its frame is off the stack while plan reads a
// command's keys: the deepest frame a client's first command reaches sets
// the size of its goroutine's stack for as long as it stays idle.
// PlanShared plans, without waiting for anything, a command whose keys
// are all in one slot, for the reading loop (proxy/loop.go): it reports
// false when planning it would wait (the slot map or the COMMAND table
// not read yet; the map changed since the client's commands in flight
// were routed; keys that only COMMAND GETKEYS finds), or when it is not
// such a command (no keys, keys in several slots, BY or GET patterns, a
// command Redis does not know), or the client is in a transaction or
// WATCHes. Plan then plans it; what PlanShared changed (the master of
// the client's last keyed command) Plan changes alike.
func (cl *Client) PlanShared(name []byte, cmd redcon.Command) (Call, bool) {
	if cl.Txn != nil || cl.Watch != nil {
		return Call{}, false
	}
	m := cl.Router.Slots.Load()
	if m == nil || (m.Gen != cl.mapGen && cl.mapGen != 0) {
		return Call{}, false
	}
	args := cmd.Args
	inf := resp.Lookup(name)
	if inf.Has(resp.Patterns) || inf.Has(resp.NumKeys) {
		return Call{}, false
	}
	table, ok := cl.Router.table.Loaded()
	if !ok {
		return Call{}, false
	}
	spec, ok := resp.LookupSpec(table, name, args)
	if !ok || spec.Movable {
		return Call{}, false
	}
	if _, ok := resp.MovableKeys(name, args); ok {
		return Call{}, false
	}
	cl.Keys = spec.Keys(cl.Keys[:0], args)
	if len(cl.Keys) == 0 {
		return Call{}, false
	}
	slot, one := oneSlot(cl.Keys)
	addr := m.Master(slot)
	if !one || addr == "" {
		return Call{}, false
	}
	cl.mapGen = m.Gen
	return cl.keyed(addr, slot, cmd.Raw), true
}

// oneSlot returns the slot of keys, one or more, and whether they are all
// in it.
func oneSlot(keys [][]byte) (slot int, one bool) {
	slot = KeySlot(keys[0])
	for _, k := range keys[1:] {
		if KeySlot(k) != slot {
			return slot, false
		}
	}
	return slot, true
}

// keyed is the call of a command whose keys are all in slot, served by
// addr: it is the client's last keyed command (where a keyless one
// follows it), numbered for WAIT's mark.
func (cl *Client) keyed(addr string, slot int, raw []byte) Call {
	cl.last, cl.lastSlot, cl.LastShared = addr, slot, false
	if cl.lastSeq++; cl.lastSeq == 0 {
		cl.lastSeq = 1
	}
	return Call{Kind: CallPlain, Seq: cl.lastSeq, One: Part{Slot: slot, Addr: addr, Raw: raw}}
}

func (cl *Client) planState(h Host, m *SlotMap, name []byte, cmd redcon.Command) (Call, bool) {
	args := cmd.Args
	// Connection state.
	switch string(name) {
	case "monitor":
		if cl.Txn == nil { // queued otherwise, as Redis queues it
			return h.Monitor(m), true
		}
	case "sync", "psync", "replconf":
		return LocalCall(Unsupported(string(name))), true
	case "replicaof", "slaveof":
		if c, ok := replicaOfNoOne(args); ok {
			return c, true
		}
	case "reset":
		h.Settle()
		h.Reset()
		cl.Txn, cl.Watch, cl.OwnIdentity = nil, nil, false
		return LocalCall(replyReset), true
	case "quit":
		return LocalCall(resp.ReplyOK), true // the session closes after it (see forward)
	case "auth", "hello":
		return cl.everywhere(h, m, cmd, name), true
	case "client":
		if len(args) < 2 {
			break
		}
		var sb [24]byte
		switch sub := string(resp.Lower(&sb, args[1])); sub {
		case "setname", "no-evict", "no-touch":
			return cl.everywhere(h, m, cmd, name), true
		case "reply", "id", "kill", "tracking", "getredir", "trackinginfo", "unblock", "caching":
			if c, ok := h.ClientState(m, sub, cmd); ok {
				return c, true
			}
		}
	}

	if h.MonitorRefuses(name, args) {
		return LocalCall(resp.ReplyReplicaKeyspace), true
	}

	// Transactions.
	if t := cl.Txn; t != nil {
		return cl.inTxn(h, m, name, cmd), true
	}
	switch string(name) {
	case "multi":
		t := &TxnState{Pin: Pin{Addr: m.Master(m.First[0]), Slot: NoSlot}}
		if w := cl.Watch; w != nil {
			t.Pin = *w
		}
		cl.Txn = t
		if cl.Watch == nil && !cl.OwnIdentity {
			// Held until the first command (TxnState.Held). Redis
			// refuses a MULTI outside a transaction only for its ACL,
			// and the masters know the proxy's identity, not the
			// client's: it answers +OK. After a WATCH the MULTI goes
			// at once, to the connection the WATCH went on.
			t.Held, t.Multi = true, append([]byte(nil), cmd.Raw...)
			return LocalCall(resp.ReplyOK), true
		}
		return Call{Kind: CallPlain, One: Part{Slot: max(t.Slot, m.First[0]), Addr: t.Addr, Raw: cmd.Raw}}, true
	case "exec", "discard":
		cl.Watch = nil
		return Call{Kind: CallPlain, One: Part{Slot: m.First[0], Addr: m.Master(m.First[0]), Raw: cmd.Raw}}, true // Redis's own "without MULTI" error
	case "unwatch":
		w := cl.Watch
		cl.Watch = nil
		if w == nil {
			return LocalCall(resp.ReplyOK), true
		}
		return Call{Kind: CallPlain, One: Part{Slot: w.Slot, Addr: w.Addr, Raw: cmd.Raw}}, true
	}
	return Call{}, false
}

// everywhere sends a command that sets connection state (AUTH, HELLO,
// CLIENT SETNAME, NO-EVICT, NO-TOUCH) on every connection of the client, and on the default
// master's, whose reply is the client's; every connection dialed later
// replays it.
func (cl *Client) everywhere(h Host, m *SlotMap, cmd redcon.Command, name []byte) Call {
	def := m.Master(m.First[0])
	c := Call{Kind: CallMerge, Op: OpFirst}
	c.Parts = append(c.Parts, Part{Slot: m.First[0], Addr: def, Raw: cmd.Raw})
	for _, a := range h.OwnAddrs() {
		if a != def {
			c.Parts = append(c.Parts, Part{Slot: NoSlot, Addr: a, Raw: cmd.Raw})
		}
	}
	raw := cmd.Raw
	kind := string(name) // learn outlives the caller's buffer
	if kind == "client" {
		kind = strings.ToLower(string(cmd.Args[1]))
	}
	if kind == "hello" {
		c.Fold = StandaloneHello
	}
	var proto int64
	if kind == "hello" && len(cmd.Args) > 1 {
		proto, _ = strconv.ParseInt(string(cmd.Args[1]), 10, 64)
	}
	signIn := kind == "auth" || (kind == "hello" && helloAuth(cmd.Args))
	c.Learn = func(failed bool) {
		if !failed {
			h.Learned(kind, raw, proto)
			if signIn {
				cl.OwnIdentity = true
			}
		}
	}
	return c
}

// inTxn routes a command while MULTI is open: everything goes to the
// transaction's master; the first command with keys chooses it, and a
// command for another slot is refused (EXEC then aborts).
func (cl *Client) inTxn(h Host, m *SlotMap, name []byte, cmd redcon.Command) Call {
	t := cl.Txn
	plain := Call{Kind: CallPlain, One: Part{Slot: max(t.Slot, m.First[0]), Addr: t.Addr, Raw: cmd.Raw}}
	switch string(name) {
	case "exec", "discard":
		cl.Txn, cl.Watch = nil, nil
		if t.Failed.Load() && string(name) == "exec" {
			if t.Held {
				return LocalCall(resp.ReplyExecAbort) // nothing reached a master
			}
			c := Call{Kind: CallSkip, One: Part{Slot: plain.One.Slot, Addr: t.Addr, Raw: resp.CmdDiscard}}
			c.Reply = resp.ReplyExecAbort
			return c
		}
		return t.open(plain)
	}
	if string(name) == "client" {
		cl.Router.LearnPause(cmd.Args) // queued: in effect from EXEC on, or so (pause.go)
	}
	keys, err := cl.Router.Keys(h.Context(), cl.Keys[:0], name, cmd.Args)
	cl.Keys = keys
	if err != nil {
		t.Failed.Store(true)
		return LocalCall(h.Unavailable(err))
	}
	if len(keys) == 0 {
		if t.Slot == NoSlot {
			t.Early = append(t.Early, cmd.Raw)
		}
		return t.open(plain)
	}
	slot := KeySlot(keys[0])
	for _, k := range keys[1:] {
		if KeySlot(k) != slot {
			t.Failed.Store(true)
			return LocalCall(ReplyCrossSlot)
		}
	}
	switch {
	case t.Slot == NoSlot:
		t.Slot = slot
		addr := m.Master(slot)
		if t.Held {
			// Nothing is queued anywhere yet: the transaction opens on
			// the master of its keys.
			t.Addr, t.Early = addr, nil
			plain.One.Slot, plain.One.Addr = slot, addr
			return t.open(plain)
		}
		if addr != t.Addr {
			// Move what was queued to the master of the keys: DISCARD it
			// where it was (the replies the client had are the same from
			// any master), queue it again there.
			c := Call{Kind: CallMerge, Op: OpLast}
			c.Parts = append(c.Parts, Part{Slot: NoSlot, Addr: t.Addr, Raw: resp.CmdDiscard})
			c.Parts = append(c.Parts, Part{Slot: slot, Addr: addr, Raw: resp.CmdMulti})
			for _, raw := range t.Early {
				c.Parts = append(c.Parts, Part{Slot: slot, Addr: addr, Raw: raw})
			}
			c.Parts = append(c.Parts, Part{Slot: slot, Addr: addr, Raw: cmd.Raw})
			c.Learn = t.learn
			c.Opens = 1
			t.Addr = addr
			t.Early = nil
			return c
		}
		t.Early = nil
		plain.One.Slot = slot
		return plain
	case slot != t.Slot:
		t.Failed.Store(true)
		return LocalCall(ReplyCrossSlot)
	}
	return plain
}

// open returns c, a command of t for one master, with the MULTI in front
// of it while t is held: the transaction opens on c's connection, and the
// client gets c's reply (its MULTI had the proxy's +OK).
func (t *TxnState) open(c Call) Call {
	if !t.Held {
		return c
	}
	o := Call{Kind: CallMerge, Op: OpLast, Learn: t.learn}
	o.Parts = []Part{{Slot: c.One.Slot, Addr: c.One.Addr, Raw: t.Multi}, c.One}
	t.Held, t.Multi = false, nil
	return o
}

// learn fails t when a part before the last of a call that opens or moves
// it failed (its MULTI, or what it queued again).
func (t *TxnState) learn(failed bool) {
	if failed {
		t.Failed.Store(true)
	}
}

// helloAuth reports whether HELLO's arguments sign in (HELLO protover
// AUTH username password ...).
func helloAuth(args [][]byte) bool {
	for _, a := range args[1:] {
		if strings.EqualFold(string(a), "auth") {
			return true
		}
	}
	return false
}

// keyless routes a command without keys: to the first master as it is,
// unless serverWide or keylessSpecial routes it otherwise.
//
// Only the commands the command table flags NoSlot reach those two, whose
// frames (2.2 and 1.6 KB: each case holds calls) would otherwise be on
// every client's stack at its first PING: the deepest frame a goroutine
// reaches sets its stack's size for as long as the client stays idle, and
// they doubled it (8 KB against 4 KB for a client of one Redis). A case
// added to either function must be flagged NoSlot there
// (internal/resp/table.go).
//
// These commands are about the whole server or its keyspace, and are not
// routed by a slot: they go to masters (every master, SCAN's, RANDOMKEY's,
// WAIT's) where a command of the client's still in flight may yet be
// redirected to, and would run there before it (DBSIZE not counting a
// key an ASK sends to the master importing its slot, FLUSHALL leaving
// it). So the replies the client is owed are waited for first, as for a
// command routed by a newer slot map (plan); a client owed nothing pays
// nothing.
func (cl *Client) keyless(h Host, m *SlotMap, name []byte, cmd redcon.Command) Call {
	if resp.Lookup(name).Has(resp.NoSlot) {
		return cl.keylessSpecial(h, cl.settleOwed(h, m), name, cmd)
	}
	return Call{Kind: CallPlain, One: Part{Slot: m.First[0], Addr: m.Master(m.First[0]), Raw: cmd.Raw}}
}

// settleOwed waits for the replies the client is owed, when there are any
// (settleCluster), and returns the slot map to route by after them: a
// redirection among them may have read it again.
func (cl *Client) settleOwed(h Host, m *SlotMap) *SlotMap {
	if !h.Owed() {
		return m
	}
	h.Settle()
	if n := cl.Router.Slots.Load(); n != nil {
		m = n
		cl.mapGen = m.Gen
	}
	return m
}

// keylessSpecial routes the keyless commands keyless names.
func (cl *Client) keylessSpecial(h Host, m *SlotMap, name []byte, cmd redcon.Command) Call {
	args := cmd.Args
	def := Call{Kind: CallPlain, One: Part{Slot: m.First[0], Addr: m.Master(m.First[0]), Raw: cmd.Raw}}
	if c, ok := ServerWide(cl.Router, h.Clients(), m, name, cmd); ok {
		return c
	}
	var sb [24]byte
	switch string(name) {
	case "dbsize":
		return Fan(m, cmd.Raw, OpSum)
	case "keys":
		return Fan(m, cmd.Raw, OpConcat)
	case "flushall", "flushdb":
		return Fan(m, cmd.Raw, OpFirst)
	case "script":
		if len(args) > 1 {
			switch string(resp.Lower(&sb, args[1])) {
			case "load", "flush":
				return Fan(m, cmd.Raw, OpFirst)
			}
		}
	case "function":
		if len(args) > 1 {
			switch string(resp.Lower(&sb, args[1])) {
			case "load", "delete", "flush", "restore":
				return Fan(m, cmd.Raw, OpFirst)
			}
		}
	case "scan":
		return ScanCall(m, cmd, def)
	case "randomkey":
		c := Call{Kind: CallRandom}
		c.One.Raw = cmd.Raw
		return c
	case "wait", "waitaof":
		// The replicas to wait for are those of the master the client
		// last wrote to with a key: where a redirection sent it, if one
		// did (keyless waited for it).
		if cl.last != "" {
			def.One.Addr = cl.last
			cl.movedMu.Lock()
			if cl.movedSeq == cl.lastSeq {
				def.One.Addr = cl.movedTo
			}
			cl.movedMu.Unlock()
			def.One.Slot = NoSlot
			if cl.LastShared {
				// Redis waits for the replication offset of the
				// connection's last write, and the client's went on
				// a shared connection: a write of the proxy's own,
				// which changes nothing, first sets it on this one.
				c := Call{Kind: CallMerge, Op: OpLast}
				c.Parts = []Part{
					{Slot: cl.lastSlot, Addr: def.One.Addr, Raw: WaitMark(cl.lastSlot)},
					def.One,
				}
				return c
			}
		}
	}
	return def
}

// replicaOfNoOne answers REPLICAOF NO ONE (and SLAVEOF NO ONE) as a
// primary does, +OK: the proxy's address is a primary endpoint. Any
// other REPLICAOF goes to a master, whose cluster-mode refusal (or arity
// error) is the client's.
func replicaOfNoOne(args [][]byte) (Call, bool) {
	if len(args) == 3 && bytes.EqualFold(args[1], []byte("no")) && bytes.EqualFold(args[2], []byte("one")) {
		return LocalCall(resp.ReplyOK), true
	}
	return Call{}, false
}
