package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/internal/redistest"
)

// mlockReply is MLOCK's success reply.
type mlockReply struct {
	token    string
	validity time.Duration
	fences   []int64
}

func mlock(ctx context.Context, c *redis.Client, args ...any) (mlockReply, error) {
	v, err := c.Do(ctx, append([]any{"MLOCK"}, args...)...).Slice()
	if err != nil {
		return mlockReply{}, err
	}
	fs, ok := v[2].([]any)
	if len(v) != 3 || !ok {
		return mlockReply{}, fmt.Errorf("MLOCK replied %v", v)
	}
	m := mlockReply{token: v[0].(string), validity: time.Duration(v[1].(int64)) * time.Millisecond}
	for _, f := range fs {
		m.fences = append(m.fences, f.(int64))
	}
	return m, nil
}

// warmProxy waits, at most 10s, until a LOCK through the proxy at addr
// succeeds, and releases it: a new deployment is used once every node has
// answered one round in time, which a loaded machine may miss at first.
func warmProxy(t *testing.T, addr string) {
	t.Helper()
	c := newClient(t, addr, 2)
	ctx := context.Background()
	deadline := time.Now().Add(10 * time.Second)
	for {
		l, err := lock(ctx, c, "warm-up", 1000)
		if err == nil {
			c.Do(ctx, "UNLOCK", "warm-up", l.token)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no LOCK succeeded on the new deployment in 10s: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestMLockThroughProxy: MLOCK's rules through a real proxy, in RESP2 and
// RESP3, with COMMAND DOCS and INFO following the command table.
func TestMLockThroughProxy(t *testing.T) {
	backend := redistest.Start(t)
	_, nodes := startNodes(t, 3)
	addr := startApp(t, "lock: {node_timeout: 250ms, max_resources: 4}\n", "-backend", backend.Addr, "-lock-nodes", nodes)
	warmProxy(t, addr)
	ctx := context.Background()
	for _, protocol := range []int{2, 3} {
		p := fmt.Sprint(protocol)
		a, b := newClient(t, addr, protocol), newClient(t, addr, protocol)
		m, err := mlock(ctx, a, 3, "a"+p, "b"+p, "c"+p, 10000)
		if err != nil || len(m.fences) != 3 || m.validity <= 0 || len(m.token) < 32 {
			t.Fatalf("RESP%d MLOCK: %+v %v", protocol, m, err)
		}
		if _, err := mlock(ctx, b, 2, "c"+p, "d"+p, 1000); !errors.Is(err, redis.Nil) {
			t.Errorf("RESP%d overlapping MLOCK: %v, want null", protocol, err)
		}
		if _, err := lock(ctx, b, "d"+p, 1000); err != nil {
			t.Errorf("RESP%d: the failed MLOCK left d locked: %v", protocol, err)
		}
		r, err := mlock(ctx, b, 3, "b"+p, "c"+p, "a"+p, 10000, "TOKEN", m.token)
		if err != nil || r.fences[0] != m.fences[1] || r.fences[2] != m.fences[0] {
			t.Errorf("RESP%d refresh: %+v %v, want the fences of %v", protocol, r, err, m.fences)
		}
		if err := b.Do(ctx, "MLOCK", 2, "a"+p, "e"+p, 1000, "TOKEN", m.token).Err(); err == nil || !strings.HasPrefix(err.Error(), "DEADLOCK ") {
			t.Errorf("RESP%d MLOCK of a set held in part: %v, want DEADLOCK", protocol, err)
		}
		for _, bad := range [][]any{
			{"MLOCK", 5, "q", "r", "s", "t", "u", 1000},
			{"MLOCK", 2, "q", "q", 1000},
			{"MLOCK", 3, "q", "r", 1000},
			{"MLOCK", 0, 1000, 1},
			{"MLOCK", 1, "q", 1000, "REENTRANT"},
			{"MLOCK", 1, "q", 1000, "PERMITS", 2},
			{"MLOCK", 1, "q"},
		} {
			if err := b.Do(ctx, bad...).Err(); err == nil || !strings.HasPrefix(err.Error(), "ERR ") {
				t.Errorf("RESP%d %v: %v, want ERR", protocol, bad, err)
			}
		}
		for _, res := range []string{"a", "b", "c"} {
			if n, err := a.Do(ctx, "UNLOCK", res+p).Int(); n != 1 || err != nil {
				t.Errorf("RESP%d token-less UNLOCK %s: %d %v", protocol, res, n, err)
			}
		}
	}
	c := newClient(t, addr, 2)
	docs, err := c.Do(ctx, "COMMAND", "DOCS", "mlock").Result()
	if err != nil || !strings.Contains(fmt.Sprint(docs), "numresources") {
		t.Errorf("COMMAND DOCS mlock: %v %v", docs, err)
	}
	info, err := c.Info(ctx, "lockproxy").Result()
	if err != nil || !strings.Contains(info, "cmd_mlock:acquired=4,not_acquired=2,") {
		t.Errorf("INFO lockproxy: %q %v", info, err)
	}
}

// TestMLockWaitAcrossProxies: clients on two proxies loop over overlapping
// MLOCKs with WAIT; every one of them gets its set every time within the
// bound, and no resource is held by two of them at once.
func TestMLockWaitAcrossProxies(t *testing.T) {
	backend := redistest.Start(t)
	_, nodes := startNodes(t, 3)
	proxies := []string{
		startApp(t, realConfig, "-backend", backend.Addr, "-lock-nodes", nodes),
		startApp(t, realConfig, "-backend", backend.Addr, "-lock-nodes", nodes),
	}
	warmProxy(t, proxies[0])
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sets := [][]any{{"P", "Q", "R"}, {"R", "S", "P"}, {"Q", "S"}, {"S", "R", "Q", "P"}}
	var (
		mu    sync.Mutex
		inUse = map[any]int{}
		wg    sync.WaitGroup
	)
	const rounds = 6
	for i, set := range sets {
		c := newClient(t, proxies[i%2], 2+i%2)
		wg.Go(func() {
			for k := range rounds {
				args := append(append([]any{len(set)}, set...), 5000, "WAIT", 20000)
				m, err := mlock(ctx, c, args...)
				if err != nil {
					t.Errorf("client %d round %d: %v", i, k, err)
					return
				}
				mu.Lock()
				for _, r := range set {
					if h, busy := inUse[r]; busy {
						t.Errorf("%v held by clients %d and %d at once", r, h, i)
					}
					inUse[r] = i
				}
				mu.Unlock()
				time.Sleep(2 * time.Millisecond)
				mu.Lock()
				for _, r := range set {
					delete(inUse, r)
				}
				mu.Unlock()
				for _, r := range set {
					if n, err := c.Do(ctx, "UNLOCK", r, m.token).Int(); n != 1 || err != nil {
						t.Errorf("client %d: UNLOCK %v: %d %v", i, r, n, err)
					}
				}
			}
		})
	}
	wg.Wait()
}

// TestMLockKeepaliveThroughProxy: MLOCK ... KEEPALIVE keeps every resource
// past its ttl while the client is connected, and all of them are free at
// once when it disconnects.
func TestMLockKeepaliveThroughProxy(t *testing.T) {
	backend := redistest.Start(t)
	_, nodes := startNodes(t, 3)
	addr := startApp(t, realConfig, "-backend", backend.Addr, "-lock-nodes", nodes)
	warmProxy(t, addr)
	ctx := context.Background()
	owner, other := newClient(t, addr, 3), newClient(t, addr, 2)
	if _, err := mlock(ctx, owner, 3, "k1", "k2", "k3", 300, "KEEPALIVE"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(900 * time.Millisecond) // three ttls
	for _, r := range []string{"k1", "k2", "k3"} {
		if _, err := lock(ctx, other, r, 1000); !errors.Is(err, redis.Nil) {
			t.Fatalf("%s was free after three ttls: %v", r, err)
		}
	}
	owner.Close()
	if _, err := mlock(ctx, other, 3, "k3", "k2", "k1", 1000, "WAIT", 250); err != nil {
		t.Fatalf("not released when the owner disconnected: %v", err)
	}
}
