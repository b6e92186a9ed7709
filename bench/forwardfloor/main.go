//go:build linux

// Command forwardfloor is a reference for the forwarding path: the least a
// Redis proxy written in Go does for a command when it is built the way
// predixy and twemproxy are, as an event loop. peers.sh runs it beside
// lockproxy, twemproxy and predixy (target floor→redis) to show which part
// of the difference in CPU per command between lockproxy and the C proxies
// belongs to the language and which to lockproxy's design: one goroutine
// per client read by redcon, a shared connection's reader goroutine writing
// the replies, and the arrival order kept across those goroutines.
//
// What it does: each loop (-loops, one by default, as lockproxy's shipped
// gomaxprocs: 0 gives one thread on two CPUs) is one locked OS thread that
// owns an epoll instance, a listening socket of its own (SO_REUSEPORT) and
// one connection to the backend. Each epoll_wait it reads every readable
// client, cuts the complete requests out of what came (RESP arrays), and
// appends them to the backend connection's batch in the order the sockets
// were returned; it reads the backend and hands each complete reply to the
// client next in line; after the events it writes the batch with one
// write(2) and each client's replies with one. It parses nothing else and
// keeps no state: no commands of its own, no transactions, pub/sub or
// blocking commands (a blocking command holds up every client behind it),
// no limits, no TLS, no reconnection (a lost backend ends the process). It
// is a measuring stick, not a proxy.
package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"syscall"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:6391", "address to accept clients on")
	backend := flag.String("backend", "127.0.0.1:6379", "the Redis to forward to")
	loops := flag.Int("loops", 1, "event loops, each a thread with its own backend connection")
	flag.Parse()
	if *loops < 1 {
		fatal(errors.New("-loops must be at least 1"))
	}
	lsa, err := sockaddr(*listen)
	if err != nil {
		fatal(err)
	}
	bsa, err := sockaddr(*backend)
	if err != nil {
		fatal(err)
	}
	runtime.GOMAXPROCS(*loops)
	for range *loops {
		l, err := newLoop(lsa, bsa)
		if err != nil {
			fatal(err)
		}
		go l.run()
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	<-sig
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "forwardfloor:", err)
	os.Exit(1)
}

// sockaddr resolves an IPv4 host:port.
func sockaddr(addr string) (*syscall.SockaddrInet4, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return nil, fmt.Errorf("port of %q: %w", addr, err)
	}
	ip := net.ParseIP(host).To4()
	if ip == nil {
		return nil, fmt.Errorf("%q: an IPv4 address is needed", addr)
	}
	sa := &syscall.SockaddrInet4{Port: p}
	copy(sa.Addr[:], ip)
	return sa, nil
}

// client is one client socket of a loop.
type client struct {
	fd    int
	in    []byte // request bytes not yet a whole request
	out   []byte // replies not yet written
	owed  int    // requests sent to the backend whose replies have not come
	dead  bool   // closed: its replies are dropped as they come
	dirty bool   // in the loop's dirty list
	polls bool   // EPOLLOUT is on: out did not fit in the socket
}

// loop is one event loop: a thread, an epoll instance, a listening socket
// and a backend connection.
type loop struct {
	ep, lfd int
	be      int    // the backend socket
	bin     []byte // backend bytes not yet a whole reply
	bout    []byte // the batch to the backend
	bpolls  bool   // EPOLLOUT is on for the backend
	line    []*client
	head    int // line[head:] wait for replies, in order
	clients map[int]*client
	dirty   []*client
	buf     []byte
}

func newLoop(lsa, bsa *syscall.SockaddrInet4) (*loop, error) {
	ep, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return nil, err
	}
	lfd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	syscall.SetsockoptInt(lfd, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1)
	syscall.SetsockoptInt(lfd, syscall.SOL_SOCKET, 0xf /* SO_REUSEPORT */, 1)
	if err := syscall.Bind(lfd, lsa); err != nil {
		return nil, fmt.Errorf("bind: %w", err)
	}
	if err := syscall.Listen(lfd, 4096); err != nil {
		return nil, err
	}
	be, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	if err := syscall.Connect(be, bsa); err != nil {
		return nil, fmt.Errorf("backend: %w", err)
	}
	syscall.SetNonblock(be, true)
	syscall.SetsockoptInt(be, syscall.IPPROTO_TCP, syscall.TCP_NODELAY, 1)
	l := &loop{ep: ep, lfd: lfd, be: be, clients: map[int]*client{}, buf: make([]byte, 64<<10)}
	if err := l.ctl(syscall.EPOLL_CTL_ADD, lfd, syscall.EPOLLIN); err != nil {
		return nil, err
	}
	if err := l.ctl(syscall.EPOLL_CTL_ADD, be, syscall.EPOLLIN); err != nil {
		return nil, err
	}
	return l, nil
}

