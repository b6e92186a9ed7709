package proxy

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"regexp"
	"strconv"
	"sync"
	"time"

	"github.com/tidwall/redcon"

	"github.com/lockproxy/lockproxy/proxy/internal/cluster"
	"github.com/lockproxy/lockproxy/proxy/internal/resp"
)

// CLIENT TRACKING in front of a cluster. Tracking is state of a
// connection, and a client's reads go to every master: so while it
// tracks, a client's commands go on its own connections only, each with
// tracking on. Without REDIRECT, each master pushes the client's
// invalidations on the client's own connection to it, in the stream of
// its replies, as one Redis does: the readers of those connections keep
// reading while the client tracks, and give each push to the client right
// after the reply it followed (cluster.Order.PushAfter), so that an
// eviction's invalidation comes before the reply of the command that
// evicted and one the client's own write caused after that write's reply,
// in RESP3; in RESP2 the masters push nothing, as Redis sends nothing.
// With REDIRECT, every master's invalidations are redirected to a
// connection of the proxy's, one per master and tracking client (a sink),
// subscribed to __redis__:invalidate; the sinks' readers give them to the
// client REDIRECT named (its id as CLIENT ID through the proxy gave it)
// as a push in RESP3 or as a __redis__:invalidate message when it is
// subscribed in RESP2; nobody else. The options other than REDIRECT
// (BCAST, PREFIX, OPTIN, OPTOUT, NOLOOP) are the masters' to apply. A
// flush's invalidation (all keys) comes from every master the proxy
// flushed; the slot-0 master's is given, once, as one Redis gives one. A
// connection dialled again (the old one lost) is brought back to tracking
// before its first command; the invalidations the lost one owed are lost
// with it.
//
// CLIENT GETREDIR answers the client's REDIRECT id, as Redis does. CLIENT
// CACHING concerns the connection's next command only, whose master is not
// known when it comes: it goes to every master's connection of the
// client, and once the next command has gone to its masters, a PING whose
// reply the client does not get ends it on the others (any command but
// CLIENT ends it on Redis).

// tracking is a client's CLIENT TRACKING ON: what it asked and its sinks.
type tracking struct {
	s        *session
	redirect int64    // the client id REDIRECT named; 0 for none
	opts     [][]byte // CLIENT TRACKING ON and its options but REDIRECT
	mu       sync.Mutex
	sinks    map[string]*sink // by master
	first    string           // the slot-0 master, whose flush invalidation is given
}

// sink is one master's connection the client's invalidations go to.
type sink struct {
	be *backendConn
	id int64
}

var (
	replyNoRedirTarget = []byte("-ERR The client ID you want redirect to does not exist\r\n")
	invalidatePush     = []byte(">2\r\n$10\r\ninvalidate\r\n")
	invalidateMessage  = []byte("*3\r\n$7\r\nmessage\r\n$20\r\n__redis__:invalidate\r\n")
	subscribeInvalid   = []byte("*2\r\n$9\r\nSUBSCRIBE\r\n$20\r\n__redis__:invalidate\r\n")
	cmdClientID        = []byte("*2\r\n$6\r\nCLIENT\r\n$2\r\nID\r\n")
)

// clientIDCall sends CLIENT ID to the first master and records the id it
// answers as the client's, for CLIENT TRACKING ... REDIRECT.
func (s *session) clientIDCall(m *cluster.SlotMap, cmd redcon.Command) cluster.Call {
	cs := s.cl
	c := cluster.Call{Kind: cluster.CallMerge, Op: cluster.OpFirst, Parts: []cluster.Part{{Slot: m.First[0], Addr: m.Master(m.First[0]), Raw: cmd.Raw}}}
	r := cs.r
	c.Fold = func(replies [][]byte) ([]byte, bool) {
		b := replies[0]
		if len(b) > 1 && b[0] == ':' {
			if id, err := strconv.ParseInt(string(bytes.TrimSpace(b[1:])), 10, 64); err == nil {
				r.clientIDs.Store(id, s)
				cs.mu.Lock()
				cs.ids = append(cs.ids, id)
				cs.mu.Unlock()
			}
		}
		return b, cluster.IsError(b)
	}
	return c
}

// forgetIDs removes the client's ids from the router's registry; it runs
// when the client has gone.
func (cs *clusterSession) forgetIDs() {
	cs.mu.Lock()
	ids := cs.ids
	cs.ids = nil
	cs.mu.Unlock()
	for _, id := range ids {
		cs.r.clientIDs.Delete(id)
	}
}

