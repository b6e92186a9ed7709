package commands

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/lockproxy/lockproxy/internal/redistest"
	"github.com/lockproxy/lockproxy/quorum"
)

// env is a Handler on a real quorum.Locker over real redis-server nodes.
type env struct {
	h     *Handler
	nodes []*redistest.Server
	logs  *observer.ObservedLogs
}

// newEnv starts n lock nodes and a Handler with DefaultConfig on them. Its
// log goes both to the test log and to e.logs. The node timeout is 250ms
// rather than the default 50ms: the suite runs under -race, with other
// packages' tests, on two cores, where 50ms is sometimes missed; a missed
// timeout would turn a test of something else into a NOQUORUM.
func newEnv(tb testing.TB, n int) *env {
	tb.Helper()
	qcfg := quorum.DefaultConfig()
	qcfg.NodeTimeout = 250 * time.Millisecond
	// Less than NodeTimeout, its default: every validity is shortened by
	// it, and the tests take locks of a few hundred ms.
	qcfg.ClockTolerance = 150 * time.Millisecond
	return newEnvQuorum(tb, n, qcfg)
}

// newEnvQuorum is newEnv with the Locker's Config qcfg.
func newEnvQuorum(tb testing.TB, n int, qcfg quorum.Config) *env {
	tb.Helper()
	e := &env{}
	opts := make([]*redis.Options, n)
	for i := range n {
		s := redistest.Start(tb)
		e.nodes = append(e.nodes, s)
		opts[i] = &redis.Options{Addr: s.Addr}
	}
	core, logs := observer.New(zapcore.DebugLevel)
	logger := zap.New(zapcore.NewTee(zaptest.NewLogger(tb).Core(), core))
	l, err := quorum.New(opts, qcfg, logger.Named("quorum"))
	if err != nil {
		tb.Fatalf("quorum.New: %v", err)
	}
	tb.Cleanup(func() { l.Close() })
	e.h = mustNew(tb, l, DefaultConfig(), logger.Named("commands"))
	e.logs = logs
	return e
}

// client is one connection's Conn, closed by the test's cleanup.
type client struct {
	tb    testing.TB
	c     *Conn
	resp3 bool
}

func (e *env) client(tb testing.TB, resp3 bool) *client {
	c := e.h.NewConn()
	tb.Cleanup(c.Close)
	return &client{tb: tb, c: c, resp3: resp3}
}

// do serves one command with a background context and returns the reply.
func (cl *client) do(args ...string) string {
	return cl.doCtx(context.Background(), args...)
}

func (cl *client) doCtx(ctx context.Context, args ...string) string {
	prev := []byte("+prev\r\n")
	reply := cl.c.Serve(ctx, prev, argv(args...), cl.resp3)
	if !strings.HasPrefix(string(reply), string(prev)) {
		cl.tb.Fatalf("%q: Serve did not append to dst: %q", args, reply)
	}
	return string(reply[len(prev):])
}

// lock runs a LOCK that must succeed and returns its parsed reply.
func (cl *client) lock(args ...string) lockReply {
	cl.tb.Helper()
	reply := cl.do(args...)
	lr, err := parseLockReply(reply)
	if err != nil {
		cl.tb.Fatalf("%q = %q: %v", args, reply, err)
	}
	return lr
}

type lockReply struct {
	token    string
	validity int64
	fence    int64
}

// parseLockReply parses the successful LOCK reply: an array of a bulk
// string and two integers, and nothing after it.
func parseLockReply(reply string) (lockReply, error) {
	var lr lockReply
	rest, ok := strings.CutPrefix(reply, "*3\r\n$")
	if !ok {
		return lr, fmt.Errorf("not an array of 3 starting with a bulk string")
	}
	n, rest, ok := strings.Cut(rest, "\r\n")
	size, err := strconv.Atoi(n)
	if !ok || err != nil || size < 0 || len(rest) < size+2 || rest[size:size+2] != "\r\n" {
		return lr, fmt.Errorf("bad bulk string")
	}
	lr.token, rest = rest[:size], rest[size+2:]
	for _, v := range []*int64{&lr.validity, &lr.fence} {
		if rest, ok = strings.CutPrefix(rest, ":"); !ok {
			return lr, fmt.Errorf("integer expected")
		}
		var num string
		num, rest, ok = strings.Cut(rest, "\r\n")
		if *v, err = strconv.ParseInt(num, 10, 64); !ok || err != nil {
			return lr, fmt.Errorf("bad integer %q", num)
		}
	}
	if rest != "" {
		return lr, fmt.Errorf("%q after the array", rest)
	}
	return lr, nil
}

// intReply parses an integer reply.
func intReply(tb testing.TB, reply string) int64 {
	tb.Helper()
	num, ok := strings.CutPrefix(reply, ":")
	num, ok2 := strings.CutSuffix(num, "\r\n")
	n, err := strconv.ParseInt(num, 10, 64)
	if !ok || !ok2 || err != nil {
		tb.Fatalf("reply %q is not an integer", reply)
	}
	return n
}

