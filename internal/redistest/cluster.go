package redistest

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// Cluster is a Redis Cluster of redis-server processes on loopback: masters
// with replicas, created with redis-cli --cluster create. Every process is
// stopped by the test's cleanup.
type Cluster struct {
	// Nodes are all the servers, the masters first as created (before any
	// failover): Nodes[i] for i < Masters served the i-th third of the
	// slots.
	Nodes   []*Server
	Masters int
	tb      testing.TB
}

// StartCluster starts masters*(1+replicas) nodes with cluster mode on (and
// a cluster-node-timeout of one second, so a failover takes about two),
// creates the cluster and waits until every node reports cluster_state:ok
// and knows every other node.
func StartCluster(tb testing.TB, masters, replicas int) *Cluster {
	tb.Helper()
	n := masters * (1 + replicas)
	c := &Cluster{Masters: masters, tb: tb}
	addrs := make([]string, n)
	for i := range n {
		s := Start(tb, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "1000", "--cluster-replica-validity-factor", "0")
		c.Nodes = append(c.Nodes, s)
		addrs[i] = s.Addr
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", fmt.Sprint(replicas), "--cluster-yes")
	if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
		tb.Fatalf("redis-cli --cluster create: %v: %s", err, lastLines(string(out), 5))
	}
	c.WaitOK(n, 20*time.Second)
	return c
}

// WaitOK waits until every running node reports cluster_state:ok and
// knows of want nodes, and every replica is in sync with its master, or
// fails the test after d.
func (c *Cluster) WaitOK(want int, d time.Duration) {
	c.tb.Helper()
	deadline := time.Now().Add(d)
	for {
		bad := ""
		for _, s := range c.Nodes {
			if !s.running() {
				continue
			}
			info, err := s.DoAll("CLUSTER", "INFO")
			if err != nil || !strings.Contains(info, "cluster_state:ok") {
				bad = fmt.Sprintf("%s: %q %v", s.Addr, firstLine(info), err)
				break
			}
			if !hasLine(info, fmt.Sprintf("cluster_known_nodes:%d", want)) {
				bad = fmt.Sprintf("%s does not know %d nodes yet", s.Addr, want)
				break
			}
			// A replica has finished its first synchronisation.
			repl, err := s.DoAll("INFO", "replication")
			if err != nil || hasLine(repl, "role:slave") && !hasLine(repl, "master_link_status:up") {
				bad = fmt.Sprintf("%s: replica not in sync yet", s.Addr)
				break
			}
		}
		if bad == "" {
			return
		}
		if time.Now().After(deadline) {
			c.tb.Fatalf("cluster not ready after %v: %s", d, bad)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Seeds returns every node's address.
func (c *Cluster) Seeds() []string {
	var out []string
	for _, s := range c.Nodes {
		out = append(out, s.Addr)
	}
	return out
}

// hasLine reports whether one of text's lines is line.
func hasLine(text, line string) bool {
	for _, l := range strings.Split(text, "\n") {
		if strings.TrimSpace(l) == line {
			return true
		}
	}
	return false
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

func (s *Server) running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cmd != nil
}

// DoAll sends one command with redis-cli and returns its whole output, for
// replies of several lines (CLUSTER INFO, CLUSTER NODES).
func (s *Server) DoAll(args ...string) (string, error) {
	full := append([]string{"-h", "127.0.0.1", "-p", fmt.Sprint(s.Port())}, args...)
	cmd := exec.Command("redis-cli", full...)
	out, err := cmd.Output()
	return string(out), err
}
