package quorum

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"
)

// Readers waiting together are admitted together. Only the head of a
// resource's queue attempts on the nodes (queue.go), so readers queued
// behind a reader would each get their turn, and their round, one after
// the other: N readers waiting for a writer would be granted over N rounds
// after its release. Instead, each attempt of a reader at the head (but
// one right after an attempt without a quorum) takes along the readers
// queued right behind it, up to the first waiter that is not a reader (a
// writer, a semaphore or an MLOCK waiter: readers behind it keep waiting,
// so that arrival order between readers and writers holds), and runs
// every one's round at once: each node gets all of their operations in one
// batch, one call (admitReaders). A reader taken along gets its outcome on
// its handed channel; one that was not granted keeps waiting for its turn.
//
// Safety is a lone reader's. Each reader's round is its own, with its own
// token, attempt, ttl and context, counted, confirmed and cleaned up
// exactly as a lone reader's is (hashTry); only the sending is shared, and
// a node runs the operations of one call one after the other, each by the
// rules of hashLua. So the intersection argument of shared.go applies to
// each reader as it stands.

// maxRiders is the most readers one reader at the head takes along, so
// that one round stays within one opsScript call (maxOps).
const maxRiders = maxOps/2 - 1

// withRiders returns try for w, a reader waiting for resource, that takes
// along the readers queued right behind it (see above).
// After an attempt without a quorum the next goes alone: the riders'
// rounds would only fail as well, each with a cleanup of its own.
func (l *Locker) withRiders(resource string, w *waiter, try attemptFunc) attemptFunc {
	alone := false
	return func(ctx context.Context) (Lock, time.Duration, error) {
		var riders []*waiter
		if !alone {
			riders = l.claimReaders(resource, w)
		}
		var (
			lk    Lock
			hint  time.Duration
			again bool
			err   error
		)
		if len(riders) > 0 {
			lk, hint, again, err = l.admitReaders(ctx, resource, w, riders)
		}
		if len(riders) == 0 || again {
			lk, hint, err = try(ctx)
		}
		var nq *NoQuorumError
		alone = errors.As(err, &nq)
		return lk, hint, err
	}
}

// claimReaders returns the readers queued right behind head, the head of
// resource's queue, that wait for their turn (not being admitted
// already), marked as being handed their outcome; nil when there are none.
func (l *Locker) claimReaders(resource string, head *waiter) []*waiter {
	l.mu.Lock()
	defer l.mu.Unlock()
	q := l.queues[resource]
	if q == nil || q.waiters[0] != head {
		return nil
	}
	var riders []*waiter
	for _, w := range q.waiters[1:] {
		if w.reader == nil {
			break // not a reader: those behind it wait for it
		}
		if w.gone || w.active || w.handing || len(w.handed) > 0 || w.reader.Err() != nil {
			continue
		}
		w.handing = true
		riders = append(riders, w)
		if len(riders) == maxRiders {
			break
		}
	}
	return riders
}

// activate marks w, which got its turn (or, with gone, stopped waiting),
// so that no reader ahead of it takes it along any more, and reports
// whether one did meanwhile: the caller then takes the outcome from
// w.handed (it may be there already).
func (l *Locker) activate(w *waiter, gone bool) (handed bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if gone {
		w.gone = true
	} else {
		w.active = true
	}
	return w.handing || len(w.handed) > 0
}

// admitReaders runs one round for head, a reader at the head of
// resource's queue, and for riders, the readers claimed behind it, sent
// together. It returns the head's outcome as attempt does (again as for
// attemptOnce) and delivers each rider's on its handed channel.
func (l *Locker) admitReaders(ctx context.Context, resource string, head *waiter, riders []*waiter) (Lock, time.Duration, bool, error) {
	ts := make([]*hashTry, 0, 1+len(riders))
	ts = append(ts, l.newHashTry(ctx, resource, head.ttl, head.token, 0, 0, codeSharedWait))
	for _, w := range riders {
		ts = append(ts, l.newHashTry(w.reader, resource, w.ttl, w.token, 0, 0, codeSharedWait))
	}
	l.countRounds(ts)
	// Confirming and cleaning up take a round each when needed: the
	// riders' run at the same time as the head's.
	var wg sync.WaitGroup
	for i, w := range riders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lk, _, _, _, err := ts[i+1].finish()
			if err == nil {
				l.ridersGranted.Add(1)
			}
			l.deliver(w, handoff{lk: lk, ok: err == nil, start: ts[i+1].start})
		}()
	}
	lk, hint, _, again, err := ts[0].finish()
	wg.Wait()
	return lk, hint, again, err
}

// countRounds is countRound for the rounds of ts at once: every node gets
// their requests together.
func (l *Locker) countRounds(ts []*hashTry) {
	rs := make([]*round, len(ts))
	for i, t := range ts {
		rs[i] = t.r
	}
	var res0 []reply // the replies of a fresh round
	l.fanoutAll(l.nodes, rs, func(j int, res []reply) {
		t := ts[j]
		l.settleClock(l.nodes, res, t.start)
		fresh := l.fresh(res, t.start)
		if fresh && res0 == nil {
			res0 = slices.Clone(res) // res is the round's, gone after this
		}
		t.count(res, fresh)
	})
	for _, t := range ts {
		t.r = nil
	}
	if res0 != nil {
		l.initFresh(context.WithoutCancel(ts[0].ctx), res0)
	}
}