func nullReply(resp3 bool) string {
	if resp3 {
		return "_\r\n"
	}
	return "*-1\r\n"
}

// onNodes runs a set-up command on every node and returns the replies.
func (e *env) onNodes(tb testing.TB, args ...string) []string {
	tb.Helper()
	var replies []string
	for _, s := range e.nodes {
		r, err := s.Do(args...)
		if err != nil {
			tb.Fatalf("%q on %s: %v", args, s.Addr, err)
		}
		replies = append(replies, r)
	}
	return replies
}

// warm locks and unlocks a resource, which on fresh nodes creates their
// markers, and waits until every node has its marker: a test that kills
// nodes starts from a deployment in use (a new one is used only once every
// node has answered).
func (e *env) warm(tb testing.TB) {
	tb.Helper()
	c := e.client(tb, false)
	lk := c.lock("LOCK", "warm-up", "1000")
	c.do("UNLOCK", "warm-up", lk.token)
	for i, n := range e.nodes {
		if !eventually(5*time.Second, func() bool { r, _ := n.Do("EXISTS", "lockproxy:intact"); return r == ":1" }) {
			tb.Fatalf("node %d has no marker", i)
		}
	}
}

// waitExtensions waits until the keepalives of e's Handler have extended
// their locks n times in all. It fails at once when a keepalive is lost.
func (e *env) waitExtensions(tb testing.TB, n uint64) {
	tb.Helper()
	eventually(10*time.Second, func() bool {
		return e.h.keepaliveExtensions.Load() >= n || e.h.keepaliveLost.Load() > 0
	})
	if got := e.h.keepaliveExtensions.Load(); got < n || e.h.keepaliveLost.Load() > 0 {
		tb.Fatalf("%d keepalive extensions, want %d; keepalives lost: %d", got, n, e.h.keepaliveLost.Load())
	}
}

// extender returns the extender of the client's kept lock on resource.
func (cl *client) extender(resource string) *extender {
	cl.tb.Helper()
	cl.c.mu.Lock()
	defer cl.c.mu.Unlock()
	hs := cl.c.held[resource]
	if len(hs) != 1 || hs[0].ext == nil {
		cl.tb.Fatalf("no keepalive for %q", resource)
	}
	return hs[0].ext
}

// eventually polls cond every 10ms until it holds or d has passed.
func eventually(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

const keyPrefix = "lockproxy:lock:" // quorum.DefaultConfig's KeyPrefix + "lock:"

func forEachProtocol(t *testing.T, f func(t *testing.T, resp3 bool)) {
	for _, resp3 := range []bool{false, true} {
		t.Run(map[bool]string{false: "RESP2", true: "RESP3"}[resp3], func(t *testing.T) {
			t.Parallel()
			f(t, resp3)
		})
	}
}

func TestReplies(t *testing.T) {
	t.Parallel()
	forEachProtocol(t, func(t *testing.T, resp3 bool) {
		e := newEnv(t, 3)
		a, b := e.client(t, resp3), e.client(t, resp3)

		got := a.lock("LOCK", "r", "10000")
		if len(got.token) != 36 || got.validity <= 9000 || got.validity > 10000 || got.fence <= 0 {
			t.Errorf("LOCK r 10000 = %+v, want a uuid token, validity in (9000, 10000] and a positive fence", got)
		}
		if reply := b.do("lock", "r", "10000"); reply != nullReply(resp3) {
			t.Errorf("LOCK of a held resource = %q, want %q", reply, nullReply(resp3))
		}

		if v := intReply(t, a.do("EXTEND", "r", "20000")); v <= 19000 || v > 20000 {
			t.Errorf("token-less EXTEND r 20000 = %d, want validity in (19000, 20000]", v)
		}
		if v := intReply(t, b.do("EXTEND", "r", "30000", got.token)); v <= 29000 || v > 30000 {
			t.Errorf("EXTEND r 30000 <token> from another connection = %d, want validity in (29000, 30000]", v)
		}
		replies := []struct {
			c    *client
			give []string
			want string
		}{
			{c: b, give: []string{"EXTEND", "r", "1000", "not-the-token"}, want: ":0\r\n"},
			{c: b, give: []string{"UNLOCK", "r", "not-the-token"}, want: ":0\r\n"},
			{c: b, give: []string{"UNLOCK", "r"}, want: "-ERR no token given and this connection does not hold the lock\r\n"},
			{c: b, give: []string{"EXTEND", "r", "1000"}, want: "-ERR no token given and this connection does not hold the lock\r\n"},
			{c: a, give: []string{"UNLOCK", "r"}, want: ":1\r\n"},
			{c: a, give: []string{"UNLOCK", "r"}, want: "-ERR no token given and this connection does not hold the lock\r\n"},
			{c: a, give: []string{"UNLOCK", "r", got.token}, want: ":0\r\n"},
			{c: a, give: []string{"EXTEND", "r", "1000", got.token}, want: ":0\r\n"},
		}
		for _, tt := range replies {
			if reply := tt.c.do(tt.give...); reply != tt.want {
				t.Errorf("%q = %q, want %q", tt.give, reply, tt.want)
			}
		}

		next := b.lock("LOCK", "r", "1000")
		if next.fence <= got.fence || next.token == got.token {
			t.Errorf("LOCK after UNLOCK = %+v, want a new token and a fence above %d", next, got.fence)
		}
	})
}

func TestLockWithToken(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 3)
	a, b := e.client(t, false), e.client(t, true)

	first := a.lock("LOCK", "r", "5000", "TOKEN", "my-token")
	if first.token != "my-token" {
		t.Fatalf("LOCK ... TOKEN my-token returned token %q", first.token)
	}
	again := a.lock("LOCK", "r", "8000", "token", "my-token")
	if again.fence != first.fence || again.validity <= 7000 {
		t.Errorf("idempotent LOCK = %+v, want fence %d and validity above 7000", again, first.fence)
	}
	// After a reconnect, the token alone proves ownership.
	if other := b.lock("LOCK", "r", "5000", "TOKEN", "my-token"); other.fence != first.fence {
		t.Errorf("LOCK with the holder's token on another connection: fence %d, want %d", other.fence, first.fence)
	}
	if reply := b.do("LOCK", "r", "5000"); reply != "_\r\n" {
		t.Errorf("LOCK without the token = %q, want null", reply)
	}
	if reply := b.do("UNLOCK", "r"); reply != ":1\r\n" {
		t.Errorf("token-less UNLOCK on the connection that re-acquired = %q, want :1", reply)
	}
	if reply := a.do("UNLOCK", "r"); reply != ":0\r\n" {
		t.Errorf("token-less UNLOCK of a lock released elsewhere = %q, want :0", reply)
	}
	if reply := a.do("UNLOCK", "r"); !strings.HasPrefix(reply, "-ERR no token given") {
		t.Errorf("UNLOCK after :0 = %q, want the no-token error (record cleared)", reply)
	}
}

