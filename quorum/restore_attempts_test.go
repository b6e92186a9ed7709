package quorum

import (
	"context"
	"testing"
	"time"
)

// TestRestoreKeepsAttempts: a node that lost its locks to a forward clock
// jump keeps its data, so the same token's later attempt (an idempotent
// retry) may have taken the lock there afresh, with a larger fence from
// the node's intact counter and a list of its own attempt only. The
// recovery copies the holding that a majority keeps (taken by another
// attempt) onto it. A cleanup of the retry arriving after the recovery
// (one the node did not answer, sent again by the keeper) must not delete
// the holding there: the copied lock relies on the first attempt too.
func TestRestoreKeepsAttempts(t *testing.T) {
	for _, tc := range []struct {
		name      string
		cur, copy string
	}{
		{"larger fence on the node", "07/a.3:T", "05/a.1,a.3:T"},
		{"larger fence copied", "05/a.3:T", "07/a.1:T"},
		{"same fence", "05/a.3:T", "05/a.1:T"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := startCluster(t, 3)
			l := newLocker(t, c, quiet(testConfig()))
			warm(t, c, l)
			ctx := context.Background()
			a := c.admin[2]
			if err := a.Set(ctx, "lockproxy:lock:R", tc.cur, 10*time.Second).Err(); err != nil {
				t.Fatal(err)
			}
			if err := a.HSet(ctx, "lockproxy:recovery", "id", "rid").Err(); err != nil {
				t.Fatal(err)
			}
			locks := map[string]copied{"lockproxy:lock:R": {value: tc.copy, pttl: 10000}}
			if err := l.restore(ctx, l.nodes[2], "rid", locks, 0); err != nil {
				t.Fatal(err)
			}
			a.Del(ctx, "lockproxy:recovery")
			v := a.Get(ctx, "lockproxy:lock:R").Val()
			t.Logf("restored value %q", v)
			l.cleanup(ctx, l.nodes[2:], "R", "T", "a.3", 10*time.Second, false)
			if h := c.holder(t, 2, "R"); h != "T" {
				t.Fatalf("after the retry's cleanup node 2 holds R for %q (value %q), want T's holding kept (it relies on attempt a.1)", h, a.Get(ctx, "lockproxy:lock:R").Val())
			}
		})
	}
}

// TestMergeKeepsAttempts: merging two nodes' readings of one holding keeps
// the attempts of both, the larger fence, a waiter's mark and the longer
// ttl.
func TestMergeKeepsAttempts(t *testing.T) {
	for _, tc := range []struct{ a, b, want string }{
		{"05/a.1:T", "05/a.3:T", "05/a.1,a.3:T"},
		{"15/a.1,a.2:T", "07/a.2,a.3:T", "17/a.1,a.2,a.3:T"},
		{"05:T", "05/a.3:T", "05/*:T"},
		{"05/1,2,3,4,5:T", "05/6,7,8,9:T", "05/*:T"},
		{"05/a.1:T", "06/a.1:U", "06"},
		// A count of holds: the later version's fence is the holding's.
		{"09/a.1;1.1;:T", "05/a.2;2.3;h:T", "05/a.1,a.2;2.3;h:T"},
		{"05/a.1;2.3;:T", "09/a.2;1.1;:T", "05/a.1,a.2;2.3;:T"},
		{"05/a.1;2.3;:T", "09/a.2;2.3;:T", "09/a.1,a.2;2.3;:T"},
	} {
		got := merge(copied{value: tc.a, pttl: 100}, copied{value: tc.b, pttl: 200})
		if got.value != tc.want || got.pttl != 200 {
			t.Errorf("merge(%q, %q) = %q %d, want %q 200", tc.a, tc.b, got.value, got.pttl, tc.want)
		}
	}
}
