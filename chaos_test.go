package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/internal/redistest"
)

// childEnv, set in a process's environment, makes the test binary run as
// lockproxy (see TestMain): the chaos test's proxies are processes of their
// own, so that SIGSTOP stops a whole proxy and nothing else.
const childEnv = "LOCKPROXY_TEST_CHILD_PROCESS"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		env := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, childEnv+"=") })
		err := run(context.Background(), process{args: os.Args[1:], env: env, stdout: os.Stdout, stderr: os.Stderr})
		if err != nil {
			fmt.Fprintln(os.Stderr, "lockproxy:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// proxyProcess is a lockproxy running as a process of its own.
type proxyProcess struct {
	addr string
	cmd  *exec.Cmd
	done chan struct{}

	mu      sync.Mutex
	stopped bool // by SIGSTOP
}

// startProxyProcess starts lockproxy as a process (the test binary, see
// TestMain) with the config yaml and flags, waits until it answers PING,
// and stops it at the end of the test. Its output goes to a file in the
// test's directory.
func startProxyProcess(t testing.TB, yaml string, flags ...string) *proxyProcess {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := unusedAddr(t)
	out, err := os.Create(filepath.Join(dir, "lockproxy.log"))
	if err != nil {
		t.Fatal(err)
	}
	args := append([]string{"-config", path, "-listen", addr, "-log-level", "warn"}, flags...)
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), childEnv+"=1")
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start lockproxy: %v", err)
	}
	p := &proxyProcess{addr: addr, cmd: cmd, done: make(chan struct{})}
	go func() {
		cmd.Wait()
		out.Close()
		close(p.done)
	}()
	t.Cleanup(p.stop)
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	defer c.Close()
	deadline := time.Now().Add(30 * time.Second)
	for c.Ping(context.Background()).Err() != nil {
		select {
		case <-p.done:
			log, _ := os.ReadFile(out.Name())
			t.Fatalf("lockproxy exited: %s", log)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("lockproxy on %s did not answer PING", addr)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return p
}

// pause stops the proxy with SIGSTOP; resume continues it.
func (p *proxyProcess) pause()  { p.signal(syscall.SIGSTOP, true) }
func (p *proxyProcess) resume() { p.signal(syscall.SIGCONT, false) }

func (p *proxyProcess) signal(sig syscall.Signal, stopped bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cmd.Process.Signal(sig)
	p.stopped = stopped
}

// stop ends the proxy: SIGTERM, and SIGKILL if it has not exited within
// 10s.
func (p *proxyProcess) stop() {
	p.resume()
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
}

// TestChaosProxies runs two lockproxy processes over the same lock nodes
// with 16 clients taking a few resources with WAIT, while one fault at a
// time strikes: a proxy is stopped (SIGSTOP) for 0.2-2s, or a node's wall
// clock jumps forward 1-30s (two times in three) or back. An independent
// checker plays the storage the locks protect: it refuses a fence older
// than one it has seen. It requires that no two holdings whose fences it
// accepted overlapped within the validity their LOCK replies gave, counted
// from when the client read the reply, and that a LOCK sent after an
// earlier holding ended got a larger fence (the contract's fence order).
//
// A refused fence is not a failure: a proxy stopped after it computed a
// reply's validity and before the reply left it (or a client scheduled
// late after reading it) hands over a holding that may have ended, which
// no lock service can prevent and which fences exist for.
// runWorkers starts n goroutines in wg, worker w with a client of one
// connection to addrs[w%len(addrs)] (no retries, readTimeout), each
// calling step with it over and over until stop is closed.
func runWorkers(wg *sync.WaitGroup, stop <-chan struct{}, n int, addrs []string, readTimeout time.Duration,
	step func(ctx context.Context, c *redis.Client)) {
	for w := range n {
		wg.Go(func() {
			c := redis.NewClient(&redis.Options{Addr: addrs[w%len(addrs)], MaxRetries: -1, ReadTimeout: readTimeout, PoolSize: 1})
			defer c.Close()
			ctx := context.Background()
			for {
				select {
				case <-stop:
					return
				default:
				}
				step(ctx, c)
			}
		})
	}
}

func TestChaosProxies(t *testing.T) {
	for _, n := range []int{3, 5} {
		t.Run(fmt.Sprintf("%d nodes", n), func(t *testing.T) { chaosProxies(t, n, 15*time.Second) })
	}
}

func chaosProxies(t *testing.T, n int, run time.Duration) {
	backend := redistest.Start(t)
	nodes := make([]*redistest.Server, n)
	addrs := make([]string, n)
	for i := range nodes {
		nodes[i] = redistest.StartWithClock(t, "--appendonly", "yes", "--appendfsync", "always")
		addrs[i] = nodes[i].Addr
	}
	const yaml = "lock: {node_timeout: 250ms, max_ttl: 3s}\n"
	flags := []string{"-backend", backend.Addr, "-lock-nodes", strings.Join(addrs, ",")}
	proxies := []*proxyProcess{startProxyProcess(t, yaml, flags...), startProxyProcess(t, yaml, flags...)}
	admin := make([]*redis.Client, n)
	for i, s := range nodes {
		admin[i] = newClient(t, s.Addr, 2)
	}

	ck := &fenceChecker{last: map[string]int64{}}
	resources := []string{"r0", "r1", "r2", "r3"}
	var (
		mu                                    sync.Mutex
		attempts, grants, noQuorum, notGotten int
		other                                 []string
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	runWorkers(&wg, stop, 16, []string{proxies[0].addr, proxies[1].addr}, 5*time.Second,
		func(ctx context.Context, c *redis.Client) {
			r := resources[rand.IntN(len(resources))]
			sent := time.Now()
			l, err := lock(ctx, c, r, 1000, "WAIT", 1000)
			start := time.Now()
			mu.Lock()
			attempts++
			switch {
			case err == nil:
				grants++
			case errors.Is(err, redis.Nil):
				notGotten++
			case strings.HasPrefix(err.Error(), "NOQUORUM"):
				noQuorum++
			default:
				other = append(other, err.Error())
			}
			mu.Unlock()
			if err != nil {
				if !errors.Is(err, redis.Nil) {
					time.Sleep(10 * time.Millisecond)
				}
				return
			}
			end := start.Add(l.validity)
			ck.hold(r, l.fence, sent, start, end)
			time.Sleep(time.Duration(rand.IntN(1000)) * time.Microsecond)
			released := time.Now()
			c.Do(ctx, "UNLOCK", r, l.token)
			if released.Before(end) {
				ck.release(r, l.fence, released)
			}
		})

	injected := map[string]int{}
	deadline := time.Now().Add(run)
	for time.Now().Before(deadline) {
		time.Sleep(time.Duration(300+rand.IntN(500)) * time.Millisecond)
		if rand.IntN(3) != 0 { // a clock jump takes a recovery: stall more often
			p := proxies[rand.IntN(len(proxies))]
			p.pause()
			time.Sleep(time.Duration(200+rand.IntN(1800)) * time.Millisecond)
			p.resume()
			injected["proxy stall"]++
			continue
		}
		d := time.Duration(1+rand.IntN(30)) * time.Second
		if rand.IntN(3) == 0 {
			d = -d
		}
		i := rand.IntN(n)
		nodes[i].ShiftClock(d)
		injected["clock jump"]++
		// One fault at a time: the node is detected at its next call and
		// recovered by copy; wait until it has its marker and no recovery.
		time.Sleep(time.Second)
		waitFor := time.Now().Add(10 * time.Second)
		for time.Now().Before(waitFor) {
			ctx := context.Background()
			if admin[i].Exists(ctx, "lockproxy:intact").Val() == 1 && admin[i].Exists(ctx, "lockproxy:recovery").Val() == 0 {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	close(stop)
	wg.Wait()

	for _, e := range other {
		t.Errorf("LOCK: %s", e)
	}
	overlaps, disorders, refused := ck.check()
	for _, o := range overlaps {
		t.Error("overlap: " + o)
	}
	for _, d := range disorders {
		t.Error("fence order: " + d)
	}
	for _, r := range refused {
		t.Log("refused by the storage: " + r)
	}
	t.Logf("%d nodes, %v, 2 proxy processes: %d LOCK attempts, %d grants, %d not acquired after the wait, %d NOQUORUM (%.1f%%); faults %v; %d overlaps, %d fences out of order, %d stale fences refused by the storage",
		n, run, attempts, grants, notGotten, noQuorum, 100*float64(noQuorum)/float64(max(attempts, 1)), injected, len(overlaps), len(disorders), len(refused))
	if grants < 100 {
		t.Errorf("only %d grants: the run proves little", grants)
	}
}

// fenceChecker is the independent checker of TestChaosProxies: it records
// each holding as its client saw it, and plays the storage that the locks
// protect, which refuses a fence not larger than one it has accepted.
type fenceChecker struct {
	mu       sync.Mutex
	last     map[string]int64 // the largest fence accepted, per resource
	refused  []string
	holdings []proxyHolding
}

type proxyHolding struct {
	resource   string
	fence      int64
	accepted   bool      // the storage took the fence
	sent       time.Time // the LOCK was sent
	start, end time.Time // the reply was read; the validity ran out or the client released
}

// hold records a holding whose LOCK was sent at sent and that began at
// start and may last until end, and presents its fence to the storage.
func (c *fenceChecker) hold(resource string, fence int64, sent, start, end time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	accepted := fence > c.last[resource]
	if accepted {
		c.last[resource] = fence
	} else {
		c.refused = append(c.refused, fmt.Sprintf("%s: fence %d presented after %d", resource, fence, c.last[resource]))
	}
	c.holdings = append(c.holdings, proxyHolding{resource, fence, accepted, sent, start, end})
}

// release ends the holding of resource with fence at t.
func (c *fenceChecker) release(resource string, fence int64, t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := len(c.holdings) - 1; i >= 0; i-- {
		if h := &c.holdings[i]; h.resource == resource && h.fence == fence {
			h.end = t
			return
		}
	}
}

// check returns the accepted holdings of one resource that overlapped,
// the pairs of holdings whose fences broke the order (a LOCK sent after a
// holding ended got a fence not larger than that holding's), and the
// fences the storage refused.
func (c *fenceChecker) check() (overlaps, disorders, refused []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	hs := slices.Clone(c.holdings)
	slices.SortFunc(hs, func(a, b proxyHolding) int { return a.start.Compare(b.start) })
	for i, h := range hs {
		for _, prev := range hs[:i] {
			if prev.resource == h.resource && prev.accepted && h.accepted && h.start.Before(prev.end) {
				overlaps = append(overlaps, fmt.Sprintf("%s: fence %d began %v before fence %d ended", h.resource, h.fence, prev.end.Sub(h.start), prev.fence))
			}
		}
	}
	for _, h := range hs {
		for _, prev := range hs {
			if prev.resource == h.resource && !prev.end.After(h.sent) && h.fence <= prev.fence {
				disorders = append(disorders, fmt.Sprintf("%s: fence %d sent %v after fence %d ended", h.resource, h.fence, h.sent.Sub(prev.end), prev.fence))
			}
		}
	}
	return overlaps, disorders, c.refused
}

// TestFenceChecker feeds the checker holdings of each kind it must tell
// apart: the chaos test's verdicts are only as good as the checker's.
func TestFenceChecker(t *testing.T) {
	at := func(ms int) time.Time { return time.Unix(1000, 0).Add(time.Duration(ms) * time.Millisecond) }
	ck := &fenceChecker{last: map[string]int64{}}
	ck.hold("a", 5, at(0), at(1), at(100))
	ck.release("a", 5, at(10))
	ck.hold("a", 7, at(5), at(20), at(120))  // after the release: fine
	ck.hold("a", 6, at(2), at(30), at(130))  // stalled reply: refused, not an overlap
	ck.hold("a", 8, at(25), at(40), at(140)) // accepted while 7 lasts: overlap
	ck.hold("b", 9, at(0), at(1), at(2))
	ck.hold("b", 3, at(3), at(4), at(5)) // sent after 9 ended: out of order (and refused)
	overlaps, disorders, refused := ck.check()
	if len(overlaps) != 1 || !strings.Contains(overlaps[0], "fence 8") {
		t.Errorf("overlaps %q, want fence 8 over 7", overlaps)
	}
	if len(disorders) != 1 || !strings.Contains(disorders[0], "fence 3") {
		t.Errorf("disorders %q, want fence 3 after 9", disorders)
	}
	if len(refused) != 2 {
		t.Errorf("refused %q, want fences 6 and 3", refused)
	}
}
