package proxy

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tidwall/redcon"

	"github.com/lockproxy/lockproxy/proxy/internal/resp"
)

// Cluster routing. The cluster*.go files own where the commands of a
// client of a Redis Cluster (BackendConfig.Cluster) go, and none of how
// they travel: cluster.go keeps the slot map and the COMMAND table (the
// router); this file plans each command (route, plan): to the master of
// its keys' slot, split per slot, fanned out to every master, SCAN's
// cursor over the masters, a transaction tied to one master;
// clusterfan.go, clusteracllog.go, clusterslowlog.go and
// clustershardinfo.go plan the commands about the whole server;
// clusterjoin.go, clusterlcs.go, clusterhll.go and clustersort.go the
// reads the proxy computes from keys in several slots; clustertx.go ties
// a transaction or WATCH to its connection; clusterpubsub.go and
// clustermonitor.go serve the clients pinned to nodes. A plan is a call
// of parts, each to one master, with what makes the client's reply from
// theirs; clustershared.go and clustercall.go hand the parts to the
// batching of shared.go and order.go, on the masters' shared connections
// or the client's own. A reply that redirects (MOVED, ASK) or says the
// slot is not served yet (TRYAGAIN, CLUSTERDOWN) is never the client's:
// the command is sent again where the cluster says, within
// BackendConfig.ClusterRetry.

var (
	replyCrossSlot   = []byte("-CROSSSLOT Keys in request don't hash to the same slot\r\n")
	replyMovedInTxn  = []byte("-TRYAGAIN the slot moved while the transaction was queued\r\n")
	replyReset       = []byte("+RESET\r\n")
	cmdAsking        = []byte("*1\r\n$6\r\nASKING\r\n")
	cmdMulti         = []byte("*1\r\n$5\r\nMULTI\r\n")
	errRetriesSpent  = errors.New("the cluster did not serve the slot in time")
	errClusterClosed = errors.New("connection closed")
)

// callKind says how the replies to one client command are made.
type callKind uint8

const (
	callPlain  callKind = iota // one part; its reply is the client's, as it is
	callLocal                  // the proxy's own reply
	callSkip                   // one part; its reply is read and dropped
	callMerge                  // several parts; their replies are merged (op)
	callScan                   // one part on one master; the cursor is rewritten
	callRandom                 // RANDOMKEY: masters in turn until one has a key
)

// mergeOp is how the replies of a call's parts become the client's.
type mergeOp = resp.Merge

const (
	opFirst  = resp.MergeFirst  // the first error, else the first part's reply
	opArray  = resp.MergeArray  // MGET: the elements, put back in the client's order
	opSum    = resp.MergeSum    // DEL, EXISTS, ...: the sum of the integers
	opConcat = resp.MergeConcat // KEYS: all the elements
	opLast   = resp.MergeLast   // the last part's reply; an error before it fails the transaction
)

// part is one request of a call to one node.
type part struct {
	slot int    // for routing again after a failover; every master's first slot for a keyless part
	addr string // the master it was sent to
	raw  []byte
	pos  []int   // opArray: the client's positions of this part's keys
	err  error   // why it could not be sent
	tx   *txPart // set when it belongs to a transaction or WATCH (clustertx.go)
}

// call is one client command, as routed: its parts and how its reply is
// made from theirs.
type call struct {
	kind callKind
	op   mergeOp
	// seq is the clusterSession.lastSeq of a command with keys in one
	// slot, whose master WAIT waits for; else 0.
	seq   uint32
	n     int // opArray: the number of keys
	one   part
	parts []part // several parts; one is unused then
	reply []byte // callLocal
	// learn, when set, sees whether the reply was an error. It runs
	// where the reply is made, on a connection's reader (clustercall.go):
	// what it sets is the forwarder's only when the forwarder waits for
	// the call's reply before it reads it (AUTH, HELLO, CLIENT SETNAME).
	learn func(failed bool)
	scan  int // callScan: the master index in the cursor
	// fold, when set, makes the reply of a callMerge from its parts'
	// replies, errors included, and reports whether it is an error (see
	// clusterfan.go, clusterjoin.go).
	fold func(replies [][]byte) ([]byte, bool)
	// alone: making the reply sends more commands (SORT with patterns):
	// the forwarder makes it before it goes on (finishCalls).
	alone bool
}

func (c *call) count() int {
	if c.parts != nil {
		return len(c.parts)
	}
	return 1
}

