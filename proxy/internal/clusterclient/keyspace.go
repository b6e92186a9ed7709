package clusterclient

import (
	"bytes"
	"context"
	"sync"
	"time"

	"github.com/lockproxy/lockproxy/proxy/internal/backend"
	"github.com/lockproxy/lockproxy/proxy/internal/cluster"
	"github.com/lockproxy/lockproxy/proxy/internal/resp"
)

// Keyspace notifications in front of a cluster. A master publishes the
// events of its own keys (__keyspace@0__:key, __keyevent@0__:event) to
// its own subscribers only, while the client's subscriptions are on its
// pinned node (the session's pub/sub). So the SUBSCRIBEs to keyspace channels
// and every PSUBSCRIBE (a pattern may match them) are made on every other
// master too, on a connection per master of the client's (a mirror),
// before the client gets its confirmation: an event of a command sent
// after it is not missed. A mirror's readers pass on to the client only
// the keyspace messages of subscriptions the client still holds; their
// confirmations, and the messages PUBLISH broadcasts to every node, are
// the pinned node's to give. UNSUBSCRIBE and PUNSUBSCRIBE go to the
// mirrors too; they are closed with the pinned connection.
//
// Two differences are left: the messages of several masters interleave in
// the order they come, as from several Redis, those of one master keeping
// its order; and a PUBLISH to a keyspace channel itself, which the cluster
// broadcasts to every node, reaches the client from every mirror too (a
// mirror cannot tell it from an event of its master's).

// keyspaceChannel reports whether a channel is a keyspace notification's.
func keyspaceChannel(ch []byte) bool {
	return bytes.HasPrefix(ch, []byte("__keyspace@")) || bytes.HasPrefix(ch, []byte("__keyevent@"))
}

// mirrors are a cluster client's keyspace mirror connections.
type mirrors struct {
	mu       sync.Mutex
	conns    []*mirror
	channels map[string]bool // the keyspace channels the client holds
	patterns map[string]bool // the patterns it holds
}

// mirror is one master's mirror connection.
type mirror struct {
	addr string
	be   *backend.Conn
	acks chan struct{} // a (p)subscribe confirmation came
}

// MirrorSubscriptions makes a (P)SUBSCRIBE or (P)UNSUBSCRIBE the client
// sends to its pinned node on the mirrors too, when it concerns keyspace
// notifications; a subscription is confirmed by every mirror before this
// returns.
func (s *Client) MirrorSubscriptions(name []byte, args [][]byte) {
	var subs [][]byte
	unsub := false
	switch string(name) {
	case "subscribe":
		for _, ch := range args[1:] {
			if keyspaceChannel(ch) {
				subs = append(subs, ch)
			}
		}
	case "psubscribe":
		subs = args[1:]
	case "unsubscribe", "punsubscribe":
		unsub = true
	default:
		return
	}
	mr := &s.mirrors
	mr.mu.Lock()
	if unsub {
		set := mr.channels
		if string(name) == "punsubscribe" {
			set = mr.patterns
		}
		if len(args) == 1 {
			clear(set)
		}
		for _, a := range args[1:] {
			delete(set, string(a))
		}
		conns := mr.conns
		mr.mu.Unlock()
		if len(conns) > 0 {
			raw := resp.Encode(args)
			for _, m := range conns {
				m.be.NC.SetWriteDeadline(time.Now().Add(s.r.cfg.DialTimeout))
				m.be.NC.Write(raw)
			}
		}
		return
	}
	if len(subs) == 0 {
		mr.mu.Unlock()
		return
	}
	if mr.channels == nil {
		mr.channels, mr.patterns = map[string]bool{}, map[string]bool{}
	}
	set := mr.channels
	if string(name) == "psubscribe" {
		set = mr.patterns
	}
	for _, a := range subs {
		set[string(a)] = true
	}
	mr.mu.Unlock()
	conns := s.openMirrors()
	cmd := append([][]byte{args[0]}, subs...)
	raw := resp.Encode(cmd)
	deadline := time.Now().Add(s.r.cfg.DialTimeout)
	for _, m := range conns {
		m.be.NC.SetWriteDeadline(deadline)
		if _, err := m.be.NC.Write(raw); err != nil {
			continue
		}
	}
	for _, m := range conns {
		for range subs {
			t := time.NewTimer(time.Until(deadline))
			select {
			case <-m.acks:
			case <-t.C:
			case <-s.ctx.Done():
			}
			t.Stop()
		}
	}
}

