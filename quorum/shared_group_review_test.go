package quorum

import (
	"context"
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
		l.placing[p.resource] = append(l.placing[p.resource], p)
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
	for _, ps := range l.placing {
		for _, p := range ps {
			p.timer.Stop()
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
