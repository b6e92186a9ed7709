package quorum

import (
	"context"
	"slices"
	"sync"
	"time"
)

// SharedInfo is what the lock nodes report of a resource held shared
// (RLock) or as a semaphore, for LOCKINFO. It never carries a token.
type SharedInfo struct {
	// Mode is "shared" or "semaphore" when a majority of the nodes that
	// count hold the resource so, and "" otherwise (free, exclusive, or no
	// majority agrees).
	Mode string
	// K is the semaphore's number of permits; 0 when shared.
	K int
	// Holders is the number of readers or permits in use that a majority
	// of the nodes that count show at least.
	Holders int
	// Fence is the largest fence among the holdings on those nodes.
	Fence int64
	// Remaining is, per node that counts and holds the resource in Mode,
	// the time its longest-lived holding has left on that node, largest
	// first: Remaining[quorum-1] is what a majority still keeps.
	Remaining []time.Duration
	// Answered is the number of nodes that answered.
	Answered int
}

// infoScript reads a resource's hash record without changing it.
//
//	EVALSHA sha 2 marker key
//
// It replies {marker, kind, holders, k, fence, remaining}: marker 1 when
// the node has it; kind 1 shared, 2 semaphore, 0 anything else (free, a
// string lock, a hash without a mode); remaining the ms the longest-lived
// live holding has left.
var infoScript = newScript(infoLua)

// SharedInfo reads what the nodes hold of resource shared or as a
// semaphore (see SharedInfo's fields) and changes nothing. Only nodes with
// their marker count. It returns a *NoQuorumError when fewer than a
// majority answered. ctx bounds the call; each node gets at most
// NodeTimeout. It is safe for concurrent use.
func (l *Locker) SharedInfo(ctx context.Context, resource string) (SharedInfo, error) {
	type nodeInfo struct {
		ok                       bool
		marker, kind, holders, k int64
		fence                    int64
		remaining                time.Duration
	}
	out := make([]nodeInfo, len(l.nodes))
	var wg sync.WaitGroup
	for i, n := range l.nodes {
		wg.Go(func() {
			v, err := l.run(ctx, n, infoScript, []string{l.markerArg.(string), l.lockPrefix + resource})
			a, _ := v.([]any)
			if err != nil || len(a) != 6 {
				return
			}
			x := make([]int64, 6)
			for j := range a {
				x[j], _ = a[j].(int64)
			}
			out[i] = nodeInfo{ok: true, marker: x[0], kind: x[1], holders: x[2], k: x[3], fence: x[4], remaining: time.Duration(x[5]) * time.Millisecond}
		})
	}
	wg.Wait()
	var info SharedInfo
	votes := map[[2]int64]int{} // (kind, k) -> counting nodes
	for _, n := range out {
		if n.ok {
			info.Answered++
			if n.marker == 1 && n.kind != 0 {
				votes[[2]int64{n.kind, n.k}]++
			}
		}
	}
	if info.Answered < l.quorum {
		return info, &NoQuorumError{Answered: info.Answered, Total: len(l.nodes)}
	}
	for mode, v := range votes {
		if v < l.quorum {
			continue
		}
		var holders []int64
		for _, n := range out {
			if n.ok && n.marker == 1 && n.kind == mode[0] && n.k == mode[1] {
				holders = append(holders, n.holders)
				info.Fence = max(info.Fence, n.fence)
				info.Remaining = append(info.Remaining, n.remaining)
			}
		}
		slices.Sort(holders)
		slices.Reverse(holders)
		slices.Sort(info.Remaining)
		slices.Reverse(info.Remaining)
		info.Holders = int(holders[l.quorum-1])
		info.Mode, info.K = "shared", int(mode[1])
		if mode[0] == 2 {
			info.Mode = "semaphore"
		}
	}
	return info, nil
}
