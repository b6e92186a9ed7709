// Command lockbench compares lockproxy's LOCK/UNLOCK with the Redlock library
// github.com/go-redsync/redsync/v4 (go-redis v9 pools) talking straight to the
// same lock nodes.
//
// Two scenarios run in interleaved rounds and are summarised as markdown
// tables of medians (min–max over rounds):
//
//   - uncontended: -clients goroutines, each with its own connection (proxy)
//     or mutex (redsync), LOCK and UNLOCK their own resource in a loop for
//     -duration. Reported: LOCK+UNLOCK pairs per second and the latency of
//     one pair.
//   - contended: -contenders goroutines compete for one resource and hold it
//     for -hold before releasing it and asking again at once. Through the
//     proxy they use LOCK ... WAIT; redsync uses its default retry settings
//     (32 tries, 50–250 ms apart) and a failed Lock is simply called again.
//     Reported: acquisitions per second, the wait from asking to holding
//     (p50/p99), fairness (fewest/most acquisitions of one client), how often
//     the client that just released is the next holder, and overlapping
//     holders (which must be 0).
//
// With -proxy-pid and -node-pids, each scenario also reports the CPU time
// per pair (or acquisition) of this benchmark's clients, the proxy and the
// lock nodes, read from /proc around every run, and how busy the machine
// was: see cpu.go.
//
// Every client uses go-redis with RESP2 and no CLIENT SETINFO, so neither
// side pays for connection set-up the other does not.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-redsync/redsync/v4"
	redsyncredis "github.com/go-redsync/redsync/v4/redis"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"
)

type config struct {
	proxy        string
	nodes        []string
	rounds       int
	duration     time.Duration
	contDur      time.Duration
	warmup       time.Duration
	clients      int
	contenders   int
	hold         time.Duration
	ttl          time.Duration
	poolSize     int
	only         string
	maxWaitCall  time.Duration
	proxyPid     int    // for CPU accounting; 0: none
	lockfloor    string // bench/lockfloor's address; empty: no reference runs
	lockfloorPid int    // for CPU accounting
	nodePids     []int  // for CPU accounting
	forms        []form // the lock family's forms measured next to LOCK, uncontended
	nodeStats    bool   // read the nodes' INFO commandstats around every run (nodestats.go)
}

// form is one of the lock family's acquisitions, measured like LOCK: the
// command and the arguments after the ttl ("RLOCK", or "LOCK" with
// "PERMITS 4").
type form struct {
	name string
	cmd  string
	args []any
}

// parseForms parses -forms: comma-separated "RLOCK" and "PERMITS k".
func parseForms(s string) ([]form, error) {
	var out []form
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		switch {
		case f == "":
		case strings.EqualFold(f, "RLOCK"):
			out = append(out, form{name: "RLOCK", cmd: "RLOCK"})
		case strings.HasPrefix(strings.ToUpper(f), "PERMITS "):
			k, err := strconv.Atoi(strings.TrimSpace(f[len("PERMITS "):]))
			if err != nil || k < 1 {
				return nil, fmt.Errorf("%q: want PERMITS and a positive k", f)
			}
			out = append(out, form{name: "LOCK PERMITS " + strconv.Itoa(k), cmd: "LOCK", args: []any{"PERMITS", k}})
		default:
			return nil, fmt.Errorf("%q: want RLOCK or PERMITS k", f)
		}
	}
	return out, nil
}

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "lockbench:", err)
		os.Exit(1)
	}
}

