package rawio

import (
	"io"
	"os"
	"syscall"
)

// Conn reads and writes a socket through its syscall.RawConn with Read
// and Write: the socket's deadlines and Close work as on the net.Conn it
// came from (the RawConn waits for the poller, and its errors are the
// net.Conn's), the system calls are unseen by the scheduler.
type Conn struct {
	rc syscall.RawConn

	// One read and one write at a time each (the callbacks' state).
	rb   []byte
	rn   int
	rerr error
	rf   func(fd uintptr) bool
	wb   []byte
	wn   int
	werr error
	wf   func(fd uintptr) bool
	// Fits' and Apart's.
	mf     func(fd uintptr)
	mn     int
	sndbuf int // the send buffer's size, read once: the kernel only grows it
	// queued bounds from above what waits in the send queue: what it
	// held when last asked (Unsent), plus what Write wrote since; -1
	// before the first ask.
	queued int
	af     func(fd uintptr)
	ap     bool
}

// New returns a Conn over rc.
func New(rc syscall.RawConn) *Conn {
	c := &Conn{rc: rc, queued: -1}
	c.rf, c.wf, c.mf, c.af = c.read, c.write, c.room, c.apart
	return c
}

// Fits reports whether a write of n bytes takes them now without waiting
// for room, with room to spare: at most half the socket's send buffer
// less what waits in it (SendBuffer, Unsent); false when it cannot tell
// or the socket is closed. It asks the kernel only when the bound it
// keeps (what waited when last asked, plus what Write wrote since) leaves
// too little room: a write that fits then costs no system call. Not
// concurrent with Write, nor with itself.
func (c *Conn) Fits(n int) bool {
	if c.queued >= 0 && c.sndbuf > 0 && c.queued+n <= c.sndbuf/2 {
		return true
	}
	c.mn = -1
	c.rc.Control(c.mf)
	return c.mn >= 0 && c.mn+n <= c.sndbuf/2
}

func (c *Conn) room(fd uintptr) {
	if c.sndbuf == 0 {
		c.sndbuf = SendBuffer(fd)
	}
	if q, ok := Unsent(fd); ok && c.sndbuf > 0 {
		c.mn, c.queued = q, q
	}
}

// Apart reports whether the peer sent its last bytes from another CPU
// than the caller's (rawio.Apart; false when it cannot tell). One call
// at a time.
func (c *Conn) Apart() bool {
	c.ap = false
	c.rc.Control(c.af)
	return c.ap
}

func (c *Conn) apart(fd uintptr) { c.ap, _ = Apart(fd) }

// Read reads what the socket has, or waits for it (the read deadline
// applies); 0 bytes read is io.EOF.
func (c *Conn) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	c.rb, c.rn, c.rerr = b, 0, nil
	err := c.rc.Read(c.rf)
	n, rerr := c.rn, c.rerr
	c.rb, c.rerr = nil, nil
	if err != nil {
		return 0, err
	}
	return n, rerr
}

func (c *Conn) read(fd uintptr) bool {
	n, e := Read(fd, c.rb)
	switch {
	case e == syscall.EAGAIN:
		return false // wait for the poller
	case e != 0:
		c.rerr = os.NewSyscallError("read", e)
	case n == 0:
		c.rerr = io.EOF
	default:
		c.rn = n
	}
	return true
}

// Write writes all of b, waiting for room as needed (the write deadline
// applies).
func (c *Conn) Write(b []byte) (int, error) {
	c.wb, c.wn, c.werr = b, 0, nil
	err := c.rc.Write(c.wf)
	n, werr := c.wn, c.werr
	c.wb, c.werr = nil, nil
	if c.queued >= 0 {
		c.queued += n
	}
	if err != nil {
		return n, err
	}
	return n, werr
}

func (c *Conn) write(fd uintptr) bool {
	for c.wn < len(c.wb) {
		n, e := Write(fd, c.wb[c.wn:])
		c.wn += n
		switch {
		case e == syscall.EAGAIN:
			return false // wait for room
		case e != 0:
			c.werr = os.NewSyscallError("write", e)
			return true
		case n == 0:
			c.werr = io.ErrShortWrite
			return true
		}
	}
	return true
}
