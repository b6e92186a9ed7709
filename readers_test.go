package main

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/internal/redistest"
)

// scriptCalls returns how many scripts node has run since it started.
func scriptCalls(t *testing.T, node *redistest.Server) int {
	t.Helper()
	info, err := node.Info(context.Background(), "commandstats")
	if err != nil {
		t.Fatalf("INFO commandstats on %s: %v", node.Addr, err)
	}
	total := 0
	for _, line := range strings.Split(info, "\n") {
		if !strings.HasPrefix(line, "cmdstat_eval") {
			continue
		}
		_, rest, _ := strings.Cut(line, "calls=")
		n, err := strconv.Atoi(strings.SplitN(rest, ",", 2)[0])
		if err != nil {
			t.Fatalf("INFO commandstats on %s: %q", node.Addr, line)
		}
		total += n
	}
	return total
}

// TestReadersWaitingTogetherThroughProxy: RLOCK ... WAIT callers of one
// proxy, in RESP2 and RESP3, that wait behind a writer are granted
// together when it releases: each node runs the release and about one more
// call, not one per reader, and every reader gets its own token and fence.
func TestReadersWaitingTogetherThroughProxy(t *testing.T) {
	backend := redistest.Start(t)
	nodes, addrs := startNodes(t, 3)
	addr := startApp(t, realConfig, "-backend", backend.Addr, "-lock-nodes", addrs)
	ctx := context.Background()
	writer := newClient(t, addr, 2)
	w, err := writer.Do(ctx, "LOCK", "doc", 10000).Slice()
	if err != nil {
		t.Fatalf("LOCK: %v", err)
	}
	const n = 8
	type result struct {
		v   []any
		err error
	}
	results := make(chan result, n)
	for i := range n {
		c := newClient(t, addr, 2+i%2)
		go func() {
			v, err := c.Do(ctx, "RLOCK", "doc", 5000, "WAIT", 10000).Slice()
			results <- result{v, err}
		}()
	}
	info := newClient(t, addr, 3)
	deadline := time.Now().Add(10 * time.Second)
	for lockInfo(t, ctx, info, "doc")["waiters"] != int64(n) {
		if time.Now().After(deadline) {
			t.Fatalf("%d readers not waiting after 10s: %v", n, lockInfo(t, ctx, info, "doc"))
		}
		time.Sleep(5 * time.Millisecond)
	}
	before := make([]int, len(nodes))
	for i, node := range nodes {
		before[i] = scriptCalls(t, node)
	}
	if got, err := writer.Do(ctx, "UNLOCK", "doc", w[0]).Int64(); err != nil || got != 1 {
		t.Fatalf("UNLOCK: %v %v", got, err)
	}
	tokens, fences := map[any]bool{}, map[any]bool{}
	for range n {
		r := <-results
		if r.err != nil || len(r.v) != 3 || tokens[r.v[0]] || fences[r.v[2]] || r.v[2].(int64) <= w[2].(int64) {
			t.Fatalf("RLOCK ... WAIT = %v, %v (writer's fence %v; tokens %v, fences %v)", r.v, r.err, w[2], tokens, fences)
		}
		tokens[r.v[0]], fences[r.v[2]] = true, true
	}
	for i, node := range nodes {
		calls := scriptCalls(t, node) - before[i]
		t.Logf("node %d: %d calls from the UNLOCK to the last of %d readers' grants", i, calls, n)
		// The release, the readers' round, maybe a raise of their fences
		// and a background call of the proxy; one reader after the other
		// would be 1 + n.
		if calls > 5 {
			t.Errorf("node %d ran %d calls for the release and %d readers waiting together, want at most 5", i, calls, n)
		}
	}
	if li := lockInfo(t, ctx, info, "doc"); li["mode"] != "shared" || li["holders"] != int64(n) {
		t.Errorf("LOCKINFO after the readers' grants: %v", li)
	}
}