func (c *call) part(i int) *part {
	if c.parts != nil {
		return &c.parts[i]
	}
	return &c.one
}

// clusterSession is one client's part of the cluster: its connections and
// the connection state it set. Only the forwarder uses it, except close,
// own (also under mu) and replay.
type clusterSession struct {
	r *router

	mu     sync.Mutex         // guards own, monitors and closed against close
	own    map[string]*shared // the client's own connection to each master (clustercall.go)
	closed bool
	// monitors are the MONITOR connections, one per master, while the
	// client monitors (clustermonitor.go).
	monitors []*backend
	monWG    sync.WaitGroup // their readers
	// monitorOn: the client is in MONITOR mode; the forwarder's own.
	monitorOn bool

	// redirs are the redirections waiting to be followed, in the order
	// they came (session.redirect); the first is being followed.
	redirMu sync.Mutex
	redirs  []redirect

	// blocking: a command that may block was sent; what follows waits
	// for its reply (session.handle).
	blocking bool

	// The place of every reply the client is owed, the shared
	// connections used so far, and the index of the client's connection
	// at every master.
	order       replyOrder
	sharedConns []*shared // one per master, found by its addr
	sharedIdx   uint64
	access      uint64 // the access generation of its shared connections
	// sharedUsed, ownUsed: replies may be owed on the shared connections,
	// on the client's own (see session.settleCluster).
	sharedUsed, ownUsed bool
	// mapGen is the slot map reading the client's last command was
	// routed by (see plan).
	mapGen uint64

	// The state the client set, sent to every new connection: the
	// forwarder's, and state, the copy its connections are dialled with
	// (stateChanged).
	st    clientState
	state atomic.Pointer[replayState]

	// pinAddr is the node of the client's pub/sub connection (session.be;
	// clusterpubsub.go).
	pinAddr string

	txn   *txnState
	watch *pin // the node and slot of the keys WATCHed, nil when none
	// last is the master the client's last command with keys in one slot
	// was routed to, whose replicas WAIT waits for; lastSeq numbers those
	// commands (call.seq). movedSeq and movedTo, under redirMu, are the
	// number of the last of them a redirection sent elsewhere, and where.
	last     string
	lastSeq  uint32
	movedSeq uint32
	movedTo  string
	// lastSlot is the slot of that last command; lastShared whether it
	// went on a master's shared connection, where WAIT, which goes on a
	// connection of the client's own, does not see it (waitMark).
	lastSlot   int
	lastShared bool

	keys [][]byte
}

// pin is a master and slot a transaction or WATCH is tied to.
type pin struct {
	addr string
	slot int // noSlot until a command with keys chose it
	// conn is the connection a WATCH (or the transaction's MULTI) went
	// on; lost, that a WATCH went on another one before, or that the
	// transaction's connection was lost (clustertx.go).
	conn *backend
	lost bool
}

// txnState is an open MULTI: where it is queued, the keyless commands
// queued before the first key chose the master (sent again there), and
// whether a command was refused (EXEC then aborts).
type txnState struct {
	pin
	early [][]byte
	// failed is set by the forwarder, or by the reader that makes the
	// reply of the call moving the transaction (inTxn's learn).
	failed atomic.Bool
	// watched is the client's WATCH when MULTI came; watchLost, that the
	// MULTI went on another connection than it (clustertx.go).
	watched   *pin
	watchLost bool
}

func newClusterSession(r *router) *clusterSession {
	// The map is made on first use: most clients use only the shared
	// connections, and an idle one nothing.
	cs := &clusterSession{r: r}
	cs.order.cond.L = &cs.order.mu
	cs.sharedIdx = r.p.nextShared.Add(1)
	cs.access = r.joined()
	return cs
}

// replay returns the connection state the client's own connections are
// dialled in. It is safe for concurrent use.
func (cs *clusterSession) replay() replayState {
	if st := cs.state.Load(); st != nil {
		return *st
	}
	return replayState{}
}

// stateChanged makes the state the client set the one its connections
// are dialled in from now on.
func (cs *clusterSession) stateChanged() {
	st := cs.st.replay
	cs.state.Store(&st)
}

// close closes every connection; it runs when the client has gone.
func (cs *clusterSession) close() {
	cs.r.left(cs.access)
	cs.mu.Lock()
	cs.closed = true
	cs.stopMonitor()
	own := cs.own
	cs.own = nil
	cs.mu.Unlock()
	for _, sh := range own {
		sh.retire()
	}
	cs.order.close()
}