func TestTokenlessAfterExpiry(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 3)
	a := e.client(t, false)
	a.lock("LOCK", "r", "600")
	time.Sleep(700 * time.Millisecond)
	if reply := a.do("EXTEND", "r", "1000"); reply != ":0\r\n" {
		t.Errorf("token-less EXTEND of an expired lock = %q, want :0", reply)
	}
	if reply := a.do("EXTEND", "r", "1000"); !strings.HasPrefix(reply, "-ERR no token given") {
		t.Errorf("second token-less EXTEND = %q, want the no-token error", reply)
	}
}

// TestBadArguments runs every bad command against lock nodes that are all
// down: a command that reached quorum would reply NOQUORUM instead.
func TestBadArguments(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 3)
	for _, s := range e.nodes {
		s.Kill()
	}
	tests := []struct {
		give []string
		want string
	}{
		{give: []string{"LOCK"}, want: "-ERR wrong number of arguments for 'lock' command\r\n"},
		{give: []string{"lock", "r"}, want: "-ERR wrong number of arguments for 'lock' command\r\n"},
		{give: []string{"UNLOCK"}, want: "-ERR wrong number of arguments for 'unlock' command\r\n"},
		{give: []string{"UnLock", "r", "t", "x"}, want: "-ERR wrong number of arguments for 'unlock' command\r\n"},
		{give: []string{"EXTEND", "r"}, want: "-ERR wrong number of arguments for 'extend' command\r\n"},
		{give: []string{"EXTEND", "r", "1", "t", "x"}, want: "-ERR wrong number of arguments for 'extend' command\r\n"},
		{give: []string{"LOCK", "r", "ten"}, want: "-ERR value is not an integer or out of range\r\n"},
		{give: []string{"LOCK", "r", "1.5"}, want: "-ERR value is not an integer or out of range\r\n"},
		{give: []string{"LOCK", "r", "0"}, want: "-ERR invalid expire time in 'lock' command\r\n"},
		{give: []string{"LOCK", "r", "-1"}, want: "-ERR invalid expire time in 'lock' command\r\n"},
		{give: []string{"LOCK", "r", "3600001"}, want: "-ERR ttl-ms exceeds the maximum of 3600000\r\n"},
		{give: []string{"LOCK", "r", "100", "WAIT"}, want: "-ERR syntax error\r\n"},
		{give: []string{"LOCK", "r", "100", "WAIT", "soon"}, want: "-ERR value is not an integer or out of range\r\n"},
		{give: []string{"LOCK", "r", "100", "WAIT", "-1"}, want: "-ERR WAIT timeout-ms is negative\r\n"},
		{give: []string{"LOCK", "r", "100", "WAIT", "60001"}, want: "-ERR WAIT timeout-ms exceeds the maximum of 60000\r\n"},
		{give: []string{"LOCK", "r", "100", "TOKEN", ""}, want: "-ERR token must not be empty\r\n"},
		{give: []string{"LOCK", "r", "100", "TOKEN"}, want: "-ERR syntax error\r\n"},
		{give: []string{"LOCK", "r", "100", "KEEPALIVE", "keepalive"}, want: "-ERR syntax error\r\n"},
		{give: []string{"LOCK", "r", "100", "WAIT", "1", "wait", "2"}, want: "-ERR syntax error\r\n"},
		{give: []string{"LOCK", "r", "100", "TOKEN", "a", "TOKEN", "b"}, want: "-ERR syntax error\r\n"},
		{give: []string{"LOCK", "r", "100", "PX", "5"}, want: "-ERR syntax error\r\n"},
		{give: []string{"EXTEND", "r", "x", "t"}, want: "-ERR value is not an integer or out of range\r\n"},
		{give: []string{"EXTEND", "r", "0", "t"}, want: "-ERR invalid expire time in 'extend' command\r\n"},
		{give: []string{"EXTEND", "r", "3600001", "t"}, want: "-ERR ttl-ms exceeds the maximum of 3600000\r\n"},
		{give: []string{"EXTEND", "r", "100", ""}, want: "-ERR token must not be empty\r\n"},
		{give: []string{"UNLOCK", "r", ""}, want: "-ERR token must not be empty\r\n"},
		{give: []string{"UNLOCK", "r"}, want: "-ERR no token given and this connection does not hold the lock\r\n"},
		{give: []string{"EXTEND", "r", "100"}, want: "-ERR no token given and this connection does not hold the lock\r\n"},
		{give: []string{"GET", "r"}, want: "-ERR unknown command\r\n"},
		{give: []string{}, want: "-ERR unknown command\r\n"},
	}
	for _, resp3 := range []bool{false, true} {
		c := e.client(t, resp3)
		for _, tt := range tests {
			if reply := c.do(tt.give...); reply != tt.want {
				t.Errorf("resp3=%v %q = %q, want %q", resp3, tt.give, reply, tt.want)
			}
		}
	}
	// The control: a good command does reach the (dead) nodes.
	if reply := e.client(t, false).do("LOCK", "r", "100"); reply != "-NOQUORUM 0 of 3 lock nodes answered\r\n" {
		t.Errorf("LOCK with every node down = %q, want NOQUORUM 0 of 3", reply)
	}
}

