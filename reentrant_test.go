package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/internal/redistest"
)

// reentrantLock sends LOCK ... REENTRANT and returns its four elements.
func reentrantLock(ctx context.Context, c *redis.Client, args ...any) (token string, validity, fence, holds int64, err error) {
	v, err := c.Do(ctx, append(append([]any{"LOCK"}, args...), "REENTRANT")...).Slice()
	if err != nil {
		return "", 0, 0, 0, err
	}
	if len(v) != 4 {
		return "", 0, 0, 0, fmt.Errorf("LOCK ... REENTRANT replied %v, want four elements", v)
	}
	return v[0].(string), v[1].(int64), v[2].(int64), v[3].(int64), nil
}

// lockInfo sends LOCKINFO and returns its fields by name, checking that
// they come in the contract's order: a map in RESP3, a flat array in RESP2.
func lockInfo(t *testing.T, ctx context.Context, c *redis.Client, resource string) map[string]any {
	t.Helper()
	names := []string{"mode", "holders", "permits", "holds", "fence", "validity-ms", "waiters", "owned", "holder", "nodes"}
	v, err := c.Do(ctx, "LOCKINFO", resource).Result()
	if err != nil {
		t.Fatalf("LOCKINFO %s: %v", resource, err)
	}
	out := make(map[string]any)
	switch r := v.(type) {
	case []any: // RESP2
		if len(r) != 2*len(names) {
			t.Fatalf("LOCKINFO %s = %v, want %d names and values", resource, r, len(names))
		}
		for i, n := range names {
			if r[2*i] != n {
				t.Fatalf("LOCKINFO field %d is %v, want %s", i, r[2*i], n)
			}
			out[n] = r[2*i+1]
		}
	case map[any]any: // RESP3
		if len(r) != len(names) {
			t.Fatalf("LOCKINFO %s = %v, want %d fields", resource, r, len(names))
		}
		for _, n := range names {
			x, ok := r[n]
			if !ok {
				t.Fatalf("LOCKINFO %s = %v, no %s", resource, r, n)
			}
			out[n] = x
		}
	default:
		t.Fatalf("LOCKINFO %s replied %T %v", resource, v, v)
	}
	return out
}

