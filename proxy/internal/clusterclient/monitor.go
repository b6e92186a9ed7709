package clusterclient

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/lockproxy/lockproxy/proxy/internal/backend"
	"github.com/lockproxy/lockproxy/proxy/internal/cluster"
	"github.com/lockproxy/lockproxy/proxy/internal/resp"
)

// MONITOR in front of a Redis Cluster. The client gets a connection of
// its own to every master, each put in MONITOR mode (with the client's
// AUTH, HELLO and CLIENT SETNAME), and one +OK once all of them are; then
// every line any master sends is copied to the client whole, by one
// goroutine per master, in the order each master sent them (the lines of
// two masters interleave as they arrive: there is no one order of what
// different masters ran). The commands the client sends meanwhile are
// answered as a monitoring client of one Redis is answered: a second
// MONITOR is ignored, a command that reads or writes the keyspace gets
// "Replica can't interact with the keyspace", the others are served;
// RESET ends the monitoring. When a master's connection breaks, the client
// is disconnected, as when the one Redis behind the proxy goes.

var cmdMonitor = []byte("*1\r\n$7\r\nMONITOR\r\n")

// monitorCall starts MONITOR on every master; the commands before it are
// answered first.
func (s *Client) monitorCall(m *cluster.SlotMap) cluster.Call {
	if s.monitoring() {
		return cluster.LocalCall(nil) // Redis ignores it, without a reply
	}
	s.Settle()
	ctx, cancel := context.WithTimeout(s.ctx, s.r.cfg.DialTimeout)
	defer cancel()
	var conns []*backend.Conn
	fail := func(err error) cluster.Call {
		for _, be := range conns {
			be.NC.Close()
		}
		s.r.cfg.Unavailable.Add(1)
		return cluster.LocalCall(s.r.cfg.ErrorReply(err))
	}
	for _, addr := range m.Masters {
		be, err := s.h.Dial(ctx, addr, AsState)
		if err != nil {
			return fail(fmt.Errorf("%s: %w", addr, err))
		}
		conns = append(conns, be)
		if err := be.Setup(ctx, [][]byte{cmdMonitor}); err != nil {
			var r *backend.RefusedError
			if errors.As(err, &r) {
				for _, be := range conns {
					be.NC.Close()
				}
				return cluster.LocalCall([]byte("-" + r.Reply + "\r\n")) // the node's own refusal (NOPERM, ...)
			}
			return fail(fmt.Errorf("%s: %w", addr, err))
		}
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return fail(backend.ErrClosed)
	}
	s.monitors = conns
	s.mu.Unlock()
	s.monitorOn = true
	s.h.Write(resp.ReplyOK)
	for i, be := range conns {
		s.monWG.Add(1)
		s.h.Go(func() { s.copyMonitor(be, i > 0) })
	}
	return cluster.LocalCall(nil)
}

// monitoring reports whether the client is in MONITOR mode. Only the
// forwarder, which starts and ends it, asks.
func (s *Client) monitoring() bool { return s.monitorOn }

// stopMonitor closes the MONITOR connections; s.mu is held.
func (s *Client) stopMonitor() {
	for _, be := range s.monitors {
		be.NC.Close()
	}
	s.monitors = nil
}

// endMonitor ends MONITOR (RESET) and waits until the lines already read
// are written: no line may follow the reply to the command that ended it.
func (s *Client) endMonitor() {
	s.monitorOn = false
	s.mu.Lock()
	s.stopMonitor()
	s.mu.Unlock()
	s.monWG.Wait()
}

// monitorRefuses reports whether a monitoring client's command touches
// the keyspace, which Redis refuses to a monitoring client (a replica, to
// Redis): the commands flagged readonly, write or may_replicate.
func (s *Client) monitorRefuses(name []byte, args [][]byte) bool {
	if !s.monitoring() {
		return false
	}
	table, err := s.r.Commands(s.ctx)
	if err != nil {
		return false
	}
	spec, ok := resp.LookupSpec(table, name, args)
	return ok && spec.Keyspace
}

// copyMonitor copies the MONITOR lines of one master to the client until
// the connection ends. It disconnects the client when the master's
// connection broke while the client was still monitoring.
func (s *Client) copyMonitor(be *backend.Conn, other bool) {
	defer s.monWG.Done()
	var line []byte
	for {
		b, err := be.R.ReadSlice('\n')
		line = append(line, b...)
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if err != nil {
			break
		}
		if other && copiedLine(line) {
			line = line[:0]
			continue
		}
		w := s.h.LockOutput()
		w.Write(line)
		if !hasLine(be.R) {
			w.Flush()
		}
		s.h.Unlock()
		line = line[:0]
	}
	s.mu.Lock()
	lost := false
	for _, m := range s.monitors {
		lost = lost || m == be
	}
	s.mu.Unlock()
	if lost {
		s.h.Disconnect()
	}
}

// hasLine reports whether r holds a whole line already read from its
// connection, so that flushing the client may wait for it.
func hasLine(r *bufio.Reader) bool {
	n := r.Buffered()
	if n == 0 {
		return false
	}
	b, _ := r.Peek(n)
	return bytes.IndexByte(b, '\n') >= 0
}

// copiedLine reports whether a MONITOR line of a master other than the
// slot-0 one shows a command the proxy sends to every master (CONFIG SET,
// FLUSHALL, SLOWLOG GET, ...) or to every connection of a client (AUTH,
// HELLO, CLIENT SETNAME, ...), replayed state included, or a keyspace
// mirror's (P)SUBSCRIBE: the slot-0 master shows it too, and one Redis
// would show it once.
func copiedLine(line []byte) bool {
	i := bytes.Index(line, []byte("] \""))
	if i < 0 {
		return false
	}
	rest := line[i+3:]
	j := bytes.IndexByte(rest, '"')
	if j < 0 {
		return false
	}
	var nb [24]byte
	name := resp.Lower(&nb, rest[:j])
	if name == nil {
		return false
	}
	args := [][]byte{name}
	if k := bytes.Index(rest[j:], []byte(" \"")); k >= 0 {
		sub := rest[j+k+2:]
		if e := bytes.IndexByte(sub, '"'); e >= 0 {
			args = append(args, sub[:e])
		}
	}
	info := resp.Of(name, args)
	// A subscription made on the other masters is a keyspace mirror's
	// (keyspace.go); a shard channel's is the client's own.
	mirrored := info.Has(resp.Subscribes) && info.Family != resp.FamShard
	return info.Flags&(resp.Fanned|resp.EveryConn) != 0 || mirrored
}
