package commands

import (
	"context"
	"maps"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/lockproxy/lockproxy/quorum"
)

// registry registers h with a fresh registry, which checks that Describe
// and Collect agree.
func registry(tb testing.TB, h *Handler) *prometheus.Registry {
	tb.Helper()
	reg := prometheus.NewRegistry()
	if err := reg.Register(h); err != nil {
		tb.Fatalf("Register: %v", err)
	}
	return reg
}

// scrape gathers reg and returns every sample by name, with the command
// and outcome labels of lockproxy_commands_total appended:
// "lockproxy_commands_total/lock/acquired".
func scrape(tb testing.TB, reg prometheus.Gatherer) map[string]float64 {
	tb.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		tb.Fatalf("Gather: %v", err)
	}
	got := make(map[string]float64)
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			key := mf.GetName()
			for _, lp := range m.GetLabel() { // sorted: command, outcome
				key += "/" + lp.GetValue()
			}
			got[key] = m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return got
}

// metricsEnv is newEnv with a node timeout that survives a loaded machine
// running -race: the tests below check every counter exactly, and a node
// call timing out at the default 50ms would move the wrong one.
func metricsEnv(tb testing.TB, n int) *env {
	tb.Helper()
	cfg := quorum.DefaultConfig()
	cfg.NodeTimeout = 250 * time.Millisecond
	cfg.ClockTolerance = 150 * time.Millisecond // as newEnv
	return newEnvQuorum(tb, n, cfg)
}

// zeroMetrics is what a new Handler reports.
func zeroMetrics() map[string]float64 {
	want := map[string]float64{
		"lockproxy_keepalive_extensions_total": 0,
		"lockproxy_keepalive_lost_total":       0,
		"lockproxy_locks_held":                 0,
	}
	for _, l := range outcomeLabels {
		want["lockproxy_commands_total/"+l[0]+"/"+l[1]] = 0
	}
	return want
}

