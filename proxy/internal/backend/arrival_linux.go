package backend

import (
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/lockproxy/lockproxy/proxy/internal/rawio"
)

// Arrivals is the arrival order across a proxy's client sockets.
//
// Redis reads its clients with one thread, in the order their sockets
// became readable, so when two clients send one right after the other
// (one a blocking XREAD, the other a SET on its key), Redis runs the first
// one first. Through the proxy each client has its own goroutine, and Go's
// network poller, when one poll finds both sockets readable, wakes their
// goroutines in the reverse order: the later command usually reaches Redis
// first.
//
// Arrivals restores Redis's order. Every client socket is also in an epoll
// instance of the proxy's own, edge-triggered: the kernel queues a socket
// there when data arrives for it, and epoll_wait hands the queued sockets
// out in the order they were queued, leaving out those whose data has
// been read meanwhile. So each read collects the queue (one epoll_wait
// with no timeout) after the poller woke its goroutine and before it takes
// the data, and numbers, in order, the sockets whose goroutine is in a
// read, and those whose goroutine is still busy with its last read (the
// client sent again as soon as the replies came), for their next read; a
// read that finds no number of its own gets the next one after it.
// Before the first of its commands that goes to the backend, a numbered
// read then waits for the newest read numbered before it until that one's
// commands have been passed on: until that client's goroutine
// reads again, which redcon does as soon as the proxy's handler returned
// (session.endBatch writes the commands to the backend, or to a shared
// connection's queue, which keeps order), or until session.flush says so
// before it waits for replies. As each waits for the one before, the
// commands leave in order.
//
// A read does not wait for a socket whose goroutine has not run since its
// data came (awake): if the poller woke it in the same poll, it runs
// after a turn or two of the scheduler (runtime.Gosched); otherwise the
// poller has not seen the data yet, and may not look before the
// scheduler runs out of goroutines. No wait lasts longer than orderWait
// either: a client that does not come to read its data cannot hold the
// others up.
//
// The same queue spares a read the system call that finds nothing. A
// goroutine that has handled its data starts its next read; Go's read
// tries the socket first (read(2), EAGAIN) and only then waits for the
// poller, since the poller's word that data came before the read began is
// dropped when it begins. Here the collect at the start of the read
// tells instead: data that came since the last read took everything the
// socket held is in the queue (the read gets a number), or was collected
// while its goroutine was busy (more is set). With neither, the read goes
// straight to the poller, which wakes it for data that comes from then
// on. So a client that sends a command and waits for its reply costs one
// read(2) per command, not two, as in an event loop.
//
// A read woken by the poller that already has its number (another read's
// collect saw its data) takes the data without collecting again: the
// reads before it were numbered by the same collect or earlier ones.
//
// The order costs an epoll_wait per read and, when clients send at once,
// a goroutine switch per read; the proxy's Config.ArrivalOrder turns it
// off. Its methods are safe for concurrent use; an Arrival's Wait and
// End are called by its client's goroutine only.
type Arrivals struct {
	epfd int

	mu     sync.Mutex
	conns  map[uint64]*Arrival
	nextID uint64
	last   uint64   // the last number handed out
	queue  []ticket // numbered reads, in order; some have ended
	events []syscall.EpollEvent
	closed bool

	// The reading loop's (loop_linux.go): the sockets it is to read, in
	// the order of their numbers; the pipe that wakes it for a socket
	// handed to it; the epoll instance as a file of Go's poller.
	ready  []*Arrival
	nudge  [2]int
	nudged bool // the pipe holds a byte
	file   *os.File
}

// orderWait bounds how long a read waits for the reads numbered before it.
const orderWait = 5 * time.Millisecond

type ticket struct {
	n uint64
	a *Arrival
}

// Arrival is one client socket's place in the arrival order.
type Arrival struct {
	o  *Arrivals
	id uint64
	// The fields below are guarded by o.mu.
	waiting bool   // its goroutine is in a read
	n       uint64 // the number of its read not yet passed on; 0: none
	// next is the number of data that came while its goroutine was busy
	// with the last read's commands: the next read's, taken when it
	// starts. 0: none.
	next uint64
	// done, made when a read waits for this one, is closed when it has
	// been passed on.
	done chan struct{}
	// awake is false while its goroutine is parked in a read: a read
	// numbered then waits for the poller, which checks the sockets only
	// when the scheduler runs out of goroutines, and nobody waits for it.
	awake atomic.Bool
	// more: the socket may hold data that no read has taken: its last
	// read filled the buffer, or a collect saw data come while no read
	// was waiting for it. Guarded by o.mu.
	more bool
	// expired is the number of a read of the socket that a wait gave up
	// on (Arrivals.expire). Guarded by o.mu.
	expired uint64
	// waited: the last read has waited for those before it. Only the
	// client's own goroutine, which reads and then handles the commands,
	// uses it.
	waited bool
	// loop: the reading loop reads the socket (loop_linux.go), for owner.
	// Guarded by o.mu; owner is set once, before loop.
	loop  bool
	owner any
}

