package quorum

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
}

type waiter struct {
	turn chan struct{} // closed when the waiter becomes the head
}

// enqueue appends a waiter for resource; it is the head if the queue was
// empty.
func (l *Locker) enqueue(resource string) *waiter {
	w := &waiter{turn: make(chan struct{})}
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
			close(q.waiters[0].turn)
		}
		break
	}
	if len(q.waiters) == 0 {
		delete(l.queues, resource)
	}
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
	}
}

// notifyAll wakes every head, for when notifications may have been lost.
func (l *Locker) notifyAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, q := range l.queues {
		close(q.wake)
		q.wake = make(chan struct{})
	}
}