func TestNoQuorum(t *testing.T) {
	t.Parallel()
	forEachProtocol(t, func(t *testing.T, resp3 bool) {
		e := newEnv(t, 3)
		a := e.client(t, resp3)
		held := a.lock("LOCK", "held", "10000")
		e.nodes[1].Kill()
		e.nodes[2].Kill()

		const want = "-NOQUORUM 1 of 3 lock nodes answered\r\n"
		for _, give := range [][]string{
			{"LOCK", "free", "1000"},
			{"LOCK", "free", "1000", "KEEPALIVE"},
			{"EXTEND", "held", "1000"},
			{"EXTEND", "held", "1000", held.token},
			{"UNLOCK", "held"},
			{"UNLOCK", "held"}, // the record survives a NOQUORUM: the retry still has the token
			{"UNLOCK", "held", held.token},
		} {
			if reply := a.do(give...); reply != want {
				t.Errorf("%q with 1 of 3 nodes up = %q, want %q", give, reply, want)
			}
		}
		if r, _ := e.nodes[0].Do("EXISTS", keyPrefix+"free"); r != ":0" {
			t.Errorf("after NOQUORUM, EXISTS on the live node = %s, want :0 (nothing left locked)", r)
		}
	})
}

func TestNoQuorumFiveNodes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 5)
	a := e.client(t, false)
	e.warm(t)
	e.nodes[0].Kill()
	e.nodes[1].Kill()
	a.lock("LOCK", "three-of-five", "1000") // a majority is still up
	e.nodes[2].Kill()
	if reply := a.do("LOCK", "two-of-five", "1000"); reply != "-NOQUORUM 2 of 5 lock nodes answered\r\n" {
		t.Errorf("LOCK with 2 of 5 nodes up = %q, want NOQUORUM 2 of 5", reply)
	}
	for _, s := range e.nodes[3:] {
		if r, _ := s.Do("EXISTS", keyPrefix+"two-of-five"); r != ":0" {
			t.Errorf("after NOQUORUM, EXISTS on a live node = %s, want :0", r)
		}
	}
}

func TestKeepAliveOutlivesTTL(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 3)
	a, b := e.client(t, false), e.client(t, false)
	start := time.Now()
	a.lock("LOCK", "r", "300", "KEEPALIVE")
	// Six extensions, every 100ms or half the validity left (about 70ms
	// with the clock tolerance), take the lock past its ttl.
	e.waitExtensions(t, 6)
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Fatalf("six extensions took %v, less than the ttl", d)
	}
	if reply := b.do("LOCK", "r", "300"); reply != "*-1\r\n" {
		t.Fatalf("LOCK %v after a 300ms KEEPALIVE lock = %q, want null (still held)", time.Since(start), reply)
	}
	if v := intReply(t, a.do("EXTEND", "r", "300")); v <= 0 {
		t.Errorf("EXTEND of the kept lock = %d, want > 0", v)
	}
	ext := a.extender("r")
	if reply := a.do("UNLOCK", "r"); reply != ":1\r\n" {
		t.Fatalf("UNLOCK = %q, want :1", reply)
	}
	// UNLOCK stopped the extender before it answered: nothing brings the
	// key back.
	select {
	case <-ext.done:
	default:
		t.Error("the extender still runs after UNLOCK")
	}
	for i, r := range e.onNodes(t, "EXISTS", keyPrefix+"r") {
		if r != ":0" {
			t.Errorf("node %d: EXISTS after UNLOCK = %s, want :0", i, r)
		}
	}
	if e.logs.FilterMessage("keepalive lost").Len() != 0 {
		t.Errorf("UNLOCK of a kept lock logged a lost keepalive")
	}
}