// NewArrivals makes an arrival order with an epoll instance of its own;
// Close releases it.
func NewArrivals() (*Arrivals, error) {
	fd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return nil, err
	}
	return &Arrivals{
		epfd:   fd,
		conns:  make(map[uint64]*Arrival),
		events: make([]syscall.EpollEvent, 128),
	}, nil
}

// Close ends the arrival order: its epoll instance is closed and Wrap
// refuses new sockets. It may be called on a nil Arrivals, and more than
// once.
func (o *Arrivals) Close() {
	if o == nil {
		return
	}
	o.mu.Lock()
	if o.closed {
		o.mu.Unlock()
		return
	}
	o.closed = true
	f := o.file
	if f == nil {
		syscall.Close(o.epfd)
	}
	o.mu.Unlock()
	if f != nil {
		// Outside the lock: Close waits for the loop's read of the file
		// to end, and the loop takes the lock there.
		f.Close()
		o.closePipe()
	}
}

// Wrap puts the socket under nc in the arrival order and returns it
// wrapped so that its reads keep it. A connection that is not a socket is
// returned as it is, with a nil arrival.
func (o *Arrivals) Wrap(nc net.Conn) (net.Conn, *Arrival, error) {
	sc, ok := nc.(syscall.Conn)
	if o == nil || !ok {
		return nc, nil, nil
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return nil, nil, err
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return nil, nil, errors.New("proxy: shut down")
	}
	o.nextID++
	// The first read tries the socket: its data may have come before
	// the socket joined the epoll instance.
	a := &Arrival{o: o, id: o.nextID, more: true}
	ev := syscall.EpollEvent{
		Events: syscall.EPOLLIN | -syscall.EPOLLET,
		Fd:     int32(a.id),
		Pad:    int32(a.id >> 32),
	}
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cerr = syscall.EpollCtl(o.epfd, syscall.EPOLL_CTL_ADD, int(fd), &ev)
	}); err != nil {
		return nil, nil, err
	}
	if cerr != nil {
		return nil, nil, cerr
	}
	// Closing the socket takes it out of the epoll instance.
	o.conns[a.id] = a
	c := &orderedConn{Conn: nc, raw: raw, a: a}
	c.rd = c.readFD
	return c, a, nil
}

// collect numbers, in arrival order, the sockets that received data since
// the last call while their goroutine waited in a read; the others are
// marked as holding more data for their next read. o.mu is held.
func (o *Arrivals) collect() {
	queued := len(o.ready)
	o.collectEvents()
	if len(o.ready) > queued {
		o.wakeLoop()
	}
}

// collectEvents is collect's work, without waking the loop for the
// sockets it queued for it: the loop's own collect. o.mu is held.
func (o *Arrivals) collectEvents() {
	if o.closed {
		return
	}
	for {
		n, e := rawio.EpollWait(o.epfd, o.events)
		if e != 0 {
			return
		}
		for _, ev := range o.events[:n] {
			id := uint64(uint32(ev.Fd)) | uint64(uint32(ev.Pad))<<32
			a := o.conns[id]
			if a == nil {
				continue // the loop's pipe, or a socket removed
			}
			switch {
			case a.loop && a.n == 0:
				// The reading loop reads it, in this place.
				a.number()
				o.ready = append(o.ready, a)
			case a.waiting && a.n == 0:
				a.number()
			case !a.waiting && a.next == 0:
				// Its goroutine is busy with the last read's commands
				// (the client sent again as soon as their replies came):
				// this data came now, before the data of sockets
				// collected after it, and its read keeps that place.
				a.numberNext()
			}
			// Its goroutine may be busy with the last read's data, or
			// be in the read(2) of this one already: this data may have
			// come after that read took the socket's data, and the next
			// read must look. (A read clears more before its read(2).)
			a.more = true
		}
		if n < len(o.events) {
			return
		}
	}
}

