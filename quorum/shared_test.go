package quorum

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

// wantErr fails tb unless err is a *ModeError (mode true) or a
// *DeadlockError.
func wantModeErr(tb testing.TB, what string, err error, mode bool) {
	tb.Helper()
	var me *ModeError
	var de *DeadlockError
	switch {
	case mode && errors.As(err, &me):
	case !mode && errors.As(err, &de):
	default:
		tb.Fatalf("%s: got %v, want a mode error (%v) or deadlock (%v)", what, err, mode, !mode)
	}
}

func TestSemaphorePermits(t *testing.T) {
	c := startCluster(t, 3)
	l := newLocker(t, c, testConfig())
	warm(t, c, l)
	opt := Options{Permits: 3}
	slots := map[int]Lock{}
	var last int64
	for range 3 {
		lk := mustLock(t, l, "sem", 5*time.Second, opt)
		if _, dup := slots[lk.Slot]; dup || lk.Slot < 0 || lk.Slot > 2 {
			t.Fatalf("slot %d given twice or out of range (%v)", lk.Slot, slots)
		}
		if lk.Fence <= last {
			t.Fatalf("fence %d after %d", lk.Fence, last)
		}
		last = lk.Fence
		slots[lk.Slot] = lk
	}
	if _, err := l.Lock(ctxT(t), "sem", time.Second, opt); !errors.Is(err, ErrNotAcquired) {
		t.Fatalf("a fourth permit of 3: %v", err)
	}
	info, err := l.SharedInfo(ctxT(t), "sem")
	if err != nil || info.Mode != "semaphore" || info.K != 3 || info.Holders != 3 || info.Fence != last || len(info.Remaining) != 3 || info.Remaining[0] <= 4*time.Second {
		t.Fatalf("SharedInfo of 3 permits: %+v %v", info, err)
	}
	// The idempotent retry: the same slot and fence.
	again := mustLock(t, l, "sem", 5*time.Second, Options{Permits: 3, Token: slots[1].Token})
	if again.Slot != 1 || again.Fence != slots[1].Fence {
		t.Fatalf("refresh gave slot %d fence %d, want 1 and %d", again.Slot, again.Fence, slots[1].Fence)
	}
	// Other modes: -LOCKMODE at once, also with a wait.
	_, err = l.Lock(ctxT(t), "sem", time.Second, Options{Wait: time.Second})
	wantModeErr(t, "LOCK on a semaphore", err, true)
	_, err = l.Lock(ctxT(t), "sem", time.Second, Options{Permits: 2})
	wantModeErr(t, "PERMITS 2 on a semaphore of 3", err, true)
	_, err = l.RLock(ctxT(t), "sem", time.Second, Options{})
	wantModeErr(t, "RLOCK on a semaphore", err, true)

	if v, err := l.Extend(ctxT(t), "sem", slots[0].Token, 5*time.Second); err != nil || v <= 0 {
		t.Fatalf("Extend a permit: %v %v", v, err)
	}
	// A waiter gets the permit that is given back, with a larger fence.
	ch := lockAsync(t, ctxT(t), l, "sem", time.Second, Options{Permits: 3, Wait: 5 * time.Second})
	waitQueued(t, l, "sem", 1)
	mustUnlock(t, l, "sem", slots[2].Token)
	r := recv(t, ch)
	if r.err != nil || r.lk.Slot != 2 || r.lk.Fence <= last {
		t.Fatalf("waiter: %+v %v, want slot 2 and a fence above %d", r.lk, r.err, last)
	}
	if err := l.Unlock(ctxT(t), "sem", slots[2].Token); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("second Unlock of a permit: %v", err)
	}
	for _, lk := range []Lock{slots[0], slots[1], r.lk} {
		mustUnlock(t, l, "sem", lk.Token)
	}
	for i := range c.servers {
		if keys := c.lockKeys(t, i); len(keys) != 0 {
			// Tombstones of attempts may remain; holdings may not.
			for _, k := range keys {
				if n, _ := c.admin[i].HLen(ctxT(t), k).Result(); n > 0 {
					if v, _ := c.admin[i].HGetAll(ctxT(t), k).Result(); hasHolding(v) {
						t.Fatalf("node %d still holds %v", i, v)
					}
				}
			}
		}
	}
	// Free again: a plain LOCK takes it.
	mustUnlock(t, l, "sem", mustLock(t, l, "sem", time.Second, Options{}).Token)
}

