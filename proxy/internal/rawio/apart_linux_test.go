package rawio

import (
	"runtime"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// onCPU runs f on a thread of its own pinned to cpu.
func onCPU(t *testing.T, cpu int, f func()) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // the thread ends with the goroutine: its affinity goes with it
		var set unix.CPUSet
		set.Set(cpu)
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			done <- err
			return
		}
		f()
		done <- nil
	}()
	if err := <-done; err != nil {
		t.Fatalf("pin to CPU %d: %v", cpu, err)
	}
}

// TestApart: the bytes that came on a loopback socket were sent from
// another CPU than the reader's exactly when the writer ran on another
// CPU. It needs two CPUs, as the test suite's machine has.
func TestApart(t *testing.T) {
	if runtime.NumCPU() < 2 {
		t.Fatalf("TestApart needs 2 CPUs, this machine has %d", runtime.NumCPU())
	}
	a, b, _, _ := tcpPair(t)
	rb, _ := b.(syscall.Conn).SyscallConn()
	for _, tc := range []struct {
		writer int
		want   bool
	}{{0, false}, {1, true}, {0, false}} {
		onCPU(t, tc.writer, func() {
			if _, err := a.Write([]byte("x")); err != nil {
				t.Error(err)
			}
		})
		onCPU(t, 0, func() {
			if _, err := b.Read(make([]byte, 1)); err != nil {
				t.Error(err)
			}
			var apart, ok bool
			rb.Control(func(fd uintptr) { apart, ok = Apart(fd) })
			if !ok || apart != tc.want {
				t.Errorf("written on CPU %d, read on CPU 0: apart %v (ok %v), want %v", tc.writer, apart, ok, tc.want)
			}
		})
	}
}
