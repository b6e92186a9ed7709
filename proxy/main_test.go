package proxy

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests when a goroutine outlives them: every
// session, shared connection reader and local command must end with
// Shutdown or with its client.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
