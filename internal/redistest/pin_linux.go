package redistest

import (
	"fmt"
	"os"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"
)

// PinCPU runs every thread of the server on cpu from now on
// (sched_setaffinity), so that a test knows where Redis runs relative to
// the proxy.
func (s *Server) PinCPU(cpu int) {
	s.tb.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		s.tb.Fatalf("pin %s: not running", s.Addr)
	}
	if err := PinThreads(s.cmd.Process.Pid, cpu); err != nil {
		s.tb.Fatalf("pin %s to CPU %d: %v", s.Addr, cpu, err)
	}
}

// PinThreads sets the CPU affinity of every thread of process pid to
// cpu alone, or to every CPU when cpu is negative.
func PinThreads(pid, cpu int) error {
	var set unix.CPUSet
	if cpu < 0 {
		for i := range runtime.NumCPU() {
			set.Set(i)
		}
	} else {
		set.Set(cpu)
	}
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return err
	}
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		if err := unix.SchedSetaffinity(tid, &set); err != nil && err != unix.ESRCH {
			return err
		}
	}
	return nil
}
