package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/internal/redistest"
)

// TestReadWriteAndSemaphoreRules runs the rules of RLOCK and LOCK ...
// PERMITS k from the contract through a real proxy, in RESP2 and RESP3.
func TestReadWriteAndSemaphoreRules(t *testing.T) {
	backend := redistest.Start(t)
	_, nodes := startNodes(t, 3)
	addr := startApp(t, "lock: {node_timeout: 250ms, max_permits: 8}\n", "-backend", backend.Addr, "-lock-nodes", nodes)
	for _, proto := range []int{2, 3} {
		t.Run(fmt.Sprintf("RESP%d", proto), func(t *testing.T) {
			ctx := context.Background()
			c := newClient(t, addr, proto)
			other := newClient(t, addr, proto)
			res := fmt.Sprintf("rw%d", proto)
			do := func(c *redis.Client, args ...any) ([]any, error) { return c.Do(ctx, args...).Slice() }
			wantErr := func(what string, err error, prefix string) {
				t.Helper()
				if err == nil || !strings.HasPrefix(err.Error(), prefix) {
					t.Fatalf("%s: %v, want %s...", what, err, prefix)
				}
			}

			// Readers share; each has its own token and a larger fence.
			r1, err := do(c, "RLOCK", res, 5000)
			if err != nil || len(r1) != 3 {
				t.Fatalf("RLOCK: %v %v", r1, err)
			}
			r2, err := do(c, "RLOCK", res, 5000)
			if err != nil || r2[0] == r1[0] || r2[2].(int64) <= r1[2].(int64) {
				t.Fatalf("second RLOCK: %v %v after %v", r2, err, r1)
			}
			// The write lock waits for them: null at once.
			if _, err := do(other, "LOCK", res, 1000); err != redis.Nil {
				t.Fatalf("LOCK while read: %v", err)
			}
			// An upgrade, a semaphore on a read lock.
			_, err = do(other, "LOCK", res, 1000, "TOKEN", r1[0], "WAIT", 1000)
			wantErr("upgrade", err, "DEADLOCK ")
			_, err = do(other, "LOCK", res, 1000, "PERMITS", 2, "WAIT", 1000)
			wantErr("PERMITS on a read lock", err, "LOCKMODE held shared")
			// The idempotent refresh keeps the fence.
			again, err := do(other, "RLOCK", res, 5000, "TOKEN", r1[0])
			if err != nil || again[2] != r1[2] {
				t.Fatalf("RLOCK refresh: %v %v, want fence %v", again, err, r1[2])
			}
			// Two holdings on one connection: the token is needed.
			_, err = c.Do(ctx, "UNLOCK", res).Result()
			wantErr("token-less UNLOCK of two readers", err, fmt.Sprintf("ERR this connection holds '%s' 2 times; give the token", res))
			_, err = c.Do(ctx, "EXTEND", res, 1000).Result()
			wantErr("token-less EXTEND of two readers", err, "ERR this connection holds")
			if n, err := c.Do(ctx, "EXTEND", res, 5000, r2[0]).Int64(); err != nil || n <= 0 {
				t.Fatalf("EXTEND a reader: %v %v", n, err)
			}
			if n, err := c.Do(ctx, "UNLOCK", res, r1[0]).Int64(); err != nil || n != 1 {
				t.Fatalf("UNLOCK a reader: %v %v", n, err)
			}
			// One reader left on the connection: token-less works again.
			if n, err := c.Do(ctx, "UNLOCK", res).Int64(); err != nil || n != 1 {
				t.Fatalf("token-less UNLOCK of the last reader: %v %v", n, err)
			}
			w, err := do(other, "LOCK", res, 5000)
			if err != nil || w[2].(int64) <= r2[2].(int64) {
				t.Fatalf("LOCK after the readers: %v %v", w, err)
			}
			_, err = do(other, "RLOCK", res, 1000, "TOKEN", w[0])
			wantErr("RLOCK by the writer", err, "DEADLOCK ")
			if _, err := do(c, "RLOCK", res, 1000); err != redis.Nil {
				t.Fatalf("RLOCK while written: %v", err)
			}
			if n, err := other.Do(ctx, "UNLOCK", res).Int64(); err != nil || n != 1 {
				t.Fatalf("UNLOCK the writer: %v %v", n, err)
			}

			// Semaphores: k holders, each with its slot; -LOCKMODE for
			// other modes and another k, even with WAIT.
			sem := fmt.Sprintf("sem%d", proto)
			slots := map[int64]bool{}
			var permits [][]any
			for range 3 {
				p, err := do(c, "LOCK", sem, 5000, "PERMITS", 3)
				if err != nil || len(p) != 4 || slots[p[3].(int64)] {
					t.Fatalf("PERMITS 3: %v %v (slots %v)", p, err, slots)
				}
				slots[p[3].(int64)] = true
				permits = append(permits, p)
			}
			if _, err := do(other, "LOCK", sem, 1000, "PERMITS", 3); err != redis.Nil {
				t.Fatalf("a fourth permit: %v", err)
			}
			_, err = do(other, "LOCK", sem, 1000, "PERMITS", 2, "WAIT", 2000)
			wantErr("PERMITS 2 on 3", err, "LOCKMODE held as a semaphore of 3 permits")
			_, err = do(other, "LOCK", sem, 1000, "WAIT", 2000)
			wantErr("LOCK on a semaphore", err, "LOCKMODE held as a semaphore of 3 permits")
			_, err = do(other, "RLOCK", sem, 1000)
			wantErr("RLOCK on a semaphore", err, "LOCKMODE held as a semaphore of 3 permits")
			same, err := do(other, "LOCK", sem, 5000, "PERMITS", 3, "TOKEN", permits[1][0])
			if err != nil || same[2] != permits[1][2] || same[3] != permits[1][3] {
				t.Fatalf("permit refresh: %v %v, want %v", same, err, permits[1])
			}
			_, err = c.Do(ctx, "UNLOCK", sem).Result()
			wantErr("token-less UNLOCK of three permits", err, fmt.Sprintf("ERR this connection holds '%s' 3 times; give the token", sem))
			for _, p := range permits {
				if n, err := c.Do(ctx, "UNLOCK", sem, p[0]).Int64(); err != nil || n != 1 {
					t.Fatalf("UNLOCK a permit: %v %v", n, err)
				}
			}
			// PERMITS 1 is a plain LOCK: three elements.
			p1, err := do(c, "LOCK", sem, 1000, "PERMITS", 1)
			if err != nil || len(p1) != 3 {
				t.Fatalf("PERMITS 1: %v %v", p1, err)
			}
			if n, err := c.Do(ctx, "UNLOCK", sem).Int64(); err != nil || n != 1 {
				t.Fatalf("UNLOCK of PERMITS 1: %v %v", n, err)
			}

			// Bad arguments: -ERR, nothing sent.
			for _, tt := range []struct {
				give []any
				want string
			}{
				{[]any{"LOCK", sem, 1000, "PERMITS", 0}, "ERR PERMITS must be a positive integer"},
				{[]any{"LOCK", sem, 1000, "PERMITS", 9}, "ERR PERMITS exceeds the maximum of 8"},
				{[]any{"LOCK", sem, 1000, "PERMITS", "x"}, "ERR value is not an integer or out of range"},
				{[]any{"LOCK", sem, 1000, "PERMITS", 2, "PERMITS", 2}, "ERR syntax error"},
				{[]any{"RLOCK", sem, 1000, "PERMITS", 2}, "ERR syntax error"},
				{[]any{"RLOCK", sem}, "ERR wrong number of arguments for 'rlock' command"},
				{[]any{"RLOCK", sem, 0}, "ERR invalid expire time in 'rlock' command"},
			} {
				_, err := c.Do(ctx, tt.give...).Result()
				wantErr(fmt.Sprint(tt.give), err, tt.want)
			}
		})
	}
	// COMMAND DOCS knows RLOCK.
	docs, err := newClient(t, addr, 2).Do(context.Background(), "COMMAND", "DOCS", "rlock").Slice()
	if err != nil || len(docs) != 2 {
		t.Fatalf("COMMAND DOCS rlock: %v %v", docs, err)
	}
}

