package redistest

import (
	"testing"
	"time"
)

// TestGroupFailsOver checks the helper itself: the Sentinels it starts
// fail over to a replica when the primary is killed.
func TestGroupFailsOver(t *testing.T) {
	g := StartGroup(t, "mymaster", 2, 3)
	if p := g.CurrentPrimary(); p != g.Primary {
		t.Fatalf("primary %s, want %s", p.Addr, g.Primary.Addr)
	}
	w := g.WatchSwitches()
	start := time.Now()
	g.Primary.Kill()
	at, payload := w.Next(t, 10*time.Second)
	t.Logf("+switch-master %q after %v", payload, at.Sub(start))
	if p := g.CurrentPrimary(); p == g.Primary {
		t.Fatalf("still %s", p.Addr)
	}
}
