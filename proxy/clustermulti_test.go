package proxy

import (
	"strings"
	"testing"

	"github.com/lockproxy/lockproxy/internal/redistest"
)

// TestClusterTransactionOpensWhereItRuns: in front of a cluster a MULTI
// goes with the transaction's first command, to the master that command
// chooses, so that a transaction whose first command has keys leaves what
// it leaves on one Redis: one MULTI in the command stats (Redis's suite,
// "command stats for MULTI"), and MULTI, the commands and EXEC in that
// order in MONITOR ("MONITOR correctly handles multi-exec cases"), with no
// MULTI or DISCARD on another master.
func TestClusterTransactionOpensWhereItRuns(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	addr, _ := startClusterProxy(t, c)
	a := dial(t, addr)
	// A sign-in the masters refuse leaves the client on the proxy's
	// identity, and its MULTI held.
	if got := string(a.do(args("AUTH not-real"))); !strings.HasPrefix(got, "-") {
		t.Fatalf("AUTH not-real: %q", got)
	}
	if got := string(a.do(args("CONFIG RESETSTAT"))); got != "+OK\r\n" {
		t.Fatalf("CONFIG RESETSTAT: %q", got)
	}
	// The first command's key is on another master than slot 0's for at
	// least one of the three transactions.
	for i := range 3 {
		k := "{" + keyOn(i, "tx:") + "}" // the same slot as keyOn's key, and k+"2" too
		got := string(a.do(args("MULTI"), args("SET "+k+" bar"), args("GEOADD "+k+"2 0 0 bar"), args("EXPIRE "+k+"2 0"), args("EXEC")))
		if want := "+OK\r\n+QUEUED\r\n+QUEUED\r\n+QUEUED\r\n*3\r\n+OK\r\n:1\r\n:1\r\n"; got != want {
			t.Fatalf("transaction on %s: %q, want %q", k, got, want)
		}
	}
	stats := string(a.do(args("INFO commandstats")))
	for _, cmd := range []string{"multi", "exec", "set", "geoadd", "expire"} {
		if !strings.Contains(stats, "cmdstat_"+cmd+":calls=3,") {
			t.Errorf("INFO commandstats: want cmdstat_%s:calls=3 in\n%s", cmd, stats)
		}
	}
	if strings.Contains(stats, "cmdstat_discard:") {
		t.Errorf("INFO commandstats: a DISCARD reached a master:\n%s", stats)
	}

	m := dial(t, addr)
	if got := string(m.do(args("MONITOR"))); got != "+OK\r\n" {
		t.Fatalf("MONITOR: %q", got)
	}
	for i := range 3 {
		k := keyOn(i, "mon:")
		a.do(args("MULTI"), args("SET "+k+" bar"), args("EXEC"))
		for _, want := range []string{`"multi"`, `"set" "` + k + `" "bar"`, `"exec"`} {
			if line := strings.ToLower(string(m.read(1))); !strings.Contains(line, want) {
				t.Fatalf("MONITOR line for the transaction on %s: %q, want one with %s", k, line, want)
			}
		}
	}
	// A command Redis refuses while queuing: the transaction opens with
	// it on the slot-0 master, which aborts it at EXEC.
	if got := string(a.do(args("MULTI"), args("SYNTAX error"), args("EXEC"))); !strings.HasPrefix(got, "+OK\r\n-ERR unknown command 'SYNTAX'") ||
		!strings.HasSuffix(got, "-EXECABORT Transaction discarded because of previous errors.\r\n") {
		t.Errorf("transaction with an unknown command: %q", got)
	}
	for _, want := range []string{`"multi"`, `"exec"`} {
		if line := strings.ToLower(string(m.read(1))); !strings.Contains(line, want) {
			t.Fatalf("MONITOR line for the transaction with an unknown command: %q, want one with %s", line, want)
		}
	}
	// A transaction refused before anything reached a master: the MONITOR
	// shows nothing of it.
	if got := string(a.do(args("MULTI"), args("MSET "+keyOn(0, "x:")+" 1 "+keyOn(1, "y:")+" 1"), args("EXEC"))); !strings.HasSuffix(got, "-EXECABORT Transaction discarded because of previous errors.\r\n") {
		t.Errorf("refused transaction: %q", got)
	}
	a.do(args("PING"))
	if line := strings.ToLower(string(m.read(1))); !strings.Contains(line, `"ping"`) {
		t.Errorf("MONITOR after a refused transaction: %q, want the PING", line)
	}
}

// TestClusterMultiAfterOwnSignIn: a client signed in to the masters as a
// user of their own whose ACL refuses MULTI gets the masters' refusal, as
// from one Redis, and its next command runs at once: after an accepted
// AUTH, MULTI is not held.
func TestClusterMultiAfterOwnSignIn(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	for _, n := range c.Nodes {
		if _, err := n.Do("ACL", "SETUSER", "nomulti", "on", ">pw", "~*", "+@all", "-multi"); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, n := range c.Nodes {
			n.Do("ACL", "DELUSER", "nomulti")
		}
	})
	addr, _ := startClusterProxy(t, c)
	a := dial(t, addr)
	if got := string(a.do(args("AUTH nomulti pw"))); got != "+OK\r\n" {
		t.Fatalf("AUTH: %q", got)
	}
	k := keyOn(1, "own:")
	got := string(a.do(args("MULTI"), args("SET "+k+" v"), args("GET "+k)))
	if !strings.HasPrefix(got, "-NOPERM") || !strings.HasSuffix(got, "+OK\r\n$1\r\nv\r\n") {
		t.Errorf("MULTI refused by the user's ACL, then SET and GET: %q, want -NOPERM, +OK, v", got)
	}
}
