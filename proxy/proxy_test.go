package proxy

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/lockproxy/lockproxy/internal/redistest"
)

// connectedClients returns Redis's own count of its clients.
func connectedClients(t *testing.T, srv *redistest.Server) int {
	t.Helper()
	c := dial(t, srv.Addr)
	defer c.c.Close()
	info := string(c.do(args("INFO clients")))
	var n int
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "connected_clients:"); ok {
			n = atoi(t, v)
		}
	}
	return n - 1 // this connection
}

// eventually polls cond until it holds or 10s pass.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestBackendRestart(t *testing.T) {
	srv := redistest.Start(t)
	addr, _ := startProxy(t, srv.Addr, nil)
	c := dial(t, addr)
	if got := c.do(args("SELECT 3"), args("SET k v"), args("CLIENT SETNAME keeper")); string(got) != "+OK\r\n+OK\r\n+OK\r\n" {
		t.Fatalf("setup: %q", got)
	}

	srv.Kill()
	got := string(c.do(args("GET k")))
	if !strings.HasPrefix(got, "-ERR backend unavailable") {
		t.Fatalf("with the backend down: %q", got)
	}
	start := time.Now()
	got = string(c.do(args("GET k")))
	if !strings.HasPrefix(got, "-ERR backend unavailable") || time.Since(start) > 2*time.Second {
		t.Fatalf("second command with the backend down: %q after %v", got, time.Since(start))
	}

	srv.Restart()
	// Within the dial backoff the proxy uses the backend again.
	eventually(t, "the backend to be used again", func() bool {
		return !strings.HasPrefix(string(c.do(args("PING"))), "-ERR backend unavailable")
	})
	// The connection is usable again and the new backend connection has
	// the client's database and name.
	if got := string(c.do(args("SET k2 v2"), args("CLIENT GETNAME"))); got != "+OK\r\n$6\r\nkeeper\r\n" {
		t.Fatalf("after restart: %q", got)
	}
	d := dial(t, srv.Addr)
	if got := string(d.do(args("SELECT 3"), args("GET k2"))); got != "+OK\r\n$2\r\nv2\r\n" {
		t.Fatalf("the write did not land in db 3: %q", got)
	}
}

func TestBackendDiesWithCommandsInFlight(t *testing.T) {
	srv := redistest.Start(t)
	addr, _ := startProxy(t, srv.Addr, nil)
	c := dial(t, addr)
	c.send(encode(args("BLPOP nothing 0"), args("GET after")))
	waitBlocked(t, srv, 1)
	srv.Kill()
	want := "-ERR backend unavailable: connection lost\r\n-ERR backend unavailable: connection lost\r\n"
	if got := string(c.read(2)); got != want {
		t.Fatalf("in-flight commands: %q", got)
	}
	srv.Restart()
	if got := string(c.do(args("PING"))); got != "+PONG\r\n" {
		t.Fatalf("after restart: %q", got)
	}
}

func TestSubscriberDisconnectedWhenBackendDies(t *testing.T) {
	srv := redistest.Start(t)
	addr, _ := startProxy(t, srv.Addr, nil)
	c := dial(t, addr)
	c.do(args("SUBSCRIBE ch"))
	srv.Kill()
	if rest, closed := c.closedAfter(5 * time.Second); !closed {
		t.Fatalf("subscriber kept its connection after the backend died (read %q)", rest)
	}
}

func TestClientGoneMidBlockingCommand(t *testing.T) {
	srv := redistest.Start(t)
	addr, p := startProxy(t, srv.Addr, nil)
	spares := DefaultConfig().Backend.SpareConnections
	eventually(t, "the spare connections", func() bool { return connectedClients(t, srv) == spares })
	base := runtime.NumGoroutine()
	for range 5 {
		c := dial(t, addr)
		c.send(encode(args("BLPOP never 0")))
	}
	waitBlocked(t, srv, 5)
	for s := range p.sessionsNow() {
		s.nc.Close()
	}
	// What is left is the spare connections, refilled.
	eventually(t, "backend connections closed", func() bool { return connectedClients(t, srv) == spares })
	eventually(t, "sessions cleaned up", func() bool { return len(p.sessionsNow()) == 0 && p.clients.Load() == 0 })
	eventually(t, "goroutines gone", func() bool { return runtime.NumGoroutine() <= base })
}

