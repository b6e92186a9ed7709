package proxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
)

// startProxy serves a proxy for backend on 127.0.0.1:0 and shuts it down
// at the end of the test.
func startProxy(tb testing.TB, backend string, edit func(*Config)) (string, *Proxy) {
	tb.Helper()
	cfg := DefaultConfig()
	cfg.Backend.Addr = backend
	if edit != nil {
		edit(&cfg)
	}
	p, err := New(cfg, zaptest.NewLogger(tb, zaptest.Level(zap.InfoLevel)))
	if err != nil {
		tb.Fatal(err)
	}
	return serveProxy(tb, p), p
}

// serveProxy serves p on a free loopback port until the test ends, then
// shuts it down and waits for Serve to return; it returns the address.
func serveProxy(tb testing.TB, p *Proxy) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.Serve(ln) }()
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := p.Shutdown(ctx); err != nil {
			tb.Errorf("shutdown: %v", err)
		}
		if err := <-done; err != nil {
			tb.Errorf("serve: %v", err)
		}
	})
	return ln.Addr().String()
}

// serveNew makes a proxy of cfg and serves it on a free loopback port;
// served receives Serve's result. The test shuts it down itself.
func serveNew(tb testing.TB, cfg Config) (p *Proxy, addr string, served chan error) {
	tb.Helper()
	p, err := New(cfg, zaptest.NewLogger(tb, zaptest.Level(zap.InfoLevel)))
	if err != nil {
		tb.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	served = make(chan error, 1)
	go func() { served <- p.Serve(ln) }()
	return p, ln.Addr().String(), served
}

// client is a raw RESP connection that reads whole replies as bytes.
type client struct {
	tb testing.TB
	c  net.Conn
	r  *bufio.Reader
}

func dial(tb testing.TB, addr string) *client {
	tb.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	return &client{tb: tb, c: c, r: bufio.NewReaderSize(c, 64<<10)}
}

// encode returns the RESP request for each command.
func encode(cmds ...[]string) []byte {
	var b bytes.Buffer
	for _, args := range cmds {
		fmt.Fprintf(&b, "*%d\r\n", len(args))
		for _, a := range args {
			fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
		}
	}
	return b.Bytes()
}

func (c *client) send(raw []byte) {
	c.tb.Helper()
	c.c.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.c.Write(raw); err != nil {
		c.tb.Fatalf("write: %v", err)
	}
}

// do sends the commands in one write and returns the raw replies.
func (c *client) do(cmds ...[]string) []byte {
	c.tb.Helper()
	c.send(encode(cmds...))
	return c.read(len(cmds))
}

// read returns the next n replies, byte for byte.
func (c *client) read(n int) []byte {
	c.tb.Helper()
	b, err := c.tryRead(n, 10*time.Second)
	if err != nil {
		c.tb.Fatalf("read %d replies: %v (got %q)", n, err, trunc(b))
	}
	return b
}

func (c *client) tryRead(n int, d time.Duration) ([]byte, error) {
	var out bytes.Buffer
	c.c.SetReadDeadline(time.Now().Add(d))
	for range n {
		if err := readValue(&out, c.r); err != nil {
			return out.Bytes(), err
		}
	}
	return out.Bytes(), nil
}

// readValue appends the next RESP2/RESP3 value from r to out, with the
// value an attribute annotates. It is the tests' own reader, written
// plainly (recursive, whole lines), so that the tests do not judge the
// proxy's reply reader with itself.
func readValue(out *bytes.Buffer, r *bufio.Reader) error {
	line, err := r.ReadBytes('\n')
	out.Write(line)
	if err != nil {
		return err
	}
	if len(line) < 3 || line[len(line)-2] != '\r' {
		return fmt.Errorf("malformed line %q", line)
	}
	body := string(line[1 : len(line)-2])
	switch line[0] {
	case '+', '-', ':', '_', ',', '#', '(':
		return nil
	case '$', '!', '=':
		n, err := strconv.Atoi(body)
		if err != nil || n < 0 {
			return err
		}
		b := make([]byte, n+2)
		k, err := io.ReadFull(r, b)
		out.Write(b[:k])
		return err
	case '*', '~', '>', '%', '|':
		n, err := strconv.Atoi(body)
		if err != nil {
			return err
		}
		if line[0] == '%' || line[0] == '|' {
			n *= 2
		}
		if line[0] == '|' {
			n++ // the annotated value
		}
		for range n {
			if err := readValue(out, r); err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("unexpected type %q", line[0])
}

// closed reports whether the server closed the connection (after reading
// and returning whatever it sent before).
func (c *client) closedAfter(d time.Duration) (string, bool) {
	c.c.SetReadDeadline(time.Now().Add(d))
	var b bytes.Buffer
	buf := make([]byte, 4096)
	for {
		n, err := c.r.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			var ne net.Error
			return b.String(), !(errors.As(err, &ne) && ne.Timeout())
		}
	}
}

func trunc(b []byte) string {
	if len(b) > 300 {
		return string(b[:300]) + fmt.Sprintf("... (%d bytes)", len(b))
	}
	return string(b)
}

func args(s string) []string { return strings.Fields(s) }
