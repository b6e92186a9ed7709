package quorum

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// scriptOp is one operation of an opsScript call in these tests.
type scriptOp struct {
	key, code, token string
	x                any
}

// runOps calls opsScript on node a with ops, all of attempt "t1" and
// without a deadline, and returns its results, each an int64 or an error.
func runOps(t *testing.T, a *redis.Client, ops ...scriptOp) []any {
	t.Helper()
	return runOpsAt(t, a, "t1", 0, ops...)
}

// runOpsAt is runOps with the given attempt and deadline (node ms, 0 for
// none) for every operation.
func runOpsAt(t *testing.T, a *redis.Client, attempt string, deadline int64, ops ...scriptOp) []any {
	t.Helper()
	keys := []string{}
	args := []any{}
	for _, o := range ops {
		keys = append(keys, "lockproxy:lock:"+o.key)
		args = append(args, o.code, o.token, o.x, attempt, deadline)
	}
	keys = append(keys, "lockproxy:fence", "lockproxy:intact", "lockproxy:recovery")
	args = append(args, "lockproxy:released", "lockproxy:clock", 10, "")
	v, err := a.Eval(context.Background(), opsScript.src, keys, args...).Slice()
	if err != nil {
		t.Fatalf("opsScript %v: %v", ops, err)
	}
	if len(v) != len(ops)+3 {
		t.Fatalf("opsScript %v replied %v: want one result per operation, the node's state and its clock", ops, v)
	}
	return v[:len(ops)]
}

// TestOpsScriptClock checks the clock that opsScript reports after the
// node's state: the node's TIME and its offset, which a call moves only
// for a node with its marker that reads more than the band below the
// caller's reference.
func TestOpsScriptClock(t *testing.T) {
	c := startCluster(t, 1)
	a := c.admin[0]
	ctx := context.Background()
	call := func(ref any) (now, offset int64) {
		t.Helper()
		keys := []string{"lockproxy:lock:r", "lockproxy:fence", "lockproxy:intact", "lockproxy:recovery"}
		v, err := a.Eval(ctx, opsScript.src, keys, "s", "", 0, "lockproxy:released", "lockproxy:clock", 10, ref).Slice()
		if err != nil || len(v) != 4 {
			t.Fatalf("opsScript: %v, %v", v, err)
		}
		return v[2].(int64), v[3].(int64)
	}
	now, offset := call("")
	if offset != 0 || now < time.Now().Add(-time.Minute).UnixMilli() {
		t.Fatalf("clock %d, offset %d; want the node's time and offset 0 without the key", now, offset)
	}
	// Without the marker, a node far behind is left alone.
	if _, offset = call(now + 60_000); offset != 0 {
		t.Errorf("offset %d after a call with a reference 60s ahead on a node without its marker, want 0", offset)
	}
	a.Set(ctx, "lockproxy:intact", "1", 0)
	// Ahead of the reference (a late call, or a jump): left alone.
	if _, offset = call(now - 60_000); offset != 0 {
		t.Errorf("offset %d after a call with a reference 60s behind, want 0", offset)
	}
	// Within the band: left alone.
	if _, offset = call(now + 5); offset != 0 {
		t.Errorf("offset %d after a call with a reference 5ms ahead (band 10ms), want 0", offset)
	}
	// Behind by more than the band: moved so that it reads the reference.
	_, offset = call(now + 60_000)
	if offset > -59_000 || offset < -61_000 {
		t.Errorf("offset %d after a call with a reference 60s ahead, want about -60000", offset)
	}
	if got := a.Get(ctx, "lockproxy:clock").Val(); got != strconv.FormatInt(offset, 10) {
		t.Errorf("stored offset %q, want %d", got, offset)
	}
}