// TestKeepAliveAfterWait keeps alive a lock that was acquired after a WAIT
// longer than its own validity: the validity counts from the acquisition,
// not from the start of the command.
func TestKeepAliveAfterWait(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 3)
	a, b, c := e.client(t, false), e.client(t, false), e.client(t, false)
	a.lock("LOCK", "r", "600") // expires, nobody releases it
	b.lock("LOCK", "r", "300", "WAIT", "3000", "KEEPALIVE")
	acquired := time.Now()
	// Had the validity counted from the start of the command, the
	// keepalive would have given up at once, without extending.
	e.waitExtensions(t, 6)
	if d := time.Since(acquired); d < 300*time.Millisecond {
		t.Fatalf("six extensions took %v, less than the ttl", d)
	}
	if reply := c.do("LOCK", "r", "300"); reply != "*-1\r\n" {
		t.Errorf("LOCK %v after a WAIT ... KEEPALIVE acquisition = %q, want null (kept alive)", time.Since(acquired), reply)
	}
	if n := e.logs.FilterMessage("keepalive lost").Len(); n != 0 {
		t.Errorf("keepalive lost logged %d times, want 0", n)
	}
}

func TestKeepAliveUsesExtendedTTL(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 3)
	a := e.client(t, false)
	a.lock("LOCK", "r", "300", "KEEPALIVE")
	if v := intReply(t, a.do("EXTEND", "r", "1500")); v <= 1000 {
		t.Fatalf("EXTEND r 1500 = %d", v)
	}
	// The first extension after the EXTEND may have been under way with
	// the old ttl; the second started after it, with the new one (about
	// 500ms later). With the old ttl the key would never have more than
	// 300ms left.
	e.waitExtensions(t, e.h.keepaliveExtensions.Load()+2)
	for i, r := range e.onNodes(t, "PTTL", keyPrefix+"r") {
		if ms, err := strconv.Atoi(strings.TrimPrefix(r, ":")); err != nil || ms < 1000 {
			t.Errorf("node %d: PTTL = %s, want above 1000 (the EXTENDed ttl)", i, r)
		}
	}
}

func TestKeepAliveLostWhenDeleted(t *testing.T) {
	t.Parallel()
	for _, cmd := range [][]string{{"EXTEND", "r", "1000"}, {"UNLOCK", "r"}} {
		t.Run(cmd[0], func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 3)
			a := e.client(t, false)
			lk := a.lock("LOCK", "r", "300", "KEEPALIVE")
			e.onNodes(t, "DEL", keyPrefix+"r")
			if !eventually(2*time.Second, func() bool { return e.logs.FilterMessage("keepalive lost").Len() > 0 }) {
				t.Fatal("no keepalive lost logged after the key was deleted on every node")
			}
			// Put the very same lock back. Only the lost keepalive can
			// make the next command say that the lock is gone.
			e.onNodes(t, "SET", keyPrefix+"r", "0"+strconv.FormatInt(lk.fence, 10)+":"+lk.token, "PX", "10000")
			if reply := a.do(cmd...); reply != ":0\r\n" {
				t.Errorf("%q after the keepalive was lost = %q, want :0", cmd, reply)
			}
			if reply := a.do(cmd...); !strings.HasPrefix(reply, "-ERR no token given") {
				t.Errorf("second %q = %q, want the no-token error (record cleared)", cmd, reply)
			}

			lost := e.logs.FilterMessage("keepalive lost").All()[0]
			if lost.Level != zapcore.WarnLevel || lost.ContextMap()["resource"] != "r" {
				t.Errorf("keepalive lost entry = %v %v, want Warn with resource r", lost.Level, lost.ContextMap())
			}
			for _, entry := range e.logs.All() {
				if strings.Contains(fmt.Sprint(entry.Message, entry.ContextMap()), lk.token) {
					t.Errorf("a log entry shows the token: %s %v", entry.Message, entry.ContextMap())
				}
			}
		})
	}
}

