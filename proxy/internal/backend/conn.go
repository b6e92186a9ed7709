package backend

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"time"

	"github.com/tidwall/redcon"

	"github.com/lockproxy/lockproxy/proxy/internal/rawio"
	"github.com/lockproxy/lockproxy/proxy/internal/resp"
	"github.com/lockproxy/lockproxy/proxy/internal/sentinel"
)

// Conn is one connection to a backend Redis. Clients' commands reach it
// through the proxy's batching, which writes NC and reads R; W carries
// only the proxy's own commands (Setup, Call). A Conn is used by one
// goroutine at a time; who that is, and who guards Dead, is the proxy's
// business.
type Conn struct {
	NC   net.Conn
	R    *bufio.Reader
	W    *bufio.Writer // the proxy's own commands (setup, COMMAND); clients' go through a shared's write buffer
	Dead bool          // guarded by the session's replyQueue on a connection of one (NewOne), by Mux.mu on the others
	Done chan struct{} // closed when the reader of a connection of one ends
	// pending is set on a shared connection and a cluster client's own
	// (Mux): whose replies are coming.
	pending *pending
	// out is where the clients' commands are written (Mux.write): the
	// socket through rawio on plain TCP and unix sockets, as R reads it;
	// NC over TLS.
	out io.Writer
}

// Dial opens a connection to addr ("host:port", or a unix socket's path,
// "/..." or "unix:..."), with TLS when tc is set, within ctx (whose
// deadline bounds the dial and the TLS handshake). The connection is sent
// nothing: bringing it to a client's state is the caller's (Setup).
func Dial(ctx context.Context, addr string, tc *tls.Config) (*Conn, error) {
	network := "tcp"
	if strings.HasPrefix(addr, "/") || strings.HasPrefix(addr, "unix:") {
		network, addr = "unix", strings.TrimPrefix(addr, "unix:")
	}
	d := net.Dialer{}
	nc, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	if tc != nil {
		c := tls.Client(nc, tc)
		if err := c.HandshakeContext(ctx); err != nil {
			nc.Close()
			return nil, err
		}
		nc = c
	}
	// Replies are read, and the clients' commands written, through
	// rawio when the socket allows it: the forwarding path's system calls
	// then leave the Go scheduler's monitor asleep (see rawio). Only the
	// proxy's own commands go through W (setup, COMMAND): the clients'
	// leave from a shared's write buffer.
	var rw io.ReadWriter = nc
	if sc, ok := nc.(syscall.Conn); ok {
		if rc, err := sc.SyscallConn(); err == nil {
			rw = rawio.New(rc)
		}
	}
	return &Conn{
		NC:   nc,
		R:    bufio.NewReaderSize(rw, 16<<10),
		W:    bufio.NewWriterSize(nc, 512),
		Done: make(chan struct{}),
		out:  rw,
	}, nil
}

// fits reports whether a write of n bytes to c takes them at once,
// without waiting for its server to read (rawio.Conn's Fits; false
// outside rawio's sockets).
func (c *Conn) fits(n int) bool {
	if rw, ok := c.out.(*rawio.Conn); ok {
		return rw.Fits(n)
	}
	return false
}

// apart reports whether c's server answers from another CPU than the
// caller's (rawio.Conn's Apart; false outside rawio's sockets).
func (c *Conn) apart() bool {
	if rw, ok := c.out.(*rawio.Conn); ok {
		return rw.Apart()
	}
	return false
}

