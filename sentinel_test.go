package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/internal/redistest"
)

// TestSentinelObservability: backend.sentinel through the whole program:
// the primary in INFO lockproxy and /metrics, /readyz false for a master
// the Sentinels do not know, and a warning in /readyz while no Sentinel
// answers, with the last known primary still in use.
func TestSentinelObservability(t *testing.T) {
	g := redistest.StartGroup(t, "mymaster", 0, 1)
	_, nodes := startNodes(t, 1)
	metricsAddr := unusedAddr(t)
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + metricsAddr + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	eventually := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("waited 10s for %s", what)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	// A master name the Sentinels do not know: no primary, not ready.
	unknown := fmt.Sprintf("metrics: {listen: %q}\nbackend:\n  sentinel: {master_name: nosuch, addrs: [%s]}\n", metricsAddr, g.Sentinels[0].Addr)
	startApp(t, unknown, "-lock-nodes", nodes)
	eventually("/readyz says no primary", func() bool {
		code, body := get("/readyz")
		return code == 503 && strings.Contains(body, `backend unavailable: no primary known for master "nosuch"`)
	})

	metricsAddr = unusedAddr(t)
	cfg := fmt.Sprintf("metrics: {listen: %q}\nbackend:\n  sentinel: {master_name: mymaster, addrs: [%s]}\n", metricsAddr, g.Sentinels[0].Addr)
	addr := startApp(t, cfg, "-lock-nodes", nodes)
	c := newClient(t, addr, 2)
	ctx := context.Background()
	eventually("a write through the proxy", func() bool { return c.Set(ctx, "k", "v", 0).Err() == nil })
	info, err := c.Info(ctx, "lockproxy").Result()
	for _, want := range []string{"backend_primary:" + g.Primary.Addr + "\r\n", "backend_failovers:0\r\n", "backend_sentinels:1\r\n", "backend_sentinels_answering:1\r\n"} {
		if err != nil || !strings.Contains(info, want) {
			t.Errorf("INFO lockproxy lacks %q: %q %v", want, info, err)
		}
	}
	code, body := get("/metrics")
	for _, want := range []string{
		`lockproxy_backend_primary{addr="` + g.Primary.Addr + `"} 1`,
		`lockproxy_backend_failovers_total 0`,
		`lockproxy_backend_sentinels_answering 1`,
	} {
		if code != 200 || !strings.Contains(body, want) {
			t.Errorf("/metrics (%d) lacks %q", code, want)
		}
	}
	if code, body := get("/readyz"); code != 200 || body != "ready\n" {
		t.Errorf("/readyz: %d %q", code, body)
	}

	g.Sentinels[0].Kill()
	eventually("/readyz warns of the silent Sentinels", func() bool {
		code, body := get("/readyz")
		return code == 200 && strings.Contains(body, "warning: no Sentinel has answered since") &&
			strings.Contains(body, "forwarding to the last known primary "+g.Primary.Addr)
	})
	if err := c.Set(ctx, "k", "v2", 0).Err(); err != nil {
		t.Errorf("SET with the Sentinels down: %v", err)
	}
}
