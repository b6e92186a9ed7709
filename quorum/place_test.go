package quorum

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"
)

// BenchmarkUnlockPlacedReaders: readers of one resource granted while a
// node is down, each with its placement onto that node pending; one op is
// one reader's Unlock, which drops the reader's placement (readers=N: N
// granted before the timed Unlocks, which release them in the order
// granted). The nodes' share of an Unlock grows with the readers in the
// resource's record (each hash operation reads the record whole, hload in
// hashLua); BenchmarkCancelPlacement measures the Locker's own step.
func BenchmarkUnlockPlacedReaders(b *testing.B) {
	for _, n := range []int{100, 2000} {
		b.Run(fmt.Sprintf("readers=%d", n), func(b *testing.B) {
			c := startCluster(b, 3)
			l := newLocker(b, c, quiet(testConfig()))
			warm(b, c, l)
			c.kill(2)
			ctx := context.Background()
			grant := func() []Lock {
				lks := make([]Lock, n)
				for i := range lks {
					lk, err := l.RLock(ctx, "doc", time.Minute, Options{})
					if err != nil {
						b.Fatalf("RLock: %v", err)
					}
					lks[i] = lk
				}
				eventually(b, "the placements kept for node 2", func() bool {
					l.mu.Lock()
					defer l.mu.Unlock()
					return placementsOf(l, "doc") == n
				})
				return lks
			}
			b.ReportAllocs()
			b.ResetTimer()
			for done := 0; done < b.N; {
				b.StopTimer()
				lks := grant()
				b.StartTimer()
				i := 0
				for ; i < len(lks) && done < b.N; i, done = i+1, done+1 {
					if err := l.Unlock(ctx, "doc", lks[i].Token); err != nil {
						b.Fatalf("Unlock: %v", err)
					}
				}
				b.StopTimer()
				for _, lk := range lks[i:] {
					mustUnlock(b, l, "doc", lk.Token)
				}
				b.StartTimer()
			}
		})
	}
}

// BenchmarkCancelPlacement: the step of Unlock that drops the token's
// placements, alone, with the placements of readers=N readers of one
// resource pending (as BenchmarkUnlockPlacedReaders has them); one op
// cancels one reader's, in the order registered.
func BenchmarkCancelPlacement(b *testing.B) {
	for _, n := range []int{100, 2000} {
		b.Run(fmt.Sprintf("readers=%d", n), func(b *testing.B) {
			c := startCluster(b, 3)
			l := newLocker(b, c, quiet(testConfig()))
			end := time.Now().Add(time.Hour)
			form := &holdingForm{shared: true}
			ps := make([]*placement, n)
			b.ReportAllocs()
			b.ResetTimer()
			for done := 0; done < b.N; {
				b.StopTimer()
				l.mu.Lock()
				for i := range ps {
					ps[i] = &placement{resource: "doc", token: "reader-" + strconv.Itoa(i), attempt: "a", form: form, end: end, nodes: l.nodes[2:]}
					ps[i].timer = time.AfterFunc(time.Hour, func() {})
					l.register(ps[i])
				}
				l.mu.Unlock()
				b.StartTimer()
				i := 0
				for ; i < n && done < b.N; i, done = i+1, done+1 {
					l.cancelPlacement("doc", ps[i].token)
				}
				b.StopTimer()
				for _, p := range ps[i:] {
					l.cancelPlacement("doc", p.token)
				}
				b.StartTimer()
			}
		})
	}
}

// placementsOf counts the pending placements of resource. l.mu is held.
func placementsOf(l *Locker, resource string) int {
	n := 0
	for _, ps := range l.placing[resource] {
		n += len(ps)
	}
	return n
}
