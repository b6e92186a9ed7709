package quorum

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"
)

// pair returns the {aux, val} reply of a hash operation.
func pair(t *testing.T, v any) (int64, int64) {
	t.Helper()
	a, ok := v.([]any)
	if !ok || len(a) != 2 {
		t.Fatalf("reply %v, want a pair", v)
	}
	return a[0].(int64), a[1].(int64)
}

// TestOpsScriptHashRecords checks the hash operations one by one: q (a
// permit or a reader), the slow branch of a (modes, deadlock, a writer's
// intent), release, extend, raise and cleanup of a holding in a hash,
// and the tombstone that makes a late acquisition do nothing.
func TestOpsScriptHashRecords(t *testing.T) {
	c := startCluster(t, 1)
	a := c.admin[0]
	ctx := context.Background()
	op := func(code, token string, x any) scriptOp { return scriptOp{key: "s", code: code, token: token, x: x} }

	// Two permits of 2; a third proposes slot 0, which is taken, and
	// learns that no slot is free.
	if slot, fence := pair(t, runOps(t, a, op("q", "A", "10000:2:0"))[0]); slot != 0 || fence < 1 {
		t.Fatalf("first permit: slot %d fence %d", slot, fence)
	}
	if free, held := pair(t, runOps(t, a, op("q", "B", "10000:2:0"))[0]); free != 1 || held >= 0 {
		t.Fatalf("slot 0 taken: free %d, %d; want slot 1 suggested", free, held)
	}
	if slot, _ := pair(t, runOps(t, a, op("q", "B", "10000:2:1"))[0]); slot != 1 {
		t.Fatalf("second permit: slot %d", slot)
	}
	if free, held := pair(t, runOps(t, a, op("q", "C", "10000:2:0"))[0]); free != -1 || held >= 0 {
		t.Fatalf("full: free %d, %d", free, held)
	}
	// The token's own permit is refreshed whatever slot is proposed.
	if slot, _ := pair(t, runOps(t, a, op("q", "B", "10000:2:0"))[0]); slot != 1 {
		t.Fatalf("refresh: slot %d, want 1", slot)
	}
	// Other modes: another k, shared, exclusive.
	for _, tt := range []struct {
		give scriptOp
		want int64
	}{
		{op("q", "C", "1000:3:0"), 2},
		{op("q", "C", "1000:0:0"), 2},
		{op("a", "C", 1000), 2},
	} {
		if code, val := pair(t, runOps(t, a, tt.give)[0]); code != tt.want || val != 0 {
			t.Errorf("%v: {%d, %d}, want {%d, 0}", tt.give, code, val, tt.want)
		}
	}
	// Extend, raise, release of one permit; the key's PX follows the
	// latest holding.
	// The reply tells the permit's k and slot, for healing.
	code, fence := pair(t, runOps(t, a, op("e", "A", 20000))[0])
	var form holdingForm
	form.note(code)
	if !form.permit || form.k != 2 || form.slot != 0 || fence < 1 {
		t.Fatalf("extend a permit: {%d, %d}: %+v", code, fence, form)
	}
	if p := c.pttl(t, 0, "s"); p < 19*time.Second {
		t.Fatalf("pttl %v after extending a permit to 20s", p)
	}
	if r := runOps(t, a, op("f", "A", 1000))[0]; r != int64(1) {
		t.Fatalf("raise a permit: %v", r)
	}
	if n, _ := a.Get(ctx, "lockproxy:fence").Int64(); n != 1000 {
		t.Fatalf("counter %d after raising to 1000", n)
	}
	if r := runOps(t, a, op("u", "A", "s"))[0]; r != int64(1) {
		t.Fatalf("release a permit: %v", r)
	}
	if r := runOps(t, a, op("u", "A", "s"))[0]; r != int64(0) {
		t.Fatalf("second release: %v", r)
	}
	if free, held := pair(t, runOps(t, a, op("q", "C", "10000:2:1"))[0]); free != 0 || held >= 0 {
		t.Fatalf("slot 1 still B's: {%d, %d}, want slot 0 suggested", free, held)
	}
	if slot, fence := pair(t, runOps(t, a, op("q", "C", "10000:2:0"))[0]); slot != 0 || fence <= 1000 {
		t.Fatalf("freed slot 0: slot %d fence %d, want a fence above the raised 1000", slot, fence)
	}
	// Cleanup of an attempt: C's holding goes (it relies on t1 alone);
	// for a token without a holding a tombstone stays, and that attempt's
	// acquisition arriving afterwards fails with LATE.
	if r := runOps(t, a, op("c", "C", "10000:s"))[0]; r != int64(1) {
		t.Fatalf("cleanup of C's attempt: %v", r)
	}
	if r := runOpsAt(t, a, "late", 0, op("c", "D", "10000:s"))[0]; r != int64(0) {
		t.Fatalf("cleanup without a holding: %v", r)
	}
	if r := runOpsAt(t, a, "late", 0, op("q", "D", "10000:2:0"))[0]; r == nil || !strings.HasPrefix(r.(error).Error(), "LATE") {
		t.Fatalf("late acquisition after its cleanup: %v", r)
	}
	runOps(t, a, op("u", "B", "s"))
	if n, _ := a.HLen(ctx, "lockproxy:lock:s").Result(); n != 2 {
		// The mode and the tombstone.
		fields, _ := a.HGetAll(ctx, "lockproxy:lock:s").Result()
		t.Fatalf("after the last release: %v", fields)
	}
	// A hash holding nothing (only a tombstone) is free for a writer.
	if fence := runOps(t, a, op("a", "W", 10000))[0].(int64); fence < 1 {
		t.Fatalf("LOCK on a record holding nothing: %d", fence)
	}
	runOps(t, a, op("u", "W", "s"))

	// Read-write: readers share; a writer with a reader's token is a
	// deadlock; a waiting writer's intent keeps new readers off, not the
	// refresh of a current one.
	r := func(code, token string, x any) scriptOp { return scriptOp{key: "rw", code: code, token: token, x: x} }
	pair(t, runOps(t, a, r("q", "R1", "10000:0:0"))[0])
	pair(t, runOps(t, a, r("q", "R2", "10000:0:0"))[0])
	if code, val := pair(t, runOps(t, a, r("a", "R1", 1000))[0]); code != -3 || val != 0 {
		t.Fatalf("upgrade: {%d, %d}", code, val)
	}
	if v := runOps(t, a, r("a", "W", 1000))[0].(int64); v >= 0 {
		t.Fatalf("writer while read: %d", v)
	}
	if _, val := pair(t, runOps(t, a, r("q", "R3", "10000:0:0"))[0]); val < 1 {
		t.Fatalf("reader without a waiting writer: %d", val)
	}
	if v := runOps(t, a, r("aw", "W", 3000))[0].(int64); v >= 0 {
		t.Fatalf("waiting writer while read: %d", v)
	}
	if _, val := pair(t, runOps(t, a, r("q", "R4", "10000:0:0"))[0]); val >= 0 {
		t.Fatalf("new reader behind a writer's intent: %d", val)
	}
	if _, val := pair(t, runOps(t, a, r("q", "R1", "10000:0:0"))[0]); val < 1 {
		t.Fatalf("refresh of a reader behind a writer's intent: %d", val)
	}
	for _, tok := range []string{"R1", "R2", "R3"} {
		runOps(t, a, r("u", tok, "rw"))
	}
	w := runOps(t, a, r("a", "W", 3000))[0].(int64)
	if w < 1 {
		t.Fatalf("writer after the readers: %d", w)
	}
	if code, val := pair(t, runOps(t, a, r("q", "W", "1000:0:0"))[0]); code != -3 || val != 0 {
		t.Fatalf("RLOCK by the writer: {%d, %d}", code, val)
	}
	if code, val := pair(t, runOps(t, a, r("q", "X", "1000:2:0"))[0]); code != -1 || val != 0 {
		t.Fatalf("permit on a write lock: {%d, %d}", code, val)
	}
}