func (p *Proxy) sessionsNow() map[*session]struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := make(map[*session]struct{}, len(p.sessions))
	for s := range p.sessions {
		m[s] = struct{}{}
	}
	return m
}

func TestBlockingClientDoesNotDelayOthers(t *testing.T) {
	srv := redistest.Start(t)
	addr, _ := startProxy(t, srv.Addr, nil)
	a := dial(t, addr)
	a.send(encode(args("BLPOP q 0")))
	waitBlocked(t, srv, 1)
	b := dial(t, addr)
	for i := range 100 {
		if got := string(b.do(args(fmt.Sprintf("SET k%d v", i)))); got != "+OK\r\n" {
			t.Fatalf("%q", got)
		}
	}
	b.do(args("RPUSH q x"))
	if got := string(a.read(1)); got != "*2\r\n$1\r\nq\r\n$1\r\nx\r\n" {
		t.Fatalf("BLPOP: %q", got)
	}
}

// countingRelay sits between the proxy and Redis and counts the writes
// that reach Redis, to show that a pipeline travels as one batch.
type countingRelay struct {
	addr   string
	writes atomic.Int64
}

func startRelay(t *testing.T, target string) *countingRelay {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &countingRelay{addr: ln.Addr().String()}
	var wg sync.WaitGroup
	var conns []net.Conn
	var mu sync.Mutex
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, up)
			mu.Unlock()
			wg.Add(2)
			go func() {
				defer wg.Done()
				buf := make([]byte, 1<<20)
				for {
					n, err := c.Read(buf)
					if n > 0 {
						r.writes.Add(1)
						up.Write(buf[:n])
					}
					if err != nil {
						up.Close()
						return
					}
				}
			}()
			go func() {
				defer wg.Done()
				io.Copy(c, up)
				c.Close()
			}()
		}
	}()
	return r
}

func TestPipelineIsBatched(t *testing.T) {
	srv := redistest.Start(t)
	relay := startRelay(t, srv.Addr)
	addr, _ := startProxy(t, relay.addr, nil)
	c := dial(t, addr)
	c.do(args("PING"))
	before := relay.writes.Load()
	cmds := make([][]string, 100)
	for i := range cmds {
		cmds[i] = args(fmt.Sprintf("SET p%d %d", i, i))
	}
	got := c.do(cmds...)
	if want := strings.Repeat("+OK\r\n", 100); string(got) != want {
		t.Fatalf("replies: %q", trunc(got))
	}
	// One client write of ~2.5 KB may reach the proxy in a few reads; it
	// must not become 100 backend writes.
	if n := relay.writes.Load() - before; n > 3 {
		t.Fatalf("100 pipelined commands reached the backend in %d writes", n)
	}
}

