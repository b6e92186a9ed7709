package proxy

import (
	"errors"
	"net"
	"sync/atomic"
	"time"

	"github.com/lockproxy/lockproxy/proxy/internal/backend"
	"github.com/lockproxy/lockproxy/proxy/internal/resp"
)

// ProtocolError is a request that breaks the RESP protocol or one of the
// configured request limits (resp.Scanner): the client gets
// "-ERR Protocol error: <Msg>" and its connection is closed, as Redis does.
type ProtocolError = resp.ProtocolError

// clientConn is a client's connection as redcon sees it. Its Read enforces
// the request limits and the idle timeout before redcon's parser runs.
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
