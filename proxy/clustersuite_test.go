package proxy

import (
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/internal/redistest"
)

// The tests of this file follow Redis's own test suite run in its
// cluster-compatible mode through the proxy in front of a cluster
// (compat/run.sh -c): each checks a behaviour of one Redis the suite
// found missing there.

// TestClusterBusyScript checks that a script running past
// busy-reply-threshold stalls no other client: they get Redis's BUSY, and
// SCRIPT KILL and FUNCTION KILL reach the master running it and end it.
func TestClusterBusyScript(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	// One shared connection per master, as on a host of 2 CPUs
	// (shared_connections: auto): both clients' commands share it.
	addr, _ := startProxy(t, "", func(cfg *Config) {
		cfg.Backend.Cluster = c.Seeds()
		cfg.Backend.SharedConnections = 1
	})
	ctl := dial(t, addr)
	if got := string(ctl.do(args("CONFIG SET busy-reply-threshold 10"))); got != "+OK\r\n" {
		t.Fatalf("CONFIG SET: %q", got)
	}
	t.Cleanup(func() {
		for _, n := range c.Nodes {
			n.Do("CONFIG", "SET", "busy-reply-threshold", "5000")
		}
	})
	lib := "#!lua name=busylib\nredis.register_function{function_name='busy', callback=function() while true do end end, flags={'no-writes'}}"
	if got := string(ctl.do([]string{"FUNCTION", "LOAD", "REPLACE", lib})); got != "$7\r\nbusylib\r\n" {
		t.Fatalf("FUNCTION LOAD: %q", got)
	}
	loop := "while true do end"
	for _, tc := range []struct {
		run          []string
		kill, killed string
	}{
		{[]string{"EVAL", loop, "0"}, "SCRIPT KILL", "-ERR Script killed by user with SCRIPT KILL"},
		{[]string{"EVAL_RO", loop, "0"}, "SCRIPT KILL", "-ERR Script killed by user with SCRIPT KILL"},
		{[]string{"FCALL", "busy", "0"}, "FUNCTION KILL", "-ERR Script killed by user with SCRIPT KILL"},
		{[]string{"FCALL_RO", "busy", "0"}, "FUNCTION KILL", "-ERR Script killed by user with SCRIPT KILL"},
	} {
		t.Run(tc.run[0], func(t *testing.T) {
			t.Cleanup(func() {
				for _, n := range c.Nodes {
					n.Do("SCRIPT", "KILL")
					n.Do("FUNCTION", "KILL")
				}
			})
			busy, other := dial(t, addr), dial(t, addr)
			// Both clients use the shared connections first.
			busy.do(args("PING"))
			other.do(args("PING"))
			busy.send(encode(tc.run))
			deadline := time.Now().Add(5 * time.Second)
			for {
				time.Sleep(50 * time.Millisecond)
				other.send(encode(args("PING")))
				got, err := other.tryRead(1, 3*time.Second)
				if err != nil {
					t.Fatalf("PING while a script runs: %v (got %q)", err, got)
				}
				if strings.HasPrefix(string(got), "-BUSY ") {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("PING while a script runs: %q, want BUSY", got)
				}
			}
			if got := string(other.do(args(tc.kill))); got != "+OK\r\n" {
				t.Fatalf("%s: %q", tc.kill, got)
			}
			got, err := busy.tryRead(1, 5*time.Second)
			if err != nil || !strings.HasPrefix(string(got), tc.killed) {
				t.Fatalf("the script's reply: %q, %v; want %s...", got, err, tc.killed)
			}
			if got := string(other.do(args("PING"))); got != "+PONG\r\n" {
				t.Fatalf("PING after the kill: %q", got)
			}
			if got := string(other.do(args(tc.kill))); !strings.HasPrefix(got, "-NOTBUSY") {
				t.Fatalf("%s with nothing running: %q", tc.kill, got)
			}
		})
	}
}
