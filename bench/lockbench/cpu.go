package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// CPU accounting: where a run's CPU time goes. On a machine whose CPUs the
// run keeps busy, pairs per second are bounded by the CPUs divided by the
// CPU time of one pair summed over every process on its path: this
// benchmark's own clients (which, for redsync, do all of Redlock's work),
// the proxy, and the lock nodes. Comparing those sums says how far a
// throughput ratio can go before the machine, not the design, is the
// limit.

// userHz is the unit of the times in /proc/PID/stat and /proc/stat (USER_HZ,
// 100 on every Linux architecture).
const userHz = 100

// cpuSample is the CPU time used so far, in ticks of 1/userHz s: by this
// process, the proxy, the lock nodes together, and the whole machine (busy
// and all, summed over its CPUs).
type cpuSample struct {
	self, proxy, nodes int64
	busy, total        int64
}

// measured reports whether s is a difference taken around a run: every
// run keeps the machine's CPUs counting.
func (s cpuSample) measured() bool { return s.total > 0 }

// sampleCPU reads the counters of this process, the proxy (pid 0: none)
// and the nodes.
func sampleCPU(proxyPid int, nodePids []int) (cpuSample, error) {
	var s cpuSample
	var err error
	if s.self, err = procTicks("self"); err != nil {
		return s, err
	}
	if proxyPid > 0 {
		if s.proxy, err = procTicks(strconv.Itoa(proxyPid)); err != nil {
			return s, err
		}
	}
	for _, p := range nodePids {
		t, err := procTicks(strconv.Itoa(p))
		if err != nil {
			return s, err
		}
		s.nodes += t
	}
	s.busy, s.total, err = machineTicks()
	return s, err
}

// busyPercent is how busy the machine's CPUs were, in percent of all of
// them, 0 when s measured nothing.
func (s cpuSample) busyPercent() float64 {
	if s.total == 0 {
		return 0
	}
	return 100 * float64(s.busy) / float64(s.total)
}

func (s cpuSample) sub(before cpuSample) cpuSample {
	return cpuSample{
		self:  s.self - before.self,
		proxy: s.proxy - before.proxy,
		nodes: s.nodes - before.nodes,
		busy:  s.busy - before.busy,
		total: s.total - before.total,
	}
}

// procTicks returns the user plus system time of process pid ("self" for
// this one), all its threads.
func procTicks(pid string) (int64, error) {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return 0, err
	}
	return statTicks(pid, string(b))
}

// statTicks returns utime plus stime from s, the text of /proc/pid/stat.
func statTicks(pid, s string) (int64, error) {
	// The name, field 2, is in parentheses and may hold spaces: count the
	// fields after its closing one. utime and stime are fields 14 and 15.
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%s/stat: no command name", pid)
	}
	f := strings.Fields(s[i+1:]) // f[0] is field 3
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%s/stat: %d fields", pid, len(f)+2)
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	k, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%s/stat: utime %q, stime %q", pid, f[11], f[12])
	}
	return u + k, nil
}

// machineTicks returns the busy and the total time of all CPUs from the
// first line of /proc/stat. Busy is everything but idle and iowait; guest
// time is part of user time already.
func machineTicks() (busy, total int64, err error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0, 0, fmt.Errorf("/proc/stat: unexpected first line %q", line)
	}
	for i := 1; i <= 8; i++ { // user nice system idle iowait irq softirq steal
		v, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("/proc/stat: %w", err)
		}
		total += v
		if i != 4 && i != 5 {
			busy += v
		}
	}
	return busy, total, nil
}

// usPer returns ticks as microseconds per operation of r.
func usPer(ticks int64, r result) float64 {
	if r.ops == 0 {
		return 0
	}
	return float64(ticks) * 1e6 / userHz / float64(r.ops)
}

// parsePids parses a comma-separated list of process ids.
func parsePids(s string) ([]int, error) {
	var pids []int
	for _, f := range strings.Split(s, ",") {
		if f == "" {
			continue
		}
		p, err := strconv.Atoi(f)
		if err != nil || p <= 0 {
			return nil, fmt.Errorf("bad process id %q", f)
		}
		pids = append(pids, p)
	}
	return pids, nil
}