func TestRequestLimits(t *testing.T) {
	srv := redistest.Start(t)
	addr, _ := startProxy(t, srv.Addr, func(c *Config) {
		c.MaxBulkLen = 1024
		c.MaxMultibulkLen = 8
		c.MaxInlineLen = 256
	})
	tests := []struct {
		name string
		give string
		want string
	}{
		{"bulk over the limit", "*2\r\n$3\r\nGET\r\n$2000\r\nab", "-ERR Protocol error: invalid bulk length\r\n"},
		{"declared but unsent", "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$999999999999\r\n", "-ERR Protocol error: invalid bulk length\r\n"},
		{"negative bulk", "*1\r\n$-5\r\n", "-ERR Protocol error: invalid bulk length\r\n"},
		{"too many arguments", "*9\r\n", "-ERR Protocol error: invalid multibulk length\r\n"},
		{"absurd count", "*99999999999999999999\r\n", "-ERR Protocol error: invalid multibulk length\r\n"},
		{"count line never ends", "*" + strings.Repeat("1", 300), "-ERR Protocol error: too big mbulk count string\r\n"},
		{"garbage length", "*x\r\n", "-ERR Protocol error: invalid multibulk length\r\n"},
		{"inline too long", strings.Repeat("a", 300), "-ERR Protocol error: too big inline request\r\n"},
		{"not a bulk", "*1\r\n:1\r\n", "-ERR Protocol error: expected '$', got ':'\r\n"},
		{"good requests first", "*1\r\n$4\r\nPING\r\n*1\r\n$-5\r\n", "+PONG\r\n-ERR Protocol error: invalid bulk length\r\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := dial(t, addr)
			c.send([]byte(tt.give))
			got, closed := c.closedAfter(5 * time.Second)
			if got != tt.want || !closed {
				t.Fatalf("got %q (closed %v), want %q and a closed connection", got, closed, tt.want)
			}
		})
	}
	// Within the limits everything passes.
	c := dial(t, addr)
	val := strings.Repeat("v", 1024)
	if got := string(c.do([]string{"SET", "k", val}, []string{"GET", "k"})); got != "+OK\r\n$1024\r\n"+val+"\r\n" {
		t.Fatalf("at the limit: %q", trunc([]byte(got)))
	}
}

func TestMaxClients(t *testing.T) {
	srv := redistest.Start(t)
	addr, _ := startProxy(t, srv.Addr, func(c *Config) { c.MaxClients = 2 })
	a, b := dial(t, addr), dial(t, addr)
	a.do(args("PING"))
	b.do(args("PING"))
	c := dial(t, addr)
	if got, closed := c.closedAfter(5 * time.Second); got != "-ERR max number of clients reached\r\n" || !closed {
		t.Fatalf("third client: %q closed=%v", got, closed)
	}
	a.c.Close()
	eventually(t, "a slot to free up", func() bool {
		d, err := net.Dial("tcp", addr)
		if err != nil {
			return false
		}
		defer d.Close()
		d.Write(encode(args("PING")))
		d.SetReadDeadline(time.Now().Add(time.Second))
		buf := make([]byte, 64)
		n, _ := d.Read(buf)
		return string(buf[:n]) == "+PONG\r\n"
	})
}

func TestIdleTimeout(t *testing.T) {
	srv := redistest.Start(t)
	addr, _ := startProxy(t, srv.Addr, func(c *Config) { c.IdleTimeout = 200 * time.Millisecond })
	idle := dial(t, addr)
	idle.do(args("PING"))
	blocked := dial(t, addr)
	blocked.send(encode(args("BLPOP q 1")))
	sub := dial(t, addr)
	sub.do(args("SUBSCRIBE ch"))
	if _, closed := idle.closedAfter(5 * time.Second); !closed {
		t.Fatal("idle client was not closed")
	}
	// The blocked client gets its timeout reply a second later.
	if got := string(blocked.read(1)); got != "*-1\r\n" {
		t.Fatalf("blocked client: %q", got)
	}
	if got := string(sub.do(args("PING"))); got != "*2\r\n$4\r\npong\r\n$0\r\n\r\n" {
		t.Fatalf("subscriber: %q", got)
	}
}

func TestMonitor(t *testing.T) {
	srv := redistest.Start(t)
	addr, _ := startProxy(t, srv.Addr, nil)
	m := dial(t, addr)
	if got := string(m.do(args("MONITOR"))); got != "+OK\r\n" {
		t.Fatalf("MONITOR: %q", got)
	}
	dial(t, addr).do(args("SET watched 1"))
	line := string(m.read(1))
	if !isMonitorLine([]byte(line)) || !strings.Contains(line, `"SET" "watched" "1"`) {
		t.Fatalf("monitor line: %q", line)
	}
	if got := string(m.do(args("RESET"))); got != "+RESET\r\n" {
		t.Fatalf("RESET: %q", got)
	}
	if got := string(m.do(args("GET watched"))); got != "$1\r\n1\r\n" {
		t.Fatalf("after RESET: %q", got)
	}
}