// dropAll closes the client's own connections (after RESET, whose state
// is gone); the replies owed on them have been written.
func (cs *clusterSession) dropAll() {
	cs.endMonitor()
	cs.mu.Lock()
	own := cs.own
	cs.own = nil
	cs.mu.Unlock()
	for _, sh := range own {
		sh.retire()
	}
}

// route sends cmd where the slot map says, or gives it the proxy's own
// reply in its place when the cluster cannot take it.
func (s *session) route(name []byte, cmd redcon.Command) {
	cs := s.cl
	if cs.blocking {
		// Held back behind a command that may block (see handle).
		s.settleCluster()
	}
	if resp.Lookup(name).Has(resp.Blocking) {
		cs.blocking = true
	}
	state := setsState(name, cmd.Args)
	if state {
		// It goes on every connection the client has, and every one
		// opened after it replays it: what came before it must have
		// opened its connections, and what follows must open them
		// knowing whether it succeeded.
		s.settleCluster()
	}
	txn, watch := cs.txn, cs.watch
	c := s.plan(name, cmd)
	s.tagTx(&c, name, txn, watch)
	if s.sharesCluster(name, cmd.Args, &c) && s.routeShared(name, cmd, &c) {
		return
	}
	s.sendCall(&c)
	if state {
		s.settleCluster()
	}
}

// forward is the cluster's upstream.forward: a command goes to the
// client's pub/sub connection when it is pinned (clusterpubsub.go), and
// is routed by its keys otherwise.
func (cs *clusterSession) forward(s *session, name []byte, cmd redcon.Command) (localItem, bool, bool) {
	if string(name) == "quit" {
		return localItem{reply: replyOK, quit: true}, false, false
	}
	if s.be != nil || resp.Lookup(name).Has(resp.Subscribes) {
		// The pub/sub connection's replies must not pass the others.
		s.settleCluster()
	}
	reply, pinned := s.clusterPubsub(name, cmd)
	switch {
	case reply != nil:
		return localItem{reply: reply}, false, false
	case !pinned:
		s.route(name, cmd)
		return localItem{}, true, false
	}
	// To the client's pub/sub connection, as to one Redis, after the
	// replies of the commands routed before it.
	s.settleCluster()
	return localItem{}, false, true
}

// dial is the cluster's upstream.dial: the client's pub/sub connection,
// to the node it is pinned to.
func (cs *clusterSession) dial(s *session, st replayState) (*backend, error) {
	be, err := s.p.dialAddr(s.ctx, cs.pinAddr, st)
	if err != nil {
		// The node may have failed: the next subscription asks the
		// cluster again.
		cs.r.reload(s.ctx, cs.r.gen.Load())
	}
	return be, err
}

// setsState reports whether a command sets connection state that every
// connection of a cluster client carries (see everywhere).
func setsState(name []byte, args [][]byte) bool {
	return resp.Of(name, args).Has(resp.EveryConn)
}

// unsupported is the reply to a command the proxy does not carry to a
// cluster. name is a string: a byte slice given to Sprintf would make
// every caller's buffer escape to the heap.
func unsupported(name string) []byte {
	return []byte(fmt.Sprintf("-ERR '%s' is not supported by lockproxy in front of a Redis Cluster\r\n", name))
}

func localCall(reply []byte) call { return call{kind: callLocal, reply: reply} }