// trackingCall answers CLIENT TRACKING: ON makes the sinks and turns
// tracking on at every master, OFF turns it off everywhere. A syntax
// the proxy does not recognise goes to the first master, whose error is
// the client's.
func (s *session) trackingCall(m *cluster.SlotMap, cmd redcon.Command) (cluster.Call, bool) {
	cs := s.cl
	args := cmd.Args
	if len(args) < 3 {
		return cluster.Call{}, false
	}
	on := bytes.EqualFold(args[2], []byte("on"))
	if !on && !bytes.EqualFold(args[2], []byte("off")) {
		return cluster.Call{}, false
	}
	opts := [][]byte{[]byte("CLIENT"), []byte("TRACKING"), []byte("ON")}
	var redirect int64
	for i := 3; i < len(args); i++ {
		if bytes.EqualFold(args[i], []byte("redirect")) && i+1 < len(args) {
			id, err := strconv.ParseInt(string(args[i+1]), 10, 64)
			if err != nil {
				return cluster.Call{}, false // Redis's error
			}
			redirect = id
			i++
			continue
		}
		opts = append(opts, args[i])
	}
	s.settleCluster()
	if !on {
		old := cs.trk.Load()
		cs.stopTracking()
		if old == nil {
			return cluster.LocalCall(replyOK), true // Redis answers OFF +OK whatever the state
		}
		return cluster.Fan(m, cmd.Raw, cluster.OpFirst), true
	}
	if redirect != 0 {
		if _, ok := cs.r.clientIDs.Load(redirect); !ok {
			return cluster.LocalCall(replyNoRedirTarget), true
		}
	}
	t := cs.trk.Load()
	if t == nil || t.redirect != redirect {
		// Tracking again with another target: Redis replaces it.
		cs.stopTracking()
		t = &tracking{s: s, redirect: redirect, sinks: map[string]*sink{}, first: m.Master(m.First[0])}
	}
	t.opts = opts
	if redirect != 0 {
		ctx, cancel := context.WithTimeout(s.ctx, s.p.cfg.Backend.DialTimeout)
		defer cancel()
		for _, addr := range m.Masters {
			if err := t.openSink(ctx, addr); err != nil {
				t.close()
				s.p.m.unavailable.Add(1)
				return cluster.LocalCall(resp.ErrorReply(&BackendError{Err: fmt.Errorf("%s: %w", addr, err)})), true
			}
		}
	} else {
		// The readers of the client's own connections read on from the
		// replies to this CLIENT TRACKING ON: the pushes come there.
		cs.listen.Store(true)
	}
	c := cluster.Call{Kind: cluster.CallMerge, Op: cluster.OpFirst}
	for i, addr := range m.Masters {
		c.Parts = append(c.Parts, cluster.Part{Slot: m.First[i], Addr: addr, Raw: t.command(addr)})
	}
	c.Learn = func(failed bool) {
		if failed {
			if cs.trk.Load() != t {
				t.close()
				cs.listen.Store(false)
			}
			return
		}
		cs.trk.Store(t)
	}
	return c, true
}

// command is the CLIENT TRACKING ON that a connection to addr gets.
func (t *tracking) command(addr string) []byte {
	if t.redirect == 0 {
		return resp.Encode(t.opts) // the master pushes on that connection
	}
	t.mu.Lock()
	sk := t.sinks[addr]
	t.mu.Unlock()
	if sk == nil {
		return nil
	}
	args := append(append([][]byte(nil), t.opts...), []byte("REDIRECT"), []byte(strconv.FormatInt(sk.id, 10)))
	return resp.Encode(args)
}

// trackingFor returns the command that brings a new connection of the
// client's to addr to tracking, or nil when the client does not track.
func (cs *clusterSession) trackingFor(addr string) []byte {
	if t := cs.trk.Load(); t != nil {
		return t.command(addr)
	}
	return nil
}

// openSink makes addr's sink, unless it has one.
func (t *tracking) openSink(ctx context.Context, addr string) error {
	t.mu.Lock()
	have := t.sinks[addr] != nil
	t.mu.Unlock()
	if have {
		return nil
	}
	s := t.s
	st := replayState{auth: s.cl.replay().auth}
	be, err := s.p.dialAddr(ctx, addr, st)
	if err != nil {
		return err
	}
	replies, err := roundTrip(ctx, be, cmdClientID, subscribeInvalid)
	if err != nil {
		be.NC.Close()
		return err
	}
	id, err := cluster.IntAt(replies[0])
	if err != nil {
		be.NC.Close()
		return fmt.Errorf("CLIENT ID: %q", replies[0])
	}
	sk := &sink{be: be, id: id}
	t.mu.Lock()
	t.sinks[addr] = sk
	t.mu.Unlock()
	s.wg.Add(1)
	go t.read(sk, addr == t.first)
	return nil
}

