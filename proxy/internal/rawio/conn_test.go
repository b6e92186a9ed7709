package rawio

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"
)

// tcpPair returns both ends of a loopback TCP connection, and Conns over
// them.
func tcpPair(t *testing.T) (net.Conn, net.Conn, *Conn, *Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	a, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	ra, _ := a.(syscall.Conn).SyscallConn()
	rb, _ := b.(syscall.Conn).SyscallConn()
	return a, b, New(ra), New(rb)
}

// TestConnCarriesBytes: what one end writes, more than the socket buffers
// hold at once, the other reads whole and in order; then EOF.
func TestConnCarriesBytes(t *testing.T) {
	a, _, ca, cb := tcpPair(t)
	want := bytes.Repeat([]byte("0123456789abcdef"), 1<<18) // 4 MB
	done := make(chan error, 1)
	go func() {
		n, err := ca.Write(want)
		if err == nil && n != len(want) {
			err = io.ErrShortWrite
		}
		a.(*net.TCPConn).CloseWrite()
		done <- err
	}()
	got, err := io.ReadAll(cb)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("read %d bytes, wrote %d, or not the same", len(got), len(want))
	}
	if n, err := cb.Read(make([]byte, 8)); n != 0 || err != io.EOF {
		t.Fatalf("after the end: %d, %v; want 0, EOF", n, err)
	}
}

// TestConnDeadlinesAndClose: the net.Conn's deadlines bound a read and a
// write that wait, and a Close ends them with net.ErrClosed.
func TestConnDeadlinesAndClose(t *testing.T) {
	a, b, ca, cb := tcpPair(t)
	b.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	start := time.Now()
	if _, err := cb.Read(make([]byte, 8)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read past its deadline: %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("read past its deadline returned after %v", d)
	}
	// Nobody reads b: a write of more than the buffers hold waits for
	// room until its deadline.
	a.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	n, err := ca.Write(make([]byte, 64<<20))
	if !errors.Is(err, os.ErrDeadlineExceeded) || n == 0 || n >= 64<<20 {
		t.Fatalf("write past its deadline: %d bytes, %v", n, err)
	}
	b.SetReadDeadline(time.Time{})
	errc := make(chan error, 1)
	go func() {
		buf := make([]byte, 1<<20)
		for {
			if _, err := cb.Read(buf); err != nil {
				errc <- err
				return
			}
		}
	}()
	time.Sleep(20 * time.Millisecond)
	b.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("read after Close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a read waiting on a closed socket did not end")
	}
}

// TestConnFits: a write that Fits never waits. While the other end reads
// nothing, the writer writes 1000 bytes at a time while Fits says they
// fit, each write returning at once, until they no longer do (the peer's
// buffers and then the sender's are full). Once the other end has read
// everything, they fit again. Nothing fits a closed Conn.
func TestConnFits(t *testing.T) {
	a, _, ca, cb := tcpPair(t)
	if !ca.Fits(1000) {
		t.Fatal("1000 bytes do not fit an idle connection")
	}
	a.SetWriteDeadline(time.Now().Add(2 * time.Second)) // a write that waits fails
	sent := 0
	chunk := make([]byte, 1000)
	for range 100000 {
		if !ca.Fits(len(chunk)) {
			break
		}
		if _, err := ca.Write(chunk); err != nil {
			t.Fatalf("a write of 1000 bytes that fit, after %d: %v", sent, err)
		}
		sent += len(chunk)
	}
	if ca.Fits(len(chunk)) || sent == 0 {
		t.Fatalf("1000 bytes still fit after %d bytes the other end did not read", sent)
	}
	buf := make([]byte, 1<<16)
	for got := 0; got < sent; {
		n, err := cb.Read(buf)
		if err != nil {
			t.Fatalf("reading what was sent, after %d of %d: %v", got, sent, err)
		}
		got += n
	}
	deadline := time.Now().Add(5 * time.Second)
	for !ca.Fits(len(chunk)) {
		if time.Now().After(deadline) {
			t.Fatal("1000 bytes do not fit after the other end read everything")
		}
		time.Sleep(time.Millisecond)
	}
	a.Close()
	ca.queued = -1 // as before the first ask: the kernel is asked
	if ca.Fits(1) {
		t.Fatal("a byte fits a closed Conn")
	}
}
