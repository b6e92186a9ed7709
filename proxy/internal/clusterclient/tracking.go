package clusterclient

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"sync"
	"time"

	"github.com/tidwall/redcon"

	"github.com/lockproxy/lockproxy/proxy/internal/backend"
	"github.com/lockproxy/lockproxy/proxy/internal/cluster"
	"github.com/lockproxy/lockproxy/proxy/internal/resp"
)

// CLIENT TRACKING in front of a cluster. Tracking is state of a
// connection, and a client's reads go to every master: so while it
// tracks, a client's commands go on its own connections only, each with
// tracking on, and the readers of those connections keep reading while no
// reply is owed, for what the masters push there.
//
// Without REDIRECT, each master pushes the client's invalidations on the
// client's own connection to it, in the stream of its replies, as one
// Redis does: each push is given to the client right after the reply it
// followed (cluster.Order.PushAfter), so that an eviction's invalidation
// comes before the reply of the command that evicted and one the
// client's own write caused after that write's reply, in RESP3; in RESP2
// the masters push nothing, as Redis sends nothing.
//
// With REDIRECT, the target (the client whose id CLIENT ID through the
// proxy gave) has a connection of the proxy's to each master, its sinks,
// subscribed to __redis__:invalidate and opened when a client first
// redirects to it; every client that redirects to it redirects there, so
// that one master's invalidations for one target come in one stream, in
// the master's order, whichever client they are for. The sinks' readers
// give them to the target as a push in RESP3 or as a __redis__:invalidate
// message when it is subscribed in RESP2. Once the target has gone, or
// has sent QUIT, its sinks are closed before anything else it is owed:
// the masters then push tracking-redir-broken to its RESP3 trackers at
// their next invalidation, on the trackers' own connections, as one Redis
// does.
//
// The options other than REDIRECT (BCAST, PREFIX, OPTIN, OPTOUT, NOLOOP)
// are the masters' to apply. A flush's invalidation (all keys) comes from
// every master the proxy flushed; the slot-0 master's is given, as one
// Redis gives one. A connection of the client's lost while it tracks (the
// master closed it, failed over, or a reply was cut short) disconnects
// the client (Lost): the invalidations the master owed on it are gone, and
// a client that reconnects empties its cache. A connection dialled while
// it tracks (a master it had none to) is brought to tracking before its
// first command.
//
// CLIENT GETREDIR answers the client's REDIRECT id, as Redis does. CLIENT
// CACHING concerns the connection's next command only, whose master is not
// known when it comes: it goes to every master's connection of the
// client, and once the next command has gone to its masters, a PING whose
// reply the client does not get ends it on the others (any command but
// CLIENT ends it on Redis).

// tracking is a client's CLIENT TRACKING ON: what it asked, and the
// target whose sinks its invalidations go to.
type tracking struct {
	redirect int64    // the client id REDIRECT named; 0 for none
	target   *Client  // that client's, while redirect is set
	opts     [][]byte // CLIENT TRACKING ON and its options but REDIRECT
}

// sinks are a REDIRECT target's connections to the masters, one each,
// that the invalidations of the clients redirecting to it go to.
type sinks struct {
	mu     sync.Mutex
	byAddr map[string]*sink
	gone   bool // the target has gone or sent QUIT: no sink opens again
}

// sink is one master's connection a target's invalidations come on.
type sink struct {
	be   *backend.Conn
	id   int64
	done chan struct{} // closed when its reader ends
}

var (
	replyNoRedirTarget = []byte("-ERR The client ID you want redirect to does not exist\r\n")
	errTargetGone      = errors.New("the REDIRECT target has gone")
	cmdQuit            = []byte("*1\r\n$4\r\nQUIT\r\n")
	invalidatePush     = []byte(">2\r\n$10\r\ninvalidate\r\n")
	redirBrokenPush    = []byte(">2\r\n$21\r\ntracking-redir-broken\r\n")
	invalidateMessage  = []byte("*3\r\n$7\r\nmessage\r\n$20\r\n__redis__:invalidate\r\n")
	subscribeInvalid   = []byte("*2\r\n$9\r\nSUBSCRIBE\r\n$20\r\n__redis__:invalidate\r\n")
	cmdClientID        = []byte("*2\r\n$6\r\nCLIENT\r\n$2\r\nID\r\n")
)