func TestKeepAliveSurvivesShortOutage(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 3)
	reg := prometheus.NewRegistry()
	reg.MustRegister(e.h.locker)
	a, b := e.client(t, false), e.client(t, false)
	start := time.Now()
	a.lock("LOCK", "r", "1500", "KEEPALIVE") // validity about 1480ms
	e.nodes[1].Pause()
	e.nodes[2].Pause()
	// The extension at about 500ms times out on the paused nodes (the
	// keepalive is the only caller); it is retried about 150ms later.
	timeouts := `lockproxy_lock_node_timeouts_total/` + e.nodes[1].Addr + `/1`
	if !eventually(5*time.Second, func() bool { return scrape(t, reg)[timeouts] >= 1 }) {
		t.Fatalf("no extension timed out on a paused node: %v", scrape(t, reg))
	}
	e.nodes[1].Resume()
	e.nodes[2].Resume()
	// Three more extensions, about every 500ms: the lock outlives the
	// validity the failed extension would have left it.
	e.waitExtensions(t, 3)
	if d := time.Since(start); d < 1500*time.Millisecond {
		t.Fatalf("the extensions after the outage took only %v since LOCK", d)
	}
	if reply := b.do("LOCK", "r", "300"); reply != "*-1\r\n" {
		t.Errorf("LOCK after a short outage of 2 of 3 nodes = %q, want null (kept alive by retries)", reply)
	}
	if n := e.logs.FilterMessage("keepalive lost").Len(); n != 0 {
		t.Errorf("keepalive lost logged %d times, want 0", n)
	}
	if v := intReply(t, a.do("EXTEND", "r", "900")); v <= 0 {
		t.Errorf("EXTEND after the outage = %d, want > 0", v)
	}
}

func TestKeepAliveLostWithoutQuorum(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 3)
	a := e.client(t, true)
	a.lock("LOCK", "r", "300", "KEEPALIVE")
	e.nodes[1].Pause()
	e.nodes[2].Pause()
	if !eventually(2*time.Second, func() bool { return e.logs.FilterMessage("keepalive lost").Len() > 0 }) {
		t.Fatal("no keepalive lost logged with 2 of 3 nodes paused past the validity")
	}
	e.nodes[1].Resume()
	e.nodes[2].Resume()
	if reply := a.do("EXTEND", "r", "300"); reply != ":0\r\n" {
		t.Errorf("EXTEND after the keepalive was lost = %q, want :0", reply)
	}
}

// TestKeepAlivePanicIsContained: a panic in an extender gives up that one
// keepalive, as a lost one, and the process carries on.
func TestKeepAlivePanicIsContained(t *testing.T) {
	t.Parallel()
	hook := func(resource string) {
		if resource == "panicky" {
			panic("injected")
		}
	}
	testHookExtend.Store(&hook)
	t.Cleanup(func() { testHookExtend.Store(nil) })
	e := newEnv(t, 3)
	a, b := e.client(t, false), e.client(t, false)
	// A ttl that leaves the extender time to run (and panic) before the
	// validity, shortened by the clock tolerance, runs out.
	a.lock("LOCK", "panicky", "1000", "KEEPALIVE")
	if !eventually(2*time.Second, func() bool { return e.logs.FilterMessage("keepalive lost").Len() > 0 }) {
		t.Fatal("no keepalive lost logged after the extender panicked")
	}
	if n := e.logs.FilterMessage("panic keeping a lock alive; the keepalive is given up").Len(); n != 1 {
		t.Errorf("panic logged %d times, want 1", n)
	}
	if reply := a.do("EXTEND", "panicky", "300"); reply != ":0\r\n" {
		t.Errorf("EXTEND after the keepalive was lost = %q, want :0", reply)
	}
	// The lock runs out with its ttl, and the connection and the process
	// still serve.
	if !eventually(2*time.Second, func() bool { return strings.HasPrefix(b.do("LOCK", "panicky", "300"), "*3") }) {
		t.Error("the lock of the panicked keepalive never became free")
	}
	if reply := a.do("LOCK", "other", "300"); !strings.HasPrefix(reply, "*3") {
		t.Errorf("LOCK on the same connection afterwards = %q", reply)
	}
}

func TestRelockReplacesKeepAlive(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 3)
	a, b := e.client(t, false), e.client(t, false)
	a.lock("LOCK", "r", "300", "TOKEN", "t", "KEEPALIVE")
	ext := a.extender("r")
	a.lock("LOCK", "r", "300", "TOKEN", "t") // same holding, no longer kept alive
	select {
	case <-ext.done:
	default:
		t.Error("the keepalive still runs after a LOCK without KEEPALIVE")
	}
	// The lock now runs out with its ttl.
	if !eventually(2*time.Second, func() bool { return strings.HasPrefix(b.do("LOCK", "r", "300"), "*3") }) {
		t.Error("the lock was still held 2s after its ttl of 300ms")
	}
}

func TestCloseReleasesKeptLocks(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 3)
	a, b := e.client(t, false), e.client(t, false)
	a.lock("LOCK", "kept", "10000", "KEEPALIVE")
	a.lock("LOCK", "kept2", "10000", "KEEPALIVE")
	a.lock("LOCK", "plain", "10000")
	a.c.Close()
	a.c.Close() // idempotent

	b.lock("LOCK", "kept", "1000")
	b.lock("LOCK", "kept2", "1000")
	if reply := b.do("LOCK", "plain", "1000"); reply != "*-1\r\n" {
		t.Errorf("LOCK of a lock taken without KEEPALIVE after Close = %q, want null (held until its ttl)", reply)
	}
	if reply := a.do("LOCK", "late", "10000", "KEEPALIVE"); reply != "-ERR connection closed\r\n" {
		t.Errorf("LOCK on a closed Conn = %q, want connection closed", reply)
	}
	b.lock("LOCK", "late", "1000") // the late LOCK released what it got
	if reply := a.do("UNLOCK", "plain"); reply != "-ERR connection closed\r\n" {
		t.Errorf("UNLOCK on a closed Conn = %q, want connection closed", reply)
	}
}

