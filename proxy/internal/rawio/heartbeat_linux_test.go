//go:build linux

package rawio

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestHeartbeatPreempts: on one thread, a goroutine woken by data that
// came through rawio, after the process had been idle, and that then
// computes without a pause, is preempted within a few heartbeats: the
// goroutine that measures runs again long before the computation ends.
// Without the heartbeat nothing wakes the scheduler's monitor, which
// preempts, until the computation is over. Each case runs in a process of
// its own (GOMAXPROCS=1), where no other timer or system call is about.
func TestHeartbeatPreempts(t *testing.T) {
	if os.Getenv("RAWIO_SPIN") != "" {
		spin(os.Getenv("RAWIO_SPIN") == "heartbeat")
		return
	}
	run := func(mode string) time.Duration {
		cmd := exec.Command(os.Args[0], "-test.run=^TestHeartbeatPreempts$", "-test.count=1")
		cmd.Env = append(os.Environ(), "RAWIO_SPIN="+mode, "GOMAXPROCS=1")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", mode, err, out)
		}
		for _, line := range strings.Split(string(out), "\n") {
			var ms float64
			if _, err := fmt.Sscanf(line, "stalled %g ms", &ms); err == nil {
				return time.Duration(ms * float64(time.Millisecond))
			}
		}
		t.Fatalf("%s: no result in\n%s", mode, out)
		return 0
	}
	with := run("heartbeat")
	without := run("none")
	t.Logf("measuring goroutine stalled %v with the heartbeat, %v without (computing for %v)", with, without, spinFor)
	if with > 10*HeartbeatPeriod {
		t.Errorf("with the heartbeat, a computing goroutine held the thread %v (heartbeat %v)", with, HeartbeatPeriod)
	}
}

// spinFor is how long the woken goroutine computes.
const spinFor = 1500 * time.Millisecond

// spin is the child process: a goroutine waits for a byte that a shell
// sends after 300 ms, by which time the process has long been idle and
// the monitor asleep, and then computes; the main goroutine, woken by it,
// prints how long it waited for the thread.
func spin(heartbeat bool) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if heartbeat {
		go Heartbeat(ctx, HeartbeatPeriod)
	}
	sh := exec.Command("sh", "-c", "sleep 0.3; printf x")
	out, err := sh.StdoutPipe()
	if err != nil {
		fmt.Println("pipe:", err)
		os.Exit(1)
	}
	if err := sh.Start(); err != nil {
		fmt.Println("sh:", err)
		os.Exit(1)
	}
	r := out.(*os.File)
	woke := make(chan time.Time)
	rc, err := r.SyscallConn()
	if err != nil {
		fmt.Println("pipe:", err)
		os.Exit(1)
	}
	go func() {
		// Parks in the poller, and reads as the proxy does, unseen.
		var buf [1]byte
		rc.Read(func(fd uintptr) bool {
			_, e := Read(fd, buf[:])
			return e != syscall.EAGAIN
		})
		start := time.Now()
		woke <- start
		x := uint64(1)
		for time.Since(start) < spinFor {
			for range 1000 {
				x = x*6364136223846793005 + 1442695040888963407
			}
		}
		sink = x
	}()
	// Nothing runs until the shell writes: no timer, no system call.
	start := <-woke
	fmt.Printf("stalled %g ms\n", float64(time.Since(start))/float64(time.Millisecond))
	sh.Wait()
}

var sink uint64