// plan decides where cmd goes.
func (s *session) plan(name []byte, cmd redcon.Command) call {
	cs := s.cl
	args := cmd.Args
	m, err := cs.r.current(s.ctx)
	if err != nil {
		s.p.m.unavailable.Add(1)
		return localCall(errorReply(&BackendError{Err: err}))
	}
	if m.gen != cs.mapGen {
		// The map changed since the client's commands in flight were
		// routed: one may be redirected from its old master to where
		// this one goes, and must reach it first, as one Redis runs a
		// client's commands in order. They are answered before this
		// one leaves (a redirection among them may read the map again).
		if cs.mapGen != 0 {
			s.settleCluster()
			m = cs.r.slots.Load()
		}
		cs.mapGen = m.gen
	}
	if c, ok := s.planState(m, name, cmd); ok {
		return c
	}

	// By the keys.
	cs.keys, err = cs.r.keys(s.ctx, cs.keys[:0], name, args)
	if err != nil {
		s.p.m.unavailable.Add(1)
		return localCall(errorReply(&BackendError{Err: err}))
	}
	if len(cs.keys) == 0 {
		return s.keyless(m, name, cmd)
	}
	slot := keySlot(cs.keys[0])
	cross := false
	for _, k := range cs.keys[1:] {
		if keySlot(k) != slot {
			cross = true
			break
		}
	}
	if string(name) == "watch" {
		if cross || (cs.watch != nil && cs.watch.slot != slot) {
			return localCall(replyCrossSlot)
		}
		if cs.watch == nil {
			cs.watch = &pin{slot: slot}
		}
		cs.watch.addr = m.master(slot)
		return call{kind: callPlain, one: part{slot: slot, addr: cs.watch.addr, raw: cmd.Raw}}
	}
	if resp.Lookup(name).Has(resp.Patterns) {
		if c, ok := s.sortCall(m, name, args); ok {
			return c
		}
	}
	if !cross {
		cs.last, cs.lastSlot, cs.lastShared = m.master(slot), slot, false
		if cs.lastSeq++; cs.lastSeq == 0 {
			cs.lastSeq = 1
		}
		return call{kind: callPlain, seq: cs.lastSeq, one: part{slot: slot, addr: cs.last, raw: cmd.Raw}}
	}
	if c, ok := s.crossRead(m, name, args); ok {
		return c
	}
	inf := resp.Lookup(name)
	if !inf.Has(resp.Splits) {
		return localCall(replyCrossSlot)
	}
	return s.split(m, name, inf.Merge, args)
}

// planState plans the commands that set or depend on the client's
// connection state (MONITOR, RESET, AUTH, HELLO, CLIENT SETNAME, MULTI and
// what it queues, ...); it reports false for the others. It is a function
// of its own so that its frame is off the stack while plan reads a
// command's keys: the deepest frame a client's first command reaches sets
// the size of its goroutine's stack for as long as it stays idle.
func (s *session) planState(m *slotMap, name []byte, cmd redcon.Command) (call, bool) {
	cs := s.cl
	args := cmd.Args
	// Connection state.
	switch string(name) {
	case "monitor":
		if cs.txn == nil { // queued otherwise, as Redis queues it
			return s.monitorCall(m), true
		}
	case "sync", "psync", "replconf":
		return localCall(unsupported(string(name))), true
	case "reset":
		s.settleCluster()
		cs.dropAll()
		cs.st = clientState{}
		cs.stateChanged()
		cs.txn, cs.watch = nil, nil
		return localCall(replyReset), true
	case "quit":
		return localCall(replyOK), true // the session closes after it (see forward)
	case "auth", "hello":
		return s.everywhere(m, cmd, name), true
	case "client":
		if len(args) < 2 {
			break
		}
		var sb [24]byte
		switch string(resp.Lower(&sb, args[1])) {
		case "setname":
			return s.everywhere(m, cmd, name), true
		case "reply", "tracking", "caching", "no-evict", "no-touch":
			return localCall([]byte(fmt.Sprintf("-ERR 'client %s' is not supported by lockproxy in front of a Redis Cluster\r\n", resp.Lower(&sb, args[1])))), true
		}
	}

	if s.monitorRefuses(name, args) {
		return localCall(replyReplicaKeyspace), true
	}

	// Transactions.
	if t := cs.txn; t != nil {
		return s.inTxn(m, name, cmd), true
	}
	switch string(name) {
	case "multi":
		t := &txnState{pin: pin{addr: m.master(m.first[0]), slot: noSlot}}
		if w := cs.watch; w != nil {
			t.pin = *w
		}
		cs.txn = t
		return call{kind: callPlain, one: part{slot: max(t.slot, m.first[0]), addr: t.addr, raw: cmd.Raw}}, true
	case "exec", "discard":
		cs.watch = nil
		return call{kind: callPlain, one: part{slot: m.first[0], addr: m.master(m.first[0]), raw: cmd.Raw}}, true // Redis's own "without MULTI" error
	case "unwatch":
		w := cs.watch
		cs.watch = nil
		if w == nil {
			return localCall(replyOK), true
		}
		return call{kind: callPlain, one: part{slot: w.slot, addr: w.addr, raw: cmd.Raw}}, true
	}
	return call{}, false
}