// TestCloseDuringServe closes a Conn while LOCK ... KEEPALIVE commands run:
// every lock is released, whether it was recorded before Close or not.
func TestCloseDuringServe(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 3)
	a, b := e.client(t, false), e.client(t, false)
	var wg sync.WaitGroup
	started := make(chan struct{})
	n := 0
	wg.Go(func() {
		for ; ; n++ {
			if n == 10 {
				close(started)
			}
			reply := a.c.Serve(context.Background(), nil, argv("LOCK", "r"+strconv.Itoa(n), "10000", "KEEPALIVE"), false)
			if string(reply) == "-ERR connection closed\r\n" {
				return
			}
		}
	})
	<-started
	a.c.Close()
	wg.Wait()
	for i := range n + 1 {
		b.lock("LOCK", "r"+strconv.Itoa(i), "1000")
	}
}

func TestWait(t *testing.T) {
	t.Parallel()
	forEachProtocol(t, func(t *testing.T, resp3 bool) {
		e := newEnv(t, 3)
		a, b, c := e.client(t, resp3), e.client(t, resp3), e.client(t, resp3)
		a.lock("LOCK", "r", "10000")

		start := time.Now()
		if reply := c.do("LOCK", "r", "1000", "WAIT", "200"); reply != nullReply(resp3) {
			t.Errorf("LOCK ... WAIT 200 on a held lock = %q, want null", reply)
		}
		if d := time.Since(start); d < 200*time.Millisecond {
			t.Errorf("LOCK ... WAIT 200 gave up after %v", d)
		}

		type result struct {
			reply string
			at    time.Time
		}
		done := make(chan result, 1)
		go func() {
			reply := b.do("LOCK", "r", "10000", "WAIT", "5000", "KEEPALIVE")
			done <- result{reply, time.Now()}
		}()
		time.Sleep(100 * time.Millisecond)
		released := time.Now()
		if reply := a.do("UNLOCK", "r"); reply != ":1\r\n" {
			t.Fatalf("UNLOCK = %q", reply)
		}
		res := <-done
		if _, err := parseLockReply(res.reply); err != nil {
			t.Fatalf("waiting LOCK = %q: %v", res.reply, err)
		}
		if d := res.at.Sub(released); d > time.Second {
			t.Errorf("waiting LOCK got the lock %v after the release, want well under 1s", d)
		}
		if reply := b.do("UNLOCK", "r"); reply != ":1\r\n" {
			t.Errorf("token-less UNLOCK by the waiter = %q, want :1", reply)
		}
	})
}

func TestContextEnded(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 3)
	a, b := e.client(t, false), e.client(t, true)

	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	if reply := a.doCtx(cancelled, "LOCK", "r", "10000", "KEEPALIVE"); reply != "-ERR command cancelled\r\n" {
		t.Errorf("LOCK with a cancelled context = %q, want command cancelled", reply)
	}
	if reply := a.do("UNLOCK", "r"); !strings.HasPrefix(reply, "-ERR no token given") {
		t.Errorf("UNLOCK after a cancelled LOCK = %q, want the no-token error (nothing recorded)", reply)
	}
	b.lock("LOCK", "r", "10000")

	// A client that leaves while waiting gives up its place.
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	start := time.Now()
	if reply := a.doCtx(ctx, "LOCK", "r", "1000", "WAIT", "5000"); reply != "-ERR command cancelled\r\n" {
		t.Errorf("LOCK ... WAIT cancelled = %q, want command cancelled", reply)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("cancelled WAIT returned after %v", d)
	}

	ctx, cancel = context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if reply := a.doCtx(ctx, "LOCK", "r", "1000", "WAIT", "5000"); reply != "-ERR command timed out\r\n" {
		t.Errorf("LOCK ... WAIT past the deadline = %q, want command timed out", reply)
	}
	if reply := a.doCtx(cancelled, "EXTEND", "r", "1000", "x"); reply != "-ERR command cancelled\r\n" {
		t.Errorf("EXTEND with a cancelled context = %q, want command cancelled", reply)
	}
	if reply := b.doCtx(cancelled, "UNLOCK", "r"); reply != "-ERR command cancelled\r\n" {
		t.Errorf("UNLOCK with a cancelled context = %q, want command cancelled", reply)
	}
	if reply := b.do("UNLOCK", "r"); reply != ":1\r\n" {
		t.Errorf("UNLOCK after a cancelled UNLOCK = %q, want :1", reply)
	}
}