// TestReentrantThroughProxy: LOCK ... REENTRANT, UNLOCK with and without
// HOLD, LOCKINFO and the argument errors, in RESP2 and RESP3, through two
// proxies that share the lock nodes.
func TestReentrantThroughProxy(t *testing.T) {
	backend := redistest.Start(t)
	_, nodes := startNodes(t, 3)
	a := startApp(t, realConfig, "-backend", backend.Addr, "-lock-nodes", nodes)
	b := startApp(t, realConfig, "-backend", backend.Addr, "-lock-nodes", nodes)
	ctx := context.Background()
	for _, proto := range []int{2, 3} {
		t.Run(fmt.Sprintf("RESP%d", proto), func(t *testing.T) {
			c := redis.NewClient(&redis.Options{Addr: a, Protocol: proto, MaxRetries: -1, ClientName: "worker-1", PoolSize: 1})
			defer c.Close()
			other := newClient(t, b, proto)
			r := fmt.Sprintf("r%d", proto)

			tok, _, fence, holds, err := reentrantLock(ctx, c, r, 10000, "TOKEN", "t1")
			if err != nil || tok != "t1" || holds != 1 {
				t.Fatalf("LOCK REENTRANT = %s %d, %v; want t1 with 1 hold", tok, holds, err)
			}
			_, _, f2, holds, err := reentrantLock(ctx, other, r, 10000, "TOKEN", "t1")
			if err != nil || holds != 2 || f2 != fence {
				t.Fatalf("re-entry through the other proxy: %d holds fence %d, %v; want 2 and fence %d", holds, f2, err, fence)
			}
			if _, _, _, _, err := reentrantLock(ctx, c, r, 10000); !errors.Is(err, redis.Nil) {
				t.Fatalf("token-less LOCK REENTRANT of a held lock: %v, want null (a new owner)", err)
			}
			if lk, err := lock(ctx, c, r, 10000, "TOKEN", "t1"); err != nil || lk.fence != fence {
				t.Fatalf("plain LOCK by the holder: %+v, %v; want the three-element refresh", lk, err)
			}

			info := lockInfo(t, ctx, c, r)
			id := strings.TrimPrefix(grepLine(t, c, "proxy_id:"), "proxy_id:")
			holder, _ := info["holder"].(string)
			if !strings.HasPrefix(holder, "worker-1@127.0.0.1:") || !strings.HasSuffix(holder, " via "+id) {
				t.Errorf("holder %q, want worker-1@<addr> via %s", holder, id)
			}
			want := map[string]any{"mode": "exclusive", "holders": int64(1), "permits": int64(1), "holds": int64(2), "fence": fence, "waiters": int64(0), "owned": int64(1), "nodes": int64(3)}
			for k, v := range want {
				if info[k] != v {
					t.Errorf("LOCKINFO %s = %v, want %v", k, info[k], v)
				}
			}
			if v, _ := info["validity-ms"].(int64); v <= 0 || v > 10000 {
				t.Errorf("LOCKINFO validity-ms = %v, want in (0, 10000]", info["validity-ms"])
			}
			// The other connection acquired a hold too; a third did not.
			if o := lockInfo(t, ctx, other, r)["owned"]; o != int64(1) {
				t.Errorf("LOCKINFO owned on the connection that re-entered = %v", o)
			}
			if o := lockInfo(t, ctx, newClient(t, b, proto), r)["owned"]; o != int64(0) {
				t.Errorf("LOCKINFO owned on a connection that did not acquire = %v", o)
			}
			for k, v := range lockInfo(t, ctx, other, r) {
				if s, ok := v.(string); ok && strings.Contains(s, "t1") {
					t.Errorf("LOCKINFO %s shows the token: %q", k, s)
				}
			}

			for _, step := range []struct {
				args []any
				want int64
			}{
				{[]any{"UNLOCK", r, "t1", "HOLD", 2}, 1},
				{[]any{"UNLOCK", r, "t1", "hold", 2}, 1}, // sent again: nothing more
			} {
				if v, err := c.Do(ctx, step.args...).Int64(); err != nil || v != step.want {
					t.Fatalf("%v = %d, %v", step.args, v, err)
				}
			}
			if h := lockInfo(t, ctx, other, r)["holds"]; h != int64(1) {
				t.Fatalf("holds after HOLD 2 sent twice = %v, want 1", h)
			}
			if v, err := other.Do(ctx, "UNLOCK", r, "t1").Int64(); err != nil || v != 1 {
				t.Fatalf("UNLOCK of the last hold = %d, %v", v, err)
			}
			if m := lockInfo(t, ctx, c, r); m["mode"] != "none" || m["holds"] != int64(0) || m["fence"] != int64(-1) || m["validity-ms"] != int64(-1) || m["holder"] != "" || m["owned"] != int64(0) {
				t.Fatalf("LOCKINFO of a released lock = %v", m)
			}
			if v, err := c.Do(ctx, "UNLOCK", r, "t1", "HOLD", 1).Int64(); err != nil || v != 0 {
				t.Fatalf("UNLOCK HOLD after the release = %d, %v; want 0", v, err)
			}

			// Token-less UNLOCK on the owning connection removes one hold.
			q := r + "-q"
			tq, _, _, _, err := reentrantLock(ctx, c, q, 10000)
			if err != nil {
				t.Fatal(err)
			}
			if _, _, _, h, err := reentrantLock(ctx, c, q, 10000, "TOKEN", tq); err != nil || h != 2 {
				t.Fatalf("re-entry with the generated token: %d, %v", h, err)
			}
			for i, wantMode := range []string{"exclusive", "none"} {
				if v, err := c.Do(ctx, "UNLOCK", q).Int64(); err != nil || v != 1 {
					t.Fatalf("token-less UNLOCK %d = %d, %v", i, v, err)
				}
				if m := lockInfo(t, ctx, c, q)["mode"]; m != wantMode {
					t.Fatalf("after token-less UNLOCK %d: mode %v, want %s", i, m, wantMode)
				}
			}

			// Errors, each changing nothing.
			p := r + "-plain"
			plain, err := lock(ctx, c, p, 10000)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range []struct {
				args []any
				want string
			}{
				{[]any{"UNLOCK", p, plain.token, "HOLD", 1}, "ERR HOLD needs a lock taken with REENTRANT or re-entered"},
				{[]any{"UNLOCK", p, plain.token, "HOLD", 0}, "ERR HOLD n must be a positive integer"},
				{[]any{"UNLOCK", p, plain.token, "HOLD", "x"}, "ERR HOLD n must be a positive integer"},
				{[]any{"UNLOCK", p, plain.token, "HOLDS", 1}, "ERR syntax error"},
				{[]any{"UNLOCK", p, "HOLD", 1}, "ERR wrong number of arguments for 'unlock' command"},
				{[]any{"LOCK", p, 100, "REENTRANT", "REENTRANT"}, "ERR syntax error"},
				{[]any{"LOCKINFO"}, "ERR wrong number of arguments for 'lockinfo' command"},
				{[]any{"LOCKINFO", p, "x"}, "ERR wrong number of arguments for 'lockinfo' command"},
			} {
				if err := c.Do(ctx, e.args...).Err(); err == nil || err.Error() != e.want {
					t.Errorf("%v: %v, want %q", e.args, err, e.want)
				}
			}
			if m := lockInfo(t, ctx, c, p); m["mode"] != "exclusive" || m["holds"] != int64(1) {
				t.Errorf("the plain lock after the refused requests: %v", m)
			}
		})
	}
}

