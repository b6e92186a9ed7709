package quorum

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// BenchmarkLocksStep runs LOCKS steps of COUNT 10 over 3 nodes holding
// 1,000 locks each, the first also holding keys=0 or 1,000,000 other keys:
// one op is one step (a SCAN step on one node and the rounds that confirm
// what it found), which should cost about the same whatever the number of
// other keys. node-cpu-µs/op is the nodes' CPU per step.
func BenchmarkLocksStep(b *testing.B) {
	for _, other := range []int{0, 1_000_000} {
		b.Run("keys="+strconv.Itoa(other), func(b *testing.B) {
			c := startCluster(b, 3)
			l := newLocker(b, c, testConfig())
			warm(b, c, l)
			ctx := context.Background()
			for i := range 1000 {
				if _, err := l.Lock(ctx, "bench:"+strconv.Itoa(i), time.Hour, Options{}); err != nil {
					b.Fatal(err)
				}
			}
			if other > 0 {
				big := redis.NewClient(&redis.Options{Addr: c.servers[0].Addr, ReadTimeout: time.Minute})
				defer big.Close()
				err := big.Eval(ctx, "for i = 1, tonumber(ARGV[1]) do redis.call('SET', 'other:' .. i, 'x') end", nil, other).Err()
				if err != nil && err != redis.Nil {
					b.Fatal(err)
				}
			}
			cpu := c.cpu(b)
			cursor, found := uint64(0), 0
			b.ResetTimer()
			for b.Loop() {
				next, got, err := l.Locks(ctx, cursor, "", 10)
				if err != nil {
					b.Fatal(err)
				}
				cursor, found = next, found+len(got)
			}
			b.StopTimer()
			b.ReportMetric(float64(found)/float64(b.N), "resources/op")
			reportNodeCPU(b, c, cpu)
		})
	}
}
