package quorum

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/internal/redistest"
)

// heldCleanup is a cleanup that holdBackCleanups kept from the nodes.
type heldCleanup struct {
	token, attempt string
	nodes          []*node
}

// holdBackCleanups keeps every cleanup of resource from the nodes until
// the returned deliver sends them, in the order they were made, as a
// link that holds them back would deliver them late. Nothing is left to
// the keeper meanwhile: the nodes see each cleanup only at deliver.
func holdBackCleanups(tb testing.TB, l *Locker, resource string) (held func() []heldCleanup, deliver func()) {
	var (
		mu   sync.Mutex
		kept []heldCleanup
	)
	hook := func(r, token, attempt string, nodes []*node) []*node {
		if r != resource {
			return nodes
		}
		mu.Lock()
		defer mu.Unlock()
		kept = append(kept, heldCleanup{token, attempt, append([]*node(nil), nodes...)})
		return nil
	}
	testHookCleanup.Store(&hook)
	tb.Cleanup(func() { testHookCleanup.Store(nil) })
	held = func() []heldCleanup {
		mu.Lock()
		defer mu.Unlock()
		return append([]heldCleanup(nil), kept...)
	}
	deliver = func() {
		testHookCleanup.Store(nil)
		for _, c := range held() {
			l.cleanup(context.Background(), c.nodes, resource, c.token, c.attempt, 10*time.Second, false)
		}
	}
	return held, deliver
}

// TestReentrantRetryOwnLeftover: a reentrant Lock's failed attempt leaves
// its holding on a node, and its cleanup reaches that node only after the
// call's next attempt. The retry must take the lock with one hold, not
// count the leftover as a hold taken before the call; the late cleanup
// must leave the lock that the retry relies on. Node 2 is down and
// another owner holds the lock on node 1 for a while, so the first
// attempts win node 0 alone; the retry that wins has node 0 (the
// leftover) and node 1 (fresh): one fresh of two counting grants.
func TestReentrantRetryOwnLeftover(t *testing.T) {
	c := startCluster(t, 3)
	l := newLocker(t, c, testConfig())
	warm(t, c, l)
	ctx := context.Background()
	held, deliver := holdBackCleanups(t, l, "R")
	c.kill(2)
	if err := c.admin[1].Set(ctx, "lockproxy:lock:R", "05/z.1:other", 700*time.Millisecond).Err(); err != nil {
		t.Fatal(err)
	}
	lk, err := l.Lock(ctxT(t), "R", 10*time.Second, Options{Reentrant: true, Token: "T", Wait: 10 * time.Second})
	if err != nil {
		t.Fatalf("Lock: %v", err)
	}
	if len(held()) == 0 {
		t.Fatal("no failed attempt: the retry did not meet a leftover")
	}
	if lk.Holds != 1 {
		t.Errorf("a fresh reentrant lock after failed attempts has %d holds, want 1 (value on node 0: %q)", lk.Holds, c.admin[0].Get(ctx, "lockproxy:lock:R").Val())
	}
	deliver()
	for i := range 2 {
		if h, _ := c.holdsOn(t, i, "R"); c.holder(t, i, "R") != "T" || h != 1 {
			t.Errorf("node %d after the late cleanups: holder %q, %d holds; want T with 1", i, c.holder(t, i, "R"), h)
		}
	}
	mustRelease(t, l, "R", "T", 0, 0)
	for i := range 2 {
		if h := c.holder(t, i, "R"); h != "" {
			t.Errorf("node %d holds R for %q after the only hold was released", i, h)
		}
	}
}