func TestShutdownLetsInflightFinish(t *testing.T) {
	srv := redistest.Start(t)
	cfg := DefaultConfig()
	cfg.Backend.Addr = srv.Addr
	p, addr, served := serveNew(t, cfg)
	c := dial(t, addr)
	c.send(encode(args("BLPOP q 0.3")))
	waitBlocked(t, srv, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	shut := make(chan error, 1)
	go func() { shut <- p.Shutdown(ctx) }()
	eventually(t, "listener closed", func() bool {
		d, err := net.Dial("tcp", addr)
		if err == nil {
			d.Close()
		}
		return err != nil
	})
	if got := string(c.read(1)); got != "*-1\r\n" {
		t.Fatalf("in-flight BLPOP: %q", got)
	}
	if err := <-shut; err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if err := <-served; err != nil {
		t.Fatalf("serve: %v", err)
	}
	if _, closed := c.closedAfter(5 * time.Second); !closed {
		t.Fatal("client still connected after shutdown")
	}
}

// echoLocal answers ECHOLOCAL and WAITLOCAL (which waits for its context)
// so that the tests can see where the proxy puts its own replies.
type echoLocal struct {
	closed *atomic.Int64
}

func (e echoLocal) Serve(ctx context.Context, dst []byte, args [][]byte, resp3 bool) []byte {
	if bytes.EqualFold(args[0], []byte("paniclocal")) {
		panic("a bug in a local command")
	}
	if bytes.EqualFold(args[0], []byte("waitlocal")) {
		<-ctx.Done()
		return append(dst, "+done\r\n"...)
	}
	if resp3 {
		return append(dst, "_\r\n"...)
	}
	return append(dst, fmt.Sprintf("$%d\r\n%s\r\n", len(args[1]), args[1])...)
}

func (e echoLocal) Close() { e.closed.Add(1) }

func startLocalProxy(t *testing.T, opts ...func(*Config)) (string, *redistest.Server, *atomic.Int64) {
	srv := redistest.Start(t)
	var closed atomic.Int64
	addr, _ := startProxy(t, srv.Addr, func(c *Config) {
		c.IsLocal = func(name []byte) bool {
			return bytes.EqualFold(name, []byte("echolocal")) || bytes.EqualFold(name, []byte("waitlocal")) ||
				bytes.EqualFold(name, []byte("paniclocal"))
		}
		c.MayWait = func(args [][]byte) bool { return bytes.EqualFold(args[0], []byte("waitlocal")) }
		c.NewLocal = func() Local { return echoLocal{&closed} }
		for _, o := range opts {
			o(c)
		}
	})
	return addr, srv, &closed
}

func TestLocalRepliesKeepTheirPlace(t *testing.T) {
	addr, _, _ := startLocalProxy(t)
	c := dial(t, addr)
	var cmds [][]string
	var want strings.Builder
	for i := range 50 {
		cmds = append(cmds, args(fmt.Sprintf("SET k %d", i)), args(fmt.Sprintf("ECHOLOCAL e%d", i)), args("GET k"))
		fmt.Fprintf(&want, "+OK\r\n$%d\r\ne%d\r\n$%d\r\n%d\r\n", len(fmt.Sprint(i))+1, i, len(fmt.Sprint(i)), i)
	}
	if got := string(c.do(cmds...)); got != want.String() {
		t.Fatalf("got %q", trunc([]byte(got)))
	}
	if got := string(c.do(args("HELLO 3"), args("ECHOLOCAL x"))[len("%"):]); !strings.HasSuffix(got, "_\r\n") {
		t.Fatalf("RESP3 null from the dispatch point: %q", got)
	}
}

func TestLocalCommandContexts(t *testing.T) {
	addr, _, _ := startLocalProxy(t)
	c := dial(t, addr)
	// A refused command makes EXEC abort, as an error while queuing does in
	// Redis: nothing of the transaction runs.
	got := string(c.do(args("MULTI"), args("SET tx 1"), args("ECHOLOCAL x"), args("SET tx 2"), args("EXEC"), args("EXISTS tx")))
	if got != "+OK\r\n+QUEUED\r\n-ERR Command not allowed inside a transaction\r\n+QUEUED\r\n"+
		"-EXECABORT Transaction discarded because of previous errors.\r\n:0\r\n" {
		t.Fatalf("in MULTI: %q", got)
	}
	// The next transaction starts clean, and DISCARD ends a failed one.
	if got := string(c.do(args("MULTI"), args("SET tx 3"), args("EXEC"))); got != "+OK\r\n+QUEUED\r\n*1\r\n+OK\r\n" {
		t.Fatalf("after an aborted EXEC: %q", got)
	}
	got = string(c.do(args("MULTI"), args("ECHOLOCAL x"), args("DISCARD"), args("EXEC"), args("MULTI"), args("GET tx"), args("EXEC")))
	if got != "+OK\r\n-ERR Command not allowed inside a transaction\r\n+OK\r\n-ERR EXEC without MULTI\r\n"+
		"+OK\r\n+QUEUED\r\n*1\r\n$1\r\n3\r\n" {
		t.Fatalf("DISCARD of a failed transaction: %q", got)
	}
	c.do(args("SUBSCRIBE ch"))
	want := "-ERR Can't execute 'echolocal': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / RESET are allowed in this context\r\n"
	if got := string(c.do(args("ECHOLOCAL x"))); got != want {
		t.Fatalf("subscribed: %q", got)
	}
	c.do(args("UNSUBSCRIBE"))
	if got := string(c.do(args("ECHOLOCAL x"))); got != "$1\r\nx\r\n" {
		t.Fatalf("after UNSUBSCRIBE: %q", got)
	}
	got = string(c.read0(args("CLIENT REPLY OFF"), args("ECHOLOCAL hidden"), args("CLIENT REPLY ON"), args("ECHOLOCAL shown")))
	if got != "+OK\r\n$5\r\nshown\r\n" {
		t.Fatalf("CLIENT REPLY: %q", got)
	}
}

// read0 sends cmds and reads the two replies that CLIENT REPLY lets through.
func (c *client) read0(cmds ...[]string) []byte {
	c.send(encode(cmds...))
	return c.read(2)
}

func TestLocalCommandCancelledWhenClientLeaves(t *testing.T) {
	addr, _, closed := startLocalProxy(t)
	c := dial(t, addr)
	c.send(encode(args("WAITLOCAL"), args("SET after 1")))
	time.Sleep(50 * time.Millisecond) // let WAITLOCAL start; the test passes either way
	c.c.Close()
	eventually(t, "the local state closed", func() bool { return closed.Load() == 1 })
}

// TestCommandTimeout: a local command ends after CommandTimeout, and at
// most a 64th later, also when it runs under a context an earlier command
// of the client started (commandContext shares one between commands).
func TestCommandTimeout(t *testing.T) {
	const timeout = 640 * time.Millisecond
	addr, _, _ := startLocalProxy(t, func(c *Config) { c.CommandTimeout = timeout })
	c := dial(t, addr)
	for i := range 3 {
		// The first WAITLOCAL runs under the context the ECHOLOCAL just
		// before it made, with the whole timeout left. Each of the others
		// finds the one its ECHOLOCAL made 100 or 200 ms earlier, with
		// less than the timeout left, and must get a new one (without,
		// it would end 100 or 200 ms early).
		if got := string(c.do(args("ECHOLOCAL x"))); got != "$1\r\nx\r\n" {
			t.Fatalf("ECHOLOCAL: %q", got)
		}
		time.Sleep(time.Duration(i) * 100 * time.Millisecond)
		start := time.Now()
		if got := string(c.do(args("WAITLOCAL"))); got != "+done\r\n" {
			t.Fatalf("WAITLOCAL: %q", got)
		}
		took := time.Since(start)
		t.Logf("WAITLOCAL %d ended after %v", i, took)
		if took < timeout {
			t.Errorf("WAITLOCAL %d ended after %v, before the command timeout %v", i, took, timeout)
		}
		// The upper bound is timeout + timeout/64; the rest is slack for
		// a loaded machine.
		if took > timeout+timeout/64+time.Second {
			t.Errorf("WAITLOCAL %d ended after %v, want about %v", i, took, timeout)
		}
	}
}

// loggedProxy is a proxy whose every log entry, debug included, is kept.
type loggedProxy struct {
	*Proxy
	addr string
}

// startLoggedProxy starts a proxy on backend, with the configuration edit
// makes, that logs into the returned observer at debug level.
func startLoggedProxy(t *testing.T, backend string, edit func(*Config)) (loggedProxy, *observer.ObservedLogs) {
	t.Helper()
	core, logs := observer.New(zap.DebugLevel)
	cfg := DefaultConfig()
	cfg.Backend.Addr = backend
	if edit != nil {
		edit(&cfg)
	}
	p, err := New(cfg, zap.New(core))
	if err != nil {
		t.Fatal(err)
	}
	return loggedProxy{p, serveProxy(t, p)}, logs
}

// TestSecretsNeverLogged: passwords sent with AUTH and HELLO never reach the
// log, even at debug level.
func TestSecretsNeverLogged(t *testing.T) {
	srv := redistest.Start(t, "--requirepass", "backend-pw")
	p, logs := startLoggedProxy(t, srv.Addr, func(c *Config) {
		c.Backend.Password = "backend-pw"
		c.Users = map[string]string{"default": "client-pw"}
	})
	c := dial(t, p.addr)
	c.do(args("AUTH wrong-pw"), args("AUTH client-pw"), args("HELLO 3 AUTH default client-pw"), args("SET k v"), args("RESET"))
	srv.Kill()
	c.do(args("GET k"))
	c.c.Close()
	eventually(t, "the client to go", func() bool { return p.clients.Load() == 0 })
	if logs.Len() == 0 {
		t.Fatal("nothing was logged at debug level; the test would prove nothing")
	}
	for _, e := range logs.All() {
		line := fmt.Sprint(e.Message, e.ContextMap())
		for _, secret := range []string{"client-pw", "backend-pw", "wrong-pw"} {
			if strings.Contains(line, secret) {
				t.Errorf("log entry shows a password: %s", line)
			}
		}
	}
}

// TestSessionLogNamesClient: what a session logs names its client's
// address (a field added lazily, at the first entry).
func TestSessionLogNamesClient(t *testing.T) {
	srv := redistest.Start(t)
	p, logs := startLoggedProxy(t, srv.Addr, nil)
	c := dial(t, p.addr)
	c.do(args("SELECT 1"), args("SET k v")) // on a connection of its own, which logs each command
	remote := c.c.LocalAddr().String()
	c.c.Close()
	eventually(t, "the client to go", func() bool { return p.clients.Load() == 0 })
	seen := map[string]bool{}
	for _, e := range logs.All() {
		if e.Message != "client connected" && e.Message != "forward" && e.Message != "client disconnected" {
			continue
		}
		seen[e.Message] = true
		if got := e.ContextMap()["remote"]; got != remote {
			t.Errorf("%q logged with remote %v, want %s", e.Message, got, remote)
		}
	}
	if len(seen) != 3 {
		t.Fatalf("entries seen: %v; want client connected, forward and client disconnected", seen)
	}
}

// TestPausedBackendDoesNotBlockOthers: a backend stopped with SIGSTOP
// holds up only the clients waiting on it.
func TestPausedBackendDoesNotBlockOthers(t *testing.T) {
	addr, srv, _ := startLocalProxy(t)
	stuck := dial(t, addr)
	stuck.do(args("PING"))
	srv.Pause()
	stuck.send(encode(args("GET k")))
	other := dial(t, addr)
	start := time.Now()
	if got := string(other.do(args("ECHOLOCAL fine"))); got != "$4\r\nfine\r\n" || time.Since(start) > 5*time.Second {
		t.Fatalf("a local command of another client: %q after %v", got, time.Since(start))
	}
	srv.Resume()
	if got := string(stuck.read(1)); got != "$-1\r\n" {
		t.Fatalf("the paused client after resume: %q", got)
	}
}

func TestBackendBackoff(t *testing.T) {
	srv := redistest.Start(t)
	addr, _ := startProxy(t, srv.Addr, nil)
	srv.Kill()
	c := dial(t, addr)
	for range 20 {
		if got := string(c.do(args("PING"))); !strings.HasPrefix(got, "-ERR backend unavailable: ") {
			t.Fatalf("with the backend down: %q", got)
		}
	}
	srv.Restart()
	eventually(t, "the backend to be used again", func() bool { return string(c.do(args("PING"))) == "+PONG\r\n" })
}

// TestPanicClosesOnlyThatClient: a panic while answering a client is
// contained to that client's connection.
// TestPanicClosesOnlyThatClient panics in a local command answered on the
// client's own goroutine and in one answered on a goroutine of its own.
func TestPanicClosesOnlyThatClient(t *testing.T) {
	for _, mayWait := range []bool{false, true} {
		t.Run(fmt.Sprintf("mayWait=%v", mayWait), func(t *testing.T) {
			addr, _, closed := startLocalProxy(t, func(c *Config) {
				c.MayWait = func([][]byte) bool { return mayWait }
			})
			bystander := dial(t, addr)
			bystander.do(args("SET k v"))
			victim := dial(t, addr)
			victim.send(encode(args("PANICLOCAL")))
			if _, gone := victim.closedAfter(5 * time.Second); !gone {
				t.Fatal("the panicking client's connection stayed open")
			}
			eventually(t, "the victim's state closed", func() bool { return closed.Load() == 1 })
			if got := string(bystander.do(args("GET k"), args("ECHOLOCAL still"))); got != "$1\r\nv\r\n$5\r\nstill\r\n" {
				t.Fatalf("the other client: %q", got)
			}
			if got := string(dial(t, addr).do(args("PING"))); got != "+PONG\r\n" {
				t.Fatalf("a new client: %q", got)
			}
		})
	}
}

// TestClientsShareBackendConnections: stateless commands of many clients
// travel on the shared connections; a client that sets state gets its own.
func TestClientsShareBackendConnections(t *testing.T) {
	srv := redistest.Start(t)
	// No spare connections: the count is of shared and dedicated ones.
	addr, _ := startProxy(t, srv.Addr, func(c *Config) {
		c.Backend.SharedConnections = 2
		c.Backend.SpareConnections = -1
	})
	clients := make([]*client, 20)
	for i := range clients {
		clients[i] = dial(t, addr)
		if got := string(clients[i].do(args(fmt.Sprintf("SET k%d %d", i, i)), args(fmt.Sprintf("GET k%d", i)))); got != fmt.Sprintf("+OK\r\n$%d\r\n%d\r\n", len(fmt.Sprint(i)), i) {
			t.Fatalf("client %d: %q", i, got)
		}
	}
	if n := connectedClients(t, srv); n > 2 {
		t.Fatalf("20 stateless clients use %d backend connections, want at most 2", n)
	}
	if got := string(clients[0].do(args("SELECT 1"), args("GET k0"), args("SELECT 0"), args("GET k0"))); got != "+OK\r\n$-1\r\n+OK\r\n$1\r\n0\r\n" {
		t.Fatalf("after SELECT: %q", got)
	}
	if n := connectedClients(t, srv); n != 3 {
		t.Fatalf("%d backend connections after one client selected a db, want 3", n)
	}
	// QUIT of a client without a connection of its own opens none.
	q := dial(t, addr)
	if got := string(q.do(args("GET k1"), args("QUIT"))); got != "$1\r\n1\r\n+OK\r\n" {
		t.Fatalf("GET, QUIT: %q", got)
	}
	if _, closed := q.closedAfter(5 * time.Second); !closed {
		t.Fatal("QUIT left the connection open")
	}
	if n := connectedClients(t, srv); n != 3 {
		t.Fatalf("%d backend connections after a shared client's QUIT, want 3", n)
	}
}
