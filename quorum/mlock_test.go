package quorum

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// groupOps returns the opsScript operations of a group acquire of
// resources with code and token for ttl ms.
func groupOps(code, token string, ttl int, resources ...string) []scriptOp {
	ops := []scriptOp{{resources[0], code, token, strconv.Itoa(ttl) + ":" + strconv.Itoa(len(resources))}}
	for _, r := range resources[1:] {
		ops = append(ops, scriptOp{r, "g", "", ""})
	}
	return ops
}

// groupResult returns the status and per-key results of a group reply.
func groupResult(t *testing.T, v any) (int64, []int64) {
	t.Helper()
	a, ok := v.([]any)
	if !ok || len(a) < 2 {
		t.Fatalf("group replied %v, want {status, r_1, ..}", v)
	}
	st, vals, ok := groupReply(a)
	if !ok {
		t.Fatalf("group replied %v, not integers", v)
	}
	return st, vals
}

// TestGroupScript runs the group acquire (m, mw, mr) directly on one node:
// all or nothing over its keys, in one call with other operations.
func TestGroupScript(t *testing.T) {
	c := startCluster(t, 1)
	a := c.admin[0]
	ctx := context.Background()
	get, want := lockValueOf(t, a), wantInt(t)

	// A plain acquire before and after the group: positions stay right.
	ops := append([]scriptOp{{"p1", "a", "o", 10000}}, groupOps("m", "T", 10000, "A", "B", "C")...)
	ops = append(ops, scriptOp{"p2", "a", "o", 10000})
	r := runOps(t, a, ops...)
	want("plain before", r[0], 1)
	st, f := groupResult(t, r[1])
	if st != 1 || f[0] != 2 || f[1] != 3 || f[2] != 4 {
		t.Fatalf("group on free keys: status %d fences %v, want 1 [2 3 4]", st, f)
	}
	want("member 2", r[2], 0)
	want("member 3", r[3], 0)
	want("plain after", r[4], 5)
	for i, res := range []string{"A", "B", "C"} {
		if v, w := get(res), "0"+strconv.Itoa(i+2)+"/t1:T"; v != w {
			t.Errorf("%s stored %q, want %q: the value a plain LOCK writes", res, v, w)
		}
	}

	// The same set again with the token: a refresh, fences kept.
	st, f = groupResult(t, runOps(t, a, groupOps("m", "T", 20000, "C", "A", "B")...)[0])
	if st != 3 || f[0] != 4 || f[1] != 2 || f[2] != 3 {
		t.Errorf("refresh: status %d fences %v, want 3 [4 2 3]", st, f)
	}
	if p := c.pttl(t, 0, "A"); p < 15*time.Second {
		t.Errorf("refresh left A a pttl of %v, want about 20s", p)
	}

	// Another token holds one of the keys: nothing changes; mw marks it.
	st, f = groupResult(t, runOps(t, a, groupOps("mw", "U", 10000, "X", "p1", "Y")...)[0])
	if st != 0 || f[0] != 0 || f[1] >= -1 || f[2] != 0 {
		t.Errorf("held: status %d results %v, want 0 [0 -1-pttl 0]", st, f)
	}
	if get("X") != "<none>" || get("Y") != "<none>" {
		t.Errorf("a refused group set keys: X=%q Y=%q", get("X"), get("Y"))
	}
	if v := get("p1"); !strings.HasPrefix(v, "1") {
		t.Errorf("mw did not mark the held key: %q", v)
	}

	// The token holds part of the set: status 2, nothing changes.
	before := c.counter(t, 0)
	st, _ = groupResult(t, runOps(t, a, groupOps("m", "T", 10000, "A", "Z")...)[0])
	if st != 2 || get("Z") != "<none>" {
		t.Errorf("partial: status %d, Z=%q; want 2 and Z free", st, get("Z"))
	}
	if c.counter(t, 0) != before {
		t.Errorf("a refused group advanced the counter")
	}

	// Refresh only: -1 on free keys, a refresh of a set held in whole.
	st, _ = groupResult(t, runOps(t, a, groupOps("mr", "V", 10000, "Q", "R")...)[0])
	if st != -1 || get("Q") != "<none>" {
		t.Errorf("refresh-only on free keys: status %d, Q=%q", st, get("Q"))
	}
	st, f = groupResult(t, runOps(t, a, groupOps("mrw", "T", 10000, "B", "A", "C")...)[0])
	if st != 3 || f[0] != 3 || f[1] != 2 || f[2] != 4 {
		t.Errorf("refresh-only of the whole set: status %d fences %v", st, f)
	}
	// mp takes a set held in part: the free keys taken, the own refreshed.
	st, f = groupResult(t, runOps(t, a, groupOps("mp", "T", 10000, "A", "Z")...)[0])
	if st != 1 || f[0] != 2 || f[1] <= 5 || !strings.HasSuffix(get("Z"), ":T") {
		t.Errorf("mp of a set held in part: status %d fences %v, Z=%q", st, f, get("Z"))
	}
	runOps(t, a, scriptOp{"Z", "u", "T", "Z"})

	// A tombstone of the attempt on one key: the late group does nothing.
	runOpsAt(t, a, "late", 0, scriptOp{"L2", "c", "W", "10000:L2"})
	v := runOpsAt(t, a, "late", 0, groupOps("m", "W", 10000, "L1", "L2", "L3")...)
	if err := asErr(v[0]); err == nil || !strings.HasPrefix(err.Error(), "LATE") {
		t.Errorf("late group replied %v, want LATE", v[0])
	}
	if get("L1") != "<none>" || get("L3") != "<none>" {
		t.Errorf("a late group set keys: L1=%q L3=%q", get("L1"), get("L3"))
	}
	_ = ctx
}