// TestRecoveryCopiesHashRecords: a node that lost its data gets the
// readers and permits back by copy, with their tokens, fences and slots,
// so that the holdings survive the loss of another node afterwards.
func TestRecoveryCopiesHashRecords(t *testing.T) {
	c := startCluster(t, 3)
	l := newLocker(t, c, testConfig())
	ctx := ctxT(t)
	warm(t, c, l)
	p0 := mustLock(t, l, "sem", 10*time.Second, Options{Permits: 2})
	p1 := mustLock(t, l, "sem", 10*time.Second, Options{Permits: 2})
	r := mustRLock(t, l, "doc", 10*time.Second, Options{})

	c.kill(0)
	c.restart(0) // empty
	waitClientUp(t, l, 0)
	if _, err := l.Extend(ctx, "sem", p0.Token, 10*time.Second); err != nil {
		t.Fatalf("Extend a permit with node 0 back empty: %v", err)
	}
	waitRecovered(t, l, 0)
	fields, err := c.admin[0].HGetAll(ctx, "lockproxy:lock:sem").Result()
	if err != nil || fields["m"] != "s2" {
		t.Fatalf("node 0 after its recovery: %v %v", fields, err)
	}
	for _, p := range []Lock{p0, p1} {
		v := fields["#"+strconv.Itoa(p.Slot)]
		if !strings.HasSuffix(v, "|"+strconv.FormatInt(p.Fence, 10)+"/"+lockAttempts("0"+v[strings.IndexByte(v, '|')+1:])+":"+p.Token) {
			t.Errorf("slot %d on node 0 after its recovery: %q, want fence %d and the token", p.Slot, v, p.Fence)
		}
	}
	if v, _ := c.admin[0].HGet(ctx, "lockproxy:lock:doc", "@"+r.Token).Result(); v == "" {
		t.Errorf("the reader is missing on node 0 after its recovery")
	}
	if d := c.pttl(t, 0, "sem"); d < 5*time.Second {
		t.Errorf("the copied record's ttl %v, want about 10s", d)
	}
	// Another node fails: the permits, the reader and the mode stand on
	// nodes 0 and 2.
	c.kill(1)
	if _, err := l.Lock(ctx, "sem", time.Second, Options{Permits: 2}); !errors.Is(err, ErrNotAcquired) {
		t.Errorf("a third permit of 2 with node 1 down: %v", err)
	}
	if _, err := l.Lock(ctx, "doc", time.Second, Options{}); !errors.Is(err, ErrNotAcquired) {
		t.Errorf("LOCK of a read resource with node 1 down: %v", err)
	}
	if _, err := l.Extend(ctx, "doc", r.Token, 10*time.Second); err != nil {
		t.Errorf("Extend the reader with node 1 down: %v", err)
	}
	mustUnlock(t, l, "sem", p1.Token)
}