func hasHolding(fields map[string]string) bool {
	for f := range fields {
		if f[0] == '#' || f[0] == '@' {
			return true
		}
	}
	return false
}

func TestReadWrite(t *testing.T) {
	c := startCluster(t, 3)
	l := newLocker(t, c, testConfig())
	warm(t, c, l)
	r1 := mustRLock(t, l, "rw", 5*time.Second, Options{})
	r2 := mustRLock(t, l, "rw", 5*time.Second, Options{})
	if r1.Token == r2.Token || r2.Fence <= r1.Fence {
		t.Fatalf("readers %+v %+v", r1, r2)
	}
	if _, err := l.Lock(ctxT(t), "rw", time.Second, Options{}); !errors.Is(err, ErrNotAcquired) {
		t.Fatalf("LOCK while read: %v", err)
	}
	if info, err := l.SharedInfo(ctxT(t), "rw"); err != nil || info.Mode != "shared" || info.Holders != 2 || info.Fence != r2.Fence {
		t.Fatalf("SharedInfo of 2 readers: %+v %v", info, err)
	}
	_, err := l.Lock(ctxT(t), "rw", time.Second, Options{Token: r1.Token, Wait: time.Second})
	wantModeErr(t, "upgrade", err, false)
	_, err = l.Lock(ctxT(t), "rw", time.Second, Options{Permits: 2})
	wantModeErr(t, "PERMITS on a read lock", err, true)
	again := mustRLock(t, l, "rw", 5*time.Second, Options{Token: r1.Token})
	if again.Fence != r1.Fence {
		t.Fatalf("refresh of a reader: fence %d, want %d", again.Fence, r1.Fence)
	}
	// A waiting writer is handed the lock by the last reader's Unlock.
	ch := lockAsync(t, ctxT(t), l, "rw", 2*time.Second, Options{Wait: 5 * time.Second})
	waitQueued(t, l, "rw", 1)
	mustUnlock(t, l, "rw", r1.Token)
	mustUnlock(t, l, "rw", r2.Token)
	w := recv(t, ch)
	if w.err != nil || w.lk.Fence <= r2.Fence {
		t.Fatalf("writer: %+v %v", w.lk, w.err)
	}
	if _, err := l.RLock(ctxT(t), "rw", time.Second, Options{}); !errors.Is(err, ErrNotAcquired) {
		t.Fatalf("RLOCK while written: %v", err)
	}
	_, err = l.RLock(ctxT(t), "rw", time.Second, Options{Token: w.lk.Token})
	wantModeErr(t, "RLOCK by the writer", err, false)
	mustUnlock(t, l, "rw", w.lk.Token)
	r3 := mustRLock(t, l, "rw", time.Second, Options{})
	if r3.Fence <= w.lk.Fence {
		t.Fatalf("reader after the writer: fence %d after %d", r3.Fence, w.lk.Fence)
	}
	mustUnlock(t, l, "rw", r3.Token)
	if info, err := l.SharedInfo(ctxT(t), "rw"); err != nil || info.Mode != "" {
		t.Fatalf("SharedInfo of a free resource: %+v %v", info, err)
	}
}

func mustRLock(tb testing.TB, l *Locker, resource string, ttl time.Duration, opt Options) Lock {
	tb.Helper()
	lk, err := l.RLock(ctxT(tb), resource, ttl, opt)
	if err != nil {
		tb.Fatalf("RLock(%q): %v", resource, err)
	}
	return lk
}