// openMirrors returns the client's mirrors, opening one to every master
// but its pinned node that has none.
func (s *Client) openMirrors() []*mirror {
	m := s.r.Slots.Load()
	mr := &s.mirrors
	if m == nil {
		return nil
	}
	mr.mu.Lock()
	have := map[string]bool{}
	for _, c := range mr.conns {
		have[c.addr] = true
	}
	mr.mu.Unlock()
	for _, addr := range m.Masters {
		if addr == s.pinAddr || have[addr] {
			continue
		}
		ctx, cancel := context.WithTimeout(s.ctx, s.r.cfg.DialTimeout)
		be, err := s.h.Dial(ctx, addr, AsPinned)
		cancel()
		if err != nil {
			continue // that master's events are not had; the client's other subscriptions stand
		}
		c := &mirror{addr: addr, be: be, acks: make(chan struct{}, 64)}
		mr.mu.Lock()
		mr.conns = append(mr.conns, c)
		mr.mu.Unlock()
		s.h.Go(func() { s.readMirror(c) })
	}
	mr.mu.Lock()
	defer mr.mu.Unlock()
	return append([]*mirror(nil), mr.conns...)
}

// CloseMirrors closes the mirrors; their readers end.
func (s *Client) CloseMirrors() {
	mr := &s.mirrors
	mr.mu.Lock()
	conns := mr.conns
	mr.conns = nil
	clear(mr.channels)
	clear(mr.patterns)
	mr.mu.Unlock()
	for _, c := range conns {
		c.be.NC.Close()
	}
}

// readMirror reads a mirror until it is closed, passing the client the
// keyspace messages of the subscriptions it holds.
func (s *Client) readMirror(c *mirror) {
	var frames resp.Frames
	mr := &s.mirrors
	for {
		frame, err := frames.Next(c.be.R)
		if err != nil {
			return
		}
		// A confirmation is two bulk strings and the count (an integer),
		// a message three or four bulk strings.
		parts := bulks(frame)
		if len(parts) < 2 {
			continue
		}
		kind := string(bytes.ToLower(parts[0]))
		switch kind {
		case "subscribe", "psubscribe":
			select {
			case c.acks <- struct{}{}:
			default:
			}
			continue
		case "message":
			if len(parts) < 3 {
				continue
			}
			mr.mu.Lock()
			ok := keyspaceChannel(parts[1]) && mr.channels[string(parts[1])]
			mr.mu.Unlock()
			if !ok {
				continue
			}
		case "pmessage":
			if len(parts) < 4 {
				continue
			}
			mr.mu.Lock()
			ok := keyspaceChannel(parts[2]) && mr.patterns[string(parts[1])]
			mr.mu.Unlock()
			if !ok {
				continue
			}
		default:
			continue
		}
		out := s.h.LockOutput()
		out.Write(frame)
		if c.be.R.Buffered() == 0 {
			out.Flush()
		}
		s.h.Unlock()
	}
}

// bulks returns the bulk strings of an array or push frame (up to its
// first element of another type), nil for another frame.
func bulks(frame []byte) [][]byte {
	if len(frame) == 0 || (frame[0] != '*' && frame[0] != '>') {
		return nil
	}
	n, rest, err := cluster.Elements(append([]byte{'*'}, frame[1:]...))
	if err != nil {
		return nil
	}
	var out [][]byte
	for range n {
		k, err := cluster.ValueLen(rest)
		if err != nil || rest[0] != '$' || rest[1] == '-' {
			return out // not a bulk string, or a null one
		}
		j := bytes.IndexByte(rest, '\n')
		out = append(out, rest[j+1:k-2])
		rest = rest[k:]
	}
	return out
}
