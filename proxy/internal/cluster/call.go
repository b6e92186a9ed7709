package cluster

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"

	"github.com/tidwall/redcon"

	"github.com/lockproxy/lockproxy/proxy/internal/resp"
)

// callKind says how the replies to one client command are made.
type callKind uint8

const (
	CallPlain  callKind = iota // one part; its reply is the client's, as it is
	CallLocal                  // the proxy's own reply
	CallSkip                   // one part; its reply is read and dropped
	CallMerge                  // several parts; their replies are merged (op)
	CallScan                   // SCAN: one master, then the next ones while COUNT is not filled (proxy/clusterscan.go)
	CallRandom                 // RANDOMKEY: masters in turn until one has a key
)

// MergeOp is how the replies of a call's parts become the client's.
type MergeOp = resp.Merge

const (
	OpFirst  = resp.MergeFirst  // the first error, else the first part's reply
	OpArray  = resp.MergeArray  // MGET: the elements, put back in the client's order
	OpSum    = resp.MergeSum    // DEL, EXISTS, ...: the sum of the integers
	OpConcat = resp.MergeConcat // KEYS: all the elements
	OpLast   = resp.MergeLast   // the last part's reply; an error before it fails the transaction
)

// part is one request of a call to one node.
type Part struct {
	Slot int    // for routing again after a failover; every master's first slot for a keyless part
	Addr string // the master it was sent to
	Raw  []byte
	pos  []int   // OpArray: the client's positions of this part's keys
	Err  error   // why it could not be sent
	Tx   *TxPart // set when it belongs to a transaction or WATCH (the proxy's clustertx.go)
}

// call is one client command, as routed: its parts and how its reply is
// made from theirs.
type Call struct {
	Kind callKind
	Op   MergeOp
	// seq is the clusterSession.lastSeq of a command with keys in one
	// slot, whose master WAIT waits for; else 0.
	Seq   uint32
	N     int // OpArray: the number of keys
	One   Part
	Parts []Part // several parts; one is unused then
	Reply []byte // callLocal
	// learn, when set, sees whether the reply was an error. It runs
	// where the reply is made, on a connection's reader (the proxy's clustercall.go):
	// what it sets is the forwarder's only when the forwarder waits for
	// the call's reply before it reads it (AUTH, HELLO, CLIENT SETNAME).
	Learn func(failed bool)
	Scan  int // callScan: the master index in the cursor
	// fold, when set, makes the reply of a callMerge from its parts'
	// replies, errors included, and reports whether it is an error (see
	// fan.go, join.go).
	Fold func(replies [][]byte) ([]byte, bool)
	// alone: making the reply sends more commands (SORT with patterns):
	// the forwarder makes it before it goes on (finishCalls).
	Alone bool
	// Opens is, for a CallMerge with OpLast in a transaction, the index of
	// the part whose MULTI opens the transaction on its connection.
	Opens int
}

func (c *Call) Count() int {
	if c.Parts != nil {
		return len(c.Parts)
	}
	return 1
}

func (c *Call) Part(i int) *Part {
	if c.Parts != nil {
		return &c.Parts[i]
	}
	return &c.One
}

// unsupported is the reply to a command the proxy does not carry to a
// cluster. name is a string: a byte slice given to Sprintf would make
// every caller's buffer escape to the heap.
func Unsupported(name string) []byte {
	return []byte(fmt.Sprintf("-ERR '%s' is not supported by lockproxy in front of a Redis Cluster\r\n", name))
}

func LocalCall(reply []byte) Call { return Call{Kind: CallLocal, Reply: reply} }

// fan sends raw to every master.
func Fan(m *SlotMap, raw []byte, op MergeOp) Call {
	c := Call{Kind: CallMerge, Op: op, Parts: make([]Part, len(m.Masters))}
	for i, a := range m.Masters {
		c.Parts[i] = Part{Slot: m.First[i], Addr: a, Raw: raw}
	}
	return c
}

// scanBits is how many low bits of a SCAN cursor through the proxy say
// which master it is on; the rest is that master's own cursor.
const scanBits = 10

// scanCall routes SCAN: the client's cursor holds the index of a master
// (in the order of their first slots) and that master's cursor. 0 starts
// on the first master; when a master's cursor comes back 0, the call goes
// on with the next master while COUNT is not filled (the session's
// scanAll), or the next cursor starts on the next master; after the last
// the cursor is 0.
func ScanCall(m *SlotMap, cmd redcon.Command, def Call) Call {
	if len(cmd.Args) < 2 {
		return def // Redis's arity error
	}
	cur, err := strconv.ParseUint(string(cmd.Args[1]), 10, 64)
	if err != nil {
		return def // Redis's "invalid cursor"
	}
	idx := int(cur & (1<<scanBits - 1))
	if idx >= len(m.Masters) {
		return LocalCall([]byte("*2\r\n$1\r\n0\r\n*0\r\n")) // a master that is gone: nothing left
	}
	raw := redcon.AppendArray(nil, len(cmd.Args))
	raw = redcon.AppendBulk(raw, cmd.Args[0])
	raw = redcon.AppendBulkString(raw, strconv.FormatUint(cur>>scanBits, 10))
	for _, a := range cmd.Args[2:] {
		raw = redcon.AppendBulk(raw, a)
	}
	return Call{Kind: CallScan, Scan: idx, N: len(m.Masters), One: Part{Slot: m.First[idx], Addr: m.Masters[idx], Raw: raw}}
}