func BenchmarkLockUnlock(b *testing.B) {
	for _, n := range []int{3, 5} {
		b.Run(strconv.Itoa(n)+"nodes", func(b *testing.B) {
			e := newEnv(b, n)
			h := mustNew(b, e.h.locker, DefaultConfig(), nil) // no per-command logging
			c := h.NewConn()
			defer c.Close()
			lock, unlock := argv("LOCK", "bench", "10000"), argv("UNLOCK", "bench")
			ctx := context.Background()
			var buf []byte
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				buf = c.Serve(ctx, buf[:0], lock, false)
				if buf[0] != '*' {
					b.Fatalf("LOCK = %q", buf)
				}
				buf = c.Serve(ctx, buf[:0], unlock, false)
				if string(buf) != ":1\r\n" {
					b.Fatalf("UNLOCK = %q", buf)
				}
			}
		})
	}
}

// TestKeepAliveSurvivesNodeLoss: a KEEPALIVE lock survives the loss of any
// one node of three, killed and then back empty, one after the other: the
// extensions heal it onto every node, and a node back empty gets it again
// before it counts.
func TestKeepAliveSurvivesNodeLoss(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 3)
	a, b := e.client(t, false), e.client(t, false)
	a.lock("LOCK", "kept", "900", "KEEPALIVE")
	var ext uint64
	for i, n := range e.nodes {
		n.Kill()
		ext += 2
		e.waitExtensions(t, ext)
		if r := b.do("LOCK", "kept", "900"); r != nullReply(false) {
			t.Fatalf("LOCK of the kept lock with node %d down = %q, want null", i, r)
		}
		n.Restart() // without persistence: empty
		ext += 2
		e.waitExtensions(t, ext)
		if r := b.do("LOCK", "kept", "900"); r != nullReply(false) {
			t.Fatalf("LOCK of the kept lock with node %d back empty = %q, want null", i, r)
		}
		// Before the next node goes, this one has its marker again and
		// holds the kept lock.
		if !eventually(5*time.Second, func() bool {
			marker, _ := n.Do("EXISTS", "lockproxy:intact")
			lock, _ := n.Do("EXISTS", "lockproxy:lock:kept")
			return marker == ":1" && lock == ":1"
		}) {
			t.Fatalf("node %d did not get its marker and the kept lock back", i)
		}
		ext += 2
		e.waitExtensions(t, ext)
	}
}

// TestStalledGrantNotSent: a proxy that stalls between the grant and its
// reply (stopped, starved of CPU) for longer than the validity answers not
// acquired and gives the lock back, rather than promise time that has
// passed; a shorter stall shortens the validity in the reply by as much.
func TestStalledGrantNotSent(t *testing.T) {
	e := newEnv(t, 3)
	a, b := e.client(t, false), e.client(t, false)
	b.lock("LOCK", "warm-up", "1000")

	stall := 600 * time.Millisecond
	hook := func() { time.Sleep(stall) }
	testHookLocked.Store(&hook)
	t.Cleanup(func() { testHookLocked.Store(nil) })
	if reply := a.do("LOCK", "r", "700"); reply != "*-1\r\n" {
		t.Fatalf("LOCK r 700 after a 600ms stall = %q, want null: its validity (under 550ms) ran out", reply)
	}
	testHookLocked.Store(nil)
	start := time.Now()
	if got := b.lock("LOCK", "r", "10000"); got.validity <= 0 {
		t.Fatalf("LOCK r through another connection = %+v", got)
	}
	if waited := time.Since(start); waited > 500*time.Millisecond {
		t.Errorf("r taken %v later: the stalled grant was not given back", waited)
	}
	if reply := a.do("UNLOCK", "r"); !strings.HasPrefix(reply, "-ERR no token given") {
		t.Errorf("token-less UNLOCK on the stalled connection = %q, want no record of the lock", reply)
	}

	stall = 200 * time.Millisecond
	testHookLocked.Store(&hook)
	got := a.lock("LOCK", "s", "10000")
	if got.validity > 10000-150-100-200 {
		t.Errorf("LOCK s 10000 after a 200ms stall: validity %d, want it shortened by the stall", got.validity)
	}
}

// TestKeepAliveShortValidity keeps alive a lock whose validity (ttl less
// the drift and the clock tolerance, 600ms here) is shorter than a third
// of its ttl: the extensions must come before the validity runs out, not
// every ttl/3. (An 850ms ttl leaves about 240ms of validity, against 283ms
// for ttl/3: room for a node's round trip on a loaded machine, which the
// 50ms a 200ms ttl left with newEnv's 150ms tolerance was not.)
func TestKeepAliveShortValidity(t *testing.T) {
	t.Parallel()
	qcfg := quorum.DefaultConfig()
	qcfg.NodeTimeout = 250 * time.Millisecond
	qcfg.ClockTolerance = 600 * time.Millisecond
	e := newEnvQuorum(t, 3, qcfg)
	a := e.client(t, false)
	if got := a.lock("LOCK", "r", "850", "KEEPALIVE"); got.validity*3 >= 850 {
		t.Fatalf("validity %dms, want less than a third of the ttl", got.validity)
	}
	e.waitExtensions(t, 3)
	if reply := a.do("UNLOCK", "r"); reply != ":1\r\n" {
		t.Fatalf("UNLOCK = %q, want :1", reply)
	}
}