func (l *loop) ctl(op, fd int, events uint32) error {
	return syscall.EpollCtl(l.ep, op, fd, &syscall.EpollEvent{Events: events, Fd: int32(fd)})
}

func (l *loop) run() {
	runtime.LockOSThread()
	events := make([]syscall.EpollEvent, 256)
	for {
		n, err := syscall.EpollWait(l.ep, events, -1)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			fatal(err)
		}
		for _, ev := range events[:n] {
			fd := int(ev.Fd)
			switch {
			case fd == l.lfd:
				l.accept()
			case fd == l.be:
				if ev.Events&syscall.EPOLLOUT != 0 {
					l.writeBackend()
				}
				if ev.Events&(syscall.EPOLLIN|syscall.EPOLLHUP|syscall.EPOLLERR) != 0 {
					l.readBackend()
				}
			default:
				c := l.clients[fd]
				if c == nil {
					continue
				}
				if ev.Events&syscall.EPOLLOUT != 0 {
					l.writeClient(c)
				}
				if !c.dead && ev.Events&(syscall.EPOLLIN|syscall.EPOLLHUP|syscall.EPOLLERR) != 0 {
					l.readClient(c)
				}
			}
		}
		if len(l.bout) > 0 && !l.bpolls {
			l.writeBackend()
		}
		for i, c := range l.dirty {
			c.dirty = false
			if !c.dead && !c.polls {
				l.writeClient(c)
			}
			l.dirty[i] = nil
		}
		l.dirty = l.dirty[:0]
	}
}

func (l *loop) accept() {
	for {
		fd, _, err := syscall.Accept4(l.lfd, syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC)
		if err != nil {
			return // EAGAIN, or EMFILE and friends: the next wake tries again
		}
		syscall.SetsockoptInt(fd, syscall.IPPROTO_TCP, syscall.TCP_NODELAY, 1)
		if err := l.ctl(syscall.EPOLL_CTL_ADD, fd, syscall.EPOLLIN|syscall.EPOLLRDHUP); err != nil {
			syscall.Close(fd)
			continue
		}
		l.clients[fd] = &client{fd: fd}
	}
}

// readClient reads what the client sent and queues its whole requests on
// the backend's batch.
func (l *loop) readClient(c *client) {
	n, err := syscall.Read(c.fd, l.buf)
	if err == syscall.EAGAIN {
		return
	}
	if n <= 0 {
		l.close(c)
		return
	}
	data := l.buf[:n]
	if len(c.in) > 0 {
		c.in = append(c.in, data...)
		data = c.in
	}
	done := 0
	for done < len(data) {
		k, err := request(data[done:])
		if err != nil {
			l.close(c)
			return
		}
		if k == 0 {
			break
		}
		done += k
		c.owed++
		l.line = append(l.line, c)
	}
	l.bout = append(l.bout, data[:done]...)
	c.in = append(c.in[:0], data[done:]...)
}

// readBackend reads replies and hands each to the client next in line.
func (l *loop) readBackend() {
	n, err := syscall.Read(l.be, l.buf)
	if err == syscall.EAGAIN {
		return
	}
	if n <= 0 {
		fatal(fmt.Errorf("backend connection lost: %v", err))
	}
	data := l.buf[:n]
	if len(l.bin) > 0 {
		l.bin = append(l.bin, data...)
		data = l.bin
	}
	done := 0
	for done < len(data) {
		k := reply(data[done:])
		if k == 0 {
			break
		}
		if l.head == len(l.line) {
			fatal(errors.New("a reply no request waits for"))
		}
		c := l.line[l.head]
		l.line[l.head] = nil
		l.head++
		c.owed--
		if !c.dead {
			c.out = append(c.out, data[done:done+k]...)
			if !c.dirty {
				c.dirty = true
				l.dirty = append(l.dirty, c)
			}
		}
		done += k
	}
	if l.head == len(l.line) {
		l.line, l.head = l.line[:0], 0
	}
	l.bin = append(l.bin[:0], data[done:]...)
}

