package redistest

import (
	"bytes"
	_ "embed"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// clockShim is a shared library that shifts the wall clock of the process
// it is preloaded into (see testdata/clockshim.c). libfaketime would do
// more, but it clashes with Debian's redis-server, which is built with
// jemalloc.
//
//go:embed testdata/clockshim.c
var clockShim string

// buildShim compiles the clock shim with gcc into a temporary directory of
// the test, which also holds the offset file, and returns the library's
// path. gcc takes about a tenth of a second.
func buildShim(tb testing.TB) string {
	tb.Helper()
	if err := install("gcc", "gcc"); err != nil {
		tb.Fatalf("gcc is missing and could not be installed: %v", err)
	}
	dir := tb.TempDir()
	src := filepath.Join(dir, "clockshim.c")
	so := filepath.Join(dir, "clockshim.so")
	if err := os.WriteFile(src, []byte(clockShim), 0o600); err != nil {
		tb.Fatalf("clock shim: %v", err)
	}
	out, err := exec.Command("gcc", "-shared", "-fPIC", "-O2", "-o", so, src, "-ldl").CombinedOutput()
	if err != nil {
		tb.Fatalf("clock shim: gcc: %v: %s", err, out)
	}
	return so
}

// StartWithClock is Start for a server whose wall clock the test can
// shift with ShiftClock: a small library preloaded into redis-server
// (LD_PRELOAD) adds an offset to CLOCK_REALTIME, gettimeofday and time,
// which is what TIME reports and what key expiry follows. The monotonic
// clock is left alone. The offset starts at 0 and survives restarts.
func StartWithClock(tb testing.TB, extra ...string) *Server {
	tb.Helper()
	if err := install("redis-server", "redis-server"); err != nil {
		tb.Fatalf("redis-server is missing and could not be installed: %v", err)
	}
	so := buildShim(tb)
	s := &Server{tb: tb, dir: tb.TempDir(), args: extra, bin: "redis-server"}
	s.skew = filepath.Join(filepath.Dir(so), "offset")
	if err := os.WriteFile(s.skew, []byte("0\n"), 0o600); err != nil {
		tb.Fatalf("clock shim: %v", err)
	}
	s.env = []string{"LD_PRELOAD=" + so, "CLOCKSHIM_FILE=" + s.skew}
	s.launch(nil)
	return s
}

// ShiftClock moves the server's wall clock by d from where it is now
// (forward when d is positive), at once, as a clock step of NTP or an
// operator would. The server sees the new offset within a millisecond;
// ShiftClock returns after that. Only servers started with StartWithClock
// have a clock to shift.
func (s *Server) ShiftClock(d time.Duration) {
	s.tb.Helper()
	if s.skew == "" {
		s.tb.Fatalf("ShiftClock on %s: not started with StartWithClock", s.Addr)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	b, err := os.ReadFile(s.skew)
	if err != nil {
		s.tb.Fatalf("ShiftClock on %s: %v", s.Addr, err)
	}
	cur, err := strconv.ParseInt(string(bytes.TrimSpace(b)), 10, 64)
	if err != nil {
		s.tb.Fatalf("ShiftClock on %s: offset file %q: %v", s.Addr, b, err)
	}
	// Written whole and renamed into place: the shim never reads half.
	tmp := s.skew + ".tmp"
	err = os.WriteFile(tmp, fmt.Appendf(nil, "%d\n", cur+d.Milliseconds()), 0o600)
	if err == nil {
		err = os.Rename(tmp, s.skew)
	}
	if err != nil {
		s.tb.Fatalf("ShiftClock on %s: %v", s.Addr, err)
	}
	time.Sleep(2 * time.Millisecond) // the shim reads the file at most once a millisecond
}