// TestLargeBatchWithGroups: groups are never split across script calls, and
// every request of a mixed batch gets its own result.
func TestLargeBatchWithGroups(t *testing.T) {
	c := startCluster(t, 1)
	l := newLocker(t, c, quiet(testConfig()))
	warm(t, c, l)
	n := &node{index: 0, addr: l.nodes[0].addr, client: l.nodes[0].client, pipe: l.nodes[0].client.Pipeline()}
	const groups, size = 10, 30 // 300 keys and 10 plain ops: at least 3 calls
	var batch []request
	for g := range groups {
		var keys []string
		for k := range size {
			keys = append(keys, l.lockPrefix+"g"+strconv.Itoa(g)+"k"+strconv.Itoa(k))
		}
		r := l.call(context.Background(), opGroup, 1, keys[0], codeGroup, "t"+strconv.Itoa(g), "", "10000:"+strconv.Itoa(size))
		r.more = keys[1:]
		batch = append(batch, request{r, 0})
		p := l.call(context.Background(), opAcquire, 1, l.lockPrefix+"p"+strconv.Itoa(g), codeAcquire, "t", "", int64(10000))
		batch = append(batch, request{p, 0})
	}
	before := c.scriptCalls(t, 0)
	l.send(n, batch, time.Now().Add(5*time.Second))
	for i, req := range batch {
		rep := req.r.res[0]
		switch {
		case rep.err != nil:
			t.Errorf("request %d: %v", i, rep.err)
		case req.r.op == opGroup && (rep.val != 1 || len(rep.vals) != size):
			t.Errorf("group %d: status %d, %d fences", i, rep.val, len(rep.vals))
		case req.r.op == opAcquire && rep.val <= 0:
			t.Errorf("plain %d: %d", i, rep.val)
		}
		<-req.r.done
		req.r.free()
	}
	if got := c.scriptCalls(t, 0) - before; got < 3 {
		t.Errorf("%d operations took %d script calls, want at least 3", groups*(size+1), got)
	}
	if keys := c.lockKeys(t, 0); len(keys) != groups*(size+1) {
		t.Errorf("%d locks on the node, want %d", len(keys), groups*(size+1))
	}
}

// ownedKeys returns the lock keys on node i whose value names token.
func (c *cluster) ownedKeys(tb testing.TB, i int, token string) []string {
	tb.Helper()
	var out []string
	for _, k := range c.lockKeys(tb, i) {
		v, err := c.admin[i].Get(context.Background(), k).Result()
		if err == nil && strings.HasSuffix(v, ":"+token) {
			out = append(out, k)
		}
	}
	return out
}

