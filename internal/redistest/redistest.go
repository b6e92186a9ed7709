// Package redistest starts real redis-server processes for tests.
//
// Every server listens on a free loopback port, keeps its files under the
// test's temporary directory and is stopped by the test's cleanup. By default
// nothing is persisted, so a restarted server comes back empty; a server
// started with "--appendonly", "yes" comes back with its data, and
// RestartEmpty brings it back without. A missing redis-server fails the test;
// it is never skipped.
package redistest

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Server is one redis-server process. Its methods are safe for concurrent use.
type Server struct {
	// Addr is the server's host:port on 127.0.0.1.
	Addr string

	tb   testing.TB
	dir  string
	args []string
	tls  *tls.Config // set for a server that speaks only TLS
	ips  []string    // loopback addresses it listens on besides 127.0.0.1
	bin  string      // the program: redis-server or redis-sentinel
	conf string      // a configuration file given first, or ""
	env  []string    // added to the process's environment (the clock shim)
	skew string      // the clock shim's offset file, or ""

	mu     sync.Mutex
	cmd    *exec.Cmd
	done   chan struct{}
	paused bool
}

// Start starts a redis-server with extra configuration directives (for
// example "--maxmemory", "10mb") and waits until it answers PING.
func Start(tb testing.TB, extra ...string) *Server {
	tb.Helper()
	return start(tb, extra, nil)
}

// StartBound is Start for a server that also listens on the loopback
// addresses ips (any of 127.0.0.0/8), on the same port: each client can
// then get an address of its own, whose packets a test can drop (see
// Blackhole) without touching the others'. AddrOn names them.
func StartBound(tb testing.TB, ips []string, extra ...string) *Server {
	tb.Helper()
	return startIPs(tb, extra, nil, ips)
}

func start(tb testing.TB, extra []string, tlsc *tls.Config) *Server {
	tb.Helper()
	return startIPs(tb, extra, tlsc, nil)
}

func startIPs(tb testing.TB, extra []string, tlsc *tls.Config, ips []string) *Server {
	tb.Helper()
	if err := install("redis-server", "redis-server"); err != nil {
		tb.Fatalf("redis-server is missing and could not be installed: %v", err)
	}
	s := &Server{tb: tb, dir: tb.TempDir(), args: extra, tls: tlsc, bin: "redis-server", ips: ips}
	s.launch(nil)
	return s
}

// AddrOn returns the server's address on the loopback address ip, one of
// those it was started with (see StartBound).
func (s *Server) AddrOn(ip string) string {
	return net.JoinHostPort(ip, strconv.Itoa(s.Port()))
}

// launch starts s on a free port, calling conf first with the port when
// it is not nil (to write a configuration file that names it), and
// registers its stop with the test's cleanup.
func (s *Server) launch(conf func(port int) error) {
	s.tb.Helper()
	var err error
	for range 5 {
		s.Addr, err = freeAddr()
		if err != nil {
			continue
		}
		if conf != nil {
			if err = conf(s.Port()); err != nil {
				break
			}
		}
		if err = s.start(); err == nil {
			break
		}
	}
	if err != nil {
		s.tb.Fatalf("start %s: %v", s.bin, err)
	}
	s.tb.Cleanup(s.stop)
}

// Port returns the server's TCP port.
func (s *Server) Port() int {
	_, p, _ := net.SplitHostPort(s.Addr)
	n, _ := strconv.Atoi(p)
	return n
}

func (s *Server) start() error {
	port := []string{"--port", strconv.Itoa(s.Port())}
	if s.tls != nil {
		port = []string{"--port", "0", "--tls-port", strconv.Itoa(s.Port())}
	}
	var args []string
	if s.conf != "" {
		args = append(args, s.conf)
	}
	args = append(args, port[0], port[1], "--bind", "127.0.0.1")
	args = append(args, s.ips...) // more values of --bind
	args = append(args,
		"--dir", s.dir,
		"--save", "",
		"--appendonly", "no",
		"--protected-mode", "no",
		"--daemonize", "no",
		"--logfile", filepath.Join(s.dir, "redis.log"),
	)
	args = append(args, port[2:]...)
	args = append(args, s.args...)
	cmd := exec.Command(s.bin, args...)
	cmd.SysProcAttr = procAttr()
	if s.env != nil {
		cmd.Env = append(os.Environ(), s.env...)
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() {
		cmd.Wait()
		close(done)
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err := ping(s.Addr, s.tls); err == nil {
			break
		}
		select {
		case <-done:
			log, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
			return fmt.Errorf("%s exited: %s", s.bin, lastLines(string(log), 5))
		default:
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			<-done
			return fmt.Errorf("%s on %s did not answer PING", s.bin, s.Addr)
		}
		time.Sleep(5 * time.Millisecond)
	}
	s.mu.Lock()
	s.cmd, s.done, s.paused = cmd, done, false
	s.mu.Unlock()
	return nil
}

// Kill stops the server at once with SIGKILL, as a crash would.
func (s *Server) Kill() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd, s.done, s.paused = nil, nil, false
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Kill()
	<-done
}

// Restart kills the server if it runs and starts it again on the same
// address, with its files: empty unless it persists its data.
func (s *Server) Restart() {
	s.tb.Helper()
	s.Kill()
	s.restart()
}

// RestartEmpty kills the server if it runs, deletes its data files (the
// AOF and RDB), and starts it again on the same address: a node that lost
// its data, whatever its persistence.
func (s *Server) RestartEmpty() {
	s.tb.Helper()
	s.Kill()
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		s.tb.Fatalf("restart redis-server on %s: %v", s.Addr, err)
	}
	for _, e := range entries {
		if e.Name() != "redis.log" {
			if err := os.RemoveAll(filepath.Join(s.dir, e.Name())); err != nil {
				s.tb.Fatalf("restart redis-server on %s: %v", s.Addr, err)
			}
		}
	}
	s.restart()
}