// TestWriterIntentBound: a writer waiting on one Locker gets the lock
// within the documented bound (shared.go: RetryMax + a round + the longest
// reader ttl) while readers on another Locker keep arriving, so that at
// every moment some reader holds the resource.
func TestWriterIntentBound(t *testing.T) {
	c := startCluster(t, 3)
	cfg := testConfig()
	readers, writers := newLocker(t, c, cfg), newLocker(t, c, cfg)
	warm(t, c, readers)
	const readerTTL = 400 * time.Millisecond
	stop := make(chan struct{})
	done := make(chan struct{})
	var grants, afterWriter int
	var writerAt time.Time
	var mu = make(chan struct{}, 1)
	go func() {
		defer close(done)
		ctx := ctxT(t)
		type rd struct {
			lk Lock
			at time.Time
		}
		var held []rd
		for {
			select {
			case <-stop:
				for _, r := range held {
					readers.Unlock(ctx, "doc", r.lk.Token)
				}
				return
			default:
			}
			// A new reader every 50ms, each held 200ms: two to four
			// readers overlap at any time.
			if lk, err := readers.RLock(ctx, "doc", readerTTL, Options{}); err == nil {
				held = append(held, rd{lk, time.Now()})
				mu <- struct{}{}
				grants++
				if !writerAt.IsZero() {
					afterWriter++
				}
				<-mu
			}
			for len(held) > 0 && time.Since(held[0].at) > 200*time.Millisecond {
				readers.Unlock(ctx, "doc", held[0].lk.Token)
				held = held[1:]
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	// Let the stream of readers run first.
	eventually(t, "readers holding", func() bool {
		mu <- struct{}{}
		defer func() { <-mu }()
		return grants >= 4
	})
	start := time.Now()
	mu <- struct{}{}
	writerAt = start
	<-mu
	lk, err := writers.Lock(ctxT(t), "doc", time.Second, Options{Wait: 5 * time.Second})
	waited := time.Since(start)
	close(stop)
	<-done
	if err != nil {
		t.Fatalf("the writer waited %v and got %v", waited, err)
	}
	bound := cfg.RetryMax + 2*cfg.NodeTimeout + readerTTL
	t.Logf("the writer waited %v (bound %v); %d reader grants in all, %d after the writer began to wait", waited, bound, grants, afterWriter)
	if waited > bound {
		t.Errorf("the writer waited %v, more than the bound %v", waited, bound)
	}
	mustUnlock(t, writers, "doc", lk.Token)
}

// TestModeAnsweredAtOnceWhenQueued: a request in another mode gets its
// ModeError at once, also with WAIT behind local waiters.
func TestModeAnsweredAtOnceWhenQueued(t *testing.T) {
	c := startCluster(t, 3)
	l := newLocker(t, c, testConfig())
	warm(t, c, l)
	p0 := mustLock(t, l, "q", 5*time.Second, Options{Permits: 2})
	p1 := mustLock(t, l, "q", 5*time.Second, Options{Permits: 2})
	ch := lockAsync(t, ctxT(t), l, "q", time.Second, Options{Permits: 2, Wait: 10 * time.Second})
	waitQueued(t, l, "q", 1)
	for _, opt := range []Options{{Permits: 3, Wait: 5 * time.Second}, {Wait: 5 * time.Second}, {shared: true, Wait: 5 * time.Second}} {
		start := time.Now()
		_, err := l.Lock(ctxT(t), "q", time.Second, opt)
		wantModeErr(t, fmt.Sprintf("%+v behind a waiter", opt), err, true)
		if d := time.Since(start); d > time.Second {
			t.Errorf("%+v: answered after %v, not at once", opt, d)
		}
	}
	mustUnlock(t, l, "q", p0.Token)
	if r := recv(t, ch); r.err != nil {
		t.Fatalf("the waiter: %v", r.err)
	} else {
		mustUnlock(t, l, "q", r.lk.Token)
	}
	mustUnlock(t, l, "q", p1.Token)
}
