package proxy

import (
	"bytes"
	"context"
	"io"
	"net"
	"syscall"

	"github.com/tidwall/redcon"
	"go.uber.org/zap"

	"github.com/lockproxy/lockproxy/proxy/internal/backend"
	"github.com/lockproxy/lockproxy/proxy/internal/rawio"
	"github.com/lockproxy/lockproxy/proxy/internal/resp"
)

// The reading loop. A client that only ever sends commands that share a
// backend connection (resp.Stateless: GET, SET, ...) costs, read by its
// own goroutine, a goroutine switch per read and a collect of the arrival
// order; most clients of a Redis are such clients. So the sockets of new
// clients of one Redis are read by one goroutine of the proxy's, the
// loop, woken by Go's poller when any of them has data (internal/backend,
// Arrivals.Loop). It reads each socket in the arrival order, checks the
// request limits (the client's resp.Scanner), cuts out the whole
// requests and forwards them as the client's goroutine would
// (session.forward) while they are stateless; the commands of every
// client it read then leave in one write per shared connection. The
// replies come back as for any client: the shared connection's reader
// writes them to the socket.
//
// The first request that is anything else (a lock command, MULTI,
// SUBSCRIBE, SELECT, HELLO, a blocking command, QUIT, a protocol error, a
// command refused...) hands the client to its goroutine for good, with
// what the loop read from that request on: the goroutine, which waited in
// clientConn.Read until then, reads the rest of the socket itself, as it
// reads any client's, in the same arrival order. A client the loop reads
// has no goroutine awake and is as cheap idle as any other.
//
// In front of a Redis Cluster the loop forwards a command whose keys are
// all in one slot, on that master's shared connection, when routing it
// waits for nothing (clusterclient.Client.RouteShared); any other command
// hands the client over. Clients over TLS, with an idle timeout, or that
// must sign in at the proxy, and guarded backends, are read by their
// goroutines from the start (Proxy.loopable).
type readLoop struct {
	p    *Proxy
	buf  []byte
	args [][]byte
	// dirty are the shared connections that commands were queued on
	// during the loop's turn: each is flushed once at its end.
	dirty []*backend.Mux
	// cdirty is a cluster client's, taken from it (TakeDirty).
	cdirty []*backend.Mux

	// The run in progress: plain commands of one client of one Redis,
	// one stretch of its read starting at from, size bytes and runN
	// requests, queued on its shared connection together (endRun).
	from []byte
	size int
	runN int
	nb   [24]byte

	// The read in progress (readFD, made once).
	rd   func(fd uintptr) bool
	n    int
	rerr error
}

// loopBuf is the size of the loop's reads.
const loopBuf = 64 << 10

// startLoop readies the reading loop when the proxy has one: when it keeps
// the arrival order (whose epoll instance the loop waits on) and the
// configuration leaves it on.
func (p *Proxy) startLoop() {
	if p.order == nil || !p.cfg.ReadLoop {
		return
	}
	run, err := p.order.Loop()
	if err != nil {
		p.log.Warn("reading loop", zap.Error(err))
		return
	}
	if p.router != nil {
		// The loop plans a cluster client's command only with the slot
		// map and the COMMAND table at hand (cluster.Client.PlanShared):
		// read them now, not at the first client's first command, which
		// would go to that client's goroutine for good.
		p.loopWG.Add(1)
		go func() {
			defer p.loopWG.Done()
			ctx, cancel := context.WithTimeout(p.root, p.cfg.Backend.DialTimeout)
			defer cancel()
			if _, err := p.router.Current(ctx); err == nil {
				p.router.Commands(ctx)
			}
		}()
	}
	l := &readLoop{p: p, buf: make([]byte, loopBuf)}
	l.rd = l.readFD
	p.looping.Store(true)
	p.loopWG.Add(1)
	go func() {
		defer p.loopWG.Done()
		run(l.serve)
	}()
}

// loopable reports whether the loop may read the session's client: the
// client's stateless commands share the backend's connections (one
// Redis's, the primary's a Sentinel names, or each cluster master's), the socket is plain TCP
// without an idle timeout (the loop keeps no timers), and nothing is
// checked at the proxy before a command leaves (sign-in, Redis's ACL, the
// guard of the lock state).
func (p *Proxy) loopable(s *session, cc *clientConn) bool {
	return p.looping.Load() && (s.sh != nil || s.cl != nil) && cc.idle == 0 &&
		p.cfg.TLS == nil && p.auth == nil && p.acl == nil && p.guard == nil
}