func (l *loop) writeBackend() {
	n, err := syscall.Write(l.be, l.bout)
	if err != nil && err != syscall.EAGAIN {
		fatal(fmt.Errorf("backend connection lost: %v", err))
	}
	if n > 0 {
		l.bout = l.bout[:copy(l.bout, l.bout[n:])]
	}
	if wait := len(l.bout) > 0; wait != l.bpolls {
		l.bpolls = wait
		ev := uint32(syscall.EPOLLIN)
		if wait {
			ev |= syscall.EPOLLOUT
		}
		l.ctl(syscall.EPOLL_CTL_MOD, l.be, ev)
	}
}

func (l *loop) writeClient(c *client) {
	if len(c.out) == 0 {
		return
	}
	n, err := syscall.Write(c.fd, c.out)
	if err != nil && err != syscall.EAGAIN {
		l.close(c)
		return
	}
	if n > 0 {
		c.out = c.out[:copy(c.out, c.out[n:])]
	}
	if wait := len(c.out) > 0; wait != c.polls {
		c.polls = wait
		ev := uint32(syscall.EPOLLIN | syscall.EPOLLRDHUP)
		if wait {
			ev |= syscall.EPOLLOUT
		}
		l.ctl(syscall.EPOLL_CTL_MOD, c.fd, ev)
	}
}

// close closes a client; the replies it is still owed are dropped as they
// come.
func (l *loop) close(c *client) {
	if c.dead {
		return
	}
	c.dead = true
	delete(l.clients, c.fd)
	syscall.Close(c.fd) // also takes it out of the epoll instance
	c.in, c.out = nil, nil
}

// request returns the length of the whole RESP array request at the start
// of b, or 0 when b does not hold all of it yet.
func request(b []byte) (int, error) {
	if b[0] != '*' {
		return 0, errors.New("only RESP arrays are forwarded")
	}
	count, i := number(b, 1)
	if i == 0 {
		return 0, nil
	}
	for range count {
		if i >= len(b) {
			return 0, nil
		}
		if b[i] != '$' {
			return 0, errors.New("only bulk strings in requests")
		}
		size, j := number(b, i+1)
		if j == 0 {
			return 0, nil
		}
		i = j + size + 2
		if i > len(b) {
			return 0, nil
		}
	}
	return i, nil
}

// reply returns the length of the whole RESP2 or RESP3 reply at the start
// of b, or 0 when b does not hold all of it yet.
func reply(b []byte) int {
	switch b[0] {
	case '$', '=', '!': // bulk string, verbatim string, bulk error
		size, i := number(b, 1)
		if i == 0 {
			return 0
		}
		if size < 0 {
			return i
		}
		if i+size+2 > len(b) {
			return 0
		}
		return i + size + 2
	case '*', '~', '>', '%', '|': // aggregates
		count, i := number(b, 1)
		if i == 0 {
			return 0
		}
		switch {
		case b[0] == '%':
			count *= 2
		case b[0] == '|': // an attribute's pairs, then the reply it describes
			count = 2*count + 1
		}
		for range max(count, 0) {
			if i >= len(b) {
				return 0
			}
			k := reply(b[i:])
			if k == 0 {
				return 0
			}
			i += k
		}
		return i
	default: // a line: + - : _ , # (
		for i := 1; i+1 < len(b); i++ {
			if b[i] == '\r' && b[i+1] == '\n' {
				return i + 2
			}
		}
		return 0
	}
}

// number reads the decimal number that starts at b[i] and ends with CRLF;
// it returns the number and the index after the CRLF, or 0 for the index
// when b does not hold the whole line.
func number(b []byte, i int) (int, int) {
	neg := false
	if i < len(b) && b[i] == '-' {
		neg = true
		i++
	}
	n := 0
	for ; i < len(b); i++ {
		if b[i] == '\r' {
			if i+1 >= len(b) {
				return 0, 0
			}
			if neg {
				n = -n
			}
			return n, i + 2
		}
		n = n*10 + int(b[i]-'0')
	}
	return 0, 0
}