func run(args []string, out io.Writer) error {
	var cfg config
	fs := flag.NewFlagSet("lockbench", flag.ContinueOnError)
	fs.StringVar(&cfg.proxy, "proxy", "127.0.0.1:6380", "lockproxy address")
	nodes := fs.String("nodes", "", "comma-separated lock node addresses (the proxy's -lock-nodes)")
	fs.IntVar(&cfg.rounds, "rounds", 3, "interleaved rounds")
	fs.DurationVar(&cfg.duration, "duration", 3*time.Second, "length of one uncontended run")
	fs.DurationVar(&cfg.contDur, "contended-duration", 3*time.Second, "length of one contended run")
	fs.DurationVar(&cfg.warmup, "warmup", 500*time.Millisecond, "unreported warm-up run of each scenario before the rounds")
	fs.IntVar(&cfg.clients, "clients", 50, "concurrent clients, uncontended")
	fs.IntVar(&cfg.contenders, "contenders", 8, "concurrent clients, contended")
	fs.DurationVar(&cfg.hold, "hold", time.Millisecond, "how long a contended holder keeps the lock")
	fs.DurationVar(&cfg.ttl, "ttl", 10*time.Second, "lock ttl (proxy ttl-ms and redsync expiry)")
	fs.IntVar(&cfg.poolSize, "redsync-pool", 0, "go-redis PoolSize per lock node for redsync (0: as many as clients)")
	fs.StringVar(&cfg.only, "only", "", "run only \"uncontended\" or \"contended\", or \"forms\": LOCK against MLOCK of 1, 3 and 10 resources, or \"reentrant\" (LOCK REENTRANT and re-entry next to plain LOCK, see reentrant.go), or \"plain\" (the proxy's LOCK+UNLOCK alone, for an A/B of two builds), or \"waits\" (the proxy's contended LOCK ... WAIT alone, for the same); forms, reentrant, plain and waits are not run by default")
	fs.DurationVar(&cfg.maxWaitCall, "max-wait", 10*time.Second, "largest WAIT of one LOCK call (at most the proxy's lock.max_wait)")
	fs.IntVar(&cfg.proxyPid, "proxy-pid", 0, "the proxy's process id: report its CPU time per pair (with -node-pids)")
	nodePids := fs.String("node-pids", "", "comma-separated process ids of the lock nodes: report their CPU time per pair")
	fs.StringVar(&cfg.lockfloor, "lockfloor", "", "bench/lockfloor's address: run the uncontended scenario through it too, as a reference")
	fs.IntVar(&cfg.lockfloorPid, "lockfloor-pid", 0, "lockfloor's process id: report its CPU time per pair (with -proxy-pid)")
	fs.BoolVar(&cfg.nodeStats, "node-stats", false, "read the lock nodes' INFO commandstats around every run: report node commands and script calls per operation")
	forms := fs.String("forms", "", "comma-separated forms to measure next to LOCK, uncontended: RLOCK, PERMITS k")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var err error
	if cfg.forms, err = parseForms(*forms); err != nil {
		return fmt.Errorf("-forms: %w", err)
	}
	if cfg.nodePids, err = parsePids(*nodePids); err != nil {
		return fmt.Errorf("-node-pids: %w", err)
	}
	if (cfg.proxyPid > 0) != (len(cfg.nodePids) > 0) {
		return errors.New("-proxy-pid and -node-pids go together")
	}
	if cfg.lockfloor != "" && (cfg.lockfloorPid > 0) != (cfg.proxyPid > 0) {
		return errors.New("-lockfloor-pid and -proxy-pid go together")
	}
	if *nodes == "" {
		return errors.New("-nodes is required")
	}
	cfg.nodes = strings.Split(*nodes, ",")
	if cfg.poolSize == 0 {
		cfg.poolSize = max(cfg.clients, cfg.contenders)
	}
	if cfg.rounds < 1 || cfg.clients < 1 || cfg.contenders < 1 {
		return errors.New("-rounds, -clients and -contenders must be positive")
	}

	b, err := newBench(cfg)
	if err != nil {
		return err
	}
	defer b.close()

	runUnc := cfg.only == "" || cfg.only == "uncontended"
	runCont := cfg.only == "" || cfg.only == "contended"
	runForms := cfg.only == "forms"
	runRe := cfg.only == "reentrant"
	runPlain := cfg.only == "plain"
	runWaits := cfg.only == "waits"
	type scenario struct {
		name string
		d    time.Duration
		fn   func(time.Duration) (result, error)
		pid  int // the proxy whose CPU time the run reports
	}
	// Each group's scenarios run one after the other in every round, the
	// first one first in the first round, the next one in the next round.
	var groups [][]scenario
	if runUnc {
		g := []scenario{
			{"proxy uncontended", cfg.duration, b.proxyUncontended, cfg.proxyPid},
			{"redsync uncontended", cfg.duration, b.redsyncUncontended, cfg.proxyPid},
		}
		if b.lockfloor != nil {
			g = append(g, scenario{"lockfloor uncontended", cfg.duration, b.lockfloorUncontended, cfg.lockfloorPid})
		}
		for _, f := range cfg.forms {
			g = append(g, scenario{"proxy uncontended " + f.name, cfg.duration, func(d time.Duration) (result, error) {
				return b.uncontended(b.proxy, "proxy", d, f)
			}, cfg.proxyPid})
		}
		groups = append(groups, g)
	}
	if runCont {
		groups = append(groups, []scenario{
			{"proxy contended", cfg.contDur, b.proxyContended, cfg.proxyPid},
			{"redsync contended", cfg.contDur, b.redsyncContended, cfg.proxyPid},
		})
	}
	if runForms {
		var g []scenario
		names, fns := b.formScenarios()
		for i := range names {
			g = append(g, scenario{names[i], cfg.duration, fns[i], cfg.proxyPid})
		}
		groups = append(groups, g)
	}
	if runRe {
		groups = append(groups, []scenario{
			{"plain", cfg.duration, b.plainPairs, cfg.proxyPid},
			{"reentrant", cfg.duration, b.reentrantPairs, cfg.proxyPid},
			{"re-entry", cfg.duration, b.reentryPairs, cfg.proxyPid},
		})
	}
	if runPlain {
		groups = append(groups, []scenario{{"plain", cfg.duration, b.plainPairs, cfg.proxyPid}})
	}
	if runWaits {
		groups = append(groups, []scenario{{"proxy contended", cfg.contDur, b.proxyContended, cfg.proxyPid}})
	}
	if cfg.warmup > 0 {
		for _, g := range groups {
			for _, s := range g {
				if _, err := s.fn(cfg.warmup); err != nil {
					return fmt.Errorf("warm-up %s: %w", s.name, err)
				}
			}
		}
	}
	results := map[string][]result{}
	var floors []floor // one per round, after its contended runs
	for r := range cfg.rounds {
		for _, g := range groups {
			k := r % len(g)
			for _, s := range slices.Concat(g[k:], g[:k]) {
				res, err := b.measure(s.fn, s.d, s.pid)
				if err != nil {
					return fmt.Errorf("round %d, %s: %w", r+1, s.name, err)
				}
				fmt.Fprintf(os.Stderr, "lockbench: round %d %-20s %s\n", r+1, s.name, res.summary())
				results[s.name] = append(results[s.name], res)
			}
		}
		if runCont {
			f, err := b.measureFloor(floorSamples)
			if err != nil {
				return fmt.Errorf("round %d, gap floor: %w", r+1, err)
			}
			floors = append(floors, f)
		}
	}
	if runUnc {
		printUncontended(out, cfg, results["proxy uncontended"], results["redsync uncontended"])
		if b.lockfloor != nil {
			printLockfloor(out, results["proxy uncontended"], results["lockfloor uncontended"], results["redsync uncontended"])
		}
		if len(cfg.forms) > 0 {
			printFamilyForms(out, cfg, results)
		}
	}
	if runCont {
		printContended(out, cfg, results["proxy contended"], results["redsync contended"], floors)
	}
	if runForms {
		printForms(out, cfg, results)
	}
	if runRe {
		printReentrant(out, cfg, results["plain"], results["reentrant"], results["re-entry"])
	}
	if runPlain {
		printPlain(out, cfg, results["plain"])
	}
	if runWaits {
		printWaits(out, cfg, results["proxy contended"])
	}
	return nil
}