// grepLine returns the line of INFO lockproxy that starts with prefix.
func grepLine(t *testing.T, c *redis.Client, prefix string) string {
	t.Helper()
	info, err := c.Info(context.Background(), "lockproxy").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(info, "\r\n") {
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	t.Fatalf("INFO lockproxy has no %s line:\n%s", prefix, info)
	return ""
}

// TestReentrantPooledClient: two callers share one pooled connection
// (go-redis with a pool of 1). The owner is the token: neither re-enters
// the other's lock, and both take turns with their own holds.
func TestReentrantPooledClient(t *testing.T) {
	backend := redistest.Start(t)
	_, nodes := startNodes(t, 3)
	addr := startApp(t, realConfig, "-backend", backend.Addr, "-lock-nodes", nodes)
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 1, MaxRetries: -1})
	defer c.Close()

	ta, _, _, _, err := reentrantLock(ctx, c, "shared", 10000)
	if err != nil {
		t.Fatal(err)
	}
	// Caller B on the same connection, without a token or with its own.
	if _, _, _, _, err := reentrantLock(ctx, c, "shared", 10000); !errors.Is(err, redis.Nil) {
		t.Fatalf("caller B without a token re-entered A's lock: %v", err)
	}
	if _, _, _, _, err := reentrantLock(ctx, c, "shared", 10000, "TOKEN", "b"); !errors.Is(err, redis.Nil) {
		t.Fatalf("caller B with its own token got A's lock: %v", err)
	}
	if v, _ := c.Do(ctx, "UNLOCK", "shared", "b").Int64(); v != 0 {
		t.Fatalf("caller B released A's lock")
	}
	if _, _, _, h, err := reentrantLock(ctx, c, "shared", 10000, "TOKEN", ta); err != nil || h != 2 {
		t.Fatalf("caller A re-entering: %d, %v", h, err)
	}
	for range 2 {
		if v, err := c.Do(ctx, "UNLOCK", "shared", ta).Int64(); err != nil || v != 1 {
			t.Fatalf("caller A's UNLOCK = %d, %v", v, err)
		}
	}

	// Both callers loop over the shared connection at once: each takes a
	// hold, re-enters, and gives both back; their holdings never overlap.
	var inside atomic.Int32
	var wg sync.WaitGroup
	deadline := time.Now().Add(2 * time.Second)
	var rounds [2]atomic.Int32
	for i, me := range []string{"caller-a", "caller-b"} {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				// No WAIT: a waiting LOCK would keep the one connection
				// from the other caller's UNLOCK.
				_, _, _, h, err := reentrantLock(ctx, c, "turns", 5000, "TOKEN", me)
				if errors.Is(err, redis.Nil) {
					time.Sleep(time.Millisecond)
					continue
				}
				if err != nil || h != 1 {
					t.Errorf("%s: LOCK = %d holds, %v", me, h, err)
					return
				}
				if inside.Add(1) != 1 {
					t.Errorf("%s holds 'turns' together with the other caller", me)
				}
				if _, _, _, h, err = reentrantLock(ctx, c, "turns", 5000, "TOKEN", me); err != nil || h != 2 {
					t.Errorf("%s: re-entry = %d holds, %v", me, h, err)
				}
				inside.Add(-1)
				rounds[i].Add(1)
				for _, hold := range []int{2, 1} {
					if v, err := c.Do(ctx, "UNLOCK", "turns", me, "HOLD", hold).Int64(); err != nil || v != 1 {
						t.Errorf("%s: UNLOCK HOLD %d = %d, %v", me, hold, v, err)
					}
				}
			}
		})
	}
	wg.Wait()
	if rounds[0].Load() == 0 || rounds[1].Load() == 0 {
		t.Errorf("rounds per caller %d and %d, want both to make progress", rounds[0].Load(), rounds[1].Load())
	}
	t.Logf("rounds per caller over one connection: %d and %d", rounds[0].Load(), rounds[1].Load())
}

