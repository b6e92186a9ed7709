package quorum

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkLockerLockUnlock acquires and releases one resource in a loop
// over 3 and 5 real lock nodes: one op is one Lock plus one Unlock, that is
// the node round trips of both.
func BenchmarkLockerLockUnlock(b *testing.B) {
	for _, n := range []int{3, 5} {
		b.Run(strconv.Itoa(n)+"nodes", func(b *testing.B) {
			c := startCluster(b, n)
			l := newLocker(b, c, testConfig())
			ctx := context.Background()
			lockUnlock(b, ctx, l, "bench") // connections, scripts loaded
			cpu := c.cpu(b)
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				lockUnlock(b, ctx, l, "bench")
			}
			b.StopTimer()
			reportNodeCPU(b, c, cpu)
		})
	}
}

// BenchmarkLockUnlockNodeDown: one Lock plus one Unlock over 3 nodes, all
// up (down=0) and with node 2 killed (down=1), which the Locker knows
// before the timer starts (a call found it down): what a minority of nodes
// down costs a call in the proxy, which should be nothing (no dial, no
// connection's buffers) beyond what the same call costs with all up.
func BenchmarkLockUnlockNodeDown(b *testing.B) {
	for _, down := range []int{0, 1} {
		b.Run(fmt.Sprintf("down=%d", down), func(b *testing.B) {
			c := startCluster(b, 3)
			l := newLocker(b, c, testConfig())
			warm(b, c, l)
			ctx := context.Background()
			if down > 0 {
				c.kill(2)
				eventually(b, "node 2 known down", func() bool {
					lockUnlock(b, ctx, l, "bench")
					return !l.nodes[2].reachable.Load()
				})
			}
			lockUnlock(b, ctx, l, "bench")
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				lockUnlock(b, ctx, l, "bench")
			}
		})
	}
}

// BenchmarkLockerLockUnlockParallel runs 25 clients per GOMAXPROCS (50 on
// two cores, as the uncontended lockbench scenario), each locking and
// unlocking its own resource on one shared Locker over 3 nodes. This is
// where batching the node round trips of concurrent clients shows.
func BenchmarkLockerLockUnlockParallel(b *testing.B) {
	c := startCluster(b, 3)
	l := newLocker(b, c, testConfig())
	ctx := context.Background()
	lockUnlock(b, ctx, l, "bench")
	cpu := c.cpu(b)
	calls := c.allScriptCalls(b)
	var next atomic.Int64
	b.SetParallelism(25)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		resource := "bench:" + strconv.FormatInt(next.Add(1), 10)
		for pb.Next() {
			lk, err := l.Lock(ctx, resource, 10*time.Second, Options{})
			if err != nil {
				b.Errorf("Lock(%q): %v", resource, err)
				return
			}
			if err := l.Unlock(ctx, resource, lk.Token); err != nil {
				b.Errorf("Unlock(%q): %v", resource, err)
				return
			}
		}
	})
	b.StopTimer()
	reportNodeCPU(b, c, cpu)
	b.ReportMetric(float64(c.allScriptCalls(b)-calls)/float64(b.N), "node-calls/op")
}

// reportNodeCPU reports the CPU time the nodes of c used since they had
// used before (from c.cpu), per op, as node-µs/op: the nodes' own count
// (INFO cpu), so it holds however busy the machine was, unlike a node
// timing its commands by the clock (INFO commandstats).
func reportNodeCPU(b *testing.B, c *cluster, before time.Duration) {
	b.ReportMetric(float64((c.cpu(b)-before).Microseconds())/float64(b.N), "node-µs/op")
}

func lockUnlock(b *testing.B, ctx context.Context, l *Locker, resource string) {
	lk, err := l.Lock(ctx, resource, 10*time.Second, Options{})
	if err != nil {
		b.Fatalf("Lock: %v", err)
	}
	if err := l.Unlock(ctx, resource, lk.Token); err != nil {
		b.Fatalf("Unlock: %v", err)
	}
}