// TestMLock: all or nothing, one fence per resource, per-resource UNLOCK
// and EXTEND, the idempotent refresh, -DEADLOCK for a set held in part.
func TestMLock(t *testing.T) {
	c := startCluster(t, 3)
	l := newLocker(t, c, quiet(testConfig()))
	ctx := ctxT(t)
	warm(t, c, l)

	ml, err := l.MLock(ctx, []string{"a", "b", "c"}, 10*time.Second, Options{})
	if err != nil {
		t.Fatalf("MLock: %v", err)
	}
	if len(ml.Fences) != 3 || ml.Validity <= 0 || ml.Token == "" {
		t.Fatalf("MLock = %+v", ml)
	}
	// Each resource is an ordinary lock: another Lock of it fails.
	if _, err := l.Lock(ctx, "b", time.Second, Options{}); !errors.Is(err, ErrNotAcquired) {
		t.Errorf("Lock of a resource of the set: %v, want ErrNotAcquired", err)
	}
	// An overlapping set fails and leaves nothing.
	if _, err := l.MLock(ctx, []string{"x", "c", "y"}, time.Second, Options{Token: "other"}); !errors.Is(err, ErrNotAcquired) {
		t.Errorf("overlapping MLock: %v, want ErrNotAcquired", err)
	}
	for i := range 3 {
		if k := c.ownedKeys(t, i, "other"); len(k) != 0 {
			t.Errorf("node %d: a failed MLock left %v", i, k)
		}
	}
	// The same set in another order with the token: a refresh, same fences.
	again, err := l.MLock(ctx, []string{"c", "a", "b"}, 10*time.Second, Options{Token: ml.Token})
	if err != nil {
		t.Fatalf("refresh: %v", err)
	}
	if again.Fences[0] != ml.Fences[2] || again.Fences[1] != ml.Fences[0] || again.Fences[2] != ml.Fences[1] {
		t.Errorf("refresh fences %v, want %v reordered", again.Fences, ml.Fences)
	}
	// Part of the set with the token: DEADLOCK, nothing changes.
	var de *DeadlockError
	if _, err := l.MLock(ctx, []string{"a", "z"}, time.Second, Options{Token: ml.Token, Wait: time.Second}); !errors.As(err, &de) {
		t.Errorf("MLock of a set held in part: %v, want a DeadlockError", err)
	}
	for i := range 3 {
		if v, _ := c.admin[i].Get(ctx, "lockproxy:lock:z").Result(); v != "" {
			t.Errorf("node %d: DEADLOCK left z = %q", i, v)
		}
	}
	// Per-resource Extend and Unlock.
	if v, err := l.Extend(ctx, "b", ml.Token, 20*time.Second); err != nil || v <= 10*time.Second {
		t.Errorf("Extend b: %v, %v", v, err)
	}
	mustUnlock(t, l, "a", ml.Token)
	if _, err := l.Lock(ctx, "a", time.Second, Options{}); err != nil {
		t.Errorf("a after its Unlock: %v", err)
	}
	mustUnlock(t, l, "b", ml.Token)
	mustUnlock(t, l, "c", ml.Token)
	// Fences grow per resource.
	next, err := l.MLock(ctx, []string{"b", "c"}, time.Second, Options{})
	if err != nil {
		t.Fatalf("MLock b c: %v", err)
	}
	if next.Fences[0] <= ml.Fences[1] || next.Fences[1] <= ml.Fences[2] {
		t.Errorf("fences %v after %v", next.Fences, ml.Fences)
	}
	// The token holds each resource of a set on a majority, but not all
	// of them on the same nodes: the refresh takes the set on every node.
	for i, keys := range [][]string{{"s1"}, {"s1", "s2"}, {"s2"}} {
		for _, k := range keys {
			c.admin[i].Set(ctx, "lockproxy:lock:"+k, "07/old:split", 30*time.Second)
		}
		c.admin[i].Set(ctx, "lockproxy:fence", 7, 0)
	}
	split, err := l.MLock(ctx, []string{"s1", "s2"}, 10*time.Second, Options{Token: "split"})
	// A node that lacked a key takes it afresh, so a fence may grow, as
	// in a Lock refresh over a node that lacks the lock.
	if err != nil || split.Fences[0] < 7 || split.Fences[1] < 7 {
		t.Errorf("MLock of a set held on split majorities: %+v, %v; want a refresh", split, err)
	}
	for i := range 3 {
		if k := c.ownedKeys(t, i, "split"); len(k) != 2 {
			t.Errorf("node %d holds %v of the refreshed set", i, k)
		}
	}
	// The token holds s1 on all nodes and s3 on one: -DEADLOCK, by the
	// majority per resource.
	c.admin[0].Set(ctx, "lockproxy:lock:s3", "07/old:split", 30*time.Second)
	if _, err := l.MLock(ctx, []string{"s1", "s3"}, time.Second, Options{Token: "split"}); !errors.As(err, &de) {
		t.Errorf("MLock of a set held in part (by the majority per resource): %v, want a DeadlockError", err)
	}
	// Bad groups.
	for _, bad := range [][]string{nil, {"q", "q"}} {
		if _, err := l.MLock(ctx, bad, time.Second, Options{}); err == nil {
			t.Errorf("MLock %q succeeded", bad)
		}
	}
}

