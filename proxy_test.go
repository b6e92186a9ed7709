package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/internal/redistest"
)

// startApp runs the whole program (run, as main does) with a config file
// holding yaml and extra flags, and stops it at the end of the test.
func startApp(t testing.TB, yaml string, flags ...string) string {
	t.Helper()
	addr, _ := startAppStop(t, yaml, flags...)
	return addr
}

// startAppStop is startApp that also returns a function that stops the
// program at once (a proxy restart); the end of the test stops it too.
func startAppStop(t testing.TB, yaml string, flags ...string) (string, func()) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	listening := make(chan net.Addr, 1)
	done := make(chan error, 1)
	args := append([]string{"-config", path, "-listen", "127.0.0.1:0", "-log-level", "warn"}, flags...)
	go func() { done <- run(ctx, testProcess(t, args, listening)) }()
	select {
	case addr := <-listening:
		var once sync.Once
		stop := func() {
			once.Do(func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("run: %v", err)
				}
			})
		}
		t.Cleanup(stop)
		return addr.String(), stop
	case err := <-done:
		cancel()
		t.Fatalf("run: %v", err)
	}
	return "", nil
}

// testProcess is a process for run with args, its output in the test's
// log, and no environment but the test binary's GOMAXPROCS: run, in the
// test's own process, leaves the number of threads as it is.
func testProcess(t testing.TB, args []string, listening chan<- net.Addr) process {
	env := []string{fmt.Sprintf("GOMAXPROCS=%d", runtime.GOMAXPROCS(0))}
	return process{args: args, env: env, stdout: testWriter{t}, stderr: testWriter{t}, listening: listening}
}

// testWriter writes to the test's log.
type testWriter struct{ t testing.TB }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(b), "\n"))
	return len(b), nil
}

// startNodes starts n redis-servers for lock nodes.
func startNodes(t testing.TB, n int) ([]*redistest.Server, string) {
	nodes := make([]*redistest.Server, n)
	addrs := make([]string, n)
	for i := range nodes {
		nodes[i] = redistest.Start(t)
		addrs[i] = nodes[i].Addr
	}
	return nodes, strings.Join(addrs, ",")
}

func newClient(t testing.TB, addr string, protocol int) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr, Protocol: protocol, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	return c
}

