package proxy

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/internal/redistest"
)

// readUntil reads replies from c until one contains want, and returns all
// of them.
func readUntil(t *testing.T, c *client, want string) string {
	t.Helper()
	var all bytes.Buffer
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		b, err := c.tryRead(1, time.Until(deadline))
		all.Write(b)
		if err != nil {
			break
		}
		if strings.Contains(string(b), want) {
			return all.String()
		}
	}
	t.Fatalf("no %q in %q", want, all.String())
	return ""
}

// TestClusterMonitor runs MONITOR through the proxy in front of 3
// masters: it shows every master's commands, and a monitoring client is
// answered as one Redis answers it.
func TestClusterMonitor(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	srv := redistest.Start(t)
	addr, _ := startClusterProxy(t, c)
	keys := []string{keyOn(0, "mon"), keyOn(1, "mon"), keyOn(2, "mon")}

	// What one Redis answers a monitoring client, without the lines.
	compareCluster(t, srv, c, addr, []step{send("a", "MULTI", "MONITOR", "EXEC", "MONITOR")})

	m, a := dial(t, addr), dial(t, addr)
	if got := string(m.do(args("MONITOR"))); got != "+OK\r\n" {
		t.Fatalf("MONITOR: %q", got)
	}
	for _, k := range keys {
		a.do(args("SET " + k + " v"))
	}
	seen := ""
	for _, k := range keys {
		if !strings.Contains(seen, k) {
			seen += readUntil(t, m, `"SET" "`+k+`" "v"`)
		}
	}
	line := regexp.MustCompile(`^\+\d+\.\d+ \[0 127\.0\.0\.1:\d+\] "SET" "mon\d+" "v"\r\n$`)
	for l := range strings.SplitSeq(seen, "\r\n") {
		if l != "" && strings.Contains(l, `"SET"`) && !line.MatchString(l+"\r\n") {
			t.Errorf("MONITOR line %q", l)
		}
	}
	// A second MONITOR is ignored; a command on the keyspace is refused;
	// RESET ends it, and nothing follows.
	m.send(encode(args("MONITOR"), args("GET "+keys[1]), args("PING")))
	readUntil(t, m, "-ERR Replica can't interact with the keyspace\r\n")
	readUntil(t, m, "+PONG\r\n")
	m.send(encode(args("RESET")))
	readUntil(t, m, "+RESET\r\n")
	a.do(args("SET " + keys[2] + " w"))
	if got := string(m.do(args("GET " + keys[2]))); got != "$1\r\nw\r\n" {
		t.Errorf("after RESET: %q", got)
	}
	// A master lost disconnects a monitoring client, as one Redis lost does.
	m2 := dial(t, addr)
	m2.do(args("MONITOR"))
	c.Nodes[1].Kill()
	if _, closed := m2.closedAfter(5 * time.Second); !closed {
		t.Errorf("monitoring client not disconnected when a master died")
	}
}