// TestMLockNothingLeftBehind: an MLock that fails leaves none of its keys
// on any node: with another holder on some nodes, with a node that dies
// in the middle of its round (SIGKILL), and with one that stalls there
// (SIGSTOP) and runs the request after the call gave up on it.
func TestMLockNothingLeftBehind(t *testing.T) {
	c := startCluster(t, 3)
	l := newLocker(t, c, quiet(testConfig()))
	ctx := ctxT(t)
	warm(t, c, l)
	set := []string{"r1", "r2", "r3", "r4"}
	// Another owner holds r3 on nodes 1 and 2 only: node 0 grants the set.
	for _, i := range []int{1, 2} {
		c.admin[i].Set(ctx, "lockproxy:lock:r3", "01/z:someone", 30*time.Second)
	}
	if _, err := l.MLock(ctx, set, 10*time.Second, Options{Token: "T1"}); !errors.Is(err, ErrNotAcquired) {
		t.Fatalf("MLock: %v, want ErrNotAcquired", err)
	}
	for i := range 3 {
		if k := c.ownedKeys(t, i, "T1"); len(k) != 0 {
			t.Errorf("node %d: a failed MLock left %v", i, k)
		}
	}

	// Node 2 stalls with the request: node 0 grants, node 1 refuses (r3),
	// node 2 answers too late. Once it runs, nothing of T2 stays there.
	c.admin[2].Del(ctx, "lockproxy:lock:r3")
	c.servers[2].Pause()
	if _, err := l.MLock(ctx, set, 10*time.Second, Options{Token: "T2"}); err == nil {
		t.Fatalf("MLock with one node refusing and one stalled succeeded")
	}
	c.servers[2].Resume()
	for i := range 3 {
		eventually(t, "nothing of T2 on node "+strconv.Itoa(i), func() bool { return len(c.ownedKeys(t, i, "T2")) == 0 })
	}

	// Node 0 dies while the set is being taken, node 1 refuses: nothing
	// stays on node 2, and node 0 comes back without the keys.
	c.admin[1].Set(ctx, "lockproxy:lock:r1", "01/z:someone", 30*time.Second)
	c.kill(0)
	if _, err := l.MLock(ctx, set, 10*time.Second, Options{Token: "T3"}); err == nil {
		t.Fatalf("MLock with one node dead and one refusing succeeded")
	}
	for _, i := range []int{1, 2} {
		if k := c.ownedKeys(t, i, "T3"); len(k) != 0 {
			t.Errorf("node %d: a failed MLock left %v", i, k)
		}
	}
	c.restart(0)
}

// TestMLockWaitOverlapping: clients looping over overlapping MLocks with
// WAIT, on one Locker and across two, all make progress: none deadlocks,
// each gets its set several times, and no resource is held twice at once.
func TestMLockWaitOverlapping(t *testing.T) {
	c := startCluster(t, 3)
	cfg := quiet(testConfig())
	cfg.RetryMin, cfg.RetryMax = 2*time.Millisecond, 20*time.Millisecond
	l1, l2 := newLocker(t, c, cfg), newLocker(t, c, cfg)
	ctx := ctxT(t)
	warm(t, c, l1)
	warm(t, c, l2)
	sets := [][]string{{"A", "B", "C"}, {"C", "D", "A"}, {"B", "D"}, {"D", "C", "B", "A"}}
	var inUse sync.Map // resource -> holder, the independent check
	var overlaps atomic.Int64
	const rounds = 8
	var wg sync.WaitGroup
	for i, set := range sets {
		l := l1
		if i%2 == 1 {
			l = l2
		}
		wg.Go(func() {
			for range rounds {
				ml, err := l.MLock(ctx, set, 5*time.Second, Options{Wait: 10 * time.Second})
				if err != nil {
					t.Errorf("client %d: %v", i, err)
					return
				}
				for _, r := range set {
					if _, busy := inUse.LoadOrStore(r, i); busy {
						overlaps.Add(1)
					}
				}
				time.Sleep(time.Millisecond)
				for _, r := range set {
					inUse.Delete(r)
				}
				for _, r := range set {
					if err := l.Unlock(ctx, r, ml.Token); err != nil {
						t.Errorf("client %d: Unlock %s: %v", i, r, err)
					}
				}
			}
		})
	}
	wg.Wait()
	if n := overlaps.Load(); n > 0 {
		t.Errorf("%d times a resource was held by two clients", n)
	}
}

