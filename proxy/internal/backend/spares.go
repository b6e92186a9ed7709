package backend

import (
	"context"
	"sync"
	"time"
)

// Spares keeps a few backend connections dialed and set up (TLS, the
// proxy's own AUTH and SELECT), ready for clients that move to a dedicated
// connection. A client's first command that needs one (SELECT, a blocking
// command, ...) then costs no dial: were it dialed on the client's request
// path, a command another client sends right after could reach Redis first,
// and a BLPOP or XREAD BLOCK would see a key that command already changed.
//
// One goroutine, the filler, dials: at start, and whenever a connection is
// taken. It is started by Start and ends with the context Start was given;
// Close waits for it and closes what was not taken. The methods are safe
// for concurrent use, and a nil *Spares has none to give.
type Spares struct {
	size int
	dial func(context.Context) (*Conn, error)

	mu     sync.Mutex
	idle   []*Conn
	closed bool

	wake chan struct{} // one pending signal: a connection was taken
	done chan struct{} // closed when the filler has returned
}

// NewSpares returns spares that keep size connections made by dial; nil
// when size is 0 or less.
func NewSpares(size int, dial func(context.Context) (*Conn, error)) *Spares {
	if size <= 0 {
		return nil
	}
	return &Spares{size: size, dial: dial, wake: make(chan struct{}, 1), done: make(chan struct{})}
}

// Start starts the filler, which dials until ctx ends.
func (sp *Spares) Start(ctx context.Context) {
	if sp == nil {
		return
	}
	go sp.fill(ctx)
}

// Take returns a spare connection that is still open, or nil when there is
// none, and has the filler replace it.
func (sp *Spares) Take() *Conn {
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
		if be.Open() {
			return be
		}
		be.NC.Close()
	}
}

// fill keeps size connections ready until ctx ends. A failed dial is
// tried again after a wait that doubles from 25ms up to a second.
func (sp *Spares) fill(ctx context.Context) {
	defer close(sp.done)
	var wait time.Duration
	for {
		sp.mu.Lock()
		need := !sp.closed && len(sp.idle) < sp.size
		sp.mu.Unlock()
		if !need {
			select {
			case <-sp.wake:
				continue
			case <-ctx.Done():
				return
			}
		}
		be, err := sp.dial(ctx)
		if err != nil {
			wait = min(max(2*wait, 25*time.Millisecond), time.Second)
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return
			}
			continue
		}
		wait = 0
		sp.mu.Lock()
		if sp.closed {
			sp.mu.Unlock()
			be.NC.Close()
			return
		}
		sp.idle = append(sp.idle, be)
		sp.mu.Unlock()
	}
}

// Close closes the connections not taken and, if the filler was started,
// waits for it; the filler's context must have ended.
func (sp *Spares) Close(started bool) {
	if sp == nil {
		return
	}
	sp.mu.Lock()
	sp.closed = true
	idle := sp.idle
	sp.idle = nil
	sp.mu.Unlock()
	for _, be := range idle {
		be.NC.Close()
	}
	if started {
		<-sp.done
	}
}

// Size returns how many connections sp keeps ready: 0 for nil.
func (sp *Spares) Size() int {
	if sp == nil {
		return 0
	}
	return sp.size
}
