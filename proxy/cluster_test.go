package proxy

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/lockproxy/lockproxy/internal/redistest"
)

// startClusterProxy serves a proxy in front of c.
func startClusterProxy(t testing.TB, c *redistest.Cluster) (string, *Proxy) {
	t.Helper()
	return startProxy(t, "", func(cfg *Config) { cfg.Backend.Cluster = c.Seeds()[:2] })
}

// flushCluster empties every master.
func flushCluster(t *testing.T, c *redistest.Cluster) {
	t.Helper()
	for _, s := range c.Nodes {
		s.Do("FLUSHALL") // replicas refuse it; their masters' flush reaches them
	}
}

// compareCluster plays steps against one standalone Redis and through the
// proxy in front of the cluster, and requires the same bytes.
func compareCluster(t *testing.T, srv *redistest.Server, c *redistest.Cluster, addr string, steps []step) {
	t.Helper()
	mustFlush(t, srv)
	want := mask(run(t, srv, srv.Addr, steps))
	flushCluster(t, c)
	got := mask(run(t, srv, addr, steps))
	if !bytes.Equal(got, want) {
		t.Errorf("replies differ\nthrough proxy: %q\ndirect:        %q", trunc(got), trunc(want))
		for i := range min(len(got), len(want)) {
			if got[i] != want[i] {
				t.Errorf("first difference at byte %d: proxy %q, direct %q", i,
					trunc(got[max(0, i-60):min(len(got), i+80)]), trunc(want[max(0, i-60):min(len(want), i+80)]))
				break
			}
		}
	}
}

// TestCluster runs the forwarding sessions through a proxy in front of a
// cluster of 3 masters with a replica each, with keys on every master,
// and compares them byte for byte with one standalone Redis.
func TestCluster(t *testing.T) {
	c := redistest.StartCluster(t, 3, 1)
	srv := redistest.Start(t)
	addr, _ := startClusterProxy(t, c)

	pipeline := make([]string, 0, 1000)
	for i := range 500 {
		pipeline = append(pipeline, fmt.Sprintf("SET key:%d %d", i, i), fmt.Sprintf("GET key:%d", i))
	}
	t.Run("strings", func(t *testing.T) {
		compareCluster(t, srv, c, addr, []step{send("a",
			"SET s hello", "GET s", "GET missing", "APPEND s world", "GETRANGE s 0 3",
			"INCR n", "INCRBY n 41", "INCRBYFLOAT f 1.5", "MGET s missing n", "SETNX s x",
			"SET s v GET", "GETDEL s", "STRLEN n", "SET e 1 PX 100000 NX", "TTL e", "TYPE n")})
	})
	t.Run("pipeline of 1000", func(t *testing.T) {
		compareCluster(t, srv, c, addr, []step{send("a", pipeline...)})
	})
	_ = strings.Repeat
}