// TestMergeHashCopies: readings of one hash record from several sources.
func TestMergeHashCopies(t *testing.T) {
	rec := func(mode string, holds ...hashHold) copied {
		return copied{value: encodeHash(mode, holds), pttl: 100}
	}
	a := hashHold{field: "#0", left: 50, fence: 3, att: "a1", token: "A"}
	a2 := hashHold{field: "#0", left: 90, fence: 4, att: "a2", token: "A"}
	b := hashHold{field: "#0", left: 70, fence: 5, att: "b1", token: "B"}
	c := hashHold{field: "#1", left: 10, fence: 2, att: "c1", token: "C"}
	tests := []struct {
		name string
		x, y copied
		want string
	}{
		{"same token", rec("s2", a), rec("s2", a2, c), encodeHash("s2", []hashHold{{field: "#0", left: 90, fence: 4, att: "a1,a2", token: "A"}, c})},
		{"disputed slot", rec("s2", a), rec("s2", b), encodeHash("s2", []hashHold{{field: "#0", left: 70, fence: 5, att: "*", token: ""}})},
		{"modes differ", rec("s2", a), rec("s3", c), "03"},
		{"a string lock", rec("s2", b), copied{value: "07/x:T", pttl: 100}, "07"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := merge(tt.x, tt.y); got.value != tt.want {
				t.Errorf("merge = %q, want %q", got.value, tt.want)
			}
		})
	}
}

// TestExtendHealsHashHoldings: an Extend puts a reader or a permit back on
// a node that lacks it, with its fence and slot.
func TestExtendHealsHashHoldings(t *testing.T) {
	c := startCluster(t, 3)
	l := newLocker(t, c, testConfig())
	ctx := ctxT(t)
	warm(t, c, l)
	other := mustLock(t, l, "sem", 10*time.Second, Options{Permits: 3}) // on every node
	c.servers[2].CutOff()
	p := mustLock(t, l, "sem", 10*time.Second, Options{Permits: 3}) // on nodes 0 and 1
	r := mustRLock(t, l, "doc", 10*time.Second, Options{})
	c.servers[2].Reconnect()
	want := "|" + strconv.FormatInt(p.Fence, 10) + "/"
	eventually(t, "node 2 healed", func() bool {
		_, err1 := l.Extend(ctx, "sem", p.Token, 10*time.Second)
		_, err2 := l.Extend(ctx, "doc", r.Token, 10*time.Second)
		v, _ := c.admin[2].HGet(ctx, "lockproxy:lock:sem", "#"+strconv.Itoa(p.Slot)).Result()
		rv, _ := c.admin[2].HGet(ctx, "lockproxy:lock:doc", "@"+r.Token).Result()
		return err1 == nil && err2 == nil && strings.Contains(v, want) && strings.HasSuffix(v, ":"+p.Token) && rv != ""
	})
	// Node 0 fails: the healed permit and reader keep their majority.
	c.kill(0)
	if _, err := l.Extend(ctx, "sem", p.Token, 10*time.Second); err != nil {
		t.Errorf("Extend the permit with node 0 down after healing: %v", err)
	}
	if _, err := l.Extend(ctx, "doc", r.Token, 10*time.Second); err != nil {
		t.Errorf("Extend the reader with node 0 down after healing: %v", err)
	}
	if other.Slot == p.Slot {
		t.Fatalf("two permits in slot %d", p.Slot)
	}
}