func TestMetricsLint(t *testing.T) {
	t.Parallel()
	e := metricsEnv(t, 1)
	reg := registry(t, e.h)
	if got, want := scrape(t, reg), zeroMetrics(); !maps.Equal(got, want) || len(want) != 40 {
		t.Errorf("metrics of a new Handler = %v, want %v (40 series)", got, want)
	}
	problems, err := testutil.CollectAndLint(e.h)
	if err != nil {
		t.Fatalf("CollectAndLint: %v", err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

// TestCommandOutcomes serves one command per step and checks that exactly
// the step's counter moved.
func TestCommandOutcomes(t *testing.T) {
	t.Parallel()
	e := metricsEnv(t, 3)
	reg := registry(t, e.h)
	a, b, closed := e.client(t, false), e.client(t, true), e.client(t, false)
	closed.c.Close()
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	bg := context.Background()

	type step struct {
		c    *client
		ctx  context.Context
		give []string
		want string // the counter that moves: command/outcome
	}
	run := func(steps []step) {
		t.Helper()
		want := scrape(t, reg)
		for _, tt := range steps {
			reply := tt.c.doCtx(tt.ctx, tt.give...)
			want["lockproxy_commands_total/"+tt.want]++
			got := scrape(t, reg)
			delete(got, "lockproxy_locks_held") // TestLocksHeld covers it
			delete(want, "lockproxy_locks_held")
			if !maps.Equal(got, want) {
				t.Errorf("%q (reply %q): metrics %v, want %v", tt.give, reply, got, want)
				want = got
			}
		}
	}

	run([]step{
		{c: a, ctx: bg, give: []string{"LOCK", "r", "10000", "TOKEN", "t"}, want: "lock/acquired"},
		{c: b, ctx: bg, give: []string{"LOCK", "r", "10000"}, want: "lock/not_acquired"},
		{c: b, ctx: bg, give: []string{"LOCK", "r", "ten"}, want: "lock/bad_request"},
		{c: b, ctx: cancelled, give: []string{"LOCK", "other", "10000"}, want: "lock/error"},
		{c: closed, ctx: bg, give: []string{"LOCK", "other", "10000"}, want: "lock/error"},
		{c: a, ctx: bg, give: []string{"EXTEND", "r", "10000"}, want: "extend/extended"},
		{c: b, ctx: bg, give: []string{"EXTEND", "r", "10000", "t"}, want: "extend/extended"},
		{c: b, ctx: bg, give: []string{"EXTEND", "r", "10000", "not-t"}, want: "extend/not_held"},
		{c: b, ctx: bg, give: []string{"EXTEND", "r", "10000"}, want: "extend/bad_request"}, // no token, not held here
		{c: b, ctx: bg, give: []string{"EXTEND", "r", "0", "t"}, want: "extend/bad_request"},
		{c: a, ctx: cancelled, give: []string{"EXTEND", "r", "10000"}, want: "extend/error"},
		{c: closed, ctx: bg, give: []string{"EXTEND", "r", "10000", "t"}, want: "extend/error"},
		{c: b, ctx: bg, give: []string{"UNLOCK", "r", "not-t"}, want: "unlock/not_held"},
		{c: b, ctx: bg, give: []string{"UNLOCK", "r"}, want: "unlock/bad_request"}, // no token, not held here
		{c: b, ctx: bg, give: []string{"UNLOCK"}, want: "unlock/bad_request"},
		{c: a, ctx: cancelled, give: []string{"UNLOCK", "r"}, want: "unlock/error"},
		{c: closed, ctx: bg, give: []string{"UNLOCK", "r", "t"}, want: "unlock/error"},
		{c: a, ctx: bg, give: []string{"UNLOCK", "r"}, want: "unlock/released"},
		{c: a, ctx: bg, give: []string{"LOCK", "r", "10000", "TOKEN", "t"}, want: "lock/acquired"},
	})
	e.nodes[1].Kill()
	e.nodes[2].Kill()
	run([]step{
		{c: b, ctx: bg, give: []string{"LOCK", "other", "10000"}, want: "lock/noquorum"},
		{c: a, ctx: bg, give: []string{"EXTEND", "r", "10000"}, want: "extend/noquorum"},
		{c: a, ctx: bg, give: []string{"UNLOCK", "r"}, want: "unlock/noquorum"},
	})

	want := Stats{Acquired: 2, NotAcquired: 1, NoQuorum: 3, Released: 1, Extended: 2, Held: 1}
	if got := e.h.Stats(); got != want {
		t.Errorf("Stats() = %+v, want %+v", got, want)
	}
}

func TestKeepAliveMetrics(t *testing.T) {
	t.Parallel()
	e := metricsEnv(t, 3)
	reg := registry(t, e.h)
	a := e.client(t, false)
	a.lock("LOCK", "r", "600", "KEEPALIVE")
	// The extender extends about every 200ms.
	if !eventually(5*time.Second, func() bool { return scrape(t, reg)["lockproxy_keepalive_extensions_total"] >= 3 }) {
		t.Fatalf("keepalive extensions after 5s: %v, want at least 3", scrape(t, reg))
	}
	if got := scrape(t, reg)["lockproxy_keepalive_lost_total"]; got != 0 {
		t.Errorf("keepalive lost = %v while the lock is kept, want 0", got)
	}

	e.onNodes(t, "DEL", keyPrefix+"r")
	if !eventually(2*time.Second, func() bool { return scrape(t, reg)["lockproxy_keepalive_lost_total"] == 1 }) {
		t.Fatalf("keepalive lost after the key was deleted on every node: %v, want 1", scrape(t, reg))
	}
	got := scrape(t, reg)
	// The last extension's validity has not run out yet: only the lost
	// keepalive tells that the lock is gone.
	if got["lockproxy_locks_held"] != 0 {
		t.Errorf("locks held right after the keepalive was lost = %v, want 0", got["lockproxy_locks_held"])
	}
	extensions := got["lockproxy_keepalive_extensions_total"]
	// The extender ends when it gives the lock up: no extension after that.
	ext := a.extender("r")
	if !eventually(2*time.Second, func() bool {
		select {
		case <-ext.done:
			return true
		default:
			return false
		}
	}) {
		t.Fatal("the extender still runs after it lost the keepalive")
	}
	got = scrape(t, reg)
	if got["lockproxy_keepalive_extensions_total"] != extensions || got["lockproxy_keepalive_lost_total"] != 1 {
		t.Errorf("after the keepalive was lost: %v, want %v extensions and 1 lost", got, extensions)
	}
	if s := e.h.Stats(); s.KeepaliveExtensions != uint64(extensions) || s.KeepaliveLost != 1 {
		t.Errorf("Stats() = %+v, want %v keepalive extensions and 1 lost", s, extensions)
	}
}

func TestLocksHeld(t *testing.T) {
	t.Parallel()
	e := metricsEnv(t, 3)
	reg := registry(t, e.h)
	a, b := e.client(t, false), e.client(t, true)
	check := func(what string, want int) {
		t.Helper()
		gauge := scrape(t, reg)["lockproxy_locks_held"]
		if held := e.h.Stats().Held; gauge != float64(want) || held != want {
			t.Errorf("%s: locks_held %v, Stats().Held %d, want %d", what, gauge, held, want)
		}
	}

	check("no locks", 0)
	plain := a.lock("LOCK", "plain", "10000")
	a.lock("LOCK", "kept", "600", "KEEPALIVE") // outlives its first validity (about 450ms)
	a.lock("LOCK", "extended", "1000")         // extended below
	shortStart := time.Now()
	short := a.lock("LOCK", "short", "1000")     // runs out
	b.lock("LOCK", "b", "10000")                 // on another connection
	b.do("LOCK", "plain", "10000")               // null: not recorded
	a.do("LOCK", "nokey", "10000", "WAIT", "-1") // bad request: not recorded
	check("after five LOCKs", 5)

	if v := intReply(t, a.do("EXTEND", "extended", "10000")); v <= 0 {
		t.Fatalf("EXTEND extended 10000 = %d", v)
	}
	// The short lock stops counting when its validity runs out; the kept
	// one has outlived its first validity by then.
	shortUntil := shortStart.Add(time.Duration(short.validity) * time.Millisecond)
	if !eventually(5*time.Second, func() bool { return e.h.Stats().Held == 4 }) {
		t.Fatalf("locks held %d, want 4 once the short lock's validity ran out", e.h.Stats().Held)
	}
	if now := time.Now(); now.Before(shortUntil) {
		t.Fatalf("a lock stopped counting %v before the short lock's validity ran out", shortUntil.Sub(now))
	}
	check("after the short lock's validity ran out", 4)

	// The holder's token on a second connection records the same lock.
	b.lock("LOCK", "plain", "10000", "TOKEN", plain.token)
	check("same lock on two connections", 4)
	if reply := a.do("UNLOCK", "kept"); reply != ":1\r\n" {
		t.Fatalf("UNLOCK kept = %q", reply)
	}
	check("after UNLOCK", 3)
	a.c.Close()
	check("after closing a connection", 2) // b and plain, recorded on b
	if reply := b.do("UNLOCK", "plain"); reply != ":1\r\n" {
		t.Fatalf("UNLOCK plain = %q", reply)
	}
	check("after UNLOCK on the other connection", 1)
	b.c.Close()
	check("every connection closed", 0)
	e.h.mu.Lock()
	defer e.h.mu.Unlock()
	if n := len(e.h.conns); n != 0 {
		t.Errorf("the Handler still tracks %d closed connections", n)
	}
}