// TestReentrantKeepaliveClose: a connection that closes gives up the holds
// it took with KEEPALIVE, and only those.
func TestReentrantKeepaliveClose(t *testing.T) {
	backend := redistest.Start(t)
	_, nodes := startNodes(t, 3)
	addr := startApp(t, realConfig, "-backend", backend.Addr, "-lock-nodes", nodes)
	ctx := context.Background()
	kept := newClient(t, addr, 2)
	other := newClient(t, addr, 3)
	for range 2 {
		if _, _, _, _, err := reentrantLock(ctx, kept, "k", 3000, "TOKEN", "tk", "KEEPALIVE"); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, _, h, err := reentrantLock(ctx, other, "k", 10000, "TOKEN", "tk"); err != nil || h != 3 {
		t.Fatalf("third hold: %d, %v", h, err)
	}
	kept.Close()
	deadline := time.Now().Add(5 * time.Second)
	for lockInfo(t, ctx, other, "k")["holds"] != int64(1) {
		if time.Now().After(deadline) {
			t.Fatalf("holds %v after the KEEPALIVE connection closed, want 1", lockInfo(t, ctx, other, "k")["holds"])
		}
		time.Sleep(20 * time.Millisecond)
	}
	if v, err := other.Do(ctx, "UNLOCK", "k", "tk").Int64(); err != nil || v != 1 {
		t.Fatalf("UNLOCK of the last hold = %d, %v", v, err)
	}
	if m := lockInfo(t, ctx, other, "k")["mode"]; m != "none" {
		t.Fatalf("mode %v after the last hold, want none", m)
	}
}

// TestReentrantProxyRestart: the hold count lives on the lock nodes, so a
// proxy that restarts (a new process on the same nodes) sees it.
func TestReentrantProxyRestart(t *testing.T) {
	backend := redistest.Start(t)
	_, nodes := startNodes(t, 3)
	addr, stop := startAppStop(t, realConfig, "-backend", backend.Addr, "-lock-nodes", nodes)
	ctx := context.Background()
	c := newClient(t, addr, 2)
	for range 3 {
		if _, _, _, _, err := reentrantLock(ctx, c, "kept", 20000, "TOKEN", "owner"); err != nil {
			t.Fatal(err)
		}
	}
	c.Close()
	stop()
	again := newClient(t, startApp(t, realConfig, "-backend", backend.Addr, "-lock-nodes", nodes), 3)
	// A fresh proxy may answer NOQUORUM until it has placed its nodes'
	// clocks (the first calls); the count is what matters.
	deadline := time.Now().Add(5 * time.Second)
	var info map[string]any
	for {
		if err := again.Do(ctx, "LOCKINFO", "kept").Err(); err == nil {
			info = lockInfo(t, ctx, again, "kept")
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("LOCKINFO through the restarted proxy: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if info["holds"] != int64(3) {
		t.Fatalf("holds through the restarted proxy = %v, want 3", info["holds"])
	}
	for _, want := range []int64{1, 1, 1} {
		if v, err := again.Do(ctx, "UNLOCK", "kept", "owner").Int64(); err != nil || v != want {
			t.Fatalf("UNLOCK through the restarted proxy = %d, %v", v, err)
		}
	}
	if m := lockInfo(t, ctx, again, "kept")["mode"]; m != "none" {
		t.Fatalf("mode %v after three releases, want none", m)
	}
}