// clientIDCall sends CLIENT ID to the first master and records the id it
// answers as the client's, for CLIENT TRACKING ... REDIRECT.
func (s *Client) clientIDCall(m *cluster.SlotMap, cmd redcon.Command) cluster.Call {
	c := cluster.Call{Kind: cluster.CallMerge, Op: cluster.OpFirst, Parts: []cluster.Part{{Slot: m.First[0], Addr: m.Master(m.First[0]), Raw: cmd.Raw}}}
	r := s.r
	c.Fold = func(replies [][]byte) ([]byte, bool) {
		b := replies[0]
		if id, ok := resp.IntegerReply(b); ok {
			r.clientIDs.Add(&s.ids, id, s)
		}
		return b, cluster.IsError(b)
	}
	return c
}

// trackingCall answers CLIENT TRACKING: ON makes the sinks and turns
// tracking on at every master, OFF turns it off everywhere. A syntax
// the proxy does not recognise goes to the first master, whose error is
// the client's.
func (s *Client) trackingCall(m *cluster.SlotMap, cmd redcon.Command) (cluster.Call, bool) {
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
	s.Settle()
	if !on {
		old := s.trk.Load()
		s.stopTracking()
		if old == nil {
			return cluster.LocalCall(resp.ReplyOK), true // Redis answers OFF +OK whatever the state
		}
		return cluster.Fan(m, cmd.Raw, cluster.OpFirst), true
	}
	var target *Client
	if redirect != 0 {
		var ok bool
		if target, ok = s.r.clientIDs.Load(redirect); !ok {
			return cluster.LocalCall(replyNoRedirTarget), true
		}
		ctx, cancel := context.WithTimeout(s.ctx, s.r.cfg.DialTimeout)
		defer cancel()
		for _, addr := range m.Masters {
			if _, err := target.sinkFor(ctx, addr); err != nil {
				if errors.Is(err, errTargetGone) {
					return cluster.LocalCall(replyNoRedirTarget), true
				}
				s.r.cfg.Unavailable.Add(1)
				return cluster.LocalCall(s.r.cfg.ErrorReply(fmt.Errorf("%s: %w", addr, err))), true
			}
		}
	}
	// Tracking again with another target replaces it, as on Redis. The
	// readers of the client's own connections read on from the replies
	// to this CLIENT TRACKING ON: pushes come there.
	t := &tracking{redirect: redirect, target: target, opts: opts}
	s.listen.Store(true)
	c := cluster.Call{Kind: cluster.CallMerge, Op: cluster.OpFirst}
	for i, addr := range m.Masters {
		c.Parts = append(c.Parts, cluster.Part{Slot: m.First[i], Addr: addr, Raw: t.command(addr)})
	}
	c.Learn = func(failed bool) {
		if !failed {
			s.trk.Store(t)
		} else if s.trk.Load() == nil {
			s.listen.Store(false)
		}
	}
	return c, true
}

// command is the CLIENT TRACKING ON that a connection to addr gets, nil
// when the target has no sink there.
func (t *tracking) command(addr string) []byte {
	if t.redirect == 0 {
		return resp.Encode(t.opts) // the master pushes on that connection
	}
	sk := t.target.sinkAt(addr)
	if sk == nil {
		return nil
	}
	args := append(append([][]byte(nil), t.opts...), []byte("REDIRECT"), []byte(strconv.FormatInt(sk.id, 10)))
	return resp.Encode(args)
}

// trackingFor returns the command that brings a new connection of the
// client's to addr to tracking, or nil when the client does not track.
func (s *Client) trackingFor(addr string) []byte {
	if t := s.trk.Load(); t != nil {
		return t.command(addr)
	}
	return nil
}

// sinkAt returns the client's sink at addr, nil when it has none.
func (s *Client) sinkAt(addr string) *sink {
	s.sinks.mu.Lock()
	defer s.sinks.mu.Unlock()
	return s.sinks.byAddr[addr]
}

