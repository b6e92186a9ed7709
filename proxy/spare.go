package proxy

import (
	"crypto/tls"
	"errors"
	"sync"
	"syscall"
	"time"

	"github.com/lockproxy/lockproxy/proxy/internal/sentinel"
)

// spares keeps a few backend connections dialed and set up (TLS, the
// proxy's own AUTH and SELECT), ready for clients that move to a dedicated
// connection. A client's first command that needs one (SELECT, a blocking
// command, ...) then costs no dial: were it dialed on the client's request
// path, a command another client sends right after could reach Redis first,
// and a BLPOP or XREAD BLOCK would see a key that command already changed.
//
// One goroutine, the filler, dials: at start, and whenever a connection is
// taken. It is started by Proxy.Serve and ends with the root context;
// close waits for it and closes what was not taken. The methods are safe
// for concurrent use, and a nil *spares has none to give.
type spares struct {
	p    *Proxy
	size int
	addr string // a cluster master's (clusterspare.go); "" for the backend

	mu     sync.Mutex
	idle   []*backendConn
	closed bool

	wake chan struct{} // one pending signal: a connection was taken
	done chan struct{} // closed when the filler has returned
}

func newSpares(p *Proxy, size int) *spares {
	if size <= 0 {
		return nil
	}
	return &spares{p: p, size: size, wake: make(chan struct{}, 1), done: make(chan struct{})}
}

// start starts the filler.
func (sp *spares) start() {
	if sp == nil {
		return
	}
	go sp.fill()
}

// take returns a spare connection that is still open, or nil when there is
// none, and has the filler replace it.
func (sp *spares) take() *backendConn {
	if sp == nil {
		return nil
	}
	for {
		sp.mu.Lock()
		n := len(sp.idle)
		if n == 0 || sp.closed {
			sp.mu.Unlock()
			return nil
		}
		be := sp.idle[n-1] // the newest: the least likely to have been closed
		sp.idle[n-1] = nil
		sp.idle = sp.idle[:n-1]
		sp.mu.Unlock()
		select {
		case sp.wake <- struct{}{}:
		default:
		}
		if open(be) {
			return be
		}
		be.nc.Close()
	}
}

// open reports whether an idle connection is still open and has nothing to
// read: Redis may have closed it since (its timeout setting, CLIENT KILL, a
// restart). It peeks at the socket without waiting; a deadline would not
// do, since Go reports an expired one without reading.
func open(be *backendConn) bool {
	if be.r.Buffered() > 0 {
		return false
	}
	nc := be.nc
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

// fill keeps size connections ready until the root context ends. A failed
// dial is tried again after a wait that doubles from 25ms up to a second.
func (sp *spares) fill() {
	defer close(sp.done)
	root := sp.p.root
	var wait time.Duration
	for {
		sp.mu.Lock()
		need := !sp.closed && len(sp.idle) < sp.size
		sp.mu.Unlock()
		if !need {
			select {
			case <-sp.wake:
				continue
			case <-root.Done():
				return
			}
		}
		var be *backendConn
		var err error
		if sp.addr != "" {
			be, err = sp.p.dialAddr(root, sp.addr, replayState{})
		} else {
			be, err = sp.p.dial(root, replayState{})
		}
		if err != nil {
			wait = min(max(2*wait, 25*time.Millisecond), time.Second)
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-root.Done():
				t.Stop()
				return
			}
			continue
		}
		wait = 0
		sp.mu.Lock()
		if sp.closed {
			sp.mu.Unlock()
			be.nc.Close()
			return
		}
		sp.idle = append(sp.idle, be)
		sp.mu.Unlock()
	}
}

// close closes the connections not taken and, if the filler was started,
// waits for it; the root context must have ended.
func (sp *spares) close(started bool) {
	if sp == nil {
		return
	}
	sp.mu.Lock()
	sp.closed = true
	idle := sp.idle
	sp.idle = nil
	sp.mu.Unlock()
	for _, be := range idle {
		be.nc.Close()
	}
	if started {
		<-sp.done
	}
}
