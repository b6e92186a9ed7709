package quorum

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestGrantedRiderNotTakenAgain: a reader that a reader ahead of it took
// along and granted, and that took its grant, is never taken along again
// in the moment before it leaves the queue: a second round for it would
// put its holding back on the nodes after its caller released it.
func TestGrantedRiderNotTakenAgain(t *testing.T) {
	c := startCluster(t, 3)
	l := newLocker(t, c, testConfig())
	warm(t, c, l)
	ctx := ctxT(t)
	const ttl = 5 * time.Second
	// The queue as wait builds it: a reader at the head (attempting on its
	// own) and a reader behind it.
	head := l.enqueue("doc", "head-token", ttl, nil, true, ctx)
	l.activate(head, false)
	rider := l.enqueue("doc", "rider-token", ttl, nil, true, ctx)
	defer l.leave("doc", head)
	defer l.leave("doc", rider)

	riders := l.claimReaders("doc", head)
	if len(riders) != 1 || riders[0] != rider {
		t.Fatalf("claimed %d riders, want the one behind the head", len(riders))
	}
	hl, _, _, err := l.admitReaders(ctx, "doc", head, riders)
	if err != nil {
		t.Fatalf("the head's grant: %v", err)
	}
	// The rider takes its grant (as wait does), its caller releases it,
	// and only then does the rider leave the queue.
	h := <-rider.handed
	if !h.ok {
		t.Fatal("the rider was not granted")
	}
	mustUnlock(t, l, "doc", h.lk.Token)
	// Meanwhile the head attempts again (as after a failed attempt).
	if again := l.claimReaders("doc", head); len(again) > 0 {
		t.Errorf("the granted rider was taken along again")
		if _, _, _, err := l.admitReaders(ctx, "doc", head, again); err != nil {
			t.Fatalf("the head's second round: %v", err)
		}
	}
	for i, a := range c.admin {
		v, err := a.HExists(context.Background(), "lockproxy:lock:doc", "@rider-token").Result()
		if err != nil {
			t.Fatalf("HEXISTS on node %d: %v", i, err)
		}
		if v {
			t.Errorf("node %d holds the released rider's reader", i)
		}
	}
	mustUnlock(t, l, "doc", hl.Token)
}

// BenchmarkDeferPlacementAtCap: a node that is unreachable keeps the most
// placements (maxPendingPlacements), all of live readers of one resource;
// one op is one more reader's placement deferred there, under Locker.mu as
// startPlacement defers it. Every Locker call waits for that lock.
func BenchmarkDeferPlacementAtCap(b *testing.B) {
	c := startCluster(b, 3)
	l := newLocker(b, c, testConfig())
	n := l.nodes[2]
	c.servers[2].Kill() // its keeper never reaches it: nothing runs them
	end := time.Now().Add(time.Hour)
	form := &holdingForm{shared: true}
	add := func() *placement {
		p := &placement{resource: "doc", token: "t", attempt: "a", form: form, end: end, nodes: []*node{n}}
		p.timer = time.AfterFunc(time.Hour, func() {})
		l.mu.Lock()
		l.register(p)
		l.mu.Unlock()
		return p
	}
	for range maxPendingPlacements {
		p := add()
		l.mu.Lock()
		n.deferPlacement(p, l.pending)
		l.mu.Unlock()
	}
	ps := make([]*placement, b.N)
	for i := range ps {
		ps[i] = add()
	}
	b.ReportAllocs()
	b.ResetTimer()
	for _, p := range ps {
		l.mu.Lock()
		n.deferPlacement(p, l.pending)
		l.mu.Unlock()
	}
	b.StopTimer()
	if len(n.placements) != maxPendingPlacements {
		b.Fatalf("the node keeps %d placements, want %d", len(n.placements), maxPendingPlacements)
	}
	l.mu.Lock()
	for _, byToken := range l.placing {
		for _, ps := range byToken {
			for _, p := range ps {
				p.timer.Stop()
			}
		}
	}
	clear(l.placing)
	l.mu.Unlock()
}

// TestRiderGoneWhileTaken: a reader taken along whose caller is gone by the
// time its round runs is answered once, not granted, and leaves nothing on
// the nodes; the head is granted all the same.
func TestRiderGoneWhileTaken(t *testing.T) {
	c := startCluster(t, 3)
	l := newLocker(t, c, testConfig())
	warm(t, c, l)
	ctx := ctxT(t)
	const ttl = 5 * time.Second
	head := l.enqueue("doc", "head-token", ttl, nil, true, ctx)
	l.activate(head, false)
	rctx, cancel := context.WithCancel(ctx)
	rider := l.enqueue("doc", "rider-token", ttl, nil, true, rctx)
	defer l.leave("doc", head)
	defer l.leave("doc", rider)
	riders := l.claimReaders("doc", head)
	if len(riders) != 1 {
		t.Fatalf("claimed %d riders, want 1", len(riders))
	}
	cancel()
	if handed := l.activate(rider, true); !handed {
		t.Fatal("the rider stopped waiting but does not wait for the outcome of its round")
	}
	hl, _, _, err := l.admitReaders(ctx, "doc", head, riders)
	if err != nil {
		t.Fatalf("the head: %v", err)
	}
	if h := <-rider.handed; h.ok {
		t.Errorf("the gone rider was granted %+v", h.lk)
	}
	if len(rider.handed) != 0 {
		t.Error("the rider was answered twice")
	}
	for i, a := range c.admin {
		if v, _ := a.HExists(context.Background(), "lockproxy:lock:doc", "@rider-token").Result(); v {
			t.Errorf("node %d holds the gone rider's reader", i)
		}
	}
	mustUnlock(t, l, "doc", hl.Token)
}

