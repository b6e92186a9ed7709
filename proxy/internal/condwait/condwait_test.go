package condwait

import (
	"sync"
	"testing"
	"time"
)

// TestWait: Wait returns once done reports true after a Broadcast, and
// after d when nothing comes.
func TestWait(t *testing.T) {
	var mu sync.Mutex
	c := sync.NewCond(&mu)
	ready := false
	go func() {
		time.Sleep(20 * time.Millisecond)
		mu.Lock()
		ready = true
		c.Broadcast()
		mu.Unlock()
	}()
	mu.Lock()
	start := time.Now()
	Wait(c, 10*time.Second, func() bool { return ready })
	if !ready || time.Since(start) > 5*time.Second {
		t.Errorf("Wait returned after %v with ready %v, want ready", time.Since(start), ready)
	}
	start = time.Now()
	Wait(c, 50*time.Millisecond, func() bool { return false })
	if waited := time.Since(start); waited < 50*time.Millisecond {
		t.Errorf("Wait with nothing to wait for returned after %v, want 50ms", waited)
	}
	mu.Unlock()
}
