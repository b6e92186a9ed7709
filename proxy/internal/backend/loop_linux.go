package backend

import (
	"errors"
	"os"
	"syscall"

	"github.com/lockproxy/lockproxy/proxy/internal/rawio"
)

// The reading loop. A client socket handed to it (Arrival.Serve) is read
// by one goroutine of the proxy's, the loop, instead of by its client's
// own: the loop sleeps in Go's poller on the arrival order's epoll
// instance, which every client socket is in, and when it wakes, takes the
// sockets with data that are its own, in the order of their numbers,
// which is the order their data came in (see collect). A read of the
// loop is numbered as a client goroutine's read is, so the two kinds of
// reads keep one arrival order between them: a goroutine's read waits for
// a loop's numbered before it, as for any other (Arrival.Wait), and the
// loop waits for a goroutine's before it forwards what it read later.
// What it saves is the goroutine switches of a read per client and
// command, and the collect of each read: one collect serves every socket
// that sent meanwhile.

// nudgeID is the epoll instance's key of the pipe that wakes the loop;
// sockets' ids start at 1.
const nudgeID = 0

// Loop readies the reading loop and returns it: run calls serve with
// the sockets the loop is to read, in the order of their numbers (a
// socket that just joined has none until its read finds data), until
// Close; then it returns. It is called once, and run by
// one goroutine, the loop. Sockets are handed to it (Serve) from Loop's
// return on.
func (o *Arrivals) Loop() (run func(serve func(ready []*Arrival)), err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed || o.file != nil {
		return nil, errors.New("proxy: arrival order closed, or looped twice")
	}
	if err := syscall.Pipe2(o.nudge[:], syscall.O_NONBLOCK|syscall.O_CLOEXEC); err != nil {
		return nil, err
	}
	// Level-triggered, and emptied by the loop only: the instance stays
	// readable until the loop has taken what it was woken for. (Go's
	// poller, told the instance became readable, asks it again before it
	// wakes the loop; a socket's event a client goroutine's collect took
	// meanwhile would not wake it.)
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN, Fd: nudgeID}
	if err := syscall.EpollCtl(o.epfd, syscall.EPOLL_CTL_ADD, o.nudge[0], &ev); err != nil {
		o.closePipe()
		return nil, err
	}
	// Go's poller waits on the epoll instance as on any other file: it is
	// readable while sockets are queued in it.
	if err := syscall.SetNonblock(o.epfd, true); err != nil {
		o.closePipe()
		return nil, err
	}
	f := os.NewFile(uintptr(o.epfd), "arrivals")
	raw, err := f.SyscallConn()
	if err != nil {
		o.closePipe()
		return nil, err
	}
	o.file = f
	var batch []*Arrival
	take := func(uintptr) bool {
		o.mu.Lock()
		defer o.mu.Unlock()
		if o.closed {
			batch = batch[:0]
			return true
		}
		if o.nudged {
			o.drainNudge()
		}
		o.collectEvents()
		batch, o.ready = o.ready, batch[:0]
		return len(batch) > 0
	}
	return func(serve func(ready []*Arrival)) {
		for {
			if err := raw.Read(take); err != nil {
				return // closed
			}
			if len(batch) == 0 {
				return // closed: take found nothing to wait for
			}
			serve(batch)
			clear(batch)
			batch = batch[:0]
		}
	}, nil
}

func (o *Arrivals) closePipe() {
	syscall.Close(o.nudge[0])
	syscall.Close(o.nudge[1])
}

// wakeLoop wakes the loop for the sockets queued for it; o.mu is held.
// A socket's own event may not: a client goroutine's collect took it.
func (o *Arrivals) wakeLoop() {
	if o.file == nil || o.nudged {
		return
	}
	o.nudged = true
	rawio.Write(uintptr(o.nudge[1]), nudgeByte[:])
}

var nudgeByte = [1]byte{1}

// drainNudge empties the loop's pipe; o.mu is held.
func (o *Arrivals) drainNudge() {
	o.nudged = false
	var b [64]byte
	for {
		if n, _ := rawio.Read(uintptr(o.nudge[0]), b[:]); n < len(b) {
			return
		}
	}
}

// Serve hands the socket to the reading loop, for owner: the loop reads
// it from now on, starting now. It reports false when there is no loop.
func (a *Arrival) Serve(owner any) bool {
	if a == nil {
		return false
	}
	o := a.o
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.file == nil || o.closed {
		return false
	}
	// Data other sockets received before this one joined the loop comes
	// first: number it before this socket's first read.
	o.collect()
	a.owner, a.loop = owner, true
	// A number a collect gave its goroutine's next read, before the
	// loop had it, is spent: the loop's read gets one of its own.
	a.next = 0
	// The loop is always in a read of it, and never long away.
	a.waiting = true
	a.awake.Store(true)
	// The loop tries the socket: data may have come before it joined.
	// Unnumbered: a read that finds nothing holds nobody up, and one that
	// finds data is numbered then (Read), after what others received
	// meanwhile, as a client goroutine's first read is.
	o.ready = append(o.ready, a)
	o.wakeLoop()
	return true
}

// Owner is what Serve was given.
func (a *Arrival) Owner() any { return a.owner }

// StartRead is called by the loop before it reads the socket: data that
// comes from now on is the next read's or this one's.
func (a *Arrival) StartRead() {
	a.o.mu.Lock()
	a.more = false
	a.o.mu.Unlock()
}

// Read records what the loop's read of the socket returned: n bytes, and
// whether they filled its buffer. A read whose data came after the last
// collect gets its number now.
func (a *Arrival) Read(n int) {
	o := a.o
	o.mu.Lock()
	if n > 0 && a.n == 0 {
		a.number()
	}
	a.waited = a.firstLocked()
	o.mu.Unlock()
}

// Done says the loop has passed on what it read of the socket. With
// full (the read filled its buffer), or when more came meanwhile, the
// socket is read again, in a place of its own.
func (a *Arrival) Done(full bool) {
	o := a.o
	o.mu.Lock()
	a.endLocked()
	if a.loop && (full || a.more) {
		a.more = false
		a.number()
		o.ready = append(o.ready, a)
	}
	o.mu.Unlock()
}

// Unloop takes the socket from the loop: its client's goroutine reads it
// from now on, starting with what the loop read last, whose number it
// keeps until that goroutine passes it on (Arrival.End, or its next read).
func (a *Arrival) Unloop() {
	o := a.o
	o.mu.Lock()
	a.loop = false
	a.waiting = false
	// Its goroutine is busy with the loop's last read and then tries the
	// socket: the loop may have left data in it.
	a.more = true
	a.awake.Store(true)
	o.mu.Unlock()
}
