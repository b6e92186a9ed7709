package redistest

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestShiftClock: a shifted server's TIME jumps, and its keys expire by
// the shifted clock (early after a forward jump, late after a backward
// one).
func TestShiftClock(t *testing.T) {
	s := StartWithClock(t)
	before := serverTime(t, s)
	do(t, s, "SET", "short", "1", "PX", "20000")
	do(t, s, "SET", "long", "1", "PX", "90000")
	s.ShiftClock(60 * time.Second)
	if d := serverTime(t, s) - before; d < 60_000 || d > 62_000 {
		t.Errorf("TIME moved %d ms after a +60s shift, want about 60000", d)
	}
	if got := do(t, s, "EXISTS", "short"); got != ":0" {
		t.Errorf("EXISTS short = %s after a +60s shift, want :0 (expired early)", got)
	}
	if p := pttl(t, s, "long"); p < 25_000 || p > 30_000 {
		t.Errorf("PTTL long = %d after a +60s shift, want about 30000", p)
	}
	do(t, s, "SET", "later", "1", "PX", "5000")
	s.ShiftClock(-60 * time.Second)
	if p := pttl(t, s, "later"); p < 60_000 {
		t.Errorf("PTTL later = %d after a -60s shift, want about 65000", p)
	}
	s.Restart() // the offset survives a restart
	if d := serverTime(t, s) - before; d < -1_000 || d > 2_000 {
		t.Errorf("TIME moved %d ms after +60s, -60s and a restart, want about 0", d)
	}
}

func do(t *testing.T, s *Server, args ...string) string {
	t.Helper()
	r, err := s.Do(args...)
	if err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	return r
}

func pttl(t *testing.T, s *Server, key string) int64 {
	t.Helper()
	p, _ := strconv.ParseInt(strings.TrimPrefix(do(t, s, "PTTL", key), ":"), 10, 64)
	return p
}

// serverTime returns the server's TIME in ms, from a Lua script whose
// reply is one integer (Do reads only the first line of a reply).
func serverTime(t *testing.T, s *Server) int64 {
	t.Helper()
	r := do(t, s, "EVAL", "local t = redis.call('TIME') return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)", "0")
	ms, err := strconv.ParseInt(strings.TrimPrefix(r, ":"), 10, 64)
	if err != nil {
		t.Fatalf("TIME: %q", r)
	}
	return ms
}