// number gives the socket's read the next number. o.mu is held.
func (a *Arrival) number() {
	o := a.o
	o.last++
	a.n = o.last
	o.queue = append(o.queue, ticket{n: a.n, a: a})
}

// numberNext gives the socket's next read the next number. o.mu is held.
func (a *Arrival) numberNext() {
	o := a.o
	o.last++
	a.next = o.last
	o.queue = append(o.queue, ticket{n: a.next, a: a})
}

// live reports whether t is a read not yet passed on: the socket's
// current one or its next. o.mu is held.
func (t ticket) live() bool {
	return (t.a.n == t.n || t.a.next == t.n) && t.a.expired != t.n
}

// expire gives up on every read numbered below n not passed on yet: a
// wait for them lasted orderWait, and no read waits for them again (a
// client stuck in its handler, or one that does not come to read its
// data, costs the reads after it one orderWait, not one each). o.mu is
// held.
func (o *Arrivals) expire(n uint64) {
	for _, t := range o.queue {
		if t.n < n && t.live() {
			t.a.expired = t.n
		}
	}
}

// before returns the newest read not yet passed on that is numbered
// below n: the one a read numbered n waits for, as that one waits for
// those before it. o.mu is held.
func (o *Arrivals) before(n uint64) (ticket, bool) {
	passed := 0
	for passed < len(o.queue) && !o.queue[passed].live() {
		passed++
	}
	if passed > 0 {
		// Move the live ones to the front, so that the queue's array is
		// reused instead of regrown as it moves on.
		n := copy(o.queue, o.queue[passed:])
		clear(o.queue[n:])
		o.queue = o.queue[:n]
	}
	for i := len(o.queue) - 1; i >= 0; i-- {
		if t := o.queue[i]; t.n < n && t.live() {
			return t, true
		}
	}
	return ticket{}, false
}

// orderedConn is a client socket read in arrival order. Its reads go
// through the socket's RawConn, so that the arrivals are collected after
// the poller woke the goroutine and before the read takes the data: epoll
// drops from its queue a socket that no longer has data.
type orderedConn struct {
	net.Conn
	raw syscall.RawConn
	a   *Arrival

	// The read in progress: rd (readFD, made once) reads into buf.
	rd   func(fd uintptr) bool
	buf  []byte
	n    int
	rerr error
}

// readFD is the read in progress, called by the RawConn when the read
// starts and each time the poller wakes it.
func (c *orderedConn) readFD(fd uintptr) bool {
	a := c.a
	a.awake.Store(true)
	o := a.o
	o.mu.Lock()
	start := !a.waiting
	if start {
		// The read starts: whatever the last one returned has been
		// passed on.
		a.endLocked()
		a.waiting = true
		a.n, a.next = a.next, 0 // numbered while the goroutine was busy
	}
	if a.n == 0 {
		o.collect()
	}
	if start && a.n == 0 && !a.more {
		// Nothing came since the last read emptied the socket: wait
		// for the poller, which wakes the read for what comes next.
		o.mu.Unlock()
		a.awake.Store(false)
		return false
	}
	// Data that comes from here on is this read's or shows again.
	a.more = false
	o.mu.Unlock()
	n, e := rawio.Read(fd, c.buf)
	c.n, c.rerr = n, nil
	if e != 0 {
		c.n, c.rerr = -1, e
	}
	if c.rerr == syscall.EAGAIN {
		a.awake.Store(false)
		return false
	}
	return true
}

// SyscallConn is the socket's, for the writes that go to it directly.
func (c *orderedConn) SyscallConn() (syscall.RawConn, error) { return c.raw, nil }