func (s *Server) restart() {
	s.tb.Helper()
	var err error
	for range 50 {
		if err = s.start(); err == nil {
			return
		}
		time.Sleep(20 * time.Millisecond) // the port may still be in TIME_WAIT use
	}
	s.tb.Fatalf("restart redis-server on %s: %v", s.Addr, err)
}

// The user that CutOff and Reconnect act as, created by CutOff.
const adminUser, adminPass = "redistest-admin", "redistest-admin-pass"

// CutOff cuts the server off from its clients while it keeps running with
// its data, as a network partition would: the default user is disabled
// (new connections get NOAUTH) and every connection of that user is
// closed. Reconnect undoes it; so does a restart.
func (s *Server) CutOff() {
	s.tb.Helper()
	if _, err := s.Do("ACL", "SETUSER", adminUser, "on", ">"+adminPass, "~*", "&*", "+@all"); err != nil {
		s.tb.Fatalf("cut off %s: %v", s.Addr, err)
	}
	for _, args := range [][]string{{"ACL", "SETUSER", "default", "off"}, {"CLIENT", "KILL", "USER", "default"}} {
		if reply, err := s.doAs(adminUser, adminPass, args...); err != nil || strings.HasPrefix(reply, "-") {
			s.tb.Fatalf("cut off %s: %s: %q, %v", s.Addr, args[0], reply, err)
		}
	}
}

// Reconnect lets clients of the default user in again after CutOff.
func (s *Server) Reconnect() {
	s.tb.Helper()
	if reply, err := s.doAs(adminUser, adminPass, "ACL", "SETUSER", "default", "on"); err != nil || reply != "+OK" {
		s.tb.Fatalf("reconnect %s: %q, %v", s.Addr, reply, err)
	}
}

// Pause stops the process with SIGSTOP: it keeps its sockets but answers
// nothing, like a node in a long GC pause or behind a partition.
func (s *Server) Pause() { s.signal(syscall.SIGSTOP, true) }

// Resume continues a paused server with SIGCONT.
func (s *Server) Resume() { s.signal(syscall.SIGCONT, false) }

func (s *Server) signal(sig syscall.Signal, paused bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Signal(sig)
	s.paused = paused
}

func (s *Server) stop() {
	s.mu.Lock()
	if s.paused && s.cmd != nil {
		s.cmd.Process.Signal(syscall.SIGCONT)
	}
	s.mu.Unlock()
	s.Kill()
}

// Do sends one command on a fresh connection and returns the raw reply
// line. It is for test set-up (CONFIG SET, FLUSHALL), not for assertions on
// multi-line replies.
func (s *Server) Do(args ...string) (string, error) {
	return s.doAs("", "", args...)
}

// doAs is Do on a connection authenticated as user, if user is set.
func (s *Server) doAs(user, pass string, args ...string) (string, error) {
	c, err := net.DialTimeout("tcp", s.Addr, time.Second)
	if err != nil {
		return "", err
	}
	if s.tls != nil {
		c = tls.Client(c, s.tls)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	var b strings.Builder
	write := func(args ...string) {
		fmt.Fprintf(&b, "*%d\r\n", len(args))
		for _, a := range args {
			fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
		}
	}
	if user != "" {
		write("AUTH", user, pass)
	}
	write(args...)
	if _, err := c.Write([]byte(b.String())); err != nil {
		return "", err
	}
	r := bufio.NewReader(c)
	if user != "" {
		if line, err := r.ReadString('\n'); err != nil || line != "+OK\r\n" {
			return strings.TrimRight(line, "\r\n"), fmt.Errorf("AUTH %s: %q, %v", user, line, err)
		}
	}
	line, err := r.ReadString('\n')
	return strings.TrimRight(line, "\r\n"), err
}

var (
	installMu sync.Mutex
	installed = map[string]error{}
)

// install makes sure the program bin is on PATH, installing the Debian
// package pkg when it is missing and the tests run as root (as in CI).
// Test binaries of several packages may run at once, so the install is
// serialised with a file lock.
func install(bin, pkg string) error {
	installMu.Lock()
	defer installMu.Unlock()
	if err, done := installed[bin]; done {
		return err
	}
	err := installPackage(bin, pkg)
	installed[bin] = err
	return err
}

func installPackage(bin, pkg string) error {
	if _, err := exec.LookPath(bin); err == nil {
		return nil
	}
	if os.Geteuid() != 0 {
		return fmt.Errorf("not root: run apt-get install -y %s", pkg)
	}
	f, err := os.OpenFile(filepath.Join(os.TempDir(), "lockproxy-apt.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		return err
	}
	defer syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	if _, err := exec.LookPath(bin); err == nil {
		return nil // another test binary installed it meanwhile
	}
	for _, args := range [][]string{{"update", "-qq"}, {"install", "-y", "-qq", pkg}} {
		cmd := exec.Command("apt-get", args...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("apt-get %s: %v: %s", args[0], err, lastLines(string(out), 5))
		}
	}
	_, err = exec.LookPath(bin)
	return err
}

func ping(addr string, tlsc *tls.Config) error {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return err
	}
	if tlsc != nil {
		c = tls.Client(c, tlsc)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(500 * time.Millisecond))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	// A server with requirepass answers, too: with NOAUTH.
	if line != "+PONG\r\n" && !strings.HasPrefix(line, "-NOAUTH") {
		return fmt.Errorf("PING answered %q", line)
	}
	return nil
}

func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
