package quorum

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/internal/redistest"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
)

func TestMain(m *testing.M) {
	// go-redis logs every failed dial through a package-level logger; the
	// fault-injection tests kill nodes on purpose.
	redis.SetLogger(discard{})
	goleak.VerifyTestMain(m) // every Locker, node and subscriber stopped
}

type discard struct{}

func (discard) Printf(context.Context, string, ...any) {}

// cluster is a set of real redis-server lock nodes with an admin client per
// node for inspecting their state.
type cluster struct {
	servers []*redistest.Server
	opts    []*redis.Options
	admin   []*redis.Client
	killed  []bool
}

func (c *cluster) kill(i int)    { c.servers[i].Kill(); c.killed[i] = true }
func (c *cluster) restart(i int) { c.servers[i].Restart(); c.killed[i] = false }

func startCluster(tb testing.TB, n int) *cluster {
	tb.Helper()
	return startClusterArgs(tb, n)
}

// startClusterArgs is startCluster with extra configuration directives for
// every node.
func startClusterArgs(tb testing.TB, n int, args ...string) *cluster {
	tb.Helper()
	return startClusterWith(tb, n, func() *redistest.Server { return redistest.Start(tb, args...) })
}

// startClockCluster is startClusterArgs with nodes whose wall clocks the
// test can shift (redistest.StartWithClock).
func startClockCluster(tb testing.TB, n int, args ...string) *cluster {
	tb.Helper()
	return startClusterWith(tb, n, func() *redistest.Server { return redistest.StartWithClock(tb, args...) })
}

// startClusterWith is startCluster with nodes that start starts.
func startClusterWith(tb testing.TB, n int, start func() *redistest.Server) *cluster {
	tb.Helper()
	c := &cluster{}
	for range n {
		s := start()
		a := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: 2 * time.Second})
		tb.Cleanup(func() { a.Close() })
		c.servers = append(c.servers, s)
		c.opts = append(c.opts, &redis.Options{Addr: s.Addr})
		c.admin = append(c.admin, a)
		c.killed = append(c.killed, false)
	}
	return c
}

// testConfig is DefaultConfig with a node timeout and a clock tolerance
// that survive a loaded CI machine running -race, where a node's reply
// can take a hundred milliseconds.
func testConfig() Config {
	cfg := DefaultConfig()
	cfg.NodeTimeout = 250 * time.Millisecond
	cfg.ClockTolerance = 300 * time.Millisecond
	return cfg
}

// quiet makes the watcher check the nodes only when New starts it and when
// a call finds a node that lost its data, for tests that count calls.
func quiet(cfg Config) Config {
	cfg.ProbeInterval = time.Hour
	return cfg
}

// warm takes and releases a lock through l, which on fresh nodes creates
// their markers, and waits until every node has its marker and counts for
// l: a test that injects faults starts from a deployment in use.
func warm(tb testing.TB, c *cluster, l *Locker) {
	tb.Helper()
	// Set-up, not the test: a round that misses NodeTimeout on a loaded
	// machine is tried again.
	eventually(tb, "a warm-up lock", func() bool {
		lk, err := l.Lock(ctxT(tb), "warm-up", time.Second, Options{})
		return err == nil && l.Unlock(ctxT(tb), "warm-up", lk.Token) == nil
	})
	for i := range c.servers {
		if !c.killed[i] {
			waitRecovered(tb, l, i)
		}
	}
}

// waitRecovered waits until node i has its marker again and l counts it
// towards grants.
func waitRecovered(tb testing.TB, l *Locker, i int) {
	tb.Helper()
	a := redis.NewClient(&redis.Options{Addr: l.nodes[i].addr, MaxRetries: -1})
	defer a.Close()
	eventually(tb, fmt.Sprintf("node %d recovered", i), func() bool {
		return a.Exists(context.Background(), "lockproxy:intact").Val() == 1 && l.Status()[i].State == NodeUp
	})
}

// noFallback makes notification and ttl expiry the only wake-ups a waiter
// has within a test's lifetime.
func noFallback(cfg Config) Config {
	cfg.RetryMin, cfg.RetryMax = time.Minute, time.Minute
	return cfg
}

func newLocker(tb testing.TB, c *cluster, cfg Config) *Locker {
	tb.Helper()
	return newLockerLog(tb, c, cfg, zaptest.NewLogger(tb))
}

func newLockerLog(tb testing.TB, c *cluster, cfg Config, logger *zap.Logger) *Locker {
	tb.Helper()
	return newLockerOptsLog(tb, c.opts, cfg, logger)
}

// newLockerOpts is newLocker with its own options per node.
func newLockerOpts(tb testing.TB, opts []*redis.Options, cfg Config) *Locker {
	tb.Helper()
	return newLockerOptsLog(tb, opts, cfg, zaptest.NewLogger(tb))
}

func newLockerOptsLog(tb testing.TB, opts []*redis.Options, cfg Config, logger *zap.Logger) *Locker {
	tb.Helper()
	l, err := New(opts, cfg, logger)
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	tb.Cleanup(func() { l.Close() })
	return l
}

func ctxT(tb testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	tb.Cleanup(cancel)
	return ctx
}