// TestReentrantRetryRecoveredLeftover: the recovery of a node that
// restarted empty copies a failed attempt's leftover from another node
// (its cleanup has not arrived there yet, and none is ever sent to the
// recovered node). The call's next attempt, counting the recovered node
// and a fresh one, must not take the copy for an older hold.
func TestReentrantRetryRecoveredLeftover(t *testing.T) {
	c := startCluster(t, 3)
	l := newLocker(t, c, noFallback(testConfig()))
	warm(t, c, l)
	ctx := context.Background()
	held, deliver := holdBackCleanups(t, l, "R")

	// The first attempt wins node 0 only: nodes 1 and 2 are paused.
	c.servers[1].Pause()
	c.servers[2].Pause()
	paused := []int{1, 2}
	defer func() {
		for _, i := range paused {
			c.servers[i].Resume()
		}
	}()
	ch := lockAsync(t, ctxT(t), l, "R", 15*time.Second, Options{Reentrant: true, Token: "T", Wait: 15 * time.Second})
	eventually(t, "the first attempt failed", func() bool { return len(held()) > 0 })
	if h := c.holder(t, 0, "R"); h != "T" {
		t.Fatalf("node 0 holds R for %q after the first attempt, want its leftover", h)
	}
	// Node 2 comes back empty and is recovered from nodes 0 and 1.
	c.servers[2].Resume()
	c.servers[2].RestartEmpty()
	c.servers[1].Resume()
	paused = nil
	waitRecovered(t, l, 2)
	if h := c.holder(t, 2, "R"); h != "T" {
		t.Fatalf("node 2 holds R for %q after its recovery, want the copy of node 0's leftover", h)
	}
	if n := len(held()); n != 1 {
		t.Fatalf("%d attempts failed before the recovery, want 1 (the waiter retries on a notification only)", n)
	}

	// The retry counts nodes 1 (free) and 2 (the copy); node 0 is cut off.
	c.servers[0].CutOff()
	defer c.servers[0].Reconnect()
	if err := c.admin[1].Publish(ctx, "lockproxy:released", "R").Err(); err != nil {
		t.Fatal(err)
	}
	r := recv(t, ch)
	if r.err != nil {
		t.Fatalf("Lock after the recovery: %v", r.err)
	}
	if r.lk.Holds != 1 {
		t.Errorf("a fresh reentrant lock counting a recovered leftover has %d holds, want 1 (node 2: %q)", r.lk.Holds, c.admin[2].Get(ctx, "lockproxy:lock:R").Val())
	}
	c.servers[0].Reconnect()
	waitUsable(t, l, 0)
	deliver()
	mustRelease(t, l, "R", "T", 0, 0)
	for i := range 3 {
		if v := c.admin[i].Get(ctx, "lockproxy:lock:R").Val(); v != "" && !strings.HasPrefix(v, "x/") {
			t.Errorf("node %d keeps %q after the only hold was released", i, v)
		}
	}
}

// TestReentrantRetryOwnCount: a re-entry's attempt that won the nodes but
// stored the new count on a minority only (then failed) leaves that count
// there; the call's next attempt must write the count it meant to, not
// one more.
func TestReentrantRetryOwnCount(t *testing.T) {
	c := startCluster(t, 3)
	l := newLocker(t, c, testConfig())
	warm(t, c, l)
	re := Options{Reentrant: true, Token: "T"}
	mustLock(t, l, "R", 10*time.Second, re)
	if lk := mustLock(t, l, "R", 10*time.Second, re); lk.Holds != 2 {
		t.Fatalf("second hold: %d holds", lk.Holds)
	}
	_, before := c.holdsOn(t, 1, "R")
	f := l.callForm(newForm(re))
	call := f.call
	// The call's first attempt read 2 holds, and stored 3 on node 0 only.
	first := holdState{holds: 2, version: before}
	if _, err := l.settleHolds(ctxT(t), "lockproxy:lock:R", "T", f.attemptID(l), []grant{
		{node: l.nodes[0], counts: true, hold: first},
		{node: l.nodes[1], counts: true, hold: first},
	}, call, 0, 2); err != nil {
		t.Fatal(err)
	}
	if h, v := c.holdsOn(t, 0, "R"); h != 3 || v != before+1 {
		t.Fatalf("node 0 after the first attempt: %d holds version %d", h, v)
	}
	// Nodes 1 and 2 missed it (set back); the retry counts nodes 0 and 1.
	wrote := ";3." + strconv.FormatInt(before+1, 10) + ";"
	for _, i := range []int{1, 2} {
		v := c.admin[i].Get(context.Background(), "lockproxy:lock:R").Val()
		if !strings.Contains(v, wrote) {
			t.Fatalf("node %d: %q", i, v)
		}
		v = strings.Replace(v, wrote, ";2."+strconv.FormatInt(before, 10)+";", 1)
		c.admin[i].Set(context.Background(), "lockproxy:lock:R", v, redis.KeepTTL)
	}
	hs, err := l.settleHolds(ctxT(t), "lockproxy:lock:R", "T", f.attemptID(l), []grant{
		{node: l.nodes[0], counts: true, hold: holdState{holds: 3, version: before + 1}},
		{node: l.nodes[1], counts: true, hold: first},
	}, call, 0, 2)
	if err != nil || hs.holds != 3 || hs.version != before+2 {
		t.Fatalf("the retry settled %+v, %v; want 3 holds, version %d", hs, err, before+2)
	}
	for i := range 3 {
		if h, _ := c.holdsOn(t, i, "R"); h != 3 {
			t.Errorf("node %d stores %d holds, want 3", i, h)
		}
	}
}