// bench holds the clients of both sides.
type bench struct {
	cfg       config
	proxy     *redis.Client
	lockfloor *redis.Client // nil without -lockfloor
	nodes     []*redis.Client
	rs        *redsync.Redsync
	ttlArg    string
	runs      atomic.Int64 // numbers the runs, so that no run meets a lock an earlier one leaked
}

// resourceName returns a name unique to this run, client and generation. A
// client whose LOCK or UNLOCK failed (a node timed out on a loaded machine)
// moves on to the next generation instead of waiting for the ttl of a lock
// that may have been left behind.
func resourceName(side string, run int64, client, gen int) string {
	return fmt.Sprintf("bench:%s:%d:%d:%d", side, run, client, gen)
}

func newBench(cfg config) (*bench, error) {
	b := &bench{cfg: cfg, ttlArg: strconv.FormatInt(cfg.ttl.Milliseconds(), 10)}
	b.proxy = redis.NewClient(&redis.Options{
		Addr:            cfg.proxy,
		Protocol:        2,
		DisableIdentity: true,
		PoolSize:        max(cfg.clients, cfg.contenders) + 1,
		ReadTimeout:     cfg.maxWaitCall + 10*time.Second, // LOCK ... WAIT blocks
		MaxRetries:      -1,
	})
	if cfg.lockfloor != "" {
		b.lockfloor = redis.NewClient(&redis.Options{
			Addr:            cfg.lockfloor,
			Protocol:        2,
			DisableIdentity: true,
			PoolSize:        cfg.clients + 1,
			MaxRetries:      -1,
		})
	}
	var pools []redsyncredis.Pool
	for _, addr := range cfg.nodes {
		c := redis.NewClient(&redis.Options{
			Addr:            addr,
			Protocol:        2,
			DisableIdentity: true,
			PoolSize:        cfg.poolSize,
		})
		b.nodes = append(b.nodes, c)
		pools = append(pools, goredis.NewPool(c))
	}
	b.rs = redsync.New(pools...)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := b.proxy.Ping(ctx).Err(); err != nil {
		b.close()
		return nil, fmt.Errorf("proxy %s: %w", cfg.proxy, err)
	}
	if b.lockfloor != nil {
		if err := b.lockfloor.Ping(ctx).Err(); err != nil {
			b.close()
			return nil, fmt.Errorf("lockfloor %s: %w", cfg.lockfloor, err)
		}
	}
	for i, c := range b.nodes {
		if err := c.Ping(ctx).Err(); err != nil {
			b.close()
			return nil, fmt.Errorf("lock node %s: %w", cfg.nodes[i], err)
		}
	}
	return b, nil
}

func (b *bench) close() {
	b.proxy.Close()
	if b.lockfloor != nil {
		b.lockfloor.Close()
	}
	for _, c := range b.nodes {
		c.Close()
	}
}

// result is one run of one scenario.
type result struct {
	elapsed  time.Duration
	ops      int             // pairs (uncontended) or acquisitions (contended)
	lat      []time.Duration // pair latency, or wait for the lock
	perCli   []int           // acquisitions per client (contended)
	seq      []int32         // holder of each acquisition, in order (contended)
	gaps     []time.Duration // from a holder's UNLOCK call to the next holder's LOCK reply (contended)
	holds    []time.Duration // from a holder's LOCK reply to its UNLOCK call (contended)
	acquire  []time.Duration // the LOCK or MLOCK call alone (forms)
	overlaps int64           // acquisitions while another client held the lock
	failed   int64           // failed LOCK calls (redsync ErrFailed; proxy nil reply)
	errs     int64           // other errors
	firstErr error
	cpu      cpuSample // CPU time during the run, with -proxy-pid and -node-pids
	node     nodeStats // the nodes' commands during the run, with -node-stats
}

// measure runs fn for d and, when the configuration names the processes,
// adds the CPU time they and the machine used meanwhile.
func (b *bench) measure(fn func(time.Duration) (result, error), d time.Duration, proxyPid int) (result, error) {
	var statsBefore nodeStats
	if b.cfg.nodeStats {
		var err error
		if statsBefore, err = b.readNodeStats(); err != nil {
			return result{}, err
		}
	}
	var before cpuSample
	if proxyPid > 0 {
		var err error
		if before, err = sampleCPU(proxyPid, b.cfg.nodePids); err != nil {
			return result{}, err
		}
	}
	res, err := fn(d)
	if err != nil {
		return res, err
	}
	if proxyPid > 0 {
		after, err := sampleCPU(proxyPid, b.cfg.nodePids)
		if err != nil {
			return res, err
		}
		res.cpu = after.sub(before)
	}
	if b.cfg.nodeStats {
		after, err := b.readNodeStats()
		if err != nil {
			return res, err
		}
		res.node = after.sub(statsBefore, len(b.nodes))
	}
	return res, nil
}

