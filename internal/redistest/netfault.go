package redistest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// Blackhole drops, with iptables, every TCP packet to and from addr (an
// ip:port on the loopback network that the test's own server listens on),
// in both directions and without any reply: established connections hang
// and TCP retransmits what was sent once heal removes the rules. Giving
// each client its own loopback address of a server (StartBound, AddrOn)
// makes the cut one client's path only.
//
// Every rule carries a comment that starts with a tag unique to the test
// (its binary and name), and is deleted by that comment on every exit path
// (heal, and the test's cleanup); rules of the same tag left by an earlier
// run that was killed are deleted when the test first calls Blackhole.
// Rules never name a chain as a whole. When iptables is missing it is
// installed with apt-get; if that fails, the test fails.
func Blackhole(tb testing.TB, addr string) (heal func()) {
	tb.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		tb.Fatalf("blackhole %q: %v", addr, err)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		tb.Fatalf("blackhole %q: only loopback addresses", addr)
	}
	if err := install("iptables", "iptables"); err != nil {
		tb.Fatalf("iptables is missing and could not be installed: %v", err)
	}
	prefix := testTag(tb)
	firewallMu.Lock()
	if !firewallTests[prefix] {
		firewallTests[prefix] = true
		firewallMu.Unlock()
		if err := deleteRules(prefix); err != nil {
			tb.Fatalf("blackhole: remove leftover rules: %v", err)
		}
		tb.Cleanup(func() {
			if err := deleteRules(prefix); err != nil {
				tb.Errorf("blackhole: remove rules: %v", err)
			}
			firewallMu.Lock()
			delete(firewallTests, prefix)
			firewallMu.Unlock()
		})
	} else {
		firewallMu.Unlock()
	}
	tag := fmt.Sprintf("%s%d.", prefix, ruleSeq.Add(1)) // the dot ends it: rule 1 is no prefix of rule 10
	for _, match := range [][]string{{"-d", host, "--dport", port}, {"-s", host, "--sport", port}} {
		args := append([]string{"-w", "-I", "INPUT", "-p", "tcp"}, match...)
		args = append(args, "-m", "comment", "--comment", tag, "-j", "DROP")
		if out, err := exec.Command("iptables", args...).CombinedOutput(); err != nil {
			deleteRules(tag)
			tb.Fatalf("iptables %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			if err := deleteRules(tag); err != nil {
				tb.Errorf("heal %s: %v", addr, err)
			}
		})
	}
}

var (
	firewallMu    sync.Mutex
	firewallTests = map[string]bool{} // tags whose cleanup is registered
	ruleSeq       atomic.Int64
)

// testTag returns the comment prefix of tb's rules: the test binary and the
// test's name, so that concurrent test binaries never touch each other's
// rules.
func testTag(tb testing.TB) string {
	name := filepath.Base(os.Args[0]) + "/" + tb.Name()
	var b strings.Builder
	b.WriteString("redistest:")
	for _, r := range name {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '-', r == '_':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	b.WriteByte(':')
	s := b.String()
	if len(s) > 200 { // iptables comments hold 256 bytes
		s = s[len(s)-200:]
	}
	return s
}

// deleteRules deletes every INPUT rule whose comment starts with prefix.
func deleteRules(prefix string) error {
	firewallMu.Lock() // one iptables listing and deletion at a time
	defer firewallMu.Unlock()
	out, err := exec.Command("iptables", "-w", "-S", "INPUT").CombinedOutput()
	if err != nil {
		return fmt.Errorf("iptables -S INPUT: %v: %s", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || f[0] != "-A" || !hasComment(f, prefix) {
			continue
		}
		args := []string{"-w", "-D"}
		for _, a := range f[1:] {
			args = append(args, strings.Trim(a, `"`)) // iptables -S quotes comments; tags have no spaces
		}
		if out, err := exec.Command("iptables", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("iptables %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	return nil
}

// hasComment reports whether the rule f (iptables -S fields) has a comment
// that starts with prefix.
func hasComment(f []string, prefix string) bool {
	for i := 0; i+1 < len(f); i++ {
		if f[i] == "--comment" && strings.HasPrefix(strings.Trim(f[i+1], `"`), prefix) {
			return true
		}
	}
	return false
}
