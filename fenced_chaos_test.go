package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/internal/redistest"
)

// fencedAppend is the chaos test's read-modify-write: it appends the
// fence to a list and counts the updates, as one atomic step.
const fencedAppend = "redis.call('rpush', KEYS[1], ARGV[1]) return redis.call('incr', KEYS[2])"

// TestFencedChaos: clients on two proxies lock one resource, then append
// their fence to a list with FENCED ... EVAL, some of them pausing past
// their validity first, while lock nodes stop and come back and the
// backend fails over (Sentinel). An independent checker reads the list
// from the backend at the end: never decreasing, every update that a
// client saw accepted and replicated (WAIT) is there exactly once, none
// that was refused is, the counter matches the list; the only errors are
// -STALEFENCE, -NOQUORUM and backend unavailable.
func TestFencedChaos(t *testing.T) {
	g := redistest.StartGroup(t, "mymaster", 1, 1)
	nodes, addrs := startNodes(t, 3)
	cfg := fmt.Sprintf("lock: {node_timeout: 100ms}\nbackend:\n  addr: \"\"\n  sentinel: {master_name: mymaster, addrs: [%s]}\n", g.Sentinels[0].Addr)
	proxies := []string{startApp(t, cfg, "-lock-nodes", addrs), startApp(t, cfg, "-lock-nodes", addrs)}

	const run = 30 * time.Second
	type outcome struct {
		fence              int64
		accepted, durable  bool // the client got the reply; WAIT 1 confirmed it
		refused, uncertain bool // -STALEFENCE; an error that may follow a run
	}
	var (
		mu       sync.Mutex
		outcomes []outcome
		counts   = map[string]int{}
		bad      []string
	)
	note := func(k string) { mu.Lock(); counts[k]++; mu.Unlock() }
	allowed := func(err error) bool {
		s := err.Error()
		return strings.HasPrefix(s, "STALEFENCE ") || strings.HasPrefix(s, "NOQUORUM ") || strings.Contains(s, "backend unavailable")
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	runWorkers(&wg, stop, 6, proxies[:2], 15*time.Second,
		func(ctx context.Context, c *redis.Client) {
			l, err := lock(ctx, c, "acct", 400, "WAIT", 1000)
			if err != nil {
				switch {
				case errors.Is(err, redis.Nil):
					note("not acquired")
				case allowed(err):
					note("lock error")
				default:
					mu.Lock()
					bad = append(bad, "LOCK: "+err.Error())
					mu.Unlock()
				}
				time.Sleep(5 * time.Millisecond)
				return
			}
			note("locked")
			if rand.IntN(4) == 0 {
				// Paused past the lock's validity (a GC, a stopped VM).
				note("paused")
				time.Sleep(l.validity + time.Duration(50+rand.IntN(200))*time.Millisecond)
			}
			o := outcome{fence: l.fence}
			_, err = c.Do(ctx, "FENCED", "acct", l.fence, "EVAL", fencedAppend, 2, "acct:fences", "acct:count", l.fence).Int64()
			switch {
			case err == nil:
				o.accepted = true
				n, werr := c.Do(ctx, "WAIT", 1, 2000).Int64()
				o.durable = werr == nil && n == 1
			case strings.HasPrefix(err.Error(), "STALEFENCE "):
				o.refused = true
			case allowed(err):
				o.uncertain = true
			default:
				mu.Lock()
				bad = append(bad, "FENCED: "+err.Error())
				mu.Unlock()
				o.uncertain = true
			}
			mu.Lock()
			outcomes = append(outcomes, o)
			mu.Unlock()
			c.Do(ctx, "UNLOCK", "acct", l.token)
		})

	faults := map[string]int{}
	start := time.Now()
	failedOver := false
	for time.Since(start) < run {
		time.Sleep(time.Duration(500+rand.IntN(1000)) * time.Millisecond)
		if !failedOver && time.Since(start) > run/3 {
			g.Failover()
			failedOver = true
			faults["failover"]++
			continue
		}
		n := nodes[rand.IntN(len(nodes))]
		n.Pause()
		time.Sleep(time.Duration(200+rand.IntN(800)) * time.Millisecond)
		n.Resume()
		faults["lock node paused"]++
	}
	close(stop)
	wg.Wait()

	// The checker reads what the backend kept.
	ctx := context.Background()
	primary := g.CurrentPrimary()
	pc := redis.NewClient(&redis.Options{Addr: primary.Addr})
	defer pc.Close()
	list, err := pc.LRange(ctx, "acct:fences", 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	count, _ := pc.Get(ctx, "acct:count").Int64()
	kept := make([]int64, len(list))
	seen := map[int64]int{}
	for i, v := range list {
		kept[i], _ = strconv.ParseInt(v, 10, 64)
		seen[kept[i]]++
	}
	for i := 1; i < len(kept); i++ {
		if kept[i] < kept[i-1] {
			t.Errorf("fence %d accepted after %d", kept[i], kept[i-1])
		}
	}
	if int64(len(kept)) != count {
		t.Errorf("the counter is %d for %d appended fences", count, len(kept))
	}
	var accepted, durable, refused, uncertain, lost int
	for _, o := range outcomes {
		switch {
		case seen[o.fence] > 1:
			t.Errorf("fence %d applied %d times", o.fence, seen[o.fence])
		case o.refused && seen[o.fence] > 0:
			t.Errorf("fence %d was refused and ran", o.fence)
		case o.durable && seen[o.fence] == 0:
			t.Errorf("fence %d was accepted and replicated, and is lost", o.fence)
		case o.accepted && seen[o.fence] == 0:
			lost++ // acknowledged before the failover, not yet replicated
		}
		switch {
		case o.durable:
			durable++
			accepted++
		case o.accepted:
			accepted++
		case o.refused:
			refused++
		default:
			uncertain++
		}
	}
	for f := range seen {
		if !slices.ContainsFunc(outcomes, func(o outcome) bool { return o.fence == f }) {
			t.Errorf("fence %d is in the list but no client sent it", f)
		}
	}
	for _, b := range bad {
		t.Errorf("unexpected error: %s", b)
	}
	t.Logf("fenced chaos over %v: %d fenced writes accepted (%d confirmed by WAIT), %d refused STALEFENCE, %d backend errors, %d acknowledged but lost in the failover before replication; %v; faults %v; violations %d",
		run, accepted, durable, refused, uncertain, lost, counts, faults, len(bad))
	if accepted < 50 || refused == 0 || counts["paused"] == 0 {
		t.Errorf("the run proves little: %d accepted, %d refused, %d paused", accepted, refused, counts["paused"])
	}
}