func (r result) rate() float64 { return float64(r.ops) / r.elapsed.Seconds() }

func (r result) quantile(q float64) time.Duration { return quantile(r.lat, q) }

// mean returns the mean of d, 0 for none.
func mean(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	var total time.Duration
	for _, x := range d {
		total += x
	}
	return total / time.Duration(len(d))
}

// quantile returns the q-quantile of d, 0 for none.
func quantile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}

func (r result) fairness() float64 {
	if len(r.perCli) == 0 || slices.Max(r.perCli) == 0 {
		return 0
	}
	return float64(slices.Min(r.perCli)) / float64(slices.Max(r.perCli))
}

// reacquire is the share of acquisitions made by the client that held the
// lock just before.
func (r result) reacquire() float64 {
	if len(r.seq) < 2 {
		return 0
	}
	same := 0
	for i := 1; i < len(r.seq); i++ {
		if r.seq[i] == r.seq[i-1] {
			same++
		}
	}
	return float64(same) / float64(len(r.seq)-1)
}

func (r result) summary() string {
	s := fmt.Sprintf("%9.0f/s p50 %s p99 %s", r.rate(), ms(r.quantile(0.5)), ms(r.quantile(0.99)))
	if r.perCli != nil {
		s += fmt.Sprintf(" gap p50 %s p99 %s fairness %.2f reacquire %.0f%% overlaps %d",
			ms(quantile(r.gaps, 0.5)), ms(quantile(r.gaps, 0.99)), r.fairness(), 100*r.reacquire(), r.overlaps)
	}
	if r.failed > 0 || r.errs > 0 {
		s += fmt.Sprintf(" failed %d errors %d", r.failed, r.errs)
	}
	if r.firstErr != nil {
		s += fmt.Sprintf(" (first error: %v)", r.firstErr)
	}
	return s + r.nodeSummary()
}

// collector gathers the workers' outcomes of one run.
type collector struct {
	mu       sync.Mutex
	res      result
	unlockAt atomic.Int64 // when the last holder called UNLOCK (unix ns); 0 once a gap used it
	holders  atomic.Int32
	overlaps atomic.Int64
	failed   atomic.Int64
	errs     atomic.Int64
}

func newCollector(clients int, contended bool) *collector {
	c := &collector{}
	if contended {
		c.res.perCli = make([]int, clients)
	}
	return c
}

func (c *collector) err(err error) {
	c.errs.Add(1)
	c.mu.Lock()
	if c.res.firstErr == nil {
		c.res.firstErr = err
	}
	c.mu.Unlock()
}

// add counts a worker's operations, with their latencies and, where the
// scenario measures them, the acquisition times.
func (c *collector) add(lat, acquire []time.Duration) {
	c.mu.Lock()
	c.res.ops += len(lat)
	c.res.lat = append(c.res.lat, lat...)
	c.res.acquire = append(c.res.acquire, acquire...)
	c.mu.Unlock()
}

// acquired records that client now holds the contended lock, having asked
// at asked and got it at got. It runs while the caller holds the lock, so
// the order of seq is the order of holders.
func (c *collector) acquired(client int, asked, got time.Time) {
	if c.holders.Add(1) != 1 {
		c.overlaps.Add(1)
	}
	unlocked := c.unlockAt.Swap(0)
	c.mu.Lock()
	c.res.ops++
	c.res.perCli[client]++
	c.res.seq = append(c.res.seq, int32(client))
	c.res.lat = append(c.res.lat, got.Sub(asked))
	if unlocked != 0 {
		c.res.gaps = append(c.res.gaps, got.Sub(time.Unix(0, unlocked)))
	}
	c.mu.Unlock()
}

func (c *collector) released() { c.holders.Add(-1) }

// unlocking records that the holder, which got the lock at got, is about
// to call UNLOCK: the hold it measured, and the start of the gap to the
// next holder's acquisition.
func (c *collector) unlocking(got time.Time) {
	now := time.Now()
	c.mu.Lock()
	c.res.holds = append(c.res.holds, now.Sub(got))
	c.mu.Unlock()
	c.unlockAt.Store(now.UnixNano())
}

// runWorkers runs n workers until all return and fills in elapsed and the
// counters.
func (c *collector) runWorkers(n int, worker func(i int)) result {
	start := time.Now()
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { worker(i) })
	}
	wg.Wait()
	c.res.elapsed = time.Since(start)
	c.res.overlaps = c.overlaps.Load()
	c.res.failed = c.failed.Load()
	c.res.errs = c.errs.Load()
	return c.res
}

func (b *bench) proxyUncontended(d time.Duration) (result, error) {
	return b.uncontended(b.proxy, "proxy", d, plainLock)
}

func (b *bench) lockfloorUncontended(d time.Duration) (result, error) {
	return b.uncontended(b.lockfloor, "lockfloor", d, plainLock)
}

// plainLock is the form of a plain LOCK.
var plainLock = form{name: "LOCK", cmd: "LOCK"}

