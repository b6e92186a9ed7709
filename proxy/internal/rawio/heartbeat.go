package rawio

import (
	"context"
	"time"
)

// HeartbeatPeriod is how long at most the scheduler's monitor sleeps
// while the proxy runs (Heartbeat).
const HeartbeatPeriod = 20 * time.Millisecond

// Heartbeat keeps the Go scheduler's monitor from sleeping longer than
// period, until ctx ends. The system calls made here do not wake it (see
// the package comment). Once it went to sleep with every thread idle,
// only a timer, a garbage collection or a system call of the scheduler's
// would wake it, and a goroutine that then computes for long on the
// proxy's one thread (gomaxprocs) would not be preempted: the monitor
// preempts. It sleeps until the next timer at most, so a ticker bounds
// its sleep, at the cost of a wake-up per period.
func Heartbeat(ctx context.Context, period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
