package quorum

import (
	"context"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestExpiresNotPastValidity: Lock.Expires is the end of the validity
// measured from the start of the granting round. A Locker that stalls
// between taking the validity and returning (here: the placement of the
// lock on a node that still showed another holder waits for the Locker's
// mutex) must not promise the stall on top of it.
func TestExpiresNotPastValidity(t *testing.T) {
	c := startCluster(t, 3)
	cfg := quiet(testConfig())
	r0 := redistest.NewRelay(t, c.servers[0].Addr)
	r1 := redistest.NewRelay(t, c.servers[1].Addr)
	opts := []*redis.Options{{Addr: r0.Addr}, {Addr: r1.Addr}, {Addr: c.servers[2].Addr}}
	l := newLockerOpts(t, opts, cfg)
	warm(t, c, l)
	// Node 2 shows another holder: the grant schedules a placement there.
	if err := c.admin[2].Set(context.Background(), "lockproxy:lock:R", "01/x.1:other", 10*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	r0.SetDelay(40 * time.Millisecond)
	r1.SetDelay(40 * time.Millisecond)

	const ttl = 3 * time.Second
	began := time.Now()
	done := make(chan Lock, 1)
	go func() {
		lk, err := l.Lock(context.Background(), "R", ttl, Options{})
		if err != nil {
			t.Errorf("Lock: %v", err)
		}
		done <- lk
	}()
	time.Sleep(20 * time.Millisecond) // the round is in flight
	l.mu.Lock()
	time.Sleep(500 * time.Millisecond)
	l.mu.Unlock()
	lk := <-done
	bound := began.Add(ttl - time.Duration(float64(ttl)*cfg.DriftFactor) - 2*time.Millisecond - cfg.ClockTolerance)
	t.Logf("Expires is %v after the bound", lk.Expires.Sub(bound))
	// The round starts a little after the call: a few ms of slack, far
	// below the stall.
	if lk.Expires.After(bound.Add(20 * time.Millisecond)) {
		t.Fatalf("Expires lies %v past ttl - drift - tolerance from the call's start", lk.Expires.Sub(bound))
	}
}