// TestSharedAndPermitKeepalive: KEEPALIVE keeps a reader and a permit
// past their ttl while the connection is open, and the connection's close
// releases them.
func TestSharedAndPermitKeepalive(t *testing.T) {
	backend := redistest.Start(t)
	_, nodes := startNodes(t, 3)
	addr := startApp(t, realConfig, "-backend", backend.Addr, "-lock-nodes", nodes)
	ctx := context.Background()
	holder := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, PoolSize: 1})
	other := newClient(t, addr, 2)
	if _, err := holder.Do(ctx, "RLOCK", "kr", 600, "KEEPALIVE").Slice(); err != nil {
		t.Fatalf("RLOCK KEEPALIVE: %v", err)
	}
	if _, err := holder.Do(ctx, "LOCK", "ks", 600, "PERMITS", 2, "KEEPALIVE").Slice(); err != nil {
		t.Fatalf("PERMITS KEEPALIVE: %v", err)
	}
	time.Sleep(1500 * time.Millisecond) // well past both ttls
	if _, err := other.Do(ctx, "LOCK", "kr", 1000).Slice(); err != redis.Nil {
		t.Fatalf("LOCK while the kept reader holds: %v", err)
	}
	p, err := other.Do(ctx, "LOCK", "ks", 10000, "PERMITS", 2).Slice()
	if err != nil {
		t.Fatalf("the second permit: %v", err)
	}
	if _, err := other.Do(ctx, "LOCK", "ks", 1000, "PERMITS", 2).Slice(); err != redis.Nil {
		t.Fatalf("a third permit while the kept one holds: %v", err)
	}
	holder.Close()
	start := time.Now()
	if _, err := other.Do(ctx, "LOCK", "kr", 1000, "WAIT", 5000).Slice(); err != nil {
		t.Fatalf("LOCK after the reader's connection closed: %v", err)
	}
	if _, err := other.Do(ctx, "LOCK", "ks", 1000, "PERMITS", 2, "WAIT", 5000).Slice(); err != nil {
		t.Fatalf("a permit after the holder's connection closed: %v", err)
	}
	if n, err := other.Do(ctx, "UNLOCK", "ks", p[0]).Int64(); err != nil || n != 1 {
		t.Fatalf("UNLOCK the second permit: %v %v", n, err)
	}
	if waited := time.Since(start); waited > time.Second {
		t.Errorf("the holdings were freed %v after the close: not released, they expired", waited)
	}
}