// TestReentryKeepsFence: a re-entry replies the fence of the holding it
// re-enters, also when it takes the lock afresh on a node that missed the
// holding (cut off at the grant, or not yet reached by a placement) and
// whose counter has run ahead; that node then stores the holding's fence,
// and the next holder's fence is still larger than any the nodes gave.
func TestReentryKeepsFence(t *testing.T) {
	c := startCluster(t, 3)
	l := newLocker(t, c, testConfig())
	warm(t, c, l)
	ctx := context.Background()
	if err := c.admin[2].IncrBy(ctx, "lockproxy:fence", 1000).Err(); err != nil {
		t.Fatal(err)
	}
	c.servers[2].CutOff()
	re := Options{Reentrant: true, Token: "T"}
	lk := mustLock(t, l, "R", 10*time.Second, re)
	c.servers[2].Reconnect()
	waitUsable(t, l, 2)
	if c.holder(t, 2, "R") != "" {
		t.Fatal("node 2 holds R: it was cut off at the grant")
	}
	again := mustLock(t, l, "R", 10*time.Second, re)
	if again.Holds != 2 || again.Fence != lk.Fence {
		t.Fatalf("re-entry: %d holds, fence %d; want 2 holds and the holding's fence %d", again.Holds, again.Fence, lk.Fence)
	}
	for i := range 3 {
		v := c.admin[i].Get(ctx, "lockproxy:lock:R").Val()
		if !strings.HasPrefix(v[1:], strconv.FormatInt(lk.Fence, 10)+"/") {
			t.Errorf("node %d stores %q, want fence %d", i, v, lk.Fence)
		}
	}
	// A third hold through nodes 1 and 2 only: the same fence.
	c.servers[0].CutOff()
	third := mustLock(t, l, "R", 10*time.Second, re)
	c.servers[0].Reconnect()
	if third.Holds != 3 || third.Fence != lk.Fence {
		t.Fatalf("re-entry through nodes 1 and 2: %d holds, fence %d; want 3 and %d", third.Holds, third.Fence, lk.Fence)
	}
	waitUsable(t, l, 0)
	mustRelease(t, l, "R", "T", 1, 0)
	next := mustLock(t, l, "R", time.Second, Options{})
	if next.Fence <= 1000 {
		t.Fatalf("the next holder's fence %d is not above node 2's counter", next.Fence)
	}
}

// TestReentryKeepsFenceLostReply: a node whose reply to the grant was
// lost (a slow link) took the lock with a fence of its own, far above the
// grant's; a later re-entry that counts it and a node of the grant
// replies the grant's fence, not that node's.
func TestReentryKeepsFenceLostReply(t *testing.T) {
	c := startCluster(t, 3)
	relay := redistest.NewRelay(t, c.servers[2].Addr)
	opts := []*redis.Options{{Addr: c.servers[0].Addr}, {Addr: c.servers[1].Addr}, {Addr: relay.Addr}}
	l := newLockerOpts(t, opts, testConfig())
	warm(t, c, l)
	ctx := context.Background()
	if err := c.admin[2].IncrBy(ctx, "lockproxy:fence", 1000).Err(); err != nil {
		t.Fatal(err)
	}
	// The request reaches node 2 in time, its reply after the timeout.
	relay.SetDelay(170 * time.Millisecond)
	re := Options{Reentrant: true, Token: "T"}
	lk := mustLock(t, l, "R", 10*time.Second, re)
	relay.SetDelay(0)
	if lk.Fence > 1000 {
		t.Fatalf("the grant counted node 2 (fence %d): its reply was not lost", lk.Fence)
	}
	eventually(t, "node 2 holds R", func() bool { return c.holder(t, 2, "R") == "T" })
	waitUsable(t, l, 2)
	c.servers[0].CutOff()
	defer c.servers[0].Reconnect()
	again := mustLock(t, l, "R", 10*time.Second, re)
	if again.Holds != 2 || again.Fence != lk.Fence {
		t.Fatalf("re-entry through nodes 1 and 2: %d holds, fence %d; want 2 and the grant's %d (node 2: %q)", again.Holds, again.Fence, lk.Fence, c.admin[2].Get(ctx, "lockproxy:lock:R").Val())
	}
}