// Setup sends cmds in one write and checks that none failed: a command
// the backend refuses is a *RefusedError. It gives up when ctx ends (the
// spares' filler at shutdown, a client that left).
func (c *Conn) Setup(ctx context.Context, cmds [][]byte) error {
	deadline, _ := ctx.Deadline()
	c.NC.SetDeadline(deadline)
	defer c.NC.SetDeadline(time.Time{})
	stop := context.AfterFunc(ctx, func() { c.NC.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	for _, cmd := range cmds {
		c.W.Write(cmd)
	}
	if err := c.W.Flush(); err != nil {
		return err
	}
	var reply bytes.Buffer
	w := bufio.NewWriter(&reply)
	var ri resp.ReplyInfo
	for _, cmd := range cmds {
		reply.Reset()
		if err := resp.CopyReply(w, c.R, &ri); err != nil {
			return err
		}
		w.Flush()
		if ri.Type == '-' {
			name, _ := redcon.Parse(cmd)
			return &RefusedError{Command: strings.ToUpper(string(name.Args[0])),
				Reply: strings.TrimSpace(reply.String()[1:])}
		}
	}
	return nil
}

// Call sends cmd on c, a connection of the proxy's, and returns its
// reply whole, within ctx's deadline.
func (c *Conn) Call(ctx context.Context, cmd []byte) ([]byte, error) {
	deadline, _ := ctx.Deadline()
	c.NC.SetDeadline(deadline)
	defer c.NC.SetDeadline(time.Time{})
	if _, err := c.W.Write(cmd); err != nil {
		return nil, err
	}
	if err := c.W.Flush(); err != nil {
		return nil, err
	}
	var out bytes.Buffer
	w := bufio.NewWriter(&out)
	var ri resp.ReplyInfo
	if err := resp.CopyReply(w, c.R, &ri); err != nil {
		return nil, err
	}
	w.Flush()
	return out.Bytes(), nil
}

// Role asks the server c is connected to for its ROLE ("master",
// "slave", "sentinel"), within ctx's deadline.
func (c *Conn) Role(ctx context.Context) (string, error) {
	deadline, _ := ctx.Deadline()
	c.NC.SetDeadline(deadline)
	if _, err := c.NC.Write(redcon.AppendBulkString(redcon.AppendArray(nil, 1), "ROLE")); err != nil {
		return "", err
	}
	var ri resp.ReplyInfo
	b, err := resp.ReadFrame(c.R, &ri)
	if err != nil {
		return "", err
	}
	// *3\r\n$6\r\nmaster\r\n...
	lines := bytes.SplitN(b, []byte("\r\n"), 4)
	if ri.Type != '*' || len(lines) < 3 || len(lines[1]) == 0 || lines[1][0] != '$' {
		return "", fmt.Errorf("ROLE answered %q", bytes.TrimSpace(lines[0]))
	}
	return string(lines[2]), nil
}

// Open reports whether an idle connection is still open and has nothing to
// read: Redis may have closed it since (its timeout setting, CLIENT KILL, a
// restart). It peeks at the socket without waiting; a deadline would not
// do, since Go reports an expired one without reading.
func (c *Conn) Open() bool {
	if c.R.Buffered() > 0 {
		return false
	}
	nc := c.NC
	if tc, ok := nc.(*sentinel.TrackedConn); ok {
		nc = tc.Conn // one a Sentinel follower closes at a failover
	}
	if tc, ok := nc.(*tls.Conn); ok {
		nc = tc.NetConn() // a TLS alert or a FIN shows on the socket alike
	}
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	idle := false
	var b [1]byte
	err = rc.Read(func(fd uintptr) bool {
		_, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		idle = errors.Is(err, syscall.EAGAIN)
		return true // never wait for the socket to become readable
	})
	return err == nil && idle
}

// RefusedError reports that the backend answered with an error a command
// the proxy sent to bring a new connection to the client's state (AUTH,
// HELLO, CLIENT SETNAME, SELECT). Sending it again cannot help, unlike a
// dial that failed.
type RefusedError struct {
	Command string // in upper case
	Reply   string // the backend's error, whole, without its "-" and CRLF
}

// Error returns the command and the backend's reply.
func (e *RefusedError) Error() string { return e.Command + ": " + e.Reply }

// Refused reports whether err is, or wraps, a *RefusedError.
func Refused(err error) bool {
	var r *RefusedError
	return errors.As(err, &r)
}