// roundTrip sends cmds on be and returns their replies.
func roundTrip(ctx context.Context, be *backendConn, cmds ...[]byte) ([][]byte, error) {
	deadline, _ := ctx.Deadline()
	be.NC.SetDeadline(deadline)
	defer be.NC.SetDeadline(time.Time{})
	for _, c := range cmds {
		be.W.Write(c)
	}
	if err := be.W.Flush(); err != nil {
		return nil, err
	}
	var out [][]byte
	var buf bytes.Buffer
	w := bufio.NewWriter(&buf)
	var ri resp.ReplyInfo
	for range cmds {
		buf.Reset()
		if err := resp.CopyReply(w, be.R, &ri); err != nil {
			return nil, err
		}
		w.Flush()
		out = append(out, append([]byte(nil), buf.Bytes()...))
	}
	return out, nil
}

// close closes the sinks; their readers end.
func (t *tracking) close() {
	t.mu.Lock()
	sinks := t.sinks
	t.sinks = map[string]*sink{}
	t.mu.Unlock()
	for _, sk := range sinks {
		sk.be.NC.Close()
	}
}

// stopTracking ends the client's tracking on the proxy's side (the
// caller turns it off on the masters, or RESET does).
func (cs *clusterSession) stopTracking() {
	cs.listen.Store(false)
	if t := cs.trk.Swap(nil); t != nil {
		t.close()
	}
}

// ownPush reads a push from r, the client's own connection to addr, and
// gives it to the client right after the reply with ticket after (see
// cluster.Order.PushAfter). A flush's invalidation (all keys) is given
// from the slot-0 master only: every master the flush reached sends one.
func (cs *clusterSession) ownPush(r *bufio.Reader, addr string, after uint64) error {
	var buf bytes.Buffer
	w := bufio.NewWriter(&buf)
	var ri resp.ReplyInfo
	if err := resp.CopyReply(w, r, &ri); err != nil {
		return err
	}
	w.Flush()
	frame := buf.Bytes()
	if bytes.HasPrefix(frame, invalidatePush) && bytes.Equal(frame[len(invalidatePush):], []byte("_\r\n")) {
		if m := cs.r.Slots.Load(); m == nil || m.Master(m.First[0]) != addr {
			return nil
		}
	}
	s := cs.s
	cs.order.PushAfter(after, frame, &s.w)
	s.pushOut()
	return nil
}

// pushesAfter gives the client the pushes that came on its own connection
// to addr right behind the reply with ticket, in the same read: a master
// writes the invalidations a command of the client's caused after its
// reply, in the same write. They are placed right after that reply.
func (cs *clusterSession) pushesAfter(r *bufio.Reader, addr string, ticket uint64) error {
	for r.Buffered() > 0 {
		if b, _ := r.Peek(1); b[0] != '>' {
			return nil
		}
		if err := cs.ownPush(r, addr, ticket); err != nil {
			return err
		}
	}
	return nil
}

// read reads a sink until it is closed and hands out its invalidations;
// a flush's (all keys) only when first is set.
func (t *tracking) read(sk *sink, first bool) {
	s := t.s
	defer s.wg.Done()
	defer s.recoverPanic()
	var buf bytes.Buffer
	w := bufio.NewWriter(&buf)
	var ri resp.ReplyInfo
	for {
		buf.Reset()
		if err := resp.CopyReply(w, sk.be.R, &ri); err != nil {
			return
		}
		w.Flush()
		frame := buf.Bytes()
		n, rest, err := cluster.Elements(frame)
		if err != nil || n != 3 {
			continue
		}
		parts := bulks(frame)
		if len(parts) < 2 || string(parts[0]) != "message" {
			continue
		}
		for range 2 {
			k, _ := cluster.ValueLen(rest)
			rest = rest[k:]
		}
		keys := rest
		null := bytes.Equal(keys, []byte("$-1\r\n"))
		if null && !first {
			continue
		}
		t.deliver(keys, null)
	}
}

// deliver gives an invalidation of keys (a RESP2 array, or a null for
// all keys) to the REDIRECT target (only a client tracking with REDIRECT
// has sinks), as one Redis would.
func (t *tracking) deliver(keys []byte, null bool) {
	s := t.s
	v, ok := s.cl.r.clientIDs.Load(t.redirect)
	if !ok {
		if s.cl.proto3.Load() {
			s.inject(fmt.Appendf(nil, ">2\r\n$21\r\ntracking-redir-broken\r\n:%d\r\n", t.redirect))
		}
		return
	}
	target := v.(*session)
	subscribed, resp3 := target.q.pubsub()
	if !subscribed {
		resp3 = target.cl.proto3.Load()
	}
	var frame []byte
	switch {
	case resp3:
		frame = append([]byte(nil), invalidatePush...)
		if null {
			frame = append(frame, "_\r\n"...)
		} else {
			frame = append(frame, keys...)
		}
	case t.redirect != 0 && subscribed:
		frame = append(append([]byte(nil), invalidateMessage...), keys...)
	default:
		return // RESP2 without a subscribed target: Redis sends nothing
	}
	target.inject(frame)
}

