package proxy

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/lockproxy/lockproxy/internal/redistest"
)

// startSentinelProxy serves a proxy that finds its backend through the
// group's Sentinels, and returns its address and the log entries at Info
// and above.
func startSentinelProxy(t *testing.T, g *redistest.Group) (string, *Proxy, *observer.ObservedLogs) {
	t.Helper()
	core, logs := observer.New(zap.InfoLevel)
	logger := zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel), zaptest.WrapOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
		return zapcore.NewTee(c, core)
	})))
	cfg := DefaultConfig()
	cfg.Backend.Sentinel.MasterName = g.MasterName
	cfg.Backend.Sentinel.Addrs = g.SentinelAddrs()
	p, err := New(cfg, logger)
	if err != nil {
		t.Fatal(err)
	}
	addr := serveProxy(t, p)
	waitUntil(t, 10*time.Second, "the proxy knows the primary", func() bool { return p.Backend().Primary == g.Primary.Addr })
	return addr, p, logs
}

// waitUntil polls cond every 5 ms for at most d.
func waitUntil(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// op is one command a load client sent and what came back.
type op struct {
	key          string
	start, end   time.Time
	reply        string // the first line
	ack          string // the reply to the client's WAIT after a successful write
	connectionUp bool   // false: the proxy closed the connection
}

// loadClient sends one command at a time on its own connection to the
// proxy until stopped, recording each.
type loadClient struct {
	name string
	c    net.Conn
	r    *bufio.Reader
	done chan struct{}
	wait []string // sent after each successful write

	mu  sync.Mutex
	ops []op // read directly once done is closed
}

func (lc *loadClient) snapshot() []op {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	return append([]op(nil), lc.ops...)
}

// runLoad starts a client on addr that first sends setup (each answered
// +OK) and then, in turn, cmd(seq), followed by wait when set and the
// command succeeded, until stop closes.
func runLoad(t *testing.T, addr, name string, setup [][]string, cmd func(seq int) []string, wait []string, stop <-chan struct{}) *loadClient {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	lc := &loadClient{name: name, c: nc, r: bufio.NewReader(nc), done: make(chan struct{}), wait: wait}
	for _, s := range setup {
		if line, err := lc.do(s); err != nil || line != "+OK" {
			t.Fatalf("%s: %v: %q %v", name, s, line, err)
		}
	}
	go func() {
		defer close(lc.done)
		// Paced, so that two groups failing over at once and the rest
		// of the suite leave the Sentinels enough of the machine to see
		// the new primary as up.
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for seq := 0; ; seq++ {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			args := cmd(seq)
			o := op{key: args[1], start: time.Now()}
			line, err := lc.do(args)
			o.end, o.reply, o.connectionUp = time.Now(), line, err == nil
			if err == nil && line == "+OK" && lc.wait != nil {
				o.ack, err = lc.do(lc.wait)
				o.connectionUp = err == nil
			}
			lc.mu.Lock()
			lc.ops = append(lc.ops, o)
			lc.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	return lc
}

// do sends args and reads the reply: its first line, and the bulk that
// follows a $ line.
func (lc *loadClient) do(args []string) (string, error) {
	lc.c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := lc.c.Write(encode(args)); err != nil {
		return "", err
	}
	line, err := lc.r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimSuffix(line, "\r\n")
	if n, err := strconv.Atoi(strings.TrimPrefix(line, "$")); line[0] == '$' && err == nil && n >= 0 {
		if _, err := lc.r.Discard(n + 2); err != nil {
			return "", err
		}
	}
	return line, nil
}

// monitor records the commands a server runs (MONITOR) until the test
// ends.
type monitor struct {
	mu    sync.Mutex
	lines []string
	done  chan struct{}
}

func startMonitor(t *testing.T, addr string) *monitor {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	m := &monitor{done: make(chan struct{})}
	r := bufio.NewReader(nc)
	nc.Write(encode([]string{"MONITOR"}))
	nc.SetReadDeadline(time.Now().Add(2 * time.Second))
	if line, err := r.ReadString('\n'); err != nil || line != "+OK\r\n" {
		t.Fatalf("MONITOR on %s: %q %v", addr, line, err)
	}
	nc.SetReadDeadline(time.Time{})
	go func() {
		defer close(m.done)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			m.mu.Lock()
			m.lines = append(m.lines, strings.TrimSuffix(line, "\r\n"))
			m.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		nc.Close()
		<-m.done
	})
	return m
}

// writes returns the keys of the SET commands the server ran that came
// from a client other than one of servers (a primary's replication link,
// whose address on a replica is the primary's).
func (m *monitor) writes(servers []*redistest.Server) []string {
	replication := map[string]bool{}
	for _, s := range servers {
		replication[s.Addr] = true
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for _, l := range m.lines {
		// +1700000000.123456 [0 127.0.0.1:5555] "SET" "k" "v"
		f := strings.Fields(strings.TrimPrefix(l, "+"))
		if len(f) < 5 || !strings.EqualFold(f[3], `"SET"`) {
			continue
		}
		if !replication[strings.TrimSuffix(f[2], "]")] {
			out = append(out, strings.Trim(f[4], `"`))
		}
	}
	return out
}

func TestSentinelFailover(t *testing.T) {
	for _, tt := range []struct {
		name string
		kill bool
	}{
		{"primary killed", true},
		{"SENTINEL FAILOVER", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			testFailover(t, tt.kill)
		})
	}
}

// testFailover drives clients of every kind through a failover: the
// primary killed with SIGKILL, or a failover asked of the Sentinels.
func testFailover(t *testing.T, kill bool) {
	g := redistest.StartGroup(t, "mymaster", 2, 3)
	addr, p, logs := startSentinelProxy(t, g)
	old := g.Primary

	stop := make(chan struct{})
	var clients []*loadClient
	for i := range 3 {
		name := fmt.Sprintf("shared%d", i)
		clients = append(clients, runLoad(t, addr, name, nil, func(seq int) []string {
			return []string{"SET", fmt.Sprintf("%s:%d", name, seq), "x"}
		}, nil, stop))
	}
	// A client with connection state: on a dedicated connection, in db 1.
	dedicated := runLoad(t, addr, "db1", [][]string{{"SELECT", "1"}}, func(seq int) []string {
		return []string{"SET", fmt.Sprintf("db1:%d", seq), "x"}
	}, nil, stop)
	clients = append(clients, dedicated)
	// A client that waits for both replicas after each write (WAIT): its
	// acknowledged writes survive whichever replica is promoted.
	waiter := runLoad(t, addr, "waiter", nil, func(seq int) []string {
		return []string{"SET", fmt.Sprintf("waiter:%d", seq), "x"}
	}, []string{"WAIT", "2", "1000"}, stop)
	clients = append(clients, waiter)
	reader := runLoad(t, addr, "reader", nil, func(seq int) []string {
		return []string{"GET", fmt.Sprintf("shared0:%d", seq)}
	}, nil, stop)
	sub := dial(t, addr)
	sub.do(args("SUBSCRIBE news"))

	var mon *monitor
	if !kill {
		mon = startMonitor(t, old.Addr)
	}
	// Let every client write for a moment on the first primary.
	waitUntil(t, 5*time.Second, "writes before the failover", func() bool { return countOK(dedicated) > 10 })

	w := g.WatchSwitches()
	t0 := time.Now()
	if kill {
		old.Kill()
	} else {
		g.Failover()
	}
	switchAt, payload := w.Next(t, 20*time.Second)
	primary := g.CurrentPrimary()
	t.Logf("+switch-master %q %v after the %s", payload, switchAt.Sub(t0), map[bool]string{true: "kill", false: "request"}[kill])
	waitUntil(t, 5*time.Second, "the proxy follows", func() bool { return p.Backend().Primary == primary.Addr })
	if st := p.Backend(); st.Failovers != 1 {
		t.Fatalf("failovers %d, want 1", st.Failovers)
	}
	dropped := logs.FilterMessage("stopped forwarding to the backend primary").All()
	if len(dropped) == 0 {
		t.Fatal("no log of dropping the old primary")
	}
	learned := dropped[0].Time
	t.Logf("dropped: %v", dropped[0].ContextMap())
	if n := logs.FilterMessage("backend primary changed; following the failover").Len(); n != 1 {
		t.Fatalf("%d WARN logs of the switch, want 1", n)
	}

	// Writes succeed again through the same proxy within a second of the
	// Sentinels' switch.
	var firstOK time.Time
	waitUntil(t, 5*time.Second, "a write after the switch", func() bool {
		firstOK = firstSuccessAfter(clients, learned)
		return !firstOK.IsZero() && countOKAfter(dedicated, learned) > 0
	})
	t.Logf("first successful write through the proxy %v after the %s; Sentinels switched after %v; proxy dropped the old primary %v after the switch",
		firstOK.Sub(t0), map[bool]string{true: "kill", false: "request"}[kill], switchAt.Sub(t0), learned.Sub(switchAt))
	if d := firstOK.Sub(switchAt); d > time.Second {
		t.Errorf("writes succeeded again %v after the Sentinels' switch, want within 1s", d)
	}

	// The old primary comes back as a replica; nothing is written to it.
	if kill {
		old.Restart()
		mon = startMonitor(t, old.Addr)
	}
	g.WaitRole(old, "slave", 30*time.Second)
	converted := time.Now()
	waitUntil(t, 5*time.Second, "writes after the old primary is a replica", func() bool {
		return !firstSuccessAfter(clients, converted).IsZero() && countOKAfter(dedicated, converted) > 0
	})
	close(stop)
	for _, c := range append(clients, reader) {
		<-c.done
	}
	// The Sentinels may fail over once more on their own (one that had
	// not heard of the first failover starts another); the proxy follows
	// them wherever they end.
	final := g.CurrentPrimary()
	waitUntil(t, 5*time.Second, "the proxy follows the Sentinels to the end", func() bool { return p.Backend().Primary == final.Addr })
	st := p.Backend()
	again := st.Failovers != 1
	if again {
		t.Logf("the Sentinels failed over %d times (the machine may be too loaded for down-after-milliseconds %v): %+v", st.Failovers, g.DownAfter, st)
		if final == old {
			t.Fatal("the old primary is primary again: the check of what reached it does not apply")
		}
	}
	// A command the client sent after the proxy dropped the old primary
	// must not reach it. (One written before may still run there: Redis
	// reads what is in its socket after the proxy closed it.)
	sent := map[string]time.Time{}
	for _, c := range clients {
		for _, o := range c.ops {
			sent[o.key] = o.start
		}
	}
	late, inFlight := 0, 0
	for _, key := range mon.writes(g.Servers()) {
		if sent[key].After(learned) {
			late++
			t.Errorf("%s, sent %v after the proxy dropped the old primary, reached it", key, sent[key].Sub(learned))
		} else {
			inFlight++
		}
	}
	t.Logf("writes that reached the old primary after the drop: %d sent before it, %d after", inFlight, late)

	// Every client but the subscriber kept its connection, and saw only
	// Redis's replies or "backend unavailable".
	for _, c := range append(clients, reader) {
		errs := 0
		for _, o := range c.ops {
			switch {
			case !o.connectionUp:
				t.Errorf("%s: connection closed at %v", c.name, o.end.Sub(t0))
			case o.reply[0] == '-':
				errs++
				if !strings.HasPrefix(o.reply, "-ERR backend unavailable: ") {
					t.Errorf("%s: %q", c.name, o.reply)
				}
			}
		}
		t.Logf("%s: %d commands, %d answered backend unavailable", c.name, len(c.ops), errs)
	}
	if _, closed := sub.closedAfter(2 * time.Second); !closed {
		t.Error("the subscribed client was not disconnected")
	}

	// The dedicated client's writes after the switch went to db 1 of the
	// new primary: its SELECT was replayed.
	var last string
	for _, o := range dedicated.ops {
		if o.reply == "+OK" && o.start.After(learned) {
			last = o.key
		}
	}
	ctx := context.Background()
	db1 := redis.NewClient(&redis.Options{Addr: final.Addr, DB: 1, Protocol: 2})
	defer db1.Close()
	if n, err := db1.Exists(ctx, last).Result(); err != nil || n != 1 {
		if err == nil && again {
			// Written before a second failover, lost to asynchronous
			// replication; no write of the client in db 0 (below) still
			// shows that SELECT was replayed.
			t.Logf("%s is not in db 1 of the last primary, after a second failover", last)
		} else {
			t.Errorf("%s in db 1 of the new primary: %d %v", last, n, err)
		}
	}
	var keys []string
	for _, o := range dedicated.ops {
		keys = append(keys, o.key)
	}
	db0 := redis.NewClient(&redis.Options{Addr: final.Addr, Protocol: 2})
	defer db0.Close()
	if n, err := db0.Exists(ctx, keys...).Result(); err != nil || n != 0 {
		t.Errorf("%d writes of the client in db 1 are in db 0: %v", n, err)
	}

	// Acknowledged writes that the new primary does not have: lost to
	// asynchronous replication (reported, not a failure).
	lost, acked := 0, 0
	for _, c := range clients {
		rdb := db0
		if c == dedicated {
			rdb = db1
		}
		pipe := rdb.Pipeline()
		var cmds []*redis.IntCmd
		for _, o := range c.ops {
			if o.reply == "+OK" {
				cmds = append(cmds, pipe.Exists(ctx, o.key))
			}
		}
		if _, err := pipe.Exec(ctx); err != nil {
			t.Fatal(err)
		}
		for i, cmd := range cmds {
			acked++
			if cmd.Val() != 1 {
				lost++
				if lost < 3 || i == len(cmds)-1 {
					t.Logf("lost %s %v", cmd.Args()[1], i)
				}
			}
		}
		var lostAt []time.Duration
		i := 0
		for _, o := range c.ops {
			if o.reply == "+OK" {
				if cmds[i].Val() != 1 {
					lostAt = append(lostAt, o.start.Sub(t0))
				}
				i++
			}
		}
		if len(lostAt) > 0 {
			t.Logf("%s lost %d: from %v to %v after t0 (switch at %v, learned at %v)", c.name, len(lostAt), lostAt[0], lostAt[len(lostAt)-1], switchAt.Sub(t0), learned.Sub(t0))
		}
	}
	t.Logf("acknowledged writes lost in the failover: %d of %d", lost, acked)
	pipe := db0.Pipeline()
	var waited []*redis.IntCmd
	for _, o := range waiter.ops {
		if o.ack == ":2" {
			waited = append(waited, pipe.Exists(ctx, o.key))
		}
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	for _, cmd := range waited {
		if cmd.Val() != 1 {
			t.Errorf("%s, acknowledged by WAIT 2, is lost", cmd.Args()[1])
		}
	}
	t.Logf("%d writes acknowledged by WAIT 2 by both replicas, all on the new primary", len(waited))
}

func countOK(c *loadClient) int { return countOKAfter(c, time.Time{}) }

// countOKAfter counts c's successful commands sent after t.
func countOKAfter(c *loadClient, t time.Time) int {
	n := 0
	for _, o := range c.snapshot() {
		if o.reply == "+OK" && o.start.After(t) {
			n++
		}
	}
	return n
}

// firstSuccessAfter returns when the first write sent after t succeeded.
func firstSuccessAfter(clients []*loadClient, t time.Time) time.Time {
	var first time.Time
	for _, c := range clients {
		for _, o := range c.snapshot() {
			if o.reply == "+OK" && o.start.After(t) && (first.IsZero() || o.end.Before(first)) {
				first = o.end
			}
		}
	}
	return first
}

// TestSentinelsUnreachable: with every Sentinel down, the proxy keeps the
// last primary it knew, says so in the log and its status, and keeps
// forwarding, also over new backend connections; it notices a Sentinel
// that comes back.
func TestSentinelsUnreachable(t *testing.T) {
	g := redistest.StartGroup(t, "mymaster", 0, 3)
	addr, p, logs := startSentinelProxy(t, g)
	c := dial(t, addr)
	if got := string(c.do(args("SET k v"))); got != "+OK\r\n" {
		t.Fatalf("SET: %q", got)
	}
	for _, s := range g.Sentinels {
		s.Kill()
	}
	waitUntil(t, 10*time.Second, "the log of the silent Sentinels", func() bool {
		return logs.FilterMessage("no Sentinel answers; keeping the last known primary").Len() == 1
	})
	st := p.Backend()
	if st.Primary != g.Primary.Addr || st.SentinelsAnswering != 0 || st.SentinelsSilentSince.IsZero() {
		t.Fatalf("status %+v", st)
	}
	// A lost backend connection makes the proxy ask the Sentinels, which
	// do not answer: it dials the primary it knew.
	if _, err := g.Primary.Do("CLIENT", "KILL", "TYPE", "normal"); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 5*time.Second, "a write after the lost connection", func() bool {
		return string(c.do(args("SET k v2"))) == "+OK\r\n"
	})
	g.Sentinels[1].Restart()
	waitUntil(t, 10*time.Second, "the log of a Sentinel back", func() bool {
		return logs.FilterMessage("Sentinels answer again").Len() == 1
	})
	if st := p.Backend(); st.Primary != g.Primary.Addr || st.SentinelsAnswering != 1 || !st.SentinelsSilentSince.IsZero() {
		t.Fatalf("status %+v", st)
	}
}
