package proxy

import (
	"errors"
	"net"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/lockproxy/lockproxy/proxy/internal/backend"
	"github.com/lockproxy/lockproxy/proxy/internal/resp"
)

// ProtocolError is a request that breaks the RESP protocol or one of the
// configured request limits (resp.Scanner): the client gets
// "-ERR Protocol error: <Msg>" and its connection is closed, as Redis does.
type ProtocolError = resp.ProtocolError

// clientConn is a client's connection as redcon sees it. Its Read enforces
// the request limits and the idle timeout before redcon's parser runs; for
// a client the reading loop reads (loop.go), it first waits until the loop
// hands the socket over, and delivers what the loop read and did not
// forward.
type clientConn struct {
	net.Conn
	sc   resp.Scanner
	idle time.Duration
	// sess is set in the accept callback, before the first Read.
	sess *session
	// order is the socket's place in the arrival order; nil: none.
	order *backend.Arrival
	err   error
	// broken is set once a write to the client failed.
	broken atomic.Bool

	// The reading loop's (loop.go). looped: the loop reads the socket,
	// and Read waits until it hands it over (only the client's goroutine
	// uses it). lstate is where the socket is (lIdle ...); wake hands it
	// over, with hand, what the loop read and passed on to nobody, and
	// herr, the error Read returns after it. part is what the loop read
	// of a request that has not fully come.
	looped bool
	lraw   syscall.RawConn
	lstate atomic.Int32
	wake   chan struct{}
	hand   []byte
	herr   error
	part   []byte
}

// Where a looped socket is: the loop's, idle; the loop's, being read
// (busy), maybe with a Close waiting for the read to end (busyClosing);
// handed over to the client's goroutine; or closed while the loop's.
const (
	lIdle int32 = iota + 1
	lBusy
	lBusyClosing
	lHanded
	lClosed
)

// errLoopClosed is what Read returns for a socket closed while the loop
// read it.
var errLoopClosed = errors.New("use of closed network connection")

// Close closes the socket. The loop's socket is taken from the loop
// first, and its goroutine, waiting in Read, is woken: by Close when the
// loop is not reading it, or by the loop when its read ends.
func (c *clientConn) Close() error {
	for {
		switch c.lstate.Load() {
		case lIdle:
			if !c.lstate.CompareAndSwap(lIdle, lClosed) {
				continue
			}
			c.order.Remove()
			c.sess.p.m.loopClients.Add(-1)
			c.herr = errLoopClosed
			c.wake <- struct{}{}
		case lBusy:
			if !c.lstate.CompareAndSwap(lBusy, lBusyClosing) {
				continue
			}
		}
		return c.Conn.Close()
	}
}

func (c *clientConn) Write(b []byte) (int, error) {
	if len(b) == 0 {
		// redcon flushes its own, always empty, writer after every batch;
		// an empty Write would still cost a system call.
		return 0, nil
	}
	n, err := c.Conn.Write(b)
	if err != nil {
		c.broken.Store(true)
	}
	return n, err
}

func (c *clientConn) Read(b []byte) (int, error) {
	if c.looped {
		// The loop reads the socket until it hands it over.
		<-c.wake
		c.looped = false
	}
	if len(c.hand) > 0 {
		n := copy(b, c.hand)
		if c.hand = c.hand[n:]; len(c.hand) == 0 {
			c.hand = nil
		}
		return n, nil
	}
	if c.herr != nil {
		return 0, c.herr
	}
	if c.sc.Pending() {
		return c.sc.Drain(b), nil
	}
	if c.err != nil {
		c.sess.protocolError(c.err)
		return 0, c.err
	}
	for {
		if c.idle > 0 {
			c.Conn.SetReadDeadline(time.Now().Add(c.idle))
		}
		n, err := c.Conn.Read(b)
		if n > 0 {
			k, verr := c.sc.Scan(b[:n])
			if k == 0 && c.sc.Pending() {
				k = c.sc.Drain(b)
			}
			if verr != nil {
				c.err = verr
				if k == 0 {
					c.sess.protocolError(verr)
					return 0, verr
				}
				return k, nil
			}
			if k > 0 || err != nil {
				return k, err
			}
			// Nothing to pass on yet: a request Redis skips, or the start
			// of a line.
			continue
		}
		// Like Redis's timeout setting, the idle timeout spares clients
		// that wait on a blocking command, a subscription or MONITOR.
		var ne net.Error
		if err != nil && c.idle > 0 && errors.As(err, &ne) && ne.Timeout() && c.sess.waiting() {
			continue
		}
		return n, err
	}
}
