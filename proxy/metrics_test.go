package proxy

import "testing"

// TestStampRun: commands stamped in runs are measured as often, and at
// the same places, as commands stamped one by one.
func TestStampRun(t *testing.T) {
	one, run := newMetrics(), newMetrics()
	sizes := []int{1, 5, 31, 2, 16, 30, 7, 31, 31, 1, 3}
	for round := range 50 {
		for _, n := range sizes {
			var want []int
			for i := range n {
				if one.stamp() != 0 {
					want = append(want, i)
				}
			}
			at, stamp := run.stampRun(n)
			switch {
			case len(want) > 1:
				t.Fatalf("round %d: %d of a run of %d measured", round, len(want), n)
			case len(want) == 0 && at != -1:
				t.Fatalf("round %d: run of %d measured at %d, one by one none", round, n, at)
			case len(want) == 1 && (at != want[0] || stamp <= 0):
				t.Fatalf("round %d: run of %d measured at %d (stamp %d), one by one at %d", round, n, at, stamp, want[0])
			}
		}
	}
}
