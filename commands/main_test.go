package commands

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests when a goroutine outlives them: every
// KEEPALIVE extender must be stopped by its Conn, every Locker closed.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