func (c *orderedConn) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	c.buf, c.n, c.rerr = b, 0, nil
	err := c.raw.Read(c.rd)
	n := c.n
	if err != nil || c.rerr != nil {
		n = 0
	}
	c.a.arrived(n, n == len(b))
	c.buf = nil
	switch {
	case err != nil:
		return 0, c.opError(err)
	case c.rerr != nil:
		return 0, c.opError(os.NewSyscallError("read", c.rerr))
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

func (c *orderedConn) opError(err error) error {
	return &net.OpError{Op: "read", Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
}

// arrived is called after a read that returned n bytes, full when they
// filled the buffer (the socket may hold more): a read that collect did
// not number gets the next number. It waits for nothing: see wait.
func (a *Arrival) arrived(n int, full bool) {
	o := a.o
	o.mu.Lock()
	a.waiting = false
	if full {
		a.more = true
	}
	switch {
	case n == 0:
		a.endLocked()
	case a.n == 0:
		// The data came after the last collect: after every read
		// numbered so far.
		a.number()
	}
	a.waited = a.firstLocked()
	o.mu.Unlock()
}

// firstLocked reports whether no live read is numbered before the
// socket's: none can come (numbers only grow), and Wait need not take the
// lock again. o.mu is held.
func (a *Arrival) firstLocked() bool {
	if a.n == 0 {
		return true
	}
	_, earlier := a.o.before(a.n)
	return !earlier
}

// Wait is called before a command of the last read goes to the backend:
// the first time for that read, it waits until the reads numbered before
// it have been passed on, or for orderWait. A read whose commands the
// proxy answers itself (lock commands) waits for nobody.
func (a *Arrival) Wait() {
	if a == nil || a.waited {
		return
	}
	a.waited = true
	o := a.o
	o.mu.Lock()
	var timer *time.Timer
	yields := 0
wait:
	for a.n != 0 {
		t, ok := o.before(a.n)
		if !ok {
			break
		}
		if !t.a.awake.Load() && !a.loop {
			// Its goroutine has not run since its data came. When the
			// poller woke it with this one, it is next in the run queue.
			// (The reading loop waits for it: while the loop waits, the
			// scheduler, out of work, asks the poller, which wakes it.)
			if yields == 2 {
				break
			}
			yields++
			o.mu.Unlock()
			runtime.Gosched()
			o.mu.Lock()
			continue
		}
		if t.a.done == nil {
			t.a.done = make(chan struct{})
		}
		done := t.a.done
		o.mu.Unlock()
		if timer == nil {
			timer = orderTimers.Get().(*time.Timer)
			timer.Reset(orderWait)
		}
		select {
		case <-done:
			o.mu.Lock()
		case <-timer.C:
			o.mu.Lock()
			o.expire(a.n)
			break wait
		}
	}
	o.mu.Unlock()
	if timer != nil {
		// Stopped, it delivers nothing stale after a Reset (Go 1.23).
		timer.Stop()
		orderTimers.Put(timer)
	}
}

// orderTimers recycles the timers that bound waits. Waits are short and
// frequent: a timer made for each was a third of the bytes the proxy
// allocated when 50 clients sent at once, and so of its collections.
var orderTimers = sync.Pool{New: func() any {
	t := time.NewTimer(orderWait)
	t.Stop()
	return t
}}

// End says the commands of the socket's last read have been passed on,
// before its goroutine reads again (which says so too).
func (a *Arrival) End() {
	if a == nil {
		return
	}
	a.o.mu.Lock()
	a.endLocked()
	a.o.mu.Unlock()
}

func (a *Arrival) endLocked() {
	a.n = 0
	if a.done != nil {
		close(a.done)
		a.done = nil
	}
}

// Remove takes a closed socket out of the arrival order.
func (a *Arrival) Remove() {
	if a == nil {
		return
	}
	a.o.mu.Lock()
	a.endLocked()
	a.next = 0
	delete(a.o.conns, a.id)
	a.o.mu.Unlock()
}

// Held returns the numbers of the reads whose commands have not been
// passed on yet, in no order; tests use it to see who would hold the
// reads after them.
func (o *Arrivals) Held() []uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	var held []uint64
	for _, a := range o.conns {
		if a.n != 0 {
			held = append(held, a.n)
		}
	}
	return held
}

// Stuck numbers a read of no socket that is never passed on, as the read
// of a client stuck in its handler is not: reads numbered after it wait
// for it (up to orderWait, once: then it expires). waitedFor reports
// whether a read has waited for it so far, expired whether a wait gave up
// on it; release passes it on. Tests use it.
func (o *Arrivals) Stuck() (waitedFor, expired func() bool, release func()) {
	o.mu.Lock()
	defer o.mu.Unlock()
	stuck := &Arrival{o: o}
	stuck.awake.Store(true)
	stuck.number()
	n := stuck.n
	waitedFor = func() bool {
		o.mu.Lock()
		defer o.mu.Unlock()
		return stuck.done != nil // made by a read that waits for it
	}
	expired = func() bool {
		o.mu.Lock()
		defer o.mu.Unlock()
		return stuck.expired == n
	}
	release = func() {
		o.mu.Lock()
		stuck.endLocked()
		o.mu.Unlock()
	}
	return waitedFor, expired, release
}
