package proxy

import (
	"errors"
	"net"
	"sync/atomic"
	"time"
)

// ProtocolError is a request that breaks the RESP protocol or one of the
// configured request limits. The client gets "-ERR Protocol error: <Msg>"
// and its connection is closed, as Redis does.
type ProtocolError struct{ Msg string }

func (e *ProtocolError) Error() string { return "Protocol error: " + e.Msg }

// Redis's own wording for each violation.
var (
	errMultibulkLen = &ProtocolError{"invalid multibulk length"}
	errBulkLen      = &ProtocolError{"invalid bulk length"}
	errInlineLen    = &ProtocolError{"too big inline request"}
	errCountLen     = &ProtocolError{"too big mbulk count string"}
	errBulkCountLen = &ProtocolError{"too big bulk count string"}
)

// scanner states.
const (
	sTop = iota
	sMultibulkLen
	sBulkHeader
	sBulkLen
	sBulkData
	sInline
)

// requestScanner follows the framing of the client's request stream, byte
// by byte, and checks every declared length against the limits before the
// RESP parser sees it. It never allocates and never waits for a declared
// length to arrive: a client that declares a 500 MB bulk and sends three
// bytes has cost three bytes.
type requestScanner struct {
	maxBulk      int64
	maxMultibulk int64
	maxInline    int64

	state  uint8
	num    int64
	digits int
	neg    bool
	args   int64 // bulk strings left in the current multibulk request
	skip   int64 // bytes left of the current bulk string, with its "\r\n"
	inline int64
}

// scan checks b, the next bytes of the stream. It returns how many bytes
// are acceptable and, if the stream broke a rule, the error.
func (sc *requestScanner) scan(b []byte) (int, error) {
	for i := 0; i < len(b); i++ {
		c := b[i]
		switch sc.state {
		case sTop:
			switch c {
			case '*':
				sc.state, sc.num, sc.digits, sc.neg = sMultibulkLen, 0, 0, false
			case '\n', '\r':
				// Empty lines between requests are ignored by Redis.
			default:
				sc.state, sc.inline = sInline, 1
			}
		case sInline:
			if c == '\n' {
				sc.state = sTop
				continue
			}
			sc.inline++
			if sc.inline > sc.maxInline {
				return i, errInlineLen
			}
		case sMultibulkLen, sBulkLen:
			bulk := sc.state == sBulkLen
			switch {
			case c >= '0' && c <= '9':
				sc.digits++
				if sc.digits > 18 {
					if bulk {
						return i, errBulkCountLen
					}
					return i, errCountLen
				}
				sc.num = sc.num*10 + int64(c-'0')
			case c == '-' && sc.digits == 0 && !sc.neg:
				sc.neg = true
			case c == '\r':
			case c == '\n':
				if bulk {
					if sc.neg || sc.digits == 0 || sc.num > sc.maxBulk {
						return i, errBulkLen
					}
					sc.state, sc.skip = sBulkData, sc.num+2
					continue
				}
				if sc.neg || sc.digits == 0 || sc.num > sc.maxMultibulk {
					return i, errMultibulkLen
				}
				if sc.num == 0 {
					sc.state = sTop
					continue
				}
				sc.state, sc.args = sBulkHeader, sc.num
			default:
				if bulk {
					return i, errBulkLen
				}
				return i, errMultibulkLen
			}
		case sBulkHeader:
			if c != '$' {
				return i, &ProtocolError{"expected '$', got '" + string(c) + "'"}
			}
			sc.state, sc.num, sc.digits, sc.neg = sBulkLen, 0, 0, false
		case sBulkData:
			n := int64(len(b) - i)
			if n > sc.skip {
				n = sc.skip
			}
			sc.skip -= n
			i += int(n) - 1
			if sc.skip == 0 {
				sc.args--
				if sc.args == 0 {
					sc.state = sTop
				} else {
					sc.state = sBulkHeader
				}
			}
		}
	}
	return len(b), nil
}

// clientConn is a client's connection as redcon sees it. Its Read enforces
// the request limits and the idle timeout before redcon's parser runs.
type clientConn struct {
	net.Conn
	sc   requestScanner
	idle time.Duration
	// sess is set in the accept callback, before the first Read.
	sess *session
	err  error
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
			k, verr := c.sc.scan(b[:n])
			if verr != nil {
				c.err = verr
				if k == 0 {
					c.sess.protocolError(verr)
					return 0, verr
				}
				return k, nil
			}
			return n, err
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