// TestStalePlacementKeepsLaterExpiry: a reader's placement that lands on a
// node after the reader refreshed its holding there (RLock with its token,
// for a longer ttl) leaves the later expiry. Shortened to the first grant's
// ttl, the holding would leave that node while the refresh, which counted
// it, still gives the reader validity; with the first grant's ttl run out
// on the node the refresh missed as well, a writer could then take both.
func TestStalePlacementKeepsLaterExpiry(t *testing.T) {
	c := startCluster(t, 3)
	l := newLocker(t, c, testConfig())
	warm(t, c, l)
	const tok = "reader-token"
	c.servers[2].CutOff()
	mustRLock(t, l, "doc", 2*time.Second, Options{Token: tok})
	// The first grant's placement onto node 2 waits for node 2's keeper;
	// take it from there so that it runs only after the refresh below (as
	// its timer or the keeper may run it).
	n := l.nodes[2]
	var p1 *placement
	eventually(t, "the placement kept for node 2", func() bool {
		n.mu.Lock()
		defer n.mu.Unlock()
		for _, p := range n.placements {
			if p.token == tok {
				p1 = p
				n.placements = nil
				return true
			}
		}
		return false
	})
	l.mu.Lock()
	p1.timer.Stop()
	l.mu.Unlock()

	c.servers[1].CutOff()
	c.servers[2].Reconnect()
	eventually(t, "node 2 reachable", func() bool { return n.reachable.Load() })
	second := mustRLock(t, l, "doc", 30*time.Second, Options{Token: tok})
	if second.Validity < 20*time.Second {
		t.Fatalf("the refresh: validity %v", second.Validity)
	}
	left := func() time.Duration {
		v, err := c.admin[2].HGet(context.Background(), "lockproxy:lock:doc", "@"+tok).Result()
		if err != nil {
			t.Fatalf("node 2: %v", err)
		}
		now, err := c.admin[2].Time(context.Background()).Result()
		if err != nil {
			t.Fatal(err)
		}
		var exp int64
		if _, err := fmt.Sscanf(v, "%d|", &exp); err != nil {
			t.Fatalf("node 2 holds %q: %v", v, err)
		}
		return time.Duration(exp-now.UnixMilli()) * time.Millisecond
	}
	if d := left(); d < 20*time.Second {
		t.Fatalf("node 2 holds the refreshed reader for %v", d)
	}
	// The first grant's placement runs now.
	l.retryPlacement(p1)
	eventually(t, "the first grant's placement on node 2", func() bool {
		v, _ := c.admin[2].HGet(context.Background(), "lockproxy:lock:doc", "@"+tok).Result()
		return strings.Contains(v, p1.attempt)
	})
	if d := left(); d < 20*time.Second {
		t.Errorf("after the first grant's placement, node 2 holds the reader for %v, while the refresh gives it a validity of %v", d, second.Validity)
	}
	c.servers[1].Reconnect()
	mustUnlock(t, l, "doc", tok)
}

// TestPlacementAfterUnlockUndone: a reader's placement already on its way
// to a node when Unlock released the reader (Unlock drops the placement,
// but its request may reach the node after the release) does not leave
// the released reader on that node until the grant's ttl runs out.
func TestPlacementAfterUnlockUndone(t *testing.T) {
	c := startCluster(t, 3)
	l := newLocker(t, c, testConfig())
	warm(t, c, l)
	rd := mustRLock(t, l, "doc", 30*time.Second, Options{})
	// The grant's placement onto node 2 (as if node 2 had missed the
	// round), registered while the reader holds.
	p := &placement{resource: "doc", token: rd.Token, attempt: "placement-attempt", fence: rd.Fence,
		form: &holdingForm{shared: true}, end: time.Now().Add(30 * time.Second), nodes: []*node{l.nodes[2]}}
	l.addPlacement(p, time.Hour)
	mustUnlock(t, l, "doc", rd.Token)
	// Its goroutine, started before the Unlock, sends only now.
	l.mu.Lock()
	l.startPlacement(p, p.nodes)
	l.mu.Unlock()
	has := func() bool {
		v, _ := c.admin[2].HExists(context.Background(), "lockproxy:lock:doc", "@"+rd.Token).Result()
		return v
	}
	l.bg.Wait() // the placement's goroutine (the only one) is done
	if has() {
		t.Error("node 2 holds the reader after its Unlock")
	}
}
