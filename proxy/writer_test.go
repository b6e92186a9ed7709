package proxy

import (
	"net"
	"sync"
	"testing"
	"time"
)

// TestWriterReplyWhileOutputLocked: a reply a reader appends to a pushed
// client's sink while another goroutine holds the output (lockOutput: a
// MONITOR line, a keyspace message, an invalidation being copied) is
// written once that goroutine unlocks: the reader's pushOut found the
// lock held and left the sink to the holder.
func TestWriterReplyWhileOutputLocked(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	peer, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	nc, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	var w clientWriter
	var wg sync.WaitGroup
	w.init(&clientConn{Conn: nc}, &wg, true)
	if !w.pushed() {
		t.Fatal("a plain TCP client of the shared connections is not pushed to")
	}

	out := w.lockOutput()
	out.Write([]byte("+line\r\n"))
	pushed := make(chan struct{})
	go func() {
		w.Write([]byte("+PONG\r\n")) // the reader's copy into the sink
		w.pushOut()                  // finds w.mu held: returns at once
		close(pushed)
	}()
	<-pushed
	out.Flush()
	w.unlock()

	want := "+line\r\n+PONG\r\n"
	got := make([]byte, 0, len(want))
	buf := make([]byte, 64)
	peer.SetReadDeadline(time.Now().Add(2 * time.Second))
	for len(got) < len(want) {
		n, err := peer.Read(buf)
		got = append(got, buf[:n]...)
		if err != nil {
			t.Fatalf("the client got %q, want %q: %v", got, want, err)
		}
	}
	if string(got) != want {
		t.Fatalf("the client got %q, want %q", got, want)
	}
	wg.Wait()
}