// sinkFor returns the client's sink at addr, opened when it has none; it
// fails with errTargetGone once the client has gone or sent QUIT.
func (s *Client) sinkFor(ctx context.Context, addr string) (*sink, error) {
	ks := &s.sinks
	ks.mu.Lock()
	defer ks.mu.Unlock()
	if ks.gone {
		return nil, errTargetGone
	}
	if sk := ks.byAddr[addr]; sk != nil {
		return sk, nil
	}
	be, err := s.h.Dial(ctx, addr, AsUser)
	if err != nil {
		return nil, err
	}
	replies, err := roundTrip(ctx, be, cmdClientID, subscribeInvalid)
	if err != nil {
		be.NC.Close()
		return nil, err
	}
	id, err := cluster.IntAt(replies[0])
	if err != nil {
		be.NC.Close()
		return nil, fmt.Errorf("CLIENT ID: %q", replies[0])
	}
	if cluster.IsError(replies[1]) {
		be.NC.Close()
		return nil, fmt.Errorf("SUBSCRIBE: %q", replies[1])
	}
	sk := &sink{be: be, id: id, done: make(chan struct{})}
	if ks.byAddr == nil {
		ks.byAddr = map[string]*sink{}
	}
	ks.byAddr[addr] = sk
	// On a goroutine of the session's, counted before the session waits:
	// gone is not set.
	s.h.Go(func() { s.readSink(sk, addr) })
	return sk, nil
}

// closeSinks ends the client's sinks, once it has gone or sent QUIT: each
// gets a QUIT, and the master has let it go once its reader has read the
// reply (bounded by the dial timeout), so that no master redirects to it
// any more.
func (s *Client) closeSinks() {
	ks := &s.sinks
	ks.mu.Lock()
	ks.gone = true
	byAddr := ks.byAddr
	ks.byAddr = nil
	ks.mu.Unlock()
	if len(byAddr) == 0 {
		return
	}
	deadline := time.Now().Add(s.r.cfg.DialTimeout)
	for _, sk := range byAddr {
		sk.be.NC.SetWriteDeadline(deadline)
		sk.be.NC.Write(cmdQuit)
	}
	for _, sk := range byAddr {
		select {
		case <-sk.done:
		case <-time.After(time.Until(deadline)):
		}
		sk.be.NC.Close()
	}
}

