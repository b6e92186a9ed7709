package proxy

import (
	"bufio"
	"io"
	"sync"
	"syscall"

	"github.com/lockproxy/lockproxy/proxy/internal/rawio"
	"github.com/lockproxy/lockproxy/proxy/internal/resp"
)

// clientWriter is the write side of a client connection. Replies reach it
// three ways: the reader of the client's connection of one (backend.NewOne)
// copies them into the buffered writer (copyFrom); the shared connections' readers append them to the
// sink, which is written by pushOut, or by whoever writes next; and the
// proxy's own replies (write).
//
// Lock order. A session has three locks: replyQueue.mu, clientWriter.mu
// and clientWriter.sinkMu. clientWriter.mu is taken before sinkMu and never
// while sinkMu is held; replyQueue.mu is never held together with either
// of them. Outside the session, backend.Mux's lock may be held while taking
// replyQueue.mu (Mux.Queue, session.Queued), never the other way round, and never with
// a writer lock.
type clientWriter struct {
	nc *clientConn
	wg *sync.WaitGroup // counts the goroutines pushOut starts

	mu      sync.Mutex    // guards out, spare, rw and the socket's writes
	out     *bufio.Writer // made on first use: an idle client needs none
	discard *bufio.Writer // replies nobody reads; the reader of the connection of one's own

	// sink collects the replies from the shared connection until they are
	// written to the client.
	sinkMu sync.Mutex
	sink   []byte
	spare  []byte // the last sink written, for the next takeSink
	// raw is the client's socket when it is plain TCP and the client uses
	// a shared connection: the shared reader then writes replies to it
	// directly (see pushOut). Set once, before the first reply.
	raw syscall.RawConn
	rw  rawWrite
}

func (w *clientWriter) init(nc *clientConn, wg *sync.WaitGroup, shared bool) {
	w.nc, w.wg = nc, wg
	w.discard = bufio.NewWriterSize(io.Discard, 64)
	if sc, ok := nc.Conn.(syscall.Conn); ok && shared {
		w.raw, _ = sc.SyscallConn()
	}
}

// pushed reports whether the shared readers write this client's replies
// to its socket themselves. Otherwise its own goroutine does.
func (w *clientWriter) pushed() bool { return w.raw != nil }

// output returns the buffered writer; w.mu is held.
func (w *clientWriter) output() *bufio.Writer {
	if w.out == nil {
		w.out = bufio.NewWriterSize(w.nc, 4096)
	}
	return w.out
}

// copyFrom copies one reply from r to the client, or, when replace is set,
// reads it and writes replace instead; it flushes when r holds nothing
// more. The error is copyReply's, or the client's write error.
func (w *clientWriter) copyFrom(r *bufio.Reader, ri *resp.ReplyInfo, replace []byte) error {
	w.mu.Lock()
	defer w.unlock()
	var err error
	if replace != nil {
		if err = resp.CopyReply(w.discard, r, ri); err == nil {
			w.output().Write(replace)
		}
	} else {
		err = resp.CopyReply(w.output(), r, ri)
	}
	if err == nil && r.Buffered() == 0 {
		err = w.output().Flush()
	}
	return err
}

// skip reads one reply from r that is not the client's. Only the reader
// of the client's connection of one calls it, so the discard writer needs no lock. When r
// holds nothing more, what earlier replies left buffered is flushed.
func (w *clientWriter) skip(r *bufio.Reader, ri *resp.ReplyInfo) error {
	if err := resp.CopyReply(w.discard, r, ri); err != nil {
		return err
	}
	if r.Buffered() == 0 {
		w.flush()
	}
	return nil
}

// relay copies everything r holds or receives to the client, as it comes,
// until r or the client fails. It returns the error.
func (w *clientWriter) relay(r *bufio.Reader) error {
	for {
		if _, err := r.Peek(1); err != nil {
			return err
		}
		b, _ := r.Peek(r.Buffered())
		w.mu.Lock()
		out := w.output()
		_, err := out.Write(b)
		if err == nil {
			err = out.Flush()
		}
		w.unlock()
		if err != nil {
			return err
		}
		r.Discard(len(b))
	}
}

// lockOutput returns the buffered output with w.mu held, for a reply
// copied in pieces; unlock releases it.
func (w *clientWriter) lockOutput() *bufio.Writer {
	w.mu.Lock()
	return w.output()
}