// uncontended runs the clients' acquire+UNLOCK loop (acquiring as f says)
// through c, lockproxy or lockfloor, for d.
func (b *bench) uncontended(c *redis.Client, side string, d time.Duration, f form) (result, error) {
	col := newCollector(b.cfg.clients, false)
	ctx := context.Background()
	conns, err := clientConns(c, b.cfg.clients)
	if err != nil {
		return result{}, err
	}
	defer closeAll(conns)
	run := b.runs.Add(1)
	stop := time.Now().Add(d)
	res := col.runWorkers(b.cfg.clients, func(i int) {
		conn := conns[i]
		gen := 0
		resource := resourceName(side, run, i, gen)
		var lat []time.Duration
		for time.Now().Before(stop) {
			t0 := time.Now()
			v, err := conn.Do(ctx, append([]any{f.cmd, resource, b.ttlArg}, f.args...)...).Slice()
			if err != nil {
				if errors.Is(err, redis.Nil) {
					col.failed.Add(1)
				} else {
					col.err(err)
				}
				gen++ // the failed attempt's clean-up may have timed out too
				resource = resourceName(side, run, i, gen)
				continue
			}
			token, _ := v[0].(string)
			n, err := conn.Do(ctx, "UNLOCK", resource, token).Int()
			if err != nil || n != 1 {
				col.err(fmt.Errorf("UNLOCK = %d, %v", n, err))
				gen++
				resource = resourceName(side, run, i, gen)
				continue
			}
			lat = append(lat, time.Since(t0))
		}
		col.add(lat, nil)
	})
	return res, nil
}

func (b *bench) redsyncUncontended(d time.Duration) (result, error) {
	col := newCollector(b.cfg.clients, false)
	run := b.runs.Add(1)
	stop := time.Now().Add(d)
	res := col.runWorkers(b.cfg.clients, func(i int) {
		gen := 0
		m := b.rs.NewMutex(resourceName("redsync", run, i, gen), redsync.WithExpiry(b.cfg.ttl))
		var lat []time.Duration
		for time.Now().Before(stop) {
			t0 := time.Now()
			if err := m.Lock(); err != nil {
				if errors.Is(err, redsync.ErrFailed) {
					col.failed.Add(1)
				} else {
					col.err(err)
				}
				gen++
				m = b.rs.NewMutex(resourceName("redsync", run, i, gen), redsync.WithExpiry(b.cfg.ttl))
				continue
			}
			if ok, err := m.Unlock(); !ok || err != nil {
				col.err(fmt.Errorf("Unlock = %v, %v", ok, err))
				gen++
				m = b.rs.NewMutex(resourceName("redsync", run, i, gen), redsync.WithExpiry(b.cfg.ttl))
				continue
			}
			lat = append(lat, time.Since(t0))
		}
		col.add(lat, nil)
	})
	return res, nil
}

func (b *bench) proxyContended(d time.Duration) (result, error) {
	n := b.cfg.contenders
	col := newCollector(n, true)
	ctx := context.Background()
	conns, err := clientConns(b.proxy, n)
	if err != nil {
		return result{}, err
	}
	defer closeAll(conns)
	resource := resourceName("proxy", b.runs.Add(1), -1, 0)
	stop := time.Now().Add(d)
	res := col.runWorkers(n, func(i int) {
		conn := conns[i]
		for {
			t0 := time.Now()
			left := stop.Sub(t0)
			if left <= 0 {
				return
			}
			wait := (min(left, b.cfg.maxWaitCall) + time.Millisecond - 1) / time.Millisecond
			v, err := conn.Do(ctx, "LOCK", resource, b.ttlArg, "WAIT", int64(wait)).Slice()
			if err != nil {
				if errors.Is(err, redis.Nil) {
					if time.Now().Before(stop) { // not just the end of the run
						col.failed.Add(1)
					}
				} else {
					col.err(err)
				}
				continue
			}
			got := time.Now()
			token, _ := v[0].(string)
			if got.Before(stop) {
				col.acquired(i, t0, got)
				time.Sleep(b.cfg.hold)
				col.released()
				col.unlocking(got)
			}
			if n, err := conn.Do(ctx, "UNLOCK", resource, token).Int(); err != nil || n != 1 {
				col.err(fmt.Errorf("UNLOCK = %d, %v", n, err))
			}
		}
	})
	return res, nil
}

func (b *bench) redsyncContended(d time.Duration) (result, error) {
	n := b.cfg.contenders
	col := newCollector(n, true)
	resource := resourceName("redsync", b.runs.Add(1), -1, 0)
	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(d))
	defer cancel()
	stop, _ := ctx.Deadline()
	res := col.runWorkers(n, func(i int) {
		m := b.rs.NewMutex(resource, redsync.WithExpiry(b.cfg.ttl))
		for {
			t0 := time.Now()
			var err error
			for {
				// A failed Lock (32 tries) is called again: the client
				// still wants the lock, and its wait goes on.
				if err = m.LockContext(ctx); err == nil || ctx.Err() != nil {
					break
				}
				col.failed.Add(1)
			}
			if err != nil {
				return // the run is over
			}
			got := time.Now()
			if got.Before(stop) {
				col.acquired(i, t0, got)
				time.Sleep(b.cfg.hold)
				col.released()
				col.unlocking(got)
			}
			if ok, err := m.Unlock(); !ok || err != nil {
				col.err(fmt.Errorf("Unlock = %v, %v", ok, err))
			}
		}
	})
	return res, nil
}

// floorSamples is how many samples of each part of a floor are taken.
const floorSamples = 500