// everywhere sends a command that sets connection state (AUTH, HELLO,
// CLIENT SETNAME) on every connection of the client, and on the default
// master's, whose reply is the client's; every connection dialed later
// replays it.
func (s *session) everywhere(m *slotMap, cmd redcon.Command, name []byte) call {
	cs := s.cl
	def := m.master(m.first[0])
	c := call{kind: callMerge, op: opFirst}
	c.parts = append(c.parts, part{slot: m.first[0], addr: def, raw: cmd.Raw})
	for _, a := range cs.ownAddrs() {
		if a != def {
			c.parts = append(c.parts, part{slot: noSlot, addr: a, raw: cmd.Raw})
		}
	}
	raw := cmd.Raw
	kind := string(name) // learn outlives the caller's buffer
	if kind == "hello" {
		c.fold = standaloneHello
	}
	var proto int64
	if kind == "hello" && len(cmd.Args) > 1 {
		proto, _ = strconv.ParseInt(string(cmd.Args[1]), 10, 64)
	}
	k := entryAuth
	switch kind {
	case "hello":
		k = entryHello
	case "client":
		k = entrySetName
	}
	c.learn = func(failed bool) {
		if !failed {
			cs.st.learn(k, raw, proto)
			cs.stateChanged()
		}
	}
	return c
}