// loop hands the client's socket to the loop, if the loop may read it.
func (p *Proxy) loop(s *session, cc *clientConn) {
	if !p.loopable(s, cc) {
		return
	}
	sc, ok := cc.Conn.(syscall.Conn)
	if !ok {
		return
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return
	}
	cc.lraw = raw
	cc.wake = make(chan struct{}, 1)
	cc.looped = true
	cc.lstate.Store(lIdle)
	p.m.loopClients.Add(1)
	if !cc.order.Serve(cc) {
		p.m.loopClients.Add(-1)
		cc.looped = false
		cc.lstate.Store(0)
	}
}

// serve reads the sockets that have data, in their arrival order, then
// writes what their commands queued.
func (l *readLoop) serve(ready []*backend.Arrival) {
	for _, a := range ready {
		c := a.Owner().(*clientConn)
		if !c.lstate.CompareAndSwap(lIdle, lBusy) {
			continue // closed meanwhile
		}
		l.read(c, a)
	}
	for i, sh := range l.dirty {
		sh.FlushTurn()
		l.dirty[i] = nil
	}
	l.dirty = l.dirty[:0]
}

// read reads c's socket once and forwards the whole requests that came,
// or hands c over to its goroutine.
func (l *readLoop) read(c *clientConn, a *backend.Arrival) {
	s := c.sess
	defer func() {
		if r := recover(); r != nil {
			l.from, l.size, l.runN = nil, 0, 0 // a run of this read, not the next one's
			s.log.Error("panic serving client; closing its connection", zap.Any("panic", r), zap.StackSkip("stack", 1))
			c.Conn.Close()
			if st := c.lstate.Load(); st == lBusy || st == lBusyClosing {
				// Not handed over or released yet: its goroutine is
				// woken once, to end.
				l.handOff(c, a, nil, errLoopClosed)
			}
		}
	}()
	a.StartRead()
	err := c.lraw.Read(l.rd)
	n := l.n
	if err != nil || l.rerr != nil {
		n = 0
	}
	a.Read(n)
	switch {
	case n == 0 && err == nil && l.rerr == syscall.EAGAIN:
		// Collected for data an earlier read took.
		a.Done(false)
		l.release(c, a)
		return
	case err != nil:
		l.handOff(c, a, nil, &net.OpError{Op: "read", Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err})
		return
	case l.rerr != nil:
		l.handOff(c, a, nil, &net.OpError{Op: "read", Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: l.rerr})
		return
	case n == 0:
		l.handOff(c, a, nil, io.EOF)
		return
	}
	k, verr := c.sc.Scan(l.buf[:n])
	data := l.buf[:k]
	if len(c.part) > 0 || c.sc.Pending() {
		// What the scanner wrote where its input was, then what did not
		// fit there (a line cut between reads).
		c.part = c.sc.AppendPending(append(c.part, data...))
		data = c.part
	}
	if verr != nil {
		// Its goroutine answers the protocol error after the requests
		// before it.
		c.err = verr
		l.handOff(c, a, data, nil)
		return
	}
	for len(data) > 0 {
		complete, args, _, rest, perr := redcon.ReadNextCommand(data, l.args)
		if perr != nil {
			l.handOff(c, a, l.endRun(s, a, data), nil)
			return
		}
		if !complete {
			break
		}
		l.args = args[:0]
		if len(args) == 0 {
			// A request Redis skips (the scanner leaves none): it ends
			// the run, whose requests are one stretch of data.
			if from := l.endRun(s, a, nil); from != nil {
				l.handOff(c, a, from, nil)
				return
			}
			data = rest
			continue
		}
		cmd := redcon.Command{Raw: data[:len(data)-len(rest)], Args: args}
		name := s.loopName(&l.nb, cmd)
		if name == nil {
			l.handOff(c, a, l.endRun(s, a, data), nil)
			return
		}
		if s.plain(name) {
			if l.runN == 0 {
				l.from = data
			}
			l.size += len(cmd.Raw)
			l.runN++
			data = rest
			continue
		}
		if from := l.endRun(s, a, nil); from != nil {
			l.handOff(c, a, from, nil)
			return
		}
		if !s.loopForward(cmd, a) {
			// Refused (the backend cannot be reached): its goroutine
			// answers it, in its place, and serves the client from now on.
			l.handOff(c, a, data, nil)
			return
		}
		data = rest
	}
	if from := l.endRun(s, a, nil); from != nil {
		l.handOff(c, a, from, nil)
		return
	}
	l.keep(c, data)
	if s.sharedOut {
		s.sharedOut = false
		if s.cl != nil {
			l.cdirty = s.cl.TakeDirty(l.cdirty[:0])
			for i, sh := range l.cdirty {
				l.touch(sh)
				l.cdirty[i] = nil
			}
		} else {
			l.touch(s.sh)
		}
	}
	a.Done(n == len(l.buf))
	l.release(c, a)
}