// unusedAddr is a loopback address that nothing listened on a moment ago:
// a port the kernel handed out, its listener closed again.
func unusedAddr(t testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// lockReply is LOCK's success reply.
type lockReply struct {
	token    string
	validity time.Duration
	fence    int64
}

func lock(ctx context.Context, c *redis.Client, args ...any) (lockReply, error) {
	v, err := c.Do(ctx, append([]any{"LOCK"}, args...)...).Slice()
	if err != nil {
		return lockReply{}, err
	}
	if len(v) != 3 {
		return lockReply{}, fmt.Errorf("LOCK replied %v", v)
	}
	return lockReply{token: v[0].(string), validity: time.Duration(v[1].(int64)) * time.Millisecond, fence: v[2].(int64)}, nil
}

func TestDefaultConfigRuns(t *testing.T) {
	raw, err := os.ReadFile("config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	addr := startApp(t, string(raw))
	ctx := context.Background()
	for _, protocol := range []int{2, 3} {
		c := newClient(t, addr, protocol)
		if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
			t.Fatal(err)
		}
		if v, err := c.Get(ctx, "k").Result(); v != "v" || err != nil {
			t.Fatalf("GET: %q %v", v, err)
		}
		l, err := lock(ctx, c, "res", 5000)
		if err != nil || l.validity <= 0 || l.fence <= 0 || len(l.token) < 32 {
			t.Fatalf("LOCK: %+v %v", l, err)
		}
		if _, err := lock(ctx, c, "res", 5000); !errors.Is(err, redis.Nil) {
			t.Fatalf("second LOCK: %v, want a null reply", err)
		}
		if n, err := c.Do(ctx, "UNLOCK", "res", l.token).Int(); n != 1 || err != nil {
			t.Fatalf("UNLOCK: %d %v", n, err)
		}
	}
}

func TestEmbeddedLocksExpire(t *testing.T) {
	raw, _ := os.ReadFile("config.yaml")
	addr := startApp(t, string(raw))
	c := newClient(t, addr, 2)
	ctx := context.Background()
	// Right after the start, a loaded machine can answer the first calls
	// -NOQUORUM until the proxy has placed the nodes' clocks.
	for start := time.Now(); ; {
		_, err := lock(ctx, c, "short", 300)
		if err == nil {
			break
		}
		if !strings.HasPrefix(err.Error(), "NOQUORUM") || time.Since(start) > 5*time.Second {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	start := time.Now()
	l, err := lock(ctx, c, "short", 1000, "WAIT", 5000)
	if err != nil {
		t.Fatalf("LOCK WAIT after the first lock expired: %v", err)
	}
	if l.fence <= 1 || time.Since(start) > 4*time.Second {
		t.Fatalf("fence %d after %v", l.fence, time.Since(start))
	}
}

func TestConfigErrors(t *testing.T) {
	tests := []struct {
		name string
		give string
		want string
	}{
		{"unknown key", "listen: 127.0.0.1:0\nbakend: {addr: x}\n", "field bakend not found"},
		{"bad duration", "lock: {node_timeout: fast}\n", "`fast` into time.Duration"},
		{"no nodes", "backend: {addr: 127.0.0.1:1}\nlock: {nodes: []}\n", "lock.nodes is empty"},
		{"bad guard", "backend: {addr: embedded}\nlock: {nodes: [embedded], guard_backend: maybe}\n", "guard_backend"},
		{"negative", "backend: {addr: embedded}\nlock: {nodes: [embedded], max_ttl: -1s}\n", "commands: MaxTTL -1s is below 1ms"},
		{"bad level", "backend: {addr: embedded}\nlock: {nodes: [embedded]}\nlog: {level: loud}\n", "log.level"},
		{"gomaxprocs", "backend: {addr: embedded}\nlock: {nodes: [embedded]}\ngomaxprocs: -1\n", "gomaxprocs must not be negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "config.yaml")
			os.WriteFile(path, []byte(tt.give), 0o600)
			err := run(context.Background(), testProcess(t, []string{"-config", path, "-listen", "127.0.0.1:0"}, nil))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want an error naming %q", err, tt.want)
			}
		})
	}
}

// realConfig is for tests against real redis-servers: a node timeout that
// a loaded 2-core machine running -race meets (the default is 50ms).
const realConfig = "lock: {node_timeout: 250ms}\n"

// TestMutualExclusion has 50 clients, spread over two proxies that share
// three lock nodes, compete for a few resources. An independent checker
// then requires that no two holdings of a resource overlapped within their
// validity and that fences grew in acquisition order.
func TestMutualExclusion(t *testing.T) {
	backend := redistest.Start(t)
	_, nodes := startNodes(t, 3)
	proxies := []string{
		startApp(t, realConfig, "-backend", backend.Addr, "-lock-nodes", nodes),
		startApp(t, realConfig, "-backend", backend.Addr, "-lock-nodes", nodes),
	}
	type holding struct {
		resource   string
		start, end time.Time // acquired (LOCK replied) and released (UNLOCK sent)
		validUntil time.Time
		fence      int64
	}
	var (
		mu       sync.Mutex
		holdings []holding
		wg       sync.WaitGroup
	)
	resources := []string{"r0", "r1", "r2"}
	ctx := context.Background()
	deadline := time.Now().Add(3 * time.Second)
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := redis.NewClient(&redis.Options{Addr: proxies[i%2], MaxRetries: -1, ReadTimeout: 10 * time.Second})
			defer c.Close()
			res := resources[i%len(resources)]
			for time.Now().Before(deadline) {
				l, err := lock(ctx, c, res, 2000, "WAIT", 3000)
				if errors.Is(err, redis.Nil) {
					continue
				}
				if err != nil {
					t.Errorf("LOCK: %v", err)
					return
				}
				start := time.Now()
				time.Sleep(time.Millisecond) // the critical section
				end := time.Now()
				if n, err := c.Do(ctx, "UNLOCK", res, l.token).Int(); n != 1 || err != nil {
					t.Errorf("UNLOCK: %d %v", n, err)
				}
				mu.Lock()
				holdings = append(holdings, holding{res, start, end, start.Add(l.validity), l.fence})
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(holdings) < 50 {
		t.Fatalf("only %d acquisitions", len(holdings))
	}
	for _, res := range resources {
		var hs []holding
		for _, h := range holdings {
			if h.resource == res {
				hs = append(hs, h)
			}
		}
		sort.Slice(hs, func(i, j int) bool { return hs[i].start.Before(hs[j].start) })
		for i := 1; i < len(hs); i++ {
			prev, cur := hs[i-1], hs[i]
			// The previous holder was done (it released) or its validity
			// ran out before the next holder's LOCK replied.
			if cur.start.Before(prev.end) && cur.start.Before(prev.validUntil) {
				t.Errorf("%s: holdings overlap: %+v and %+v", res, prev, cur)
			}
			if cur.fence <= prev.fence {
				t.Errorf("%s: fence did not grow: %d then %d", res, prev.fence, cur.fence)
			}
		}
	}
	t.Logf("%d acquisitions checked", len(holdings))
}

// TestHandoffAcrossProxies: a waiter on one proxy takes over when the
// holder unlocks through another, long before the holder's ttl, and not
// before the holder unlocked.
func TestHandoffAcrossProxies(t *testing.T) {
	backend := redistest.Start(t)
	servers, nodes := startNodes(t, 3)
	a := newClient(t, startApp(t, realConfig, "-backend", backend.Addr, "-lock-nodes", nodes), 2)
	b := newClient(t, startApp(t, realConfig, "-backend", backend.Addr, "-lock-nodes", nodes), 3)
	ctx := context.Background()
	held, err := lock(ctx, a, "job", 30000)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	var waited lockReply
	go func() {
		var err error
		waited, err = lock(ctx, b, "job", 30000, "WAIT", 20000)
		got <- err
	}()
	waitForWaiter(t, servers, "job")
	select {
	case err := <-got:
		t.Fatalf("the waiter's LOCK returned while the lock was held: %v", err)
	default:
	}
	released := time.Now()
	if n, err := a.Do(ctx, "UNLOCK", "job", held.token).Int(); n != 1 || err != nil {
		t.Fatalf("UNLOCK: %d %v", n, err)
	}
	if err := <-got; err != nil {
		t.Fatalf("waiter: %v", err)
	}
	if d := time.Since(released); d > 5*time.Second {
		t.Fatalf("handoff took %v", d)
	}
	if waited.fence <= held.fence {
		t.Fatalf("fence %d after %d", waited.fence, held.fence)
	}
}

// waitForWaiter waits until a LOCK ... WAIT for resource is waiting: its
// attempt marked the lock as waited for on a node (in quorum's key layout
// the value of lockproxy:lock:<resource> then starts with '1').
func waitForWaiter(t testing.TB, nodes []*redistest.Server, resource string) {
	t.Helper()
	const marked = "return redis.call('GETRANGE', KEYS[1], 0, 0) == '1' and 1 or 0"
	deadline := time.Now().Add(10 * time.Second)
	for {
		for _, n := range nodes {
			if r, _ := n.Do("EVAL", marked, "1", "lockproxy:lock:"+resource); r == ":1" {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no waiter for %q after 10s", resource)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitForClients waits until the proxy at c counts n connected clients.
func waitForClients(t testing.TB, c *redis.Client, n int) {
	t.Helper()
	want := fmt.Sprintf("connected_clients:%d\r\n", n)
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, err := c.Info(context.Background(), "lockproxy").Result()
		if err == nil && strings.Contains(info, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("want %q in INFO lockproxy after 10s: %q %v", want, info, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestClientKilledWhileWaiting: a waiter that hangs up gives up its place
// and never ends up holding the lock: right after the holder's UNLOCK the
// lock is free, with no waiter queued before the next client.
func TestClientKilledWhileWaiting(t *testing.T) {
	backend := redistest.Start(t)
	servers, nodes := startNodes(t, 3)
	addr := startApp(t, realConfig, "-backend", backend.Addr, "-lock-nodes", nodes)
	ctx := context.Background()
	holder := newClient(t, addr, 2)
	held, err := lock(ctx, holder, "q", 30000)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	raw.Write([]byte("*5\r\n$4\r\nLOCK\r\n$1\r\nq\r\n$5\r\n30000\r\n$4\r\nWAIT\r\n$5\r\n20000\r\n"))
	waitForWaiter(t, servers, "q")
	raw.Close()
	waitForClients(t, holder, 1) // the proxy ended the waiter's connection
	if n, err := holder.Do(ctx, "UNLOCK", "q", held.token).Int(); n != 1 || err != nil {
		t.Fatalf("UNLOCK: %d %v", n, err)
	}
	// A LOCK without WAIT gets nothing while a waiter of this proxy is
	// queued, and the lock would be the waiter's if it had kept its place.
	other := newClient(t, addr, 2)
	if _, err := lock(ctx, other, "q", 1000); err != nil {
		t.Fatalf("LOCK right after the UNLOCK, with the waiter gone: %v", err)
	}
}

// TestKeepaliveReleasedWhenClientDies: a KEEPALIVE lock outlives its ttl
// while its client is connected and is free at once when it disconnects.
func TestKeepaliveReleasedWhenClientDies(t *testing.T) {
	backend := redistest.Start(t)
	_, nodes := startNodes(t, 3)
	addr := startApp(t, realConfig, "-backend", backend.Addr, "-lock-nodes", nodes)
	ctx := context.Background()
	owner := newClient(t, addr, 2)
	if _, err := lock(ctx, owner, "kept", 300, "KEEPALIVE"); err != nil {
		t.Fatal(err)
	}
	other := newClient(t, addr, 2)
	time.Sleep(900 * time.Millisecond) // three ttls
	if _, err := lock(ctx, other, "kept", 1000); !errors.Is(err, redis.Nil) {
		t.Fatalf("the kept lock was free after three ttls: %v", err)
	}
	owner.Close()
	if _, err := lock(ctx, other, "kept", 1000, "WAIT", 250); err != nil {
		t.Fatalf("not released when the owner disconnected: %v", err)
	}
}

// TestGuardWhenBackendIsLockNode: lock state on a node that is also the
// backend cannot be read or changed through the proxy.
func TestGuardWhenBackendIsLockNode(t *testing.T) {
	nodes, addrs := startNodes(t, 3)
	addr := startApp(t, realConfig, "-backend", nodes[0].Addr, "-lock-nodes", addrs)
	ctx := context.Background()
	c := newClient(t, addr, 2)
	if _, err := lock(ctx, c, "secret", 10000); err != nil {
		t.Fatal(err)
	}
	for _, cmd := range [][]any{
		{"HGETALL", "lockproxy:lock:secret"},
		{"DEL", "lockproxy:lock:secret"},
		{"GET", "lockproxy:fence"},
		{"MSET", "a", "1", "lockproxy:fence", "0"},
		{"EVAL", "return redis.call('DEL', KEYS[1])", "1", "lockproxy:lock:secret"},
		{"SORT", "list", "BY", "lockproxy:lock:*->t"},
		{"OBJECT", "ENCODING", "lockproxy:fence"},
		{"FLUSHALL"},
		{"SYNC"},
		{"PSYNC", "?", "-1"},
	} {
		err := c.Do(ctx, cmd...).Err()
		if err == nil || !strings.Contains(err.Error(), "lock state") {
			t.Errorf("%v: %v, want a refusal", cmd, err)
		}
	}
	if err := c.Set(ctx, "ordinary", "1", 0).Err(); err != nil {
		t.Fatalf("ordinary keys: %v", err)
	}
	if n, _ := c.Exists(ctx, "ordinary").Result(); n != 1 {
		t.Fatal("EXISTS ordinary")
	}
	// A refusal inside a transaction aborts it, as an error while queuing
	// does in Redis: the SET before it never runs. So does a LOCK.
	for _, refused := range [][]any{{"DEL", "lockproxy:lock:secret"}, {"LOCK", "other", "1000"}} {
		_, err := c.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.Set(ctx, "ordinary", "2", 0)
			p.Do(ctx, refused...)
			return nil
		})
		if err == nil || !strings.HasPrefix(err.Error(), "EXECABORT") {
			t.Fatalf("transaction with %v: %v, want EXECABORT", refused, err)
		}
		if v, _ := c.Get(ctx, "ordinary").Result(); v != "1" {
			t.Fatalf("the aborted transaction ran: ordinary = %q", v)
		}
	}
	if _, err := lock(ctx, c, "secret", 10000); !errors.Is(err, redis.Nil) {
		t.Fatalf("the lock state was changed: %v", err)
	}
}

// TestTLSEverywhere: clients, backend and lock nodes all speak TLS with
// certificates made in the test, clients must present a certificate, and
// the proxy requires a password.
func TestTLSEverywhere(t *testing.T) {
	certs := redistest.NewCerts(t)
	backend := redistest.StartTLS(t, certs)
	addrs := make([]string, 3)
	for i := range addrs {
		addrs[i] = redistest.StartTLS(t, certs).Addr
	}
	tlsBlock := fmt.Sprintf("{enabled: true, ca_file: %q, cert_file: %q, key_file: %q, server_name: localhost}",
		certs.CA, certs.ClientCert, certs.ClientKey)
	yaml := fmt.Sprintf(`
tls: {enabled: true, cert_file: %q, key_file: %q, client_ca_file: %q, require_client_cert: true}
auth: {requirepass: s3cret}
backend: {addr: %q, tls: %s}
lock: {nodes: [%s], tls: %s, node_timeout: 1s}  # TLS handshakes under -race are slow
`, certs.ServerCert, certs.ServerKey, certs.CA, backend.Addr, tlsBlock, strings.Join(addrs, ", "), tlsBlock)
	addr := startApp(t, yaml)
	ctx := context.Background()

	c := redis.NewClient(&redis.Options{Addr: addr, Password: "s3cret", TLSConfig: certs.ClientTLS(t), MaxRetries: -1})
	defer c.Close()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET over TLS: %v", err)
	}
	if _, err := lock(ctx, c, "tls-res", 1000); err != nil {
		t.Fatalf("LOCK over TLS: %v", err)
	}

	noCert := certs.ClientTLS(t)
	noCert.Certificates = nil
	bad := redis.NewClient(&redis.Options{Addr: addr, Password: "s3cret", TLSConfig: noCert, MaxRetries: -1})
	defer bad.Close()
	if err := bad.Ping(ctx).Err(); err == nil {
		t.Fatal("a client without a certificate was served")
	}
	plain := redis.NewClient(&redis.Options{Addr: addr, Password: "s3cret", MaxRetries: -1, ReadTimeout: time.Second})
	defer plain.Close()
	if err := plain.Ping(ctx).Err(); err == nil {
		t.Fatal("a plain-text client was served")
	}
	noPass := redis.NewClient(&redis.Options{Addr: addr, TLSConfig: certs.ClientTLS(t), MaxRetries: -1})
	defer noPass.Close()
	if err := noPass.Get(ctx, "k").Err(); err == nil || !strings.HasPrefix(err.Error(), "NOAUTH") {
		t.Fatalf("without AUTH: %v", err)
	}
}

// TestReloadOnSIGHUP: SIGHUP re-reads the file and applies new limits to
// clients that connect afterwards.
func TestReloadOnSIGHUP(t *testing.T) {
	backend := redistest.Start(t)
	_, nodes := startNodes(t, 1)
	path := filepath.Join(t.TempDir(), "config.yaml")
	os.WriteFile(path, []byte("limits: {max_clients: 100}\n"), 0o600)
	ctx, cancel := context.WithCancel(context.Background())
	listening := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, testProcess(t, []string{"-config", path, "-listen", "127.0.0.1:0", "-backend", backend.Addr, "-lock-nodes", nodes}, listening))
	}()
	addr := (<-listening).String()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	first := newClient(t, addr, 2)
	if err := first.Ping(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(path, []byte("limits: {max_clients: 1}\nlog: {level: debug}\n"), 0o600)
	syscall.Kill(os.Getpid(), syscall.SIGHUP)
	deadline := time.Now().Add(5 * time.Second)
	for {
		// The proxy greets a client over the limit with the error and
		// closes; read it on a raw connection.
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(time.Second))
		buf := make([]byte, 128)
		n, _ := c.Read(buf)
		c.Close()
		if strings.Contains(string(buf[:n]), "max number of clients") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the new max_clients did not apply: read %q", buf[:n])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestObservability: /metrics, /healthz, /readyz and INFO lockproxy through
// the whole program.
func TestObservability(t *testing.T) {
	backend := redistest.Start(t)
	nodes, addrs := startNodes(t, 3)
	metricsAddr := unusedAddr(t)
	addr := startApp(t, fmt.Sprintf("metrics: {listen: %q}\nlock: {node_timeout: 250ms}\n", metricsAddr),
		"-backend", backend.Addr, "-lock-nodes", addrs)
	ctx := context.Background()
	c := newClient(t, addr, 2)
	l, err := lock(ctx, c, "observed", 10000)
	if err != nil {
		t.Fatal(err)
	}
	c.Set(ctx, "k", "v", 0)

	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + metricsAddr + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	code, body := get("/metrics")
	for _, want := range []string{
		`lockproxy_commands_total{command="lock",outcome="acquired"} 1`,
		`lockproxy_locks_held 1`,
		`lockproxy_lock_node_up{addr="` + nodes[0].Addr + `",node="0"} 1`,
		`lockproxy_client_connections 1`,
		`lockproxy_backend_latency_seconds_count`,
		`go_goroutines`,
	} {
		if code != 200 || !strings.Contains(body, want) {
			t.Errorf("/metrics (%d) lacks %q", code, want)
		}
	}
	if code, body := get("/healthz"); code != 200 {
		t.Errorf("/healthz: %d %s", code, body)
	}
	if code, body := get("/readyz"); code != 200 {
		t.Errorf("/readyz with everything up: %d %s", code, body)
	}

	info, err := c.Info(ctx, "lockproxy").Result()
	if err != nil || !strings.HasPrefix(info, "# Lockproxy\r\n") || !strings.Contains(info, "locks_acquired:1\r\n") ||
		!strings.Contains(info, "lock_nodes_up:3\r\n") {
		t.Errorf("INFO lockproxy: %q %v", info, err)
	}
	if n, err := c.Do(ctx, "UNLOCK", "observed", l.token).Int(); n != 1 || err != nil {
		t.Fatalf("UNLOCK: %d %v", n, err)
	}

	nodes[1].Kill()
	nodes[2].Kill()
	if code, body := get("/readyz"); code != 503 || !strings.Contains(body, "1 of 3 lock nodes answered") {
		t.Errorf("/readyz with 2 of 3 nodes down: %d %s", code, body)
	}
	backend.Kill()
	if code, body := get("/readyz"); code != 503 || !strings.Contains(body, "backend unavailable") {
		t.Errorf("/readyz with the backend down: %d %s", code, body)
	}
}
