package redistest

import (
	"os/exec"
	"testing"
)

// Chromium returns the path of Debian's headless-capable chromium,
// installing the package when it is missing and the tests run as root (as
// redis-server is). It fails the test when there is none.
func Chromium(tb testing.TB) string {
	tb.Helper()
	if err := install("chromium", "chromium"); err != nil {
		tb.Fatalf("chromium: %v", err)
	}
	path, err := exec.LookPath("chromium")
	if err != nil {
		tb.Fatalf("chromium: %v", err)
	}
	return path
}

// ChromiumFlags are the command-line flags a test's headless chromium
// needs here (as root, without a GPU, without talking to anything but the
// page), besides a fresh --user-data-dir.
var ChromiumFlags = []string{
	"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
	"--disable-background-networking", "--disable-component-update", "--disable-sync",
}