// roundTrip sends cmds on be and returns their replies.
func roundTrip(ctx context.Context, be *backend.Conn, cmds ...[]byte) ([][]byte, error) {
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
	var ri resp.ReplyInfo
	for range cmds {
		b, err := resp.ReadFrame(be.R, &ri)
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, nil
}

// stopTracking ends the client's tracking on the proxy's side (the
// caller turns it off on the masters, or RESET does).
func (s *Client) stopTracking() {
	s.listen.Store(false)
	s.trk.Store(nil)
}

// Listening reports whether the masters push on the client's own
// connections (while it tracks): their readers then read while no reply
// is owed (backend.Pusher).
func (s *Client) Listening() bool { return s.listen.Load() }

// Push reads a push from r, the client's own connection to addr, and
// gives it to the client right after the reply with ticket after (see
// cluster.Order.PushAfter). A flush's invalidation (all keys) is given
// from the slot-0 master only: every master the flush reached sends one.
func (s *Client) Push(r *bufio.Reader, addr string, after uint64) error {
	var ri resp.ReplyInfo
	frame, err := resp.ReadFrame(r, &ri)
	if err != nil {
		return err
	}
	if bytes.HasPrefix(frame, invalidatePush) && bytes.Equal(frame[len(invalidatePush):], []byte("_\r\n")) {
		if m := s.r.Slots.Load(); m == nil || m.Master(m.First[0]) != addr {
			return nil
		}
	}
	if bytes.HasPrefix(frame, redirBrokenPush) {
		// The master names its sink; the client named the target's id.
		t := s.trk.Load()
		if t == nil || t.redirect == 0 {
			return nil
		}
		frame = fmt.Appendf(frame[:0], "%s:%d\r\n", redirBrokenPush, t.redirect)
	}
	s.order.PushAfter(after, frame, s.w)
	s.h.PushOut()
	return nil
}

// pushesAfter gives the client the pushes that came on its own connection
// to addr right behind the reply with ticket, in the same read: a master
// writes the invalidations a command of the client's caused after its
// reply, in the same write. They are placed right after that reply.
func (s *Client) pushesAfter(r *bufio.Reader, addr string, ticket uint64) error {
	for r.Buffered() > 0 {
		if b, _ := r.Peek(1); b[0] != '>' {
			return nil
		}
		if err := s.Push(r, addr, ticket); err != nil {
			return err
		}
	}
	return nil
}

// readSink reads the client's sink at addr until it ends, and gives the
// client the invalidations that come there; a flush's (all keys) from the
// slot-0 master only.
func (s *Client) readSink(sk *sink, addr string) {
	defer close(sk.done)
	var frames resp.Frames
	for {
		frame, err := frames.Next(sk.be.R)
		if err != nil {
			return
		}
		n, rest, err := cluster.Elements(frame)
		if err != nil || n != 3 {
			continue // QUIT's +OK: the EOF follows
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
		if null {
			if m := s.r.Slots.Load(); m == nil || m.Master(m.First[0]) != addr {
				continue
			}
		}
		s.deliver(keys, null)
	}
}

// deliver gives the client, a REDIRECT target, an invalidation of keys
// (a RESP2 array, or a null for all keys) as one Redis would.
func (s *Client) deliver(keys []byte, null bool) {
	subscribed, resp3 := s.h.PubSub()
	if !subscribed {
		resp3 = s.h.Proto3()
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
	case subscribed:
		frame = append(append([]byte(nil), invalidateMessage...), keys...)
	default:
		return // RESP2 and not subscribed: Redis sends nothing
	}
	s.inject(frame)
}

// inject writes a push to the client, between two replies.
func (s *Client) inject(frame []byte) {
	out := s.h.LockOutput()
	out.Write(frame)
	out.Flush()
	s.h.Unlock()
}

// getRedir answers CLIENT GETREDIR: the REDIRECT id, 0 when tracking
// without one, -1 when not tracking.
func (s *Client) getRedir() cluster.Call {
	t := s.trk.Load()
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
func (s *Client) trackingInfoCall(m *cluster.SlotMap, cmd redcon.Command) cluster.Call {
	c := cluster.Call{Kind: cluster.CallMerge, Op: cluster.OpFirst, Parts: []cluster.Part{{Slot: m.First[0], Addr: m.Master(m.First[0]), Raw: cmd.Raw}}}
	t := s.trk.Load()
	if t == nil {
		return c
	}
	field := fmt.Appendf(nil, "$8\r\nredirect\r\n:%d\r\n", t.redirect)
	r := s.r
	c.Fold = func(replies [][]byte) ([]byte, bool) {
		b := replies[0]
		if cluster.IsError(b) {
			return b, true
		}
		b = redirectField.ReplaceAllLiteral(b, field)
		if _, ok := r.clientIDs.Load(t.redirect); t.redirect != 0 && !ok && !bytes.Contains(b, []byte("$15\r\nbroken_redirect\r\n")) {
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
func (s *Client) cachingCall(m *cluster.SlotMap, cmd redcon.Command) cluster.Call {
	s.caching = true
	return cluster.Fan(m, cmd.Raw, cluster.OpFirst)
}

// endCaching ends a CLIENT CACHING on the masters c did not go to, with
// a PING whose reply is held back from the client.
func (s *Client) endCaching(c *cluster.Call) {
	s.caching = false
	m := s.r.Slots.Load()
	if m == nil {
		return
	}
	used := map[string]bool{}
	if c.Kind != cluster.CallLocal {
		for i := range c.Count() {
			used[c.Part(i).Addr] = true
		}
	}
	deadline := time.Now().Add(s.r.cfg.Retry)
	for i, addr := range m.Masters {
		if used[addr] {
			continue
		}
		p := cluster.Part{Slot: m.First[i], Addr: addr, Raw: cmdPing}
		s.sendPart(&p, cluster.TicketOpts{Own: true, Mute: true}, deadline)
	}
}

// Lost is told that one of the client's own connections was lost other
// than by the proxy's choice (backend.Pusher). While the client tracks
// keys, tracking was on there, and the invalidations the master owed on it
// are gone with it: the client is disconnected, so that it empties its
// cache, as a client of one Redis is (and as Redis closing the connection
// does). Otherwise the next command dials again.
func (s *Client) Lost() bool {
	if s.trk.Load() == nil {
		return false
	}
	s.h.Disconnect()
	return true
}