// split sends a command whose keys are in several slots as one command
// per slot, each with its keys (and MSET's values) in the client's order.
func Split(m *SlotMap, name []byte, op MergeOp, args [][]byte) Call {
	width := 1
	if string(name) == "mset" {
		width = 2
		if (len(args)-1)%2 != 0 {
			return LocalCall([]byte("-ERR wrong number of arguments for 'mset' command\r\n"))
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
		sl := KeySlot(args[i])
		g, ok := index[sl]
		if !ok {
			g = len(groups)
			index[sl] = g
			groups = append(groups, group{slot: sl, args: [][]byte{args[0]}})
		}
		groups[g].args = append(groups[g].args, args[i:i+width]...)
		groups[g].pos = append(groups[g].pos, j)
	}
	c := Call{Kind: CallMerge, Op: op, N: (len(args) - 1) / width, Parts: make([]Part, len(groups))}
	for i, g := range groups {
		raw := redcon.AppendArray(nil, len(g.args))
		for _, a := range g.args {
			raw = redcon.AppendBulk(raw, a)
		}
		c.Parts[i] = Part{Slot: g.slot, Addr: m.Master(g.slot), Raw: raw, pos: g.pos}
	}
	return c
}

// redirection is what an error reply asks of the proxy.
type Redirection uint8

const (
	RedirNone  Redirection = iota
	RedirMoved             // -MOVED slot addr: the slot has a new master
	RedirAsk               // -ASK slot addr: this key is there already
	RedirWait              // -TRYAGAIN, -CLUSTERDOWN: not served right now
)

// redirected parses an error line ("-MOVED 3999 127.0.0.1:6381\r\n").
func Redirected(line []byte) (Redirection, string) {
	var kind Redirection
	switch {
	case bytes.HasPrefix(line, []byte("-MOVED ")):
		kind = RedirMoved
	case bytes.HasPrefix(line, []byte("-ASK ")):
		kind = RedirAsk
	case bytes.HasPrefix(line, []byte("-TRYAGAIN")), bytes.HasPrefix(line, []byte("-CLUSTERDOWN")):
		return RedirWait, ""
	default:
		return RedirNone, ""
	}
	f := bytes.Fields(line)
	if len(f) != 3 {
		return RedirNone, ""
	}
	return kind, string(f[2])
}

// merge makes the client's reply from the replies of c's parts, and
// reports whether one of them failed.
func Merge(c *Call, replies [][]byte) ([]byte, bool) {
	if c.Fold != nil {
		return c.Fold(replies)
	}
	var firstErr []byte
	for i, r := range replies {
		if len(r) > 0 && (r[0] == '-' || r[0] == '!') && firstErr == nil && (c.Op != OpLast || i < len(replies)-1) {
			firstErr = r
		}
	}
	switch c.Op {
	case OpLast:
		return replies[len(replies)-1], firstErr != nil
	case OpFirst:
		if firstErr != nil {
			return firstErr, true
		}
		return replies[0], false
	}
	if firstErr != nil {
		return firstErr, true
	}
	switch c.Op {
	case OpSum:
		var sum int64
		for _, r := range replies {
			n, ok := resp.ParseLength(r[1:])
			if r[0] != ':' || !ok {
				return resp.ErrorReply(fmt.Errorf("unexpected reply %q", r)), true
			}
			sum += n
		}
		return redcon.AppendInt(nil, sum), false
	case OpConcat:
		var n int64
		var body []byte
		for _, r := range replies {
			count, elems, err := elements(r)
			if err != nil {
				return resp.ErrorReply(err), true
			}
			n += int64(count)
			body = append(body, elems...)
		}
		return append(redcon.AppendArray(nil, int(n)), body...), false
	}
	// OpArray
	out := make([][]byte, c.N)
	for i, r := range replies {
		_, elems, err := elements(r)
		if err != nil {
			return resp.ErrorReply(err), true
		}
		for _, pos := range c.Part(i).pos {
			k, err := valueLen(elems)
			if err != nil {
				return resp.ErrorReply(err), true
			}
			out[pos] = elems[:k]
			elems = elems[k:]
		}
	}
	b := redcon.AppendArray(nil, c.N)
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

// Result makes the client's reply to a call of several parts, or of one
// whose reply is rewritten or learned from, from the replies of its
// parts, runs its learn, and reports whether the reply is an error.
func (c *Call) Result(replies [][]byte) ([]byte, bool) {
	var reply []byte
	var failed bool
	switch c.Kind {
	case CallPlain:
		reply, failed = replies[0], IsError(replies[0])
	default:
		reply, failed = Merge(c, replies)
	}
	if c.Learn != nil {
		c.Learn(failed)
	}
	return reply, failed
}

// Elements returns the number of elements of an array reply and their
// bytes (elements).
func Elements(r []byte) (int, []byte, error) { return elements(r) }

// ValueLen returns the length of the RESP value b starts with
// (valueLen).
func ValueLen(b []byte) (int, error) { return valueLen(b) }
