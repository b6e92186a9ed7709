package main

import (
	"strings"
	"testing"
	"time"
)

func TestMeanAndSpread(t *testing.T) {
	if got := mean([]time.Duration{time.Millisecond, 3 * time.Millisecond}); got != 2*time.Millisecond {
		t.Errorf("mean = %v, want 2ms", got)
	}
	if got := mean(nil); got != 0 {
		t.Errorf("mean(nil) = %v, want 0", got)
	}
	if med, lo, hi := spread([]float64{3, 1, 2, 10}); med != 2.5 || lo != 1 || hi != 10 {
		t.Errorf("spread = %v %v %v, want 2.5 1 10", med, lo, hi)
	}
}

func TestGapBound(t *testing.T) {
	hold := func(ms float64) result {
		return result{holds: []time.Duration{time.Duration(ms * float64(time.Millisecond))}}
	}
	px := []result{hold(1.0), hold(1.1), hold(1.2)}
	rs := []result{{ops: 729, elapsed: time.Second}}
	var b strings.Builder
	us := func(n int) time.Duration { return time.Duration(n) * time.Microsecond }
	floors := []floor{{one: us(30), round: us(100)}, {one: us(19), round: us(120)}, {one: us(20), round: us(90)}}
	printGapBound(&b, 3, px, rs, floors)
	// 1.2 × 729/s is a cycle of 1000/874.8 = 1.143 ms; the median hold is 1.1 ms.
	wantAll(t, b.String(),
		"PING to a lock node, as the holder's UNLOCK to the proxy and back, 0.020 ms (0.019–0.030)",
		"PINGs to the 3 lock nodes at once until all answered, as the proxy's round, 0.100 ms (0.090–0.120)",
		"together 0.130 ms (0.110–0.139)",
		"729 acquisitions/s is a cycle of 1.14 ms",
		"mean hold of 1.10 ms that leaves 0.04 ms",
	)

	b.Reset()
	printGapBound(&b, 3, px, rs, nil)
	if b.Len() != 0 {
		t.Errorf("without round trips: %q, want nothing", b.String())
	}
}

func TestPrintLockfloor(t *testing.T) {
	run := func(pairs int, proxy, nodes int64) result {
		return result{ops: pairs, elapsed: time.Second, cpu: cpuSample{self: 10, proxy: proxy, nodes: nodes, busy: 160, total: 200}}
	}
	// 100 ticks a second: 1,000 pairs in a tick of 10 ms is 10 µs a pair.
	px := []result{run(1500, 4, 3), run(1600, 4, 3), run(1700, 4, 3)}
	fl := []result{run(1800, 3, 2), run(1900, 3, 2), run(2000, 3, 2)}
	rs := []result{run(1000, 0, 6), run(1000, 0, 6), run(1000, 0, 6)}
	var b strings.Builder
	printLockfloor(&b, px, fl, rs)
	wantAll(t, b.String(),
		"| pairs/s | 1600 (1500–1700) | 1900 (1800–2000) | 1000 (1000–1000) | 1.60x | **1.90x** |",
		"| CPU µs per pair: the proxy | 25.0 (23.5–26.7) | 15.8 (15.0–16.7) | – | | |",
		"| machine busy (% of all CPUs, any process) | 80% (80%–80%) | 80% (80%–80%) | 80% (80%–80%) | | |",
	)

	// Without CPU times, only the pairs.
	b.Reset()
	printLockfloor(&b, []result{{ops: 10, elapsed: time.Second}}, []result{{ops: 20, elapsed: time.Second}}, []result{{ops: 10, elapsed: time.Second}})
	if strings.Contains(b.String(), "CPU") || !strings.Contains(b.String(), "| pairs/s | 10 | 20 | 10 | 1.00x | **2.00x** |") {
		t.Errorf("without CPU times:\n%s", b.String())
	}
}

// wantAll reports each of want that got does not contain.
func wantAll(t *testing.T, got string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(got, w) {
			t.Errorf("missing %q in\n%s", w, got)
		}
	}
}