// eventually polls cond every millisecond until it holds or 10s pass. It
// awaits an event that has no channel to wait on (state on a node, a queue
// length), never a fixed amount of time.
func eventually(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// lockKeys returns the lock keys on node i.
func (c *cluster) lockKeys(tb testing.TB, i int) []string {
	tb.Helper()
	keys, err := c.admin[i].Keys(context.Background(), "lockproxy:lock:*").Result()
	if err != nil {
		tb.Fatalf("KEYS on node %d: %v", i, err)
	}
	return keys
}

func (c *cluster) counter(tb testing.TB, i int) int64 {
	tb.Helper()
	v, err := c.admin[i].Get(context.Background(), "lockproxy:fence").Int64()
	if err != nil && err != redis.Nil {
		tb.Fatalf("GET fence on node %d: %v", i, err)
	}
	return v
}

func (c *cluster) pttl(tb testing.TB, i int, resource string) time.Duration {
	tb.Helper()
	d, err := c.admin[i].PTTL(context.Background(), "lockproxy:lock:"+resource).Result()
	if err != nil {
		tb.Fatalf("PTTL on node %d: %v", i, err)
	}
	return d
}

// scriptCalls returns how many scripts node i ran since it started.
func (c *cluster) scriptCalls(tb testing.TB, i int) int {
	tb.Helper()
	return c.calls(tb, i, "eval")
}

// allScriptCalls returns how many scripts all nodes of c ran since they
// started: one per batch sent to a node.
func (c *cluster) allScriptCalls(tb testing.TB) int {
	tb.Helper()
	n := 0
	for i := range c.admin {
		n += c.scriptCalls(tb, i)
	}
	return n
}

// cpu returns the CPU time (user and system) that the nodes of c have used
// so far, as they report it in INFO cpu.
func (c *cluster) cpu(tb testing.TB) time.Duration {
	tb.Helper()
	var total time.Duration
	for i, a := range c.admin {
		info, err := a.Info(context.Background(), "cpu").Result()
		if err != nil {
			tb.Fatalf("INFO cpu on node %d: %v", i, err)
		}
		for _, line := range strings.Split(info, "\n") {
			k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
			if k != "used_cpu_user" && k != "used_cpu_sys" {
				continue
			}
			sec, err := strconv.ParseFloat(v, 64)
			if err != nil {
				tb.Fatalf("INFO cpu on node %d: %s is %q", i, k, v)
			}
			total += time.Duration(sec * float64(time.Second))
		}
	}
	return total
}

// calls returns how many times node i ran the commands whose names start
// with prefix (lower case), on their own or from a script.
func (c *cluster) calls(tb testing.TB, i int, prefix string) int {
	tb.Helper()
	info, err := c.admin[i].Info(context.Background(), "commandstats").Result()
	if err != nil {
		tb.Fatalf("INFO on node %d: %v", i, err)
	}
	total := 0
	for _, line := range strings.Split(info, "\n") {
		if !strings.HasPrefix(line, "cmdstat_"+prefix) {
			continue
		}
		var calls int
		_, rest, _ := strings.Cut(line, "calls=")
		for _, r := range rest {
			if r < '0' || r > '9' {
				break
			}
			calls = calls*10 + int(r-'0')
		}
		total += calls
	}
	return total
}

// waitSubscribed waits until every node has n subscribers on the release
// channel.
func (c *cluster) waitSubscribed(tb testing.TB, n int64) {
	tb.Helper()
	for i, a := range c.admin {
		if c.killed[i] {
			continue
		}
		eventually(tb, "release subscriptions", func() bool {
			m, err := a.PubSubNumSub(context.Background(), "lockproxy:released").Result()
			return err == nil && m["lockproxy:released"] == n
		})
	}
}

// waitClientUp waits until l's client for node i can reach the node again
// after a restart (go-redis backs off dialing a node that kept failing).
func waitClientUp(tb testing.TB, l *Locker, i int) {
	tb.Helper()
	eventually(tb, "client reconnect", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		return l.nodes[i].client.Ping(ctx).Err() == nil
	})
}

// queueLen returns how many local waiters are queued for resource.
func queueLen(l *Locker, resource string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if q := l.queues[resource]; q != nil {
		return len(q.waiters)
	}
	return 0
}

func waitQueued(tb testing.TB, l *Locker, resource string, n int) {
	tb.Helper()
	eventually(tb, "waiters queued", func() bool { return queueLen(l, resource) == n })
}

type lockResult struct {
	lk  Lock
	err error
	at  time.Time
}

// lockAsync runs Lock in a goroutine that the test waits for at cleanup.
func lockAsync(tb testing.TB, ctx context.Context, l *Locker, resource string, ttl time.Duration, opt Options) <-chan lockResult {
	ch := make(chan lockResult, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		lk, err := l.Lock(ctx, resource, ttl, opt)
		ch <- lockResult{lk, err, time.Now()}
	}()
	tb.Cleanup(func() { <-done })
	return ch
}

func recv(tb testing.TB, ch <-chan lockResult) lockResult {
	tb.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(15 * time.Second):
		tb.Fatal("Lock did not return")
		return lockResult{}
	}
}

func mustLock(tb testing.TB, l *Locker, resource string, ttl time.Duration, opt Options) Lock {
	tb.Helper()
	lk, err := l.Lock(ctxT(tb), resource, ttl, opt)
	if err != nil {
		tb.Fatalf("Lock(%q): %v", resource, err)
	}
	return lk
}

func mustUnlock(tb testing.TB, l *Locker, resource, token string) {
	tb.Helper()
	if err := l.Unlock(ctxT(tb), resource, token); err != nil {
		tb.Fatalf("Unlock(%q): %v", resource, err)
	}
}