// inTxn routes a command while MULTI is open: everything goes to the
// transaction's master; the first command with keys chooses it, and a
// command for another slot is refused (EXEC then aborts).
func (s *session) inTxn(m *slotMap, name []byte, cmd redcon.Command) call {
	cs := s.cl
	t := cs.txn
	plain := call{kind: callPlain, one: part{slot: max(t.slot, m.first[0]), addr: t.addr, raw: cmd.Raw}}
	switch string(name) {
	case "exec", "discard":
		cs.txn, cs.watch = nil, nil
		if t.failed.Load() && string(name) == "exec" {
			c := call{kind: callSkip, one: part{slot: plain.one.slot, addr: t.addr, raw: cmdDiscard}}
			c.reply = replyExecAbort
			return c
		}
		return plain
	}
	keys, err := cs.r.keys(s.ctx, cs.keys[:0], name, cmd.Args)
	cs.keys = keys
	if err != nil {
		t.failed.Store(true)
		s.p.m.unavailable.Add(1)
		return localCall(errorReply(&BackendError{Err: err}))
	}
	if len(keys) == 0 {
		if t.slot == noSlot {
			t.early = append(t.early, cmd.Raw)
		}
		return plain
	}
	slot := keySlot(keys[0])
	for _, k := range keys[1:] {
		if keySlot(k) != slot {
			t.failed.Store(true)
			return localCall(replyCrossSlot)
		}
	}
	switch {
	case t.slot == noSlot:
		t.slot = slot
		addr := m.master(slot)
		if addr != t.addr {
			// Move what was queued to the master of the keys: DISCARD it
			// where it was (the replies the client had are the same from
			// any master), queue it again there.
			c := call{kind: callMerge, op: opLast}
			c.parts = append(c.parts, part{slot: noSlot, addr: t.addr, raw: cmdDiscard})
			c.parts = append(c.parts, part{slot: slot, addr: addr, raw: cmdMulti})
			for _, raw := range t.early {
				c.parts = append(c.parts, part{slot: slot, addr: addr, raw: raw})
			}
			c.parts = append(c.parts, part{slot: slot, addr: addr, raw: cmd.Raw})
			c.learn = func(failed bool) {
				if failed {
					t.failed.Store(true)
				}
			}
			t.addr = addr
			t.early = nil
			return c
		}
		t.early = nil
		plain.one.slot = slot
		return plain
	case slot != t.slot:
		t.failed.Store(true)
		return localCall(replyCrossSlot)
	}
	return plain
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
func (s *session) keyless(m *slotMap, name []byte, cmd redcon.Command) call {
	if resp.Lookup(name).Has(resp.NoSlot) {
		return s.keylessSpecial(s.settleOwed(m), name, cmd)
	}
	return call{kind: callPlain, one: part{slot: m.first[0], addr: m.master(m.first[0]), raw: cmd.Raw}}
}

// settleOwed waits for the replies the client is owed, when there are any
// (settleCluster), and returns the slot map to route by after them: a
// redirection among them may have read it again.
func (s *session) settleOwed(m *slotMap) *slotMap {
	cs := s.cl
	if (!cs.sharedUsed && !cs.ownUsed) || cs.order.drained() {
		return m
	}
	s.settleCluster()
	if n := cs.r.slots.Load(); n != nil {
		m = n
		cs.mapGen = m.gen
	}
	return m
}

// keylessSpecial routes the keyless commands keyless names.
func (s *session) keylessSpecial(m *slotMap, name []byte, cmd redcon.Command) call {
	args := cmd.Args
	def := call{kind: callPlain, one: part{slot: m.first[0], addr: m.master(m.first[0]), raw: cmd.Raw}}
	if c, ok := s.serverWide(m, name, cmd); ok {
		return c
	}
	var sb [24]byte
	switch string(name) {
	case "dbsize":
		return fan(m, cmd.Raw, opSum)
	case "keys":
		return fan(m, cmd.Raw, opConcat)
	case "flushall", "flushdb":
		return fan(m, cmd.Raw, opFirst)
	case "script":
		if len(args) > 1 {
			switch string(resp.Lower(&sb, args[1])) {
			case "load", "flush":
				return fan(m, cmd.Raw, opFirst)
			}
		}
	case "function":
		if len(args) > 1 {
			switch string(resp.Lower(&sb, args[1])) {
			case "load", "delete", "flush", "restore":
				return fan(m, cmd.Raw, opFirst)
			}
		}
	case "scan":
		return scanCall(m, cmd, def)
	case "randomkey":
		c := call{kind: callRandom}
		c.one.raw = cmd.Raw
		return c
	case "wait", "waitaof":
		// The replicas to wait for are those of the master the client
		// last wrote to with a key: where a redirection sent it, if one
		// did (keyless waited for it).
		cs := s.cl
		if cs.last != "" {
			def.one.addr = cs.last
			cs.redirMu.Lock()
			if cs.movedSeq == cs.lastSeq {
				def.one.addr = cs.movedTo
			}
			cs.redirMu.Unlock()
			def.one.slot = noSlot
			if cs.lastShared {
				// Redis waits for the replication offset of the
				// connection's last write, and the client's went on
				// a shared connection: a write of the proxy's own,
				// which changes nothing, first sets it on this one.
				c := call{kind: callMerge, op: opLast}
				c.parts = []part{
					{slot: cs.lastSlot, addr: def.one.addr, raw: waitMark(cs.lastSlot)},
					def.one,
				}
				return c
			}
		}
	}
	return def
}

// waitMarkScript writes KEYS[1] and deletes it at once, unless it exists:
// the connection it runs on then has the primary's replication offset as
// that of its last write (what WAIT and WAITAOF wait for), and no key
// changes. No command sees the key, as a script runs alone; but the write
// shows where writes show: BCAST tracking invalidations, keyspace
// notifications, MONITOR (see README).
const waitMarkScript = "if redis.call('set',KEYS[1],'1','nx') then redis.call('del',KEYS[1]) end return 0"

// waitMarkKey is the key waitMarkScript writes, in front of one Redis.
const waitMarkKey = "lockproxy:wait-mark"

// waitMarks caches waitMark's commands by slot.
var waitMarks sync.Map // int -> []byte

// waitMark returns the command that runs waitMarkScript on a key of
// waitMarkKey's with a hash tag in slot: the first that hashes there,
// found once per slot (about numSlots checksums).
func waitMark(slot int) []byte {
	if raw, ok := waitMarks.Load(slot); ok {
		return raw.([]byte)
	}
	var key []byte
	for n := 0; ; n++ {
		key = fmt.Appendf(key[:0], "%s{%d}", waitMarkKey, n)
		if keySlot(key) == slot {
			break
		}
	}
	raw := waitMarkCommand(string(key))
	waitMarks.Store(slot, raw)
	return raw
}

// waitMarkCommand is the RESP command that runs waitMarkScript on key.
func waitMarkCommand(key string) []byte {
	return fmt.Appendf(nil, "*4\r\n$4\r\nEVAL\r\n$%d\r\n%s\r\n$1\r\n1\r\n$%d\r\n%s\r\n",
		len(waitMarkScript), waitMarkScript, len(key), key)
}

// fan sends raw to every master.
func fan(m *slotMap, raw []byte, op mergeOp) call {
	c := call{kind: callMerge, op: op, parts: make([]part, len(m.masters))}
	for i, a := range m.masters {
		c.parts[i] = part{slot: m.first[i], addr: a, raw: raw}
	}
	return c
}

// scanBits is how many low bits of a SCAN cursor through the proxy say
// which master it is on; the rest is that master's own cursor.
const scanBits = 10

// scanCall routes SCAN: the client's cursor holds the index of a master
// (in the order of their first slots) and that master's cursor. 0 starts
// on the first master; when a master's cursor comes back 0, the next
// cursor starts on the next master, and after the last the cursor is 0.
func scanCall(m *slotMap, cmd redcon.Command, def call) call {
	if len(cmd.Args) < 2 {
		return def // Redis's arity error
	}
	cur, err := strconv.ParseUint(string(cmd.Args[1]), 10, 64)
	if err != nil {
		return def // Redis's "invalid cursor"
	}
	idx := int(cur & (1<<scanBits - 1))
	if idx >= len(m.masters) {
		return localCall([]byte("*2\r\n$1\r\n0\r\n*0\r\n")) // a master that is gone: nothing left
	}
	raw := redcon.AppendArray(nil, len(cmd.Args))
	raw = redcon.AppendBulk(raw, cmd.Args[0])
	raw = redcon.AppendBulkString(raw, strconv.FormatUint(cur>>scanBits, 10))
	for _, a := range cmd.Args[2:] {
		raw = redcon.AppendBulk(raw, a)
	}
	return call{kind: callScan, scan: idx, n: len(m.masters), one: part{slot: m.first[idx], addr: m.masters[idx], raw: raw}}
}

// split sends a command whose keys are in several slots as one command
// per slot, each with its keys (and MSET's values) in the client's order.
func (s *session) split(m *slotMap, name []byte, op mergeOp, args [][]byte) call {
	width := 1
	if string(name) == "mset" {
		width = 2
		if (len(args)-1)%2 != 0 {
			return localCall([]byte("-ERR wrong number of arguments for 'mset' command\r\n"))
		}
	}
	type group struct {
		slot int
		args [][]byte
		pos  []int
	}
	var groups []group
	index := map[int]int{}
	for i, j := 1, 0; i+width-1 < len(args); i, j = i+width, j+1 {
		sl := keySlot(args[i])
		g, ok := index[sl]
		if !ok {
			g = len(groups)
			index[sl] = g
			groups = append(groups, group{slot: sl, args: [][]byte{args[0]}})
		}
		groups[g].args = append(groups[g].args, args[i:i+width]...)
		groups[g].pos = append(groups[g].pos, j)
	}
	c := call{kind: callMerge, op: op, n: (len(args) - 1) / width, parts: make([]part, len(groups))}
	for i, g := range groups {
		raw := redcon.AppendArray(nil, len(g.args))
		for _, a := range g.args {
			raw = redcon.AppendBulk(raw, a)
		}
		c.parts[i] = part{slot: g.slot, addr: m.master(g.slot), raw: raw, pos: g.pos}
	}
	return c
}

// refused reports whether a dial failed because the node refused the
// client's state (its AUTH, say): the error is the client's at once, as
// waiting for the cluster cannot change the node's answer.
func refused(err error) bool {
	var r *refusedError
	return errors.As(err, &r)
}

// again waits a little, reads the slot map again and routes p by its slot
// once more; it reports false when it is too late to try again.
func (s *session) again(p *part, deadline time.Time) bool {
	if p.slot == noSlot || s.ctx.Err() != nil || time.Now().After(deadline) {
		return false
	}
	t := time.NewTimer(50 * time.Millisecond)
	select {
	case <-t.C:
	case <-s.ctx.Done():
		t.Stop()
		return false
	}
	r := s.cl.r
	r.reload(s.ctx, r.gen.Load())
	if m := r.slots.Load(); m != nil {
		if a := m.master(p.slot); a != "" {
			p.addr = a
		}
	}
	return true
}

// redirection is what an error reply asks of the proxy.
type redirection uint8

const (
	redirNone  redirection = iota
	redirMoved             // -MOVED slot addr: the slot has a new master
	redirAsk               // -ASK slot addr: this key is there already
	redirWait              // -TRYAGAIN, -CLUSTERDOWN: not served right now
)

// redirected parses an error line ("-MOVED 3999 127.0.0.1:6381\r\n").
func redirected(line []byte) (redirection, string) {
	var kind redirection
	switch {
	case bytes.HasPrefix(line, []byte("-MOVED ")):
		kind = redirMoved
	case bytes.HasPrefix(line, []byte("-ASK ")):
		kind = redirAsk
	case bytes.HasPrefix(line, []byte("-TRYAGAIN")), bytes.HasPrefix(line, []byte("-CLUSTERDOWN")):
		return redirWait, ""
	default:
		return redirNone, ""
	}
	f := bytes.Fields(line)
	if len(f) != 3 {
		return redirNone, ""
	}
	return kind, string(f[2])
}

// merge makes the client's reply from the replies of c's parts, and
// reports whether one of them failed.
func merge(c *call, replies [][]byte) ([]byte, bool) {
	if c.fold != nil {
		return c.fold(replies)
	}
	var firstErr []byte
	for i, r := range replies {
		if len(r) > 0 && (r[0] == '-' || r[0] == '!') && firstErr == nil && (c.op != opLast || i < len(replies)-1) {
			firstErr = r
		}
	}
	switch c.op {
	case opLast:
		return replies[len(replies)-1], firstErr != nil
	case opFirst:
		if firstErr != nil {
			return firstErr, true
		}
		return replies[0], false
	}
	if firstErr != nil {
		return firstErr, true
	}
	switch c.op {
	case opSum:
		var sum int64
		for _, r := range replies {
			n, ok := resp.ParseLength(r[1:])
			if r[0] != ':' || !ok {
				return errorReply(fmt.Errorf("unexpected reply %q", r)), true
			}
			sum += n
		}
		return redcon.AppendInt(nil, sum), false
	case opConcat:
		var n int64
		var body []byte
		for _, r := range replies {
			count, elems, err := elements(r)
			if err != nil {
				return errorReply(err), true
			}
			n += int64(count)
			body = append(body, elems...)
		}
		return append(redcon.AppendArray(nil, int(n)), body...), false
	}
	// opArray
	out := make([][]byte, c.n)
	for i, r := range replies {
		_, elems, err := elements(r)
		if err != nil {
			return errorReply(err), true
		}
		for _, pos := range c.part(i).pos {
			k, err := valueLen(elems)
			if err != nil {
				return errorReply(err), true
			}
			out[pos] = elems[:k]
			elems = elems[k:]
		}
	}
	b := redcon.AppendArray(nil, c.n)
	for _, e := range out {
		b = append(b, e...)
	}
	return b, false
}

// elements returns the element count of an array reply and its elements'
// bytes.
func elements(r []byte) (int, []byte, error) {
	if len(r) == 0 || (r[0] != '*' && r[0] != '~') {
		return 0, nil, fmt.Errorf("unexpected reply %q", r)
	}
	i := bytes.IndexByte(r, '\n')
	n, ok := resp.ParseLength(r[1 : i+1])
	if i < 0 || !ok {
		return 0, nil, fmt.Errorf("unexpected reply %q", r)
	}
	return int(max(n, 0)), r[i+1:], nil
}

// valueLen returns the length of the RESP value at the start of b.
func valueLen(b []byte) (int, error) {
	i := bytes.IndexByte(b, '\n')
	if i < 1 {
		return 0, errors.New("truncated reply")
	}
	switch b[0] {
	case '+', '-', ':', '_', ',', '#', '(':
		return i + 1, nil
	case '$', '!', '=':
		n, ok := resp.ParseLength(b[1 : i+1])
		if !ok {
			return 0, errors.New("bad length")
		}
		if n < 0 {
			return i + 1, nil
		}
		return i + 1 + int(n) + 2, nil
	case '*', '~', '>', '%', '|':
		n, ok := resp.ParseLength(b[1 : i+1])
		if !ok {
			return 0, errors.New("bad length")
		}
		if b[0] == '%' || b[0] == '|' {
			n *= 2
		}
		if b[0] == '|' {
			n++
		}
		off := i + 1
		for range max(n, 0) {
			k, err := valueLen(b[off:])
			if err != nil {
				return 0, err
			}
			off += k
		}
		return off, nil
	}
	return 0, fmt.Errorf("unexpected type %q", b[0])
}

// rewriteScan turns a master's SCAN reply into the client's: its cursor
// becomes the proxy's (see scanCall).
func rewriteScan(b []byte, idx, n int) []byte {
	if !bytes.HasPrefix(b, []byte("*2\r\n$")) {
		return b // an error
	}
	k, err := valueLen(b[4:])
	if err != nil {
		return b
	}
	_, cur, _ := bytes.Cut(b[4:4+k-2], []byte("\r\n"))
	c, err := strconv.ParseUint(string(cur), 10, 64)
	if err != nil {
		return b
	}
	var next uint64
	switch {
	case c != 0:
		next = c<<scanBits | uint64(idx)
	case idx+1 < n:
		next = uint64(idx + 1)
	}
	out := redcon.AppendArray(nil, 2)
	out = redcon.AppendBulkString(out, strconv.FormatUint(next, 10))
	return append(out, b[4+k:]...)
}
