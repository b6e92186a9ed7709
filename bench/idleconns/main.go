// Command idleconns measures what idle client connections cost lockproxy in
// resident memory.
//
// It reads the proxy's VmRSS from /proc/<pid>/status three times:
//
//  1. before connecting (baseline);
//  2. "connected only": after -n connections are open and the proxy has
//     accepted them all (its open file count went up by n), nothing sent;
//  3. "after one PING": after each connection sent PING and read +PONG. The
//     proxy opens a client's backend connection lazily, on the first
//     forwarded command, so this is the cost of a client that has been used
//     once and then sits idle.
//
// Each connection's cost is (RSS - baseline) / connections. The proxy can
// only hold as many sockets as its RLIMIT_NOFILE allows: when n clients plus
// one backend connection each would not fit, the PING phase uses as many
// clients as fit and says so; the total for n pinged clients is then
// extrapolated from the measured cost per connection.
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "idleconns:", err)
		os.Exit(1)
	}
}

func run(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("idleconns", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:6380", "lockproxy address")
	pid := fs.Int("pid", 0, "lockproxy process id (to read /proc/<pid>/status)")
	n := fs.Int("n", 10000, "idle client connections")
	settle := fs.Duration("settle", time.Second, "pause before each RSS reading")
	parallel := fs.Int("parallel", 64, "connections dialled or pinged at once")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *pid <= 0 {
		return errors.New("-pid is required")
	}
	if err := raiseNoFile(uint64(*n) + 256); err != nil {
		return err
	}

	time.Sleep(*settle)
	base, err := rss(*pid)
	if err != nil {
		return err
	}
	fdBase, err := openFiles(*pid)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "idleconns: baseline RSS %.1f MB, %d open files\n", mb(base), fdBase)

	conns := make([]net.Conn, *n)
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
	}()
	if err := each(*n, *parallel, func(i int) error {
		c, err := net.DialTimeout("tcp", *addr, 10*time.Second)
		conns[i] = c
		return err
	}); err != nil {
		return fmt.Errorf("dial: %w", err)
	}
	// The kernel completes the handshake before the proxy accepts; wait
	// until the proxy holds a socket for every client.
	deadline := time.Now().Add(30 * time.Second)
	for {
		fd, err := openFiles(*pid)
		if err != nil {
			return err
		}
		if fd >= fdBase+*n {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("proxy accepted only %d of %d connections", fd-fdBase, *n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(*settle)
	connected, err := rss(*pid)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "idleconns: %d connected: RSS %.1f MB\n", *n, mb(connected))

	// Every pinged client adds a backend socket to the proxy.
	limit, err := noFileLimit(*pid)
	if err != nil {
		return err
	}
	fdNow, err := openFiles(*pid)
	if err != nil {
		return err
	}
	m := min(*n, limit-fdNow-64)
	if m < 1 {
		return fmt.Errorf("the proxy's open file limit (%d) leaves no room for backend connections", limit)
	}
	if err := each(m, *parallel, func(i int) error {
		c := conns[i]
		c.SetDeadline(time.Now().Add(10 * time.Second))
		defer c.SetDeadline(time.Time{})
		if _, err := c.Write([]byte("*1\r\n$4\r\nPING\r\n")); err != nil {
			return err
		}
		line, err := bufio.NewReaderSize(c, 16).ReadString('\n')
		if err != nil {
			return err
		}
		if line != "+PONG\r\n" {
			return fmt.Errorf("PING answered %q", line)
		}
		return nil
	}); err != nil {
		return fmt.Errorf("PING: %w", err)
	}
	time.Sleep(*settle)
	pinged, err := rss(*pid)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "idleconns: %d pinged: RSS %.1f MB\n", m, mb(pinged))

	perConnected := float64(connected-base) / float64(*n)
	perPinged := perConnected + float64(pinged-connected)/float64(m)
	fmt.Fprintf(out, "\n#### Memory: %d idle client connections (lockproxy VmRSS)\n\n", *n)
	fmt.Fprintln(out, "| state | clients | proxy RSS total | RSS above baseline | bytes per idle connection |")
	fmt.Fprintln(out, "|---|---|---|---|---|")
	fmt.Fprintf(out, "| baseline (no clients) | 0 | %.1f MB | | |\n", mb(base))
	fmt.Fprintf(out, "| connected only | %d | %.1f MB | %.1f MB | %.0f |\n", *n, mb(connected), mb(connected-base), perConnected)
	if m == *n {
		fmt.Fprintf(out, "| after one PING each | %d | **%.1f MB** | %.1f MB | **%.0f** |\n", *n, mb(pinged), mb(pinged-base), perPinged)
	} else {
		fmt.Fprintf(out, "| after one PING on %d of them (fd limit %d) | %d | %.1f MB | %.1f MB | **%.0f** |\n",
			m, limit, *n, mb(pinged), mb(pinged-base), perPinged)
		fmt.Fprintf(out, "| after one PING each, extrapolated | %d | **%.1f MB** | %.1f MB | %.0f |\n",
			*n, mb(base)+mb(int64(perPinged*float64(*n))), mb(int64(perPinged*float64(*n))), perPinged)
	}
	return nil
}

// each runs f(0..n-1) on at most parallel goroutines and returns the first
// error.
func each(n, parallel int, f func(i int) error) error {
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	next := make(chan int)
	for range max(1, parallel) {
		wg.Go(func() {
			for i := range next {
				if err := f(i); err != nil {
					once.Do(func() { first = fmt.Errorf("connection %d: %w", i, err) })
				}
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	return first
}

// rss returns the process's resident set size in bytes.
func rss(pid int) (int64, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(v) // "123456 kB"
			if len(f) != 2 || f[1] != "kB" {
				return 0, fmt.Errorf("VmRSS line %q", line)
			}
			kb, err := strconv.ParseInt(f[0], 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}

func openFiles(pid int) (int, error) {
	ents, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(pid), "fd"))
	return len(ents), err
}

// noFileLimit returns the soft "Max open files" of the process. A Go
// program raises its soft limit to the hard one at start, so this is what
// the proxy can really use.
func noFileLimit(pid int) (int, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if rest, ok := strings.CutPrefix(line, "Max open files"); ok {
			f := strings.Fields(rest)
			if len(f) < 1 {
				break
			}
			if f[0] == "unlimited" {
				return 1 << 30, nil
			}
			return strconv.Atoi(f[0])
		}
	}
	return 0, fmt.Errorf("no open files limit in /proc/%d/limits", pid)
}

// raiseNoFile lifts this process's soft RLIMIT_NOFILE to need, or fails
// when the hard limit is lower.
func raiseNoFile(need uint64) error {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return err
	}
	if lim.Cur >= need {
		return nil
	}
	if lim.Max < need {
		return fmt.Errorf("RLIMIT_NOFILE hard limit %d is below the %d files needed; raise it (ulimit -Hn)", lim.Max, need)
	}
	lim.Cur = lim.Max
	return syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
}

func mb(b int64) float64 { return float64(b) / (1 << 20) }
