package quorum

import (
	"context"
	"strconv"
	"testing"
	"time"
)

// TestIntentRefusalTime: a node that refuses a new reader because of a
// waiting writer's intent answers with the time the intent has left, not
// with the time until the first reader there expires, which may be much
// later; a permit refused for a taken slot still answers with the time
// until the first holding expires.
func TestIntentRefusalTime(t *testing.T) {
	c := startCluster(t, 1)
	a := c.admin[0]
	r := func(code, token string, x any) scriptOp { return scriptOp{key: "ri", code: code, token: token, x: x} }
	pair(t, runOps(t, a, r("q", "R1", "20000:0:0"))[0])
	if v := runOps(t, a, r("aw", "W", 500))[0].(int64); v >= 0 {
		t.Fatalf("waiting writer while read: %d", v)
	}
	_, val := pair(t, runOps(t, a, r("q", "R2", "20000:0:0"))[0])
	if left := time.Duration(-1-val) * time.Millisecond; val >= 0 || left > 500*time.Millisecond {
		t.Errorf("new reader behind a 500ms intent, readers for 20s: refused for %v (%d), want at most the intent's 500ms", left, val)
	}

	p := func(token, x string) scriptOp { return scriptOp{key: "rp", code: "q", token: token, x: x} }
	pair(t, runOps(t, a, p("A", "20000:2:0"))[0])
	pair(t, runOps(t, a, p("B", "20000:2:1"))[0])
	_, val = pair(t, runOps(t, a, p("C", "20000:2:0"))[0])
	if left := time.Duration(-1-val) * time.Millisecond; left < 19*time.Second {
		t.Errorf("permit with both slots held for 20s: refused for %v (%d), want the first holding's 20s", left, val)
	}
}

// TestPlacementBehindIntent: a reader granted while a waiting writer's
// intent keeps it off one node (the two others hold an earlier reader for
// a long time) is placed there soon after the intent ends, not when the
// earlier reader expires.
func TestPlacementBehindIntent(t *testing.T) {
	c := startCluster(t, 3)
	l := newLocker(t, c, testConfig())
	warm(t, c, l)
	ctx := ctxT(t)
	mustRLock := func() Lock {
		t.Helper()
		lk, err := l.RLock(ctx, "doc", 20*time.Second, Options{})
		if err != nil {
			t.Fatalf("RLock: %v", err)
		}
		return lk
	}
	r1 := mustRLock()
	// The intent of a writer that waited on node 2 alone, for 300ms.
	now, err := c.admin[2].Time(context.Background()).Result()
	if err != nil {
		t.Fatalf("TIME on node 2: %v", err)
	}
	const intent = 300 * time.Millisecond
	key := "lockproxy:lock:doc"
	if err := c.admin[2].HSet(context.Background(), key, "i", strconv.FormatInt(now.Add(intent).UnixMilli(), 10), "w", "1").Err(); err != nil {
		t.Fatalf("HSET intent on node 2: %v", err)
	}
	start := time.Now()
	r2 := mustRLock()
	if ok, _ := c.admin[2].HExists(context.Background(), key, "@"+r2.Token).Result(); ok {
		t.Fatal("the second reader was granted on node 2 behind the intent")
	}
	const bound = 3 * time.Second // the intent, a placement's backoff, room for a loaded machine
	for {
		if ok, _ := c.admin[2].HExists(context.Background(), key, "@"+r2.Token).Result(); ok {
			break
		}
		if time.Since(start) > bound {
			t.Fatalf("the second reader not placed on node 2 %v after its grant, the intent ending after %v; want within %v", time.Since(start).Round(time.Millisecond), intent, bound)
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("placed on node 2 %v after the grant, the intent ending after %v", time.Since(start).Round(time.Millisecond), intent)
	mustUnlock(t, l, "doc", r1.Token)
	mustUnlock(t, l, "doc", r2.Token)
}