// inject writes a push to the client, between two replies.
func (s *session) inject(frame []byte) {
	out := s.w.lockOutput()
	out.Write(frame)
	out.Flush()
	s.w.unlock()
}

// getRedir answers CLIENT GETREDIR: the REDIRECT id, 0 when tracking
// without one, -1 when not tracking.
func (s *session) getRedir() cluster.Call {
	t := s.cl.trk.Load()
	switch {
	case t == nil:
		return cluster.LocalCall([]byte(":-1\r\n"))
	default:
		return cluster.LocalCall(redcon.AppendInt(nil, t.redirect))
	}
}

// redirectField is the redirect field of a CLIENT TRACKINGINFO reply.
var redirectField = regexp.MustCompile(`\$8\r\nredirect\r\n:-?[0-9]+\r\n`)

// trackingInfoCall sends CLIENT TRACKINGINFO to the slot-0 master, whose
// reply names the client's REDIRECT id in place of the proxy's sink.
func (s *session) trackingInfoCall(m *cluster.SlotMap, cmd redcon.Command) cluster.Call {
	c := cluster.Call{Kind: cluster.CallMerge, Op: cluster.OpFirst, Parts: []cluster.Part{{Slot: m.First[0], Addr: m.Master(m.First[0]), Raw: cmd.Raw}}}
	t := s.cl.trk.Load()
	if t == nil {
		return c
	}
	field := fmt.Appendf(nil, "$8\r\nredirect\r\n:%d\r\n", t.redirect)
	r := s.cl.r
	c.Fold = func(replies [][]byte) ([]byte, bool) {
		b := replies[0]
		if cluster.IsError(b) {
			return b, true
		}
		b = redirectField.ReplaceAllLiteral(b, field)
		if _, ok := r.clientIDs.Load(t.redirect); t.redirect != 0 && !ok {
			b = addBrokenRedirect(b)
		}
		return b, false
	}
	return c
}

// flagsField is the start of a CLIENT TRACKINGINFO reply's flags.
var flagsField = regexp.MustCompile(`\$5\r\nflags\r\n[*~]([0-9]+)\r\n`)

// addBrokenRedirect adds the broken_redirect flag to a CLIENT
// TRACKINGINFO reply, as Redis reports a REDIRECT target that is gone
// (the masters' connections redirect to the proxy's sinks, which live
// on).
func addBrokenRedirect(b []byte) []byte {
	loc := flagsField.FindSubmatchIndex(b)
	if loc == nil {
		return b
	}
	n, err := strconv.Atoi(string(b[loc[2]:loc[3]]))
	if err != nil {
		return b
	}
	end := loc[1]
	for range n {
		k, err := cluster.ValueLen(b[end:])
		if err != nil {
			return b
		}
		end += k
	}
	out := append([]byte(nil), b[:loc[2]]...)
	out = strconv.AppendInt(out, int64(n+1), 10)
	out = append(out, b[loc[3]:end]...)
	out = append(out, "$15\r\nbroken_redirect\r\n"...)
	return append(out, b[end:]...)
}

// cmdPing is the command that ends a CLIENT CACHING on a connection.
var cmdPing = []byte("*1\r\n$4\r\nPING\r\n")

// isCaching reports whether a command is CLIENT CACHING.
func isCaching(name []byte, args [][]byte) bool {
	return string(name) == "client" && len(args) > 1 && bytes.EqualFold(args[1], []byte("caching"))
}

// cachingCall sends CLIENT CACHING to every master's connection of the
// client; the reply is the first master's (or the first error).
func (s *session) cachingCall(m *cluster.SlotMap, cmd redcon.Command) cluster.Call {
	s.cl.caching = true
	return cluster.Fan(m, cmd.Raw, cluster.OpFirst)
}

// endCaching ends a CLIENT CACHING on the masters c did not go to, with
// a PING whose reply is held back from the client.
func (s *session) endCaching(c *cluster.Call) {
	cs := s.cl
	cs.caching = false
	m := cs.r.Slots.Load()
	if m == nil {
		return
	}
	used := map[string]bool{}
	if c.Kind != cluster.CallLocal {
		for i := range c.Count() {
			used[c.Part(i).Addr] = true
		}
	}
	deadline := time.Now().Add(s.p.cfg.Backend.ClusterRetry)
	for i, addr := range m.Masters {
		if used[addr] {
			continue
		}
		p := cluster.Part{Slot: m.First[i], Addr: addr, Raw: cmdPing}
		s.sendPart(&p, cluster.TicketOpts{Own: true, Mute: true}, deadline)
	}
}
