package main

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/internal/redistest"
)

// startBenchApp serves the proxy over a real backend and n lock nodes.
func startBenchApp(b *testing.B, n int) string {
	backend := redistest.Start(b)
	_, nodes := startNodes(b, n)
	return startApp(b, realConfig, "-backend", backend.Addr, "-lock-nodes", nodes)
}

// BenchmarkLockUnlock is one client's uncontended LOCK+UNLOCK through the
// proxy; ns/op is the latency of the pair.
func BenchmarkLockUnlock(b *testing.B) {
	for _, n := range []int{3, 5} {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			c := newClient(b, startBenchApp(b, n), 2)
			benchLockUnlock(b, c)
		})
	}
}

// benchLockUnlock runs b.N uncontended LOCK+UNLOCK pairs of one resource
// on c, with allocations reported.
func benchLockUnlock(b *testing.B, c *redis.Client) {
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		l, err := lock(ctx, c, "bench", 10000)
		if err != nil {
			b.Fatal(err)
		}
		if err := c.Do(ctx, "UNLOCK", "bench", l.token).Err(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkHandoff measures the time from an UNLOCK being sent to the
// LOCK ... WAIT of the next waiter being answered, and reports its median
// and p99 as custom metrics.
func BenchmarkHandoff(b *testing.B) {
	addr := startBenchApp(b, 3)
	holder, waiter := newClient(b, addr, 2), newClient(b, addr, 2)
	ctx := context.Background()
	handoffs := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		held, err := lock(ctx, holder, "handoff", 10000)
		if err != nil {
			b.Fatal(err)
		}
		got := make(chan time.Time, 1)
		unlocked := make(chan struct{})
		go func() {
			defer close(unlocked)
			l, err := lock(ctx, waiter, "handoff", 10000, "WAIT", 5000)
			if err != nil && !errors.Is(err, redis.Nil) {
				b.Error(err)
			}
			got <- time.Now()
			waiter.Do(ctx, "UNLOCK", "handoff", l.token)
		}()
		time.Sleep(2 * time.Millisecond) // let the waiter queue behind the holder
		released := time.Now()
		holder.Do(ctx, "UNLOCK", "handoff", held.token)
		handoffs = append(handoffs, (<-got).Sub(released))
		<-unlocked
	}
	b.StopTimer()
	sort.Slice(handoffs, func(i, j int) bool { return handoffs[i] < handoffs[j] })
	b.ReportMetric(float64(handoffs[len(handoffs)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(handoffs[len(handoffs)*99/100].Microseconds()), "p99-µs")
}

// BenchmarkACLLockUnlock is BenchmarkLockUnlock (3 nodes) for a
// password-only user and for a user with Redis's ACL rules, whose lock
// commands are checked (the category @lock, and the resource as a key,
// by ACL DRYRUN, cached): the cost of the rules on the lock path.
func BenchmarkACLLockUnlock(b *testing.B) {
	backend := redistest.Start(b)
	_, nodes := startNodes(b, 3)
	yaml := realConfig + "\nauth:\n  users: {plain: pp}\n  acl: [\"user ruled on >pr ~bench* +@lock +set +get +@connection\"]\n"
	addr := startApp(b, yaml, "-backend", backend.Addr, "-lock-nodes", nodes)
	for _, u := range []struct{ name, user, pass string }{{"password-only", "plain", "pp"}, {"rules", "ruled", "pr"}} {
		b.Run(u.name, func(b *testing.B) {
			c := redis.NewClient(&redis.Options{Addr: addr, Username: u.user, Password: u.pass, MaxRetries: -1, PoolSize: 1})
			b.Cleanup(func() { c.Close() })
			benchLockUnlock(b, c)
		})
	}
}
