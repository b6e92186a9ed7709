package proxy

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests when a goroutine outlives them: every
// session, shared connection reader and local command must end with
// Shutdown or with its client. go-redis's pool (the Sentinel clients')
// probes a server that refused a dial once a second on a goroutine of its
// own, which ends at the first probe after the client's Close.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"))
}