// BenchmarkLockerMLock takes 1, 3 and 10 resources with one MLock and
// releases them (their Unlocks at once, as releaseAll does) over 3 real
// nodes, next to BenchmarkLockerLockUnlock's plain pair: node-µs/op is the
// nodes' CPU per op.
func BenchmarkLockerMLock(b *testing.B) {
	for _, n := range []int{1, 3, 10} {
		b.Run(strconv.Itoa(n)+"resources", func(b *testing.B) {
			c := startCluster(b, 3)
			l := newLocker(b, c, testConfig())
			ctx := context.Background()
			var set []string
			for i := range n {
				set = append(set, "bench:"+strconv.Itoa(i))
			}
			mlockUnlock(b, ctx, l, set) // connections, scripts loaded
			cpu := c.cpu(b)
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				mlockUnlock(b, ctx, l, set)
			}
			b.StopTimer()
			reportNodeCPU(b, c, cpu)
		})
	}
}

func mlockUnlock(b *testing.B, ctx context.Context, l *Locker, set []string) {
	ml, err := l.MLock(ctx, set, 10*time.Second, Options{})
	if err != nil {
		b.Fatalf("MLock: %v", err)
	}
	var failed atomic.Int64
	forEach(len(set), func(j int) {
		if l.Unlock(ctx, set[j], ml.Token) != nil {
			failed.Add(1)
		}
	})
	if failed.Load() > 0 {
		b.Fatalf("%d Unlocks failed", failed.Load())
	}
}

// TestMLockOtherModes: an MLOCK over a resource held as a semaphore gets
// -LOCKMODE at once (also with a wait), one over a resource the token
// read-holds gets -DEADLOCK, one over a resource other readers hold waits
// for them as a writer; none of them leaves anything locked.
func TestMLockOtherModes(t *testing.T) {
	c := startCluster(t, 3)
	l := newLocker(t, c, quiet(testConfig()))
	ctx := ctxT(t)
	warm(t, c, l)

	mustLock(t, l, "sem", 5*time.Second, Options{Permits: 3})
	start := time.Now()
	_, err := l.MLock(ctx, []string{"free1", "sem"}, time.Second, Options{Wait: 2 * time.Second})
	wantModeErr(t, "MLOCK over a semaphore", err, true)
	if waited := time.Since(start); waited > time.Second {
		t.Errorf("-LOCKMODE after %v: not at once", waited)
	}

	reader := mustLock(t, l, "doc", 5*time.Second, Options{shared: true})
	_, err = l.MLock(ctx, []string{"free2", "doc"}, time.Second, Options{Token: reader.Token})
	wantModeErr(t, "MLOCK by a reader's token", err, false)

	// Another reader's hold: the MLOCK is a writer and waits for it.
	if _, err := l.MLock(ctx, []string{"free3", "doc"}, time.Second, Options{}); !errors.Is(err, ErrNotAcquired) {
		t.Errorf("MLOCK over a read-held resource: %v, want ErrNotAcquired", err)
	}
	ch := make(chan error, 1)
	go func() {
		_, err := l.MLock(ctx, []string{"free3", "doc"}, time.Second, Options{Wait: 5 * time.Second})
		ch <- err
	}()
	time.Sleep(100 * time.Millisecond)
	if err := l.Unlock(ctx, "doc", reader.Token); err != nil {
		t.Fatalf("Unlock of the reader: %v", err)
	}
	if err := <-ch; err != nil {
		t.Errorf("MLOCK ... WAIT after the reader left: %v", err)
	}
	// The failed ones left their free resources free.
	for _, r := range []string{"free1", "free2"} {
		lk := mustLock(t, l, r, time.Second, Options{})
		if err := l.Unlock(ctx, r, lk.Token); err != nil {
			t.Errorf("Unlock %s: %v", r, err)
		}
	}
}