// endRun queues the run in progress, if any, on s's shared connection,
// as s.forward would queue each of its commands. It returns nil when it
// did, or had nothing to do; otherwise, when the backend cannot be
// reached, nothing of the run was sent, and it returns the read from the
// run's start, for s's goroutine to answer. With none to queue it returns
// rest.
func (l *readLoop) endRun(s *session, a *backend.Arrival, rest []byte) []byte {
	if l.runN == 0 {
		return rest
	}
	from, run, n := l.from, l.from[:l.size], l.runN
	l.from, l.size, l.runN = nil, 0, 0
	a.Wait()
	if err := s.sh.QueueRun(s, run, n); err != nil {
		return from
	}
	s.sharedOut, s.waitStale = true, true
	s.p.m.forwarded.Add(uint64(n))
	return rest
}

// readFD is the read of a socket, through its RawConn, which keeps the
// descriptor from being closed under it; it never waits for the poller.
func (l *readLoop) readFD(fd uintptr) bool {
	n, e := rawio.Read(fd, l.buf)
	l.n, l.rerr = n, nil
	if e != 0 {
		l.rerr = e
	}
	return true
}

// keep keeps data, the start of a request still to come, for c's next
// read.
func (l *readLoop) keep(c *clientConn, data []byte) {
	switch {
	case len(data) == 0 && cap(c.part) > 16<<10:
		c.part = nil
	case len(data) == 0:
		c.part = c.part[:0]
	case len(c.part) > 0 && &data[len(data)-1] == &c.part[len(c.part)-1]:
		// data is the tail of part.
		c.part = c.part[:copy(c.part, data)]
	default:
		c.part = append(c.part[:0], data...)
	}
}

// touch notes that commands wait on sh, to be written at the turn's end.
func (l *readLoop) touch(sh *backend.Mux) {
	for _, d := range l.dirty {
		if d == sh {
			return
		}
	}
	l.dirty = append(l.dirty, sh)
}

// release gives c back to the loop after a read, or, when c was closed
// during it, wakes its goroutine to end it.
func (l *readLoop) release(c *clientConn, a *backend.Arrival) {
	if c.lstate.CompareAndSwap(lBusy, lIdle) {
		return
	}
	a.Remove()
	c.lstate.Store(lClosed)
	l.p.m.loopClients.Add(-1)
	c.herr = errLoopClosed
	c.wake <- struct{}{}
}

// handOff hands c over to its goroutine for good, with data, what the
// loop read and did not pass on, and then herr, if set.
func (l *readLoop) handOff(c *clientConn, a *backend.Arrival, data []byte, herr error) {
	if len(data) > 0 {
		c.hand = bytes.Clone(data)
	}
	c.part = nil
	c.herr = herr
	if herr != nil {
		a.End() // nothing of this read is left to pass on
	}
	a.Unloop()
	l.p.m.loopClients.Add(-1)
	if herr == nil {
		l.p.m.handedOver.Add(1)
	}
	if !c.lstate.CompareAndSwap(lBusy, lHanded) {
		// Closed meanwhile.
		a.Remove()
		c.lstate.Store(lClosed)
		c.hand, c.herr = nil, errLoopClosed
	}
	c.wake <- struct{}{}
}

// loopForward forwards cmd as the client's goroutine would, and reports
// whether it did; otherwise nothing of it was sent. In front of a cluster
// only what goes on a shared connection without waiting is forwarded
// (clusterclient.Client.RouteShared).
func (s *session) loopForward(cmd redcon.Command, a *backend.Arrival) bool {
	if s.cl == nil {
		_, forwarded := s.forward(cmd, a)
		return forwarded
	}
	name := resp.Lower(&s.nb, cmd.Args[0])
	a.Wait()
	return s.cl.RouteShared(name, cmd)
}

// loopName returns cmd's name, lowered into nb, when the loop forwards
// cmd: a command that shares the client's connection and that the proxy
// does not look at; nil otherwise.
func (s *session) loopName(nb *[24]byte, cmd redcon.Command) []byte {
	name := resp.Lower(nb, cmd.Args[0])
	if name == nil || !resp.Stateless(name) {
		return nil
	}
	switch string(name) {
	case "quit", "info", "command", "fenced":
		return nil
	}
	if s.p.cfg.IsLocal != nil && s.p.cfg.IsLocal(cmd.Args[0]) {
		return nil
	}
	for _, a := range cmd.Args[1:] {
		if bytes.HasPrefix(a, fencePrefix) {
			return nil // a fence token (guardRecords)
		}
	}
	return name
}

// plain reports whether the loop queues the command name, which
// loopName let through, in a run (readLoop.endRun) rather than through
// forward: a command of no effect on the connection (resp.Plain) from a
// client of one Redis still on its shared connection, which forward
// would queue there as it is (single.forward).
func (s *session) plain(name []byte) bool {
	return s.cl == nil && s.sh != nil && !s.dedicated && !s.replica && resp.Plain(name)
}

var fencePrefix = []byte(FencePrefix)