// unlock releases w.mu, for every holder but pushOut and finish, which
// look again themselves. A reply a reader appended to the sink meanwhile
// found w.mu held, and its pushOut left the sink to the holder: it is
// pushed now. (In front of a
// cluster a MONITOR line, a keyspace message, or a RESP3 subscriber's
// message copied from its pinned connection, while a routed command's
// reply came, would otherwise leave that reply in the sink.)
func (w *clientWriter) unlock() {
	w.mu.Unlock()
	if w.pushed() && !w.sinkEmpty() {
		w.pushOut()
	}
}

// flush writes what is buffered.
func (w *clientWriter) flush() {
	w.mu.Lock()
	w.output().Flush()
	w.unlock()
}

// write writes what the sink holds, then reply, and flushes.
func (w *clientWriter) write(reply []byte) {
	w.mu.Lock()
	w.writeSink()
	w.output().Write(reply)
	w.output().Flush()
	w.unlock()
}

// repeat writes reply n times and flushes.
func (w *clientWriter) repeat(reply []byte, n int) {
	w.mu.Lock()
	for range n {
		w.output().Write(reply)
	}
	w.output().Flush()
	w.unlock()
}

// drain writes everything in the sink, blocking.
func (w *clientWriter) drain() {
	w.mu.Lock()
	w.writeSink()
	w.unlock()
}

// Write appends b to the sink; the shared reader copies replies into it.
func (w *clientWriter) Write(b []byte) (int, error) {
	w.sinkMu.Lock()
	w.sink = append(w.sink, b...)
	w.sinkMu.Unlock()
	return len(b), nil
}

// sinkEmpty reports whether the sink holds nothing.
func (w *clientWriter) sinkEmpty() bool {
	w.sinkMu.Lock()
	defer w.sinkMu.Unlock()
	return len(w.sink) == 0
}

// takeSink swaps the sink for the spare buffer and returns what it held;
// w.mu is held.
func (w *clientWriter) takeSink() []byte {
	spare := w.spare
	w.spare = nil
	w.sinkMu.Lock()
	out := w.sink
	w.sink = spare[:0]
	w.sinkMu.Unlock()
	return out
}

// recycle keeps a written sink buffer as the next spare, unless it grew
// large for one big reply; w.mu is held.
func (w *clientWriter) recycle(b []byte) {
	if cap(b) <= 64<<10 {
		w.spare = b[:0]
	}
}

// writeSink writes everything in the sink, blocking; w.mu is held.
func (w *clientWriter) writeSink() {
	for {
		out := w.takeSink()
		if len(out) == 0 {
			w.recycle(out)
			return
		}
		w.nc.Write(out)
		w.recycle(out)
	}
}

// pushOut writes the sink to the client from the shared connection's reader
// without ever blocking it: if another goroutine holds w.mu, that one
// writes the sink before it lets go (finish does, and every other holder
// lets go through unlock, which pushes it); if the socket takes only part, a
// goroutine of its own writes the rest. Only pushed clients are pushed to.
func (w *clientWriter) pushOut() {
	for w.mu.TryLock() {
		out := w.takeSink()
		if len(out) > 0 {
			n := w.tryWrite(out)
			if n < len(out) {
				// The client reads slowly: hand w.mu over to a goroutine
				// that may block.
				w.wg.Add(1)
				go w.finish(out, n)
				return
			}
		}
		w.recycle(out)
		w.mu.Unlock()
		// A reply appended while w.mu was held elsewhere is written by
		// whoever takes w.mu next; make sure someone does.
		if w.sinkEmpty() {
			return
		}
	}
}

// finish writes out[n:] and then the sink, blocking, with w.mu held.
func (w *clientWriter) finish(out []byte, n int) {
	defer w.wg.Done()
	w.nc.Write(out[n:])
	w.recycle(out)
	w.writeSink()
	w.mu.Unlock()
	if !w.sinkEmpty() {
		w.pushOut()
	}
}

// tryWrite writes as much of b as the socket takes without waiting; w.mu
// is held.
func (w *clientWriter) tryWrite(b []byte) int {
	if w.rw.f == nil {
		w.rw.f = w.rw.write // one closure per client, not per write
	}
	w.rw.b, w.rw.n = b, 0
	w.raw.Write(w.rw.f)
	w.rw.b = nil
	return w.rw.n
}

// rawWrite writes b to a socket without waiting for it to become writable.
type rawWrite struct {
	b []byte
	n int // how much of b was written
	f func(fd uintptr) bool
}

func (rw *rawWrite) write(fd uintptr) bool {
	for rw.n < len(rw.b) {
		k, e := rawio.Write(fd, rw.b[rw.n:])
		rw.n += k
		if e != 0 || k == 0 {
			break // EAGAIN: the rest goes to finish; other errors show there too
		}
	}
	return true
}
