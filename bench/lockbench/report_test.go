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
	for _, want := range []string{
		"PING to a lock node, as the holder's UNLOCK to the proxy and back, 0.020 ms (0.019–0.030)",
		"PINGs to the 3 lock nodes at once until all answered, as the proxy's round, 0.100 ms (0.090–0.120)",
		"together 0.130 ms (0.110–0.139)",
		"729 acquisitions/s is a cycle of 1.14 ms",
		"mean hold of 1.10 ms that leaves 0.04 ms",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("missing %q in %q", want, b.String())
		}
	}

	b.Reset()
	printGapBound(&b, 3, px, rs, nil)
	if b.Len() != 0 {
		t.Errorf("without round trips: %q, want nothing", b.String())
	}
}
