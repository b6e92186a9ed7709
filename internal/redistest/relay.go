package redistest

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Relay forwards TCP connections from an address of its own on 127.0.0.1
// to a server, and holds the data in each direction for a delay that the
// test sets and changes at will: a slow link, on a kernel without tc netem.
// Data keeps its order; a delay applies to the data read after it was set.
// Its methods are safe for concurrent use; the test's cleanup closes it.
type Relay struct {
	// Addr is where clients connect.
	Addr string

	target string
	ln     net.Listener
	delay  atomic.Int64 // time.Duration, one way

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// NewRelay starts a relay to target (host:port).
func NewRelay(tb testing.TB, target string) *Relay {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("relay: %v", err)
	}
	r := &Relay{Addr: ln.Addr().String(), target: target, ln: ln, conns: make(map[net.Conn]struct{})}
	r.wg.Add(1)
	go r.accept()
	tb.Cleanup(r.Close)
	return r
}

// SetDelay makes the relay hold data for d in each direction, so a round
// trip through it takes 2d longer.
func (r *Relay) SetDelay(d time.Duration) { r.delay.Store(int64(d)) }

// Close stops the relay, closes its connections and waits for its
// goroutines.
func (r *Relay) Close() {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	r.closed = true
	r.ln.Close()
	for c := range r.conns {
		c.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
}

// track registers c, or closes it when the relay is closed.
func (r *Relay) track(c net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		c.Close()
		return false
	}
	r.conns[c] = struct{}{}
	return true
}

func (r *Relay) accept() {
	defer r.wg.Done()
	for {
		in, err := r.ln.Accept()
		if err != nil {
			return
		}
		if !r.track(in) {
			return
		}
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			out, err := net.DialTimeout("tcp", r.target, time.Second)
			if err != nil {
				in.Close()
				return
			}
			if !r.track(out) {
				in.Close()
				return
			}
			var done sync.WaitGroup
			done.Add(2)
			go func() { defer done.Done(); r.pipe(out, in) }()
			go func() { defer done.Done(); r.pipe(in, out) }()
			done.Wait()
			r.mu.Lock()
			delete(r.conns, in)
			delete(r.conns, out)
			r.mu.Unlock()
		}()
	}
}

// chunk is data read from one side, due on the other at a time.
type chunk struct {
	data []byte
	due  time.Time
}

// pipe copies src to dst, each chunk held until the delay in force when it
// was read has passed, and closes both when either side ends.
func (r *Relay) pipe(dst, src net.Conn) {
	defer dst.Close()
	defer src.Close()
	q := make(chan chunk, 1024)
	go func() {
		defer close(q)
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				q <- chunk{buf[:n], time.Now().Add(time.Duration(r.delay.Load()))}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range q {
		if d := time.Until(c.due); d > 0 {
			time.Sleep(d)
		}
		if _, err := dst.Write(c.data); err != nil {
			src.Close() // ends the reader
			for range q {
			}
			return
		}
	}
}

// Ping sends PING to addr on a fresh connection and waits for the answer
// until ctx ends.
func Ping(ctx context.Context, addr string) error {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if line != "+PONG\r\n" {
		return fmt.Errorf("PING answered %q", line)
	}
	return nil
}
