package quorum

import (
	"context"
	"time"
)

// waitQueue holds the local waiters for one resource in arrival order. Only
// the head contends on the nodes; the others wait for their turn, so a
// Locker never splits the votes among its own waiters and serves them
// first come, first served. A queue exists only while it has waiters, so
// memory follows the number of resources being waited for, not ever locked.
type waitQueue struct {
	waiters []*waiter
	// wake is closed, and replaced, when a release of the resource is
	// observed. The head takes the channel before each attempt, so a release
	// that lands during the attempt triggers the next one at once.
	wake chan struct{}
	// handedUntil, when not zero, is the validity's end of the lock that
	// an Unlock through this Locker handed to a waiter of this queue, until
	// a release of the resource is observed (notify). The next head then
	// knows the lock held and skips its first attempt (see wait).
	handedUntil time.Time
}

type waiter struct {
	turn chan struct{} // closed when the waiter becomes the head
	// behind counts, for a group's waiter (mlock.go), the queues it is
	// not the head of yet, under Locker.mu; its turn comes at the last.
	behind int

	// What an Unlock of the resource needs to hand the lock to this
	// waiter (see handOver), and the handoff's state, under Locker.mu.
	token   string
	ttl     time.Duration
	form    *form        // what the waiter's holding stores (reentrant.go)
	idle    bool         // the head, between attempts: it may be handed the lock
	hash    bool         // a shared or semaphore waiter: never handed a lock
	handing bool         // an Unlock is handing it the lock; the outcome comes on handed
	handed  chan handoff // capacity 1

	// reader, for a shared waiter, is its caller's context: readers
	// queued together are admitted together (shared_group.go), each with
	// its own context, and a reader taken along by the one ahead of it is
	// handing meanwhile. nil for every other waiter. active: the waiter
	// attempts on its own (it is the head), so no reader ahead takes it
	// along any more; gone: it stopped waiting. Under Locker.mu.
	reader       context.Context
	active, gone bool
}

// handoff is the outcome of handing a lock to a waiter: ok with the Lock,
// or not (the waiter then attempts as before).
type handoff struct {
	lk    Lock
	ok    bool
	start time.Time // when the handing round began
}

// enqueue appends a waiter for resource that would lock it with token for
// ttl (f: what its holding stores; hash: a shared or semaphore holding;
// reader: a shared holding's caller's context, else nil); it is the head if
// the queue was empty.
func (l *Locker) enqueue(resource, token string, ttl time.Duration, f *form, hash bool, reader context.Context) *waiter {
	w := &waiter{turn: make(chan struct{}), token: token, ttl: ttl, form: f, hash: hash, reader: reader, handed: make(chan handoff, 1)}
	l.mu.Lock()
	defer l.mu.Unlock()
	q := l.queues[resource]
	if q == nil {
		q = &waitQueue{wake: make(chan struct{})}
		l.queues[resource] = q
	}
	q.waiters = append(q.waiters, w)
	if len(q.waiters) == 1 {
		close(w.turn)
	}
	return w
}

// leave removes w from resource's queue. If w was the head, the next waiter
// becomes the head at once.
func (l *Locker) leave(resource string, w *waiter) {
	l.mu.Lock()
	defer l.mu.Unlock()
	q := l.queues[resource]
	if q == nil {
		return
	}
	for i, x := range q.waiters {
		if x != w {
			continue
		}
		q.waiters = append(q.waiters[:i], q.waiters[i+1:]...)
		if i == 0 && len(q.waiters) > 0 {
			q.waiters[0].promote()
		}
		break
	}
	if len(q.waiters) == 0 {
		delete(l.queues, resource)
	}
}

// setIdle marks w, the head, as between attempts (idle) or not. Leaving
// idleness reports whether an Unlock took w for a handoff meanwhile: the
// caller must then take the outcome from w.handed (it may be there
// already).
func (l *Locker) setIdle(w *waiter, idle bool) (handed bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	w.idle = idle
	return w.handing || len(w.handed) > 0
}

// claimHandoff returns the head waiting for resource if it is between
// attempts and waits for another token than the releasing one, marked as
// being handed the lock; nil otherwise.
func (l *Locker) claimHandoff(resource, releasing string) *waiter {
	l.mu.Lock()
	defer l.mu.Unlock()
	q := l.queues[resource]
	if q == nil {
		return nil
	}
	w := q.waiters[0]
	if !w.idle || w.handing || w.hash || w.token == releasing {
		return nil
	}
	w.idle, w.handing = false, true
	return w
}

// deliver ends w's handoff with h. The outcome is in w.handed before the
// handoff stops counting as under way, so setIdle never misses it.
func (l *Locker) deliver(w *waiter, h handoff) {
	l.mu.Lock()
	defer l.mu.Unlock()
	w.handed <- h // capacity 1, and one handoff at a time
	w.handing = false
	if h.ok && w.reader != nil {
		// A reader granted along with the one ahead of it is done
		// waiting: taken along again after it took the grant (it may
		// even have been released by then), it would be granted anew.
		w.gone = true
	}
}

// queuedHash reports whether shared or semaphore waiters are queued for
// resource.
func (l *Locker) queuedHash(resource string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if q := l.queues[resource]; q != nil {
		for _, w := range q.waiters {
			if w.hash {
				return true
			}
		}
	}
	return false
}

// queued reports whether local waiters are queued for resource.
func (l *Locker) queued(resource string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.queues[resource] != nil
}

// wakeChan returns the channel that the next release of resource closes, or
// nil (never ready) when nobody waits for resource.
func (l *Locker) wakeChan(resource string) <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	if q := l.queues[resource]; q != nil {
		return q.wake
	}
	return nil
}

// notify wakes the head waiting for resource, if any.
func (l *Locker) notify(resource string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if q := l.queues[resource]; q != nil {
		close(q.wake)
		q.wake = make(chan struct{})
		q.handedUntil = time.Time{}
	}
}

// notifyAll wakes every head, for when notifications may have been lost.
func (l *Locker) notifyAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, q := range l.queues {
		close(q.wake)
		q.wake = make(chan struct{})
		q.handedUntil = time.Time{}
	}
}

// noteHanded records that the lock of resource was handed to a waiter of
// its queue, valid until until (see waitQueue.handedUntil).
func (l *Locker) noteHanded(resource string, until time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if q := l.queues[resource]; q != nil {
		q.handedUntil = until
	}
}

// handedFor returns how long the lock of resource that this Locker handed
// to a waiter stays valid, or 0 when no such handing is known: none was
// made, a release was observed since, or its validity has run out.
func (l *Locker) handedFor(resource string) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if q := l.queues[resource]; q != nil && !q.handedUntil.IsZero() {
		return max(time.Until(q.handedUntil), 0)
	}
	return 0
}