// floor is the least a handoff gap through the proxy costs on this machine,
// measured with no lock work at all, each sample after sleeping for one
// hold, so that the processes are as idle as after a real one. A gap holds
// a round trip from the holder to the proxy and back (one: a PING to a lock
// node) and the proxy's round to the nodes (round: a PING to every lock
// node at once, until all answered). Both are p50s.
type floor struct{ one, round time.Duration }

func (f floor) gap() time.Duration { return f.one + f.round }

// measureFloor measures a floor with n samples of each part, on a
// connection of its own to each lock node.
func (b *bench) measureFloor(n int) (floor, error) {
	ctx := context.Background()
	conns := make([]*redis.Conn, len(b.nodes))
	for i, c := range b.nodes {
		conns[i] = c.Conn()
		defer conns[i].Close()
		if err := conns[i].Ping(ctx).Err(); err != nil { // connects
			return floor{}, err
		}
	}
	one := make([]time.Duration, n)
	round := make([]time.Duration, n)
	errs := make([]error, len(conns))
	for i := range n {
		time.Sleep(b.cfg.hold)
		t0 := time.Now()
		if err := conns[0].Ping(ctx).Err(); err != nil {
			return floor{}, err
		}
		one[i] = time.Since(t0)

		time.Sleep(b.cfg.hold)
		t0 = time.Now()
		var wg sync.WaitGroup
		for j, c := range conns {
			wg.Go(func() { errs[j] = c.Ping(ctx).Err() })
		}
		wg.Wait()
		round[i] = time.Since(t0)
		if err := errors.Join(errs...); err != nil {
			return floor{}, err
		}
	}
	return floor{one: quantile(one, 0.5), round: quantile(round, 0.5)}, nil
}

// proxyConns returns n dedicated, connected proxy connections: one per
// client, as n separate applications would have.
// clientConns returns n connections of c, each a client of its own.
func clientConns(c *redis.Client, n int) ([]*redis.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conns := make([]*redis.Conn, n)
	for i := range conns {
		conns[i] = c.Conn()
		if err := conns[i].Ping(ctx).Err(); err != nil {
			closeAll(conns[:i+1])
			return nil, fmt.Errorf("connection to %s: %w", c.Options().Addr, err)
		}
	}
	return conns, nil
}

