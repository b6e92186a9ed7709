package quorum

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestNoQuorumSaysClockNotPlaced: when nodes answer but their clock
// readings cannot be placed against the reference (here two of three
// behind a relay that delays each way by six times half the clock
// tolerance), Lock and Info fail with a NoQuorumError that says so,
// instead of a bare "3 of 3 lock nodes answered".
func TestNoQuorumSaysClockNotPlaced(t *testing.T) {
	c := startCluster(t, 3)
	cfg := quiet(testConfig())
	cfg.ClockTolerance = 20 * time.Millisecond
	cfg.NodeTimeout = time.Second
	r0 := redistest.NewRelay(t, c.servers[0].Addr)
	r1 := redistest.NewRelay(t, c.servers[1].Addr)
	opts := []*redis.Options{{Addr: r0.Addr}, {Addr: r1.Addr}, {Addr: c.servers[2].Addr}}
	l := newLockerOpts(t, opts, cfg)
	warm(t, c, l)
	r0.SetDelay(60 * time.Millisecond)
	r1.SetDelay(60 * time.Millisecond)

	check := func(what string, err error) {
		t.Helper()
		var nq *NoQuorumError
		if !errors.As(err, &nq) || nq.Answered != 3 || nq.Unplaced < 2 ||
			!strings.Contains(err.Error(), "with a clock reading not placed") {
			t.Errorf("%s with two nodes' round trips over the clock tolerance: %v, want a NoQuorumError with 3 answered, at least 2 not placed", what, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := l.Lock(ctx, "r", 10*time.Second, Options{})
	check("Lock", err)
	_, err = l.Info(ctx, "r", "")
	check("Info", err)
}