// lockValueOf returns a function that reads the lock value of a resource
// on a, "<none>" when there is none.
func lockValueOf(t *testing.T, a *redis.Client) func(resource string) string {
	return func(resource string) string {
		t.Helper()
		v, err := a.Get(context.Background(), "lockproxy:lock:"+resource).Result()
		if err == redis.Nil {
			return "<none>"
		}
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

// wantInt returns a function that fails t unless got is the integer want.
func wantInt(t *testing.T) func(what string, got any, want int64) {
	return func(what string, got any, want int64) {
		t.Helper()
		if g, ok := got.(int64); !ok || g != want {
			t.Errorf("%s = %v, want %d", what, got, want)
		}
	}
}

// TestOpsScript runs each operation of the node script directly on one node
// and checks both its result and what it leaves on the node.
func TestOpsScript(t *testing.T) {
	c := startCluster(t, 1)
	a := c.admin[0]
	ctx := context.Background()
	get, want := lockValueOf(t, a), wantInt(t)

	// A token may contain ':'; the fence ends at the first one after it.
	const tok = "t:1:x"
	r := runOps(t, a, scriptOp{"r", "a", tok, 10000})
	want("fresh acquire", r[0], 1)
	if v := get("r"); v != "01/t1:"+tok {
		t.Errorf("stored %q, want %q", v, "01/t1:"+tok)
	}
	// Refresh keeps the fence; the counter advanced on the attempt anyway.
	a.PExpire(ctx, "lockproxy:lock:r", time.Second)
	r = runOps(t, a, scriptOp{"r", "a", tok, 10000})
	want("refresh", r[0], 1)
	if d := a.PTTL(ctx, "lockproxy:lock:r").Val(); d < 5*time.Second {
		t.Errorf("ttl after refresh %v, want it reset to 10s", d)
	}
	want("counter", c.counter(t, 0), 2)

	// Another token: held, with the ttl as hint; only aw marks the lock.
	r = runOps(t, a, scriptOp{"r", "a", "t", 10000})
	if v, ok := r[0].(int64); !ok || v > -5000 {
		t.Errorf("acquire of a held lock = %v, want -1-pttl", r[0])
	}
	if v := get("r"); v[0] != '0' {
		t.Errorf("plain acquire marked the lock: %q", v)
	}
	runOps(t, a, scriptOp{"r", "aw", "t", 10000})
	if v := get("r"); v != "11/t1:"+tok {
		t.Errorf("after a waiting acquire %q, want %q", v, "11/t1:"+tok)
	}
	// The mark is kept by raise and read by release.
	r = runOps(t, a, scriptOp{"r", "f", tok, 7}, scriptOp{"r", "f", "t", 9})
	want("raise by the owner", r[0], 1)
	want("raise by another", r[1], 0)
	if v := get("r"); v != "17/t1:"+tok {
		t.Errorf("after raise %q, want %q", v, "17/t1:"+tok)
	}
	want("counter after raise", c.counter(t, 0), 7)
	r = runOps(t, a, scriptOp{"r", "r", tok, 10000})
	want("refresh after raise", r[0], 7)

	// Extend and release only for the owner; the release publishes only
	// when asked and marked.
	sub := a.Subscribe(ctx, "lockproxy:released")
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	r = runOps(t, a, scriptOp{"r", "e", "t", 10000}, scriptOp{"r", "e", tok, 20000}, scriptOp{"r", "u", "t", "r"})
	want("extend by another", r[0], 0)
	want("extend by the owner", r[1], 7) // the stored fence
	want("release by another", r[2], 0)
	if d := a.PTTL(ctx, "lockproxy:lock:r").Val(); d < 15*time.Second {
		t.Errorf("ttl after extend %v, want 20s", d)
	}
	r = runOps(t, a, scriptOp{"r", "up", tok, "r"})
	want("release by the owner", r[0], 1)
	if v := get("r"); v != "<none>" {
		t.Errorf("after release %q is left", v)
	}
	msg, err := sub.ReceiveTimeout(ctx, 2*time.Second)
	if m, ok := msg.(*redis.Message); err != nil || !ok || m.Payload != "r" {
		t.Errorf("release of a marked lock published %v, %v; want r", msg, err)
	}
	runOps(t, a, scriptOp{"q", "a", "t", 10000})
	runOps(t, a, scriptOp{"q", "aw", "u", 10000}) // marked
	r = runOps(t, a, scriptOp{"q", "u", "t", "q"})
	want("release without publish", r[0], 1)
	if msg, err := sub.ReceiveTimeout(ctx, 200*time.Millisecond); err == nil {
		t.Errorf("release without publish published %v", msg)
	}

	// Refresh-only never takes a free lock.
	r = runOps(t, a, scriptOp{"free", "r", "t", 10000}, scriptOp{"free", "rw", "t", 10000})
	want("refresh-only of a free lock", r[0], -1)
	want("refresh-only (waiting) of a free lock", r[1], -1)
	if v := get("free"); v != "<none>" {
		t.Errorf("refresh-only took the lock: %q", v)
	}

	// A key of another type is held by someone else and left alone.
	a.HSet(ctx, "lockproxy:lock:h", "token", "t", "fence", "1")
	a.PExpire(ctx, "lockproxy:lock:h", 10*time.Second)
	r = runOps(t, a, scriptOp{"h", "aw", "t", 10000}, scriptOp{"h", "r", "t", 10000},
		scriptOp{"h", "e", "t", 10000}, scriptOp{"h", "f", "t", 99}, scriptOp{"h", "u", "t", "h"})
	if v, ok := r[0].(int64); !ok || v > -5000 {
		t.Errorf("acquire over a hash = %v, want -1-pttl", r[0])
	}
	if v, ok := r[1].(int64); !ok || v > -5000 {
		t.Errorf("refresh over a hash = %v, want -1-pttl", r[1])
	}
	want("extend of a hash", r[2], 0)
	want("raise of a hash", r[3], 0)
	want("release of a hash", r[4], 0)
	if v := a.HGet(ctx, "lockproxy:lock:h", "token").Val(); v != "t" {
		t.Errorf("the hash was changed: token %q", v)
	}

	// One operation's error leaves the others in the call to run.
	runOps(t, a, scriptOp{"k", "a", "t", 10000})
	a.Set(ctx, "lockproxy:fence", "not a number", 0)
	r = runOps(t, a, scriptOp{"n", "a", "t", 10000}, scriptOp{"k", "u", "t", "k"}, scriptOp{"k", "zz", "t", 0})
	var e redis.Error
	if !errors.As(asErr(r[0]), &e) || !strings.HasPrefix(e.Error(), "ERR value is not an integer") {
		t.Errorf("acquire with a broken counter = %v, want the INCR error", r[0])
	}
	want("release next to a failing acquire", r[1], 1)
	if !errors.As(asErr(r[2]), &e) || e.Error() != "ERR unknown lock operation zz" {
		t.Errorf("unknown code = %v, want an error", r[2])
	}
	if v := get("k"); v != "<none>" {
		t.Errorf("release did not run: %q left", v)
	}
}

func asErr(v any) error {
	err, _ := v.(error)
	return err
}

// TestLargeBatchIsSplit sends one batch of more operations than one script
// call carries: they go out as several calls in one pipeline, and every
// operation gets its own result.
func TestLargeBatchIsSplit(t *testing.T) {
	c := startCluster(t, 1)
	l := newLocker(t, c, quiet(testConfig()))
	warm(t, c, l) // caches the script
	// The node as its batcher sees it, for this goroutine alone.
	n := &node{index: 0, addr: l.nodes[0].addr, client: l.nodes[0].client, pipe: l.nodes[0].client.Pipeline()}
	const ops = 2*maxOps + 44
	before, counter := c.scriptCalls(t, 0), c.counter(t, 0)
	var batch []request
	for i := range ops {
		r := l.call(context.Background(), opAcquire, 1, l.lockPrefix+"r"+strconv.Itoa(i), codeAcquire, "t", "", int64(10000))
		batch = append(batch, request{r, 0})
	}
	l.send(n, batch, time.Now().Add(5*time.Second))
	for i, req := range batch {
		if !req.r.fin[0].Load() {
			t.Fatalf("operation %d not completed", i)
		}
		if rep := req.r.res[0]; rep.err != nil || rep.val != counter+int64(i+1) {
			t.Errorf("operation %d: fence %d, %v; want %d (the counter's next value)", i, rep.val, rep.err, counter+int64(i+1))
		}
		<-req.r.done // as fanout takes it, before the round goes back to the pool
		req.r.free()
	}
	if got := c.scriptCalls(t, 0) - before; got != 3 {
		t.Errorf("%d operations took %d script calls, want 3", ops, got)
	}
	if keys := c.lockKeys(t, 0); len(keys) != ops {
		t.Errorf("%d locks on the node, want %d", len(keys), ops)
	}
}

// TestFinishScriptClock: a recovery does not end on a node whose clock
// jumped forward during it (its copied locks may have expired early, its
// deadline came early): the deadline moves out by the jump, the copy is
// started over under a new id, and the node gets an offset that puts it in
// line, so that the next attempt ends it.
func TestFinishScriptClock(t *testing.T) {
	c := startCluster(t, 1)
	a := c.admin[0]
	ctx := context.Background()
	keys := []string{"lockproxy:intact", "lockproxy:recovery", "lockproxy:fence", "lockproxy:clock"}
	now := time.Now().UnixMilli()
	a.HSet(ctx, "lockproxy:recovery", "id", "x", "detected", now, "deadline", now+1000)
	// The reference reads 60s behind the node: the node jumped 60s.
	v, err := a.Eval(ctx, finishScript.src, keys, "x", 0, "0", now-60_000, 10).Int()
	if err != nil || v != 0 {
		t.Fatalf("finish on a node 60s ahead = %d, %v; want 0", v, err)
	}
	r := a.HGetAll(ctx, "lockproxy:recovery").Val()
	deadline, _ := strconv.ParseInt(r["deadline"], 10, 64)
	if r["id"] != "x+" || deadline < now+60_000 {
		t.Errorf("recovery %v after the jump, want id x+ and the deadline about %d", r, now+61_000)
	}
	if off, _ := a.Get(ctx, "lockproxy:clock").Int64(); off < 59_000 || off > 61_000 {
		t.Errorf("offset %d, want about 60000", off)
	}
	if a.Exists(ctx, "lockproxy:intact").Val() != 0 {
		t.Fatal("marker created on a node whose clock jumped")
	}
	v, err = a.Eval(ctx, finishScript.src, keys, "x+", 7, "0", time.Now().UnixMilli()-60_000, 10).Int()
	if err != nil || v != 1 || a.Exists(ctx, "lockproxy:intact").Val() != 1 {
		t.Errorf("finish in line = %d, %v; want 1 and the marker", v, err)
	}
}

// TestLateOps runs opsScript's operations as requests that arrive late
// would: after their deadline, after their attempt's cleanup, and after a
// later attempt of the same token. None of them creates, extends or
// deletes what a later attempt or holding relies on (see late.go).
func TestLateOps(t *testing.T) {
	c := startCluster(t, 1)
	a := c.admin[0]
	ctx := context.Background()
	get, want := lockValueOf(t, a), wantInt(t)
	late := func(what string, got any) {
		t.Helper()
		if err := asErr(got); err == nil || !strings.HasPrefix(err.Error(), "LATE ") {
			t.Errorf("%s = %v, want a LATE error", what, got)
		}
	}
	tm, err := a.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	past, future := tm.UnixMilli()-1, tm.UnixMilli()+60_000

	// Past its deadline, every write does nothing.
	r := runOpsAt(t, a, "A", past,
		scriptOp{"d", "a", "t", 10000}, scriptOp{"d", "p", "t", "10000:5"}, scriptOp{"d", "h", "u", "10000:t"},
		scriptOp{"d", "c", "t", "10000:d"}, scriptOp{"d", "i", "", 0})
	for i, what := range []string{"acquire", "place", "handoff", "cleanup", "init"} {
		late(what+" after the deadline", r[i])
	}
	if v := get("d"); v != "<none>" {
		t.Errorf("late requests left %q", v)
	}
	if n := a.Exists(ctx, "lockproxy:intact").Val(); n != 0 {
		t.Errorf("a late init created the marker")
	}
	want("acquire before the deadline", runOpsAt(t, a, "A", future, scriptOp{"d", "a", "t", 10000})[0], 1)

	// A cleanup that arrives first leaves a tombstone: the attempt's
	// acquisition and placement then do nothing, anyone else's take the lock.
	want("cleanup of a free lock", runOpsAt(t, a, "B", 0, scriptOp{"tomb", "c", "t", "10000:tomb"})[0], 0)
	if v := get("tomb"); v != "x/B" {
		t.Errorf("tombstone %q, want x/B", v)
	}
	late("acquire after its cleanup", runOpsAt(t, a, "B", 0, scriptOp{"tomb", "a", "t", 10000})[0])
	late("place after its cleanup", runOpsAt(t, a, "B", 0, scriptOp{"tomb", "p", "t", "10000:9"})[0])
	r = runOpsAt(t, a, "B", 0, scriptOp{"tomb", "e", "t", 10000}, scriptOp{"tomb", "u", "t", "tomb"}, scriptOp{"tomb", "f", "t", 9})
	want("extend of a tombstone (free)", r[0], -1)
	want("release of a tombstone", r[1], 0)
	want("raise of a tombstone", r[2], 0)
	want("refresh-only of a tombstone", runOpsAt(t, a, "C", 0, scriptOp{"tomb", "r", "t", 10000})[0], -1)
	r = runOpsAt(t, a, "C", 0, scriptOp{"tomb", "a", "t", 10000})
	if f, ok := r[0].(int64); !ok || f < 1 {
		t.Errorf("acquire by another attempt over a tombstone = %v, want a fence", r[0])
	} else if v := get("tomb"); v != "0"+strconv.FormatInt(f, 10)+"/C:t" {
		t.Errorf("after acquiring over a tombstone %q", v)
	}

	// The cleanup of the attempt that alone holds a lock deletes it; the
	// cleanup of another attempt does not.
	want("acquire by A1", runOpsAt(t, a, "A1", 0, scriptOp{"s", "a", "t", 10000})[0], c.counter(t, 0))
	want("cleanup by another attempt", runOpsAt(t, a, "A9", 0, scriptOp{"s", "c", "t", "10000:s"})[0], 0)
	want("cleanup by the attempt", runOpsAt(t, a, "A1", 0, scriptOp{"s", "c", "t", "10000:s"})[0], 1)
	if v := get("s"); v != "<none>" {
		t.Errorf("after the attempt's cleanup %q is left", v)
	}

	// Two attempts of one token relied on one lock, in either order: one
	// attempt's cleanup leaves it to the other; the last one deletes it.
	for _, order := range [][2]string{{"A1", "A2"}, {"A2", "A1"}} {
		f := runOpsAt(t, a, order[0], 0, scriptOp{"s", "a", "t", 10000})[0].(int64)
		want("refresh by the second attempt", runOpsAt(t, a, order[1], 0, scriptOp{"s", "a", "t", 10000})[0], f)
		if v := get("s"); v != "0"+strconv.FormatInt(f, 10)+"/"+order[0]+","+order[1]+":t" {
			t.Errorf("after a second attempt %q, want both attempts", v)
		}
		want("cleanup by an attempt that never relied on it", runOpsAt(t, a, "x", 0, scriptOp{"s", "c", "t", "10000:s"})[0], 0)
		want("cleanup by the first attempt", runOpsAt(t, a, order[0], 0, scriptOp{"s", "c", "t", "10000:s"})[0], 0)
		if v := get("s"); v != "0"+strconv.FormatInt(f, 10)+"/"+order[1]+":t" {
			t.Errorf("after the first attempt's cleanup %q, want the second attempt's lock", v)
		}
		want("cleanup by the first attempt again", runOpsAt(t, a, order[0], 0, scriptOp{"s", "c", "t", "10000:s"})[0], 0)
		want("cleanup by the last attempt", runOpsAt(t, a, order[1], 0, scriptOp{"s", "c", "t", "10000:s"})[0], 1)
	}
	// The holder's release deletes the lock whatever attempts rely on it;
	// beyond eight attempts, no cleanup does.
	for i := range 9 {
		runOpsAt(t, a, "B"+strconv.Itoa(i), 0, scriptOp{"s", "a", "t", 10000})
	}
	if v := get("s"); !strings.Contains(v, "/*:") {
		t.Errorf("after nine attempts %q, want '*'", v)
	}
	want("cleanup of a lock that many attempts relied on", runOpsAt(t, a, "B0", 0, scriptOp{"s", "c", "t", "10000:s"})[0], 0)
	want("the holder's release", runOps(t, a, scriptOp{"s", "u", "t", "s"})[0], 1)

	// A late raise never lowers the stored fence.
	f := runOpsAt(t, a, "A1", 0, scriptOp{"f", "a", "t", 10000})[0].(int64)
	runOpsAt(t, a, "A1", 0, scriptOp{"f", "f", "t", f + 10})
	want("late raise to a smaller fence", runOpsAt(t, a, "A0", 0, scriptOp{"f", "f", "t", f + 5})[0], 1)
	if v := get("f"); v != "0"+strconv.FormatInt(f+10, 10)+"/A1:t" {
		t.Errorf("after a late raise %q, want fence %d", v, f+10)
	}

	// A value of the previous layout is the token's holding by no attempt:
	// refreshed (and shared) by the token, never deleted by a cleanup.
	a.Set(ctx, "lockproxy:lock:old", "05:t", 10*time.Second)
	want("refresh of an old-layout lock", runOpsAt(t, a, "A1", 0, scriptOp{"old", "a", "t", 10000})[0], 5)
	want("cleanup of an old-layout lock", runOpsAt(t, a, "A1", 0, scriptOp{"old", "c", "t", "10000:old"})[0], 0)
	want("release of an old-layout lock", runOps(t, a, scriptOp{"old", "u", "t", "old"})[0], 1)
}