func closeAll(conns []*redis.Conn) {
	for _, c := range conns {
		c.Close()
	}
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", msf(d)) }

// stat summarises one metric over rounds: median (min–max).
func stat(rs []result, f func(result) float64) (med, lo, hi float64) {
	v := make([]float64, len(rs))
	for i, r := range rs {
		v[i] = f(r)
	}
	return spread(v)
}

// spread returns the median, the least and the largest of v, which it
// sorts.
func spread(v []float64) (med, lo, hi float64) {
	slices.Sort(v)
	n := len(v)
	if n%2 == 1 {
		med = v[n/2]
	} else {
		med = (v[n/2-1] + v[n/2]) / 2
	}
	return med, v[0], v[n-1]
}

func cell(rs []result, format string, f func(result) float64) string {
	med, lo, hi := stat(rs, f)
	if len(rs) == 1 {
		return fmt.Sprintf(format, med)
	}
	return fmt.Sprintf(format+" ("+format+"–"+format+")", med, lo, hi)
}

func ratio(a, b []result, f func(result) float64) string { return ratioOf(a, f, b, f) }

// ratioOf is the median of fa over a divided by that of fb over b.
func ratioOf(a []result, fa func(result) float64, b []result, fb func(result) float64) string {
	ma, _, _ := stat(a, fa)
	mb, _, _ := stat(b, fb)
	if mb == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2fx", ma/mb)
}

func sum(rs []result, f func(result) int64) int64 {
	var n int64
	for _, r := range rs {
		n += f(r)
	}
	return n
}

func msOf(q float64) func(result) float64 {
	return func(r result) float64 { return msf(r.quantile(q)) }
}

func printUncontended(w io.Writer, cfg config, px, rs []result) {
	fmt.Fprintf(w, "\n#### Lock path, uncontended: %d clients, each LOCK+UNLOCK of its own resource (%d rounds × %v, median (min–max))\n\n",
		cfg.clients, cfg.rounds, cfg.duration)
	fmt.Fprintln(w, "| metric | lockproxy LOCK/UNLOCK | redsync v4 direct | proxy/redsync |")
	fmt.Fprintln(w, "|---|---|---|---|")
	rate := func(r result) float64 { return r.rate() }
	fmt.Fprintf(w, "| pairs/s | %s | %s | **%s** |\n", cell(px, "%.0f", rate), cell(rs, "%.0f", rate), ratio(px, rs, rate))
	fmt.Fprintf(w, "| pair latency p50 (ms) | %s | %s | %s |\n", cell(px, "%.2f", msOf(0.5)), cell(rs, "%.2f", msOf(0.5)), ratio(px, rs, msOf(0.5)))
	fmt.Fprintf(w, "| pair latency p99 (ms) | %s | %s | %s |\n", cell(px, "%.2f", msOf(0.99)), cell(rs, "%.2f", msOf(0.99)), ratio(px, rs, msOf(0.99)))
	fmt.Fprintf(w, "| not acquired / errors (all rounds) | %d / %d | %d / %d | |\n",
		sum(px, func(r result) int64 { return r.failed }), sum(px, func(r result) int64 { return r.errs }),
		sum(rs, func(r result) int64 { return r.failed }), sum(rs, func(r result) int64 { return r.errs }))
	printCPU(w, px, rs)
	printNodeStats(w, px, rs)
}

// printFamilyForms compares the lock family's forms with a plain LOCK, through
// the same proxy in the same rounds.
func printFamilyForms(w io.Writer, cfg config, results map[string][]result) {
	fmt.Fprintf(w, "\n#### The lock family's forms, uncontended: %d clients, each acquire+UNLOCK of its own resource (%d rounds × %v, median (min–max))\n\n",
		cfg.clients, cfg.rounds, cfg.duration)
	fmt.Fprintln(w, "| form | pairs/s | vs LOCK | pair latency p50 (ms) | p99 (ms) | not acquired / errors |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|")
	rate := func(r result) float64 { return r.rate() }
	px := results["proxy uncontended"]
	for _, f := range append([]form{plainLock}, cfg.forms...) {
		rs := px
		if f.name != plainLock.name {
			rs = results["proxy uncontended "+f.name]
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %d / %d |\n", f.name, cell(rs, "%.0f", rate), ratio(rs, px, rate),
			cell(rs, "%.2f", msOf(0.5)), cell(rs, "%.2f", msOf(0.99)),
			sum(rs, func(r result) int64 { return r.failed }), sum(rs, func(r result) int64 { return r.errs }))
	}
}

// printCPU adds the rows of CPU time per pair (or acquisition) when every
// run measured it. The proxy's row is empty for redsync, which does not
// use it, and the sum leaves it out there.
func printCPU(w io.Writer, px, rs []result) {
	for _, r := range slices.Concat(px, rs) {
		if !r.cpu.measured() {
			return
		}
	}
	self := func(r result) float64 { return usPer(r.cpu.self, r) }
	proxy := func(r result) float64 { return usPer(r.cpu.proxy, r) }
	nodes := func(r result) float64 { return usPer(r.cpu.nodes, r) }
	pxAll := func(r result) float64 { return usPer(r.cpu.self+r.cpu.proxy+r.cpu.nodes, r) }
	rsAll := func(r result) float64 { return usPer(r.cpu.self+r.cpu.nodes, r) }
	busy := func(r result) float64 { return r.cpu.busyPercent() }
	fmt.Fprintf(w, "| CPU µs per operation: the benchmark's clients (redsync: all of Redlock) | %s | %s | %s |\n", cell(px, "%.1f", self), cell(rs, "%.1f", self), ratio(px, rs, self))
	fmt.Fprintf(w, "| CPU µs per operation: lockproxy | %s | – | |\n", cell(px, "%.1f", proxy))
	fmt.Fprintf(w, "| CPU µs per operation: the lock nodes together | %s | %s | %s |\n", cell(px, "%.1f", nodes), cell(rs, "%.1f", nodes), ratio(px, rs, nodes))
	fmt.Fprintf(w, "| CPU µs per operation: all of these | %s | %s | %s |\n", cell(px, "%.1f", pxAll), cell(rs, "%.1f", rsAll), ratioOf(px, pxAll, rs, rsAll))
	fmt.Fprintf(w, "| machine busy (%% of all CPUs, any process) | %s | %s | |\n", cell(px, "%.0f%%", busy), cell(rs, "%.0f%%", busy))
}

// printLockfloor reports the reference runs through bench/lockfloor beside
// lockproxy's and redsync's of the same rounds.
func printLockfloor(w io.Writer, px, fl, rs []result) {
	fmt.Fprintf(w, "\n#### Reference: the same uncontended runs through bench/lockfloor, a minimal Redlock proxy (median (min–max))\n\n")
	fmt.Fprintln(w, "lockfloor answers LOCK with SET NX PX on every node and UNLOCK with a compare-and-delete, batched per node as lockproxy batches, and nothing else: no fences, no lost-data checks, no timeouts, no forwarding, no arrival order.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| metric | lockproxy | lockfloor | redsync v4 direct | lockproxy/redsync | lockfloor/redsync |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|")
	rate := func(r result) float64 { return r.rate() }
	fmt.Fprintf(w, "| pairs/s | %s | %s | %s | %s | **%s** |\n", cell(px, "%.0f", rate), cell(fl, "%.0f", rate), cell(rs, "%.0f", rate), ratio(px, rs, rate), ratio(fl, rs, rate))
	for _, r := range slices.Concat(px, fl, rs) {
		if !r.cpu.measured() {
			return
		}
	}
	proxy := func(r result) float64 { return usPer(r.cpu.proxy, r) }
	nodes := func(r result) float64 { return usPer(r.cpu.nodes, r) }
	all := func(r result) float64 { return usPer(r.cpu.self+r.cpu.proxy+r.cpu.nodes, r) }
	busy := func(r result) float64 { return r.cpu.busyPercent() }
	fmt.Fprintf(w, "| CPU µs per pair: the proxy | %s | %s | – | | |\n", cell(px, "%.1f", proxy), cell(fl, "%.1f", proxy))
	fmt.Fprintf(w, "| CPU µs per pair: the lock nodes together | %s | %s | %s | | |\n", cell(px, "%.1f", nodes), cell(fl, "%.1f", nodes), cell(rs, "%.1f", nodes))
	fmt.Fprintf(w, "| CPU µs per pair: clients, proxy and nodes | %s | %s | %s | | |\n", cell(px, "%.1f", all), cell(fl, "%.1f", all), cell(rs, "%.1f", all))
	fmt.Fprintf(w, "| machine busy (%% of all CPUs, any process) | %s | %s | %s | | |\n", cell(px, "%.0f%%", busy), cell(fl, "%.0f%%", busy), cell(rs, "%.0f%%", busy))
}

func printContended(w io.Writer, cfg config, px, rs []result, floors []floor) {
	fmt.Fprintf(w, "\n#### Lock path, contended: %d clients, one resource, held %v (%d rounds × %v, median (min–max))\n\n",
		cfg.contenders, cfg.hold, cfg.rounds, cfg.contDur)
	fmt.Fprintln(w, "| metric | lockproxy LOCK ... WAIT | redsync v4 default retries | proxy/redsync |")
	fmt.Fprintln(w, "|---|---|---|---|")
	rate := func(r result) float64 { return r.rate() }
	fair := func(r result) float64 { return r.fairness() }
	re := func(r result) float64 { return 100 * r.reacquire() }
	fmt.Fprintf(w, "| acquisitions/s | %s | %s | **%s** |\n", cell(px, "%.0f", rate), cell(rs, "%.0f", rate), ratio(px, rs, rate))
	fmt.Fprintf(w, "| wait p50 (ms) | %s | %s | %s |\n", cell(px, "%.2f", msOf(0.5)), cell(rs, "%.2f", msOf(0.5)), ratio(px, rs, msOf(0.5)))
	fmt.Fprintf(w, "| wait p99 (ms) | %s | %s | %s |\n", cell(px, "%.2f", msOf(0.99)), cell(rs, "%.2f", msOf(0.99)), ratio(px, rs, msOf(0.99)))
	gap := func(q float64) func(r result) float64 {
		return func(r result) float64 { return msf(quantile(r.gaps, q)) }
	}
	fmt.Fprintf(w, "| handoff gap p50 (ms): UNLOCK call to the next LOCK reply | %s | %s | %s |\n", cell(px, "%.2f", gap(0.5)), cell(rs, "%.2f", gap(0.5)), ratio(px, rs, gap(0.5)))
	fmt.Fprintf(w, "| handoff gap p99 (ms) | %s | %s | %s |\n", cell(px, "%.2f", gap(0.99)), cell(rs, "%.2f", gap(0.99)), ratio(px, rs, gap(0.99)))
	gapMean := func(r result) float64 { return msf(mean(r.gaps)) }
	holdMean := func(r result) float64 { return msf(mean(r.holds)) }
	fmt.Fprintf(w, "| handoff gap mean (ms) | %s | %s | %s |\n", cell(px, "%.2f", gapMean), cell(rs, "%.2f", gapMean), ratio(px, rs, gapMean))
	fmt.Fprintf(w, "| hold mean (ms): LOCK reply to UNLOCK call | %s | %s | %s |\n", cell(px, "%.2f", holdMean), cell(rs, "%.2f", holdMean), ratio(px, rs, holdMean))
	fmt.Fprintf(w, "| fairness: fewest/most acquisitions per client | %s | %s | |\n", cell(px, "%.2f", fair), cell(rs, "%.2f", fair))
	fmt.Fprintf(w, "| releaser re-acquires (%% of acquisitions) | %s | %s | |\n", cell(px, "%.0f%%", re), cell(rs, "%.0f%%", re))
	ov := func(r result) int64 { return r.overlaps }
	failed := func(r result) int64 { return r.failed }
	errs := func(r result) int64 { return r.errs }
	fmt.Fprintf(w, "| overlapping holders (must be 0) | %d | %d | |\n", sum(px, ov), sum(rs, ov))
	fmt.Fprintf(w, "| LOCK calls that gave up / errors (all rounds) | %d / %d | %d / %d | |\n",
		sum(px, failed), sum(px, errs), sum(rs, failed), sum(rs, errs))
	printCPU(w, px, rs)
	printNodeStats(w, px, rs)
	printGapBound(w, len(cfg.nodes), px, rs, floors)
}

// printGapBound gives the floor of the handoff gap measured in the run, and
// the gap that 1.2x redsync's acquisitions would leave after the measured
// hold: a cycle is one hold and one gap.
func printGapBound(w io.Writer, nodes int, px, rs []result, floors []floor) {
	rsRate, _, _ := stat(rs, func(r result) float64 { return r.rate() })
	if len(floors) == 0 || rsRate == 0 {
		return
	}
	part := func(f func(floor) time.Duration) string {
		v := make([]float64, len(floors))
		for i, fl := range floors {
			v[i] = msf(f(fl))
		}
		med, lo, hi := spread(v)
		return fmt.Sprintf("%.3f ms (%.3f–%.3f)", med, lo, hi)
	}
	hold, _, _ := stat(px, func(r result) float64 { return msf(mean(r.holds)) })
	cycle := 1000 / (1.2 * rsRate)
	fmt.Fprintf(w, "\nThe floor of a handoff gap through the proxy, measured after each round's contended runs with no lock work, "+
		"each sample after a sleep of one hold (p50 of %d, median of the rounds): a PING to a lock node, as the holder's UNLOCK to the proxy and back, %s; "+
		"PINGs to the %d lock nodes at once until all answered, as the proxy's round, %s; together %s. "+
		"1.2x redsync's %.0f acquisitions/s is a cycle of %.2f ms; after lockproxy's mean hold of %.2f ms that leaves %.2f ms for the gap.\n",
		floorSamples, part(func(f floor) time.Duration { return f.one }), nodes, part(func(f floor) time.Duration { return f.round }),
		part(floor.gap), rsRate, cycle, hold, cycle-hold)
}

// msf returns d in milliseconds.
func msf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
