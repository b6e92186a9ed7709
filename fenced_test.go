package main

import (
	"bufio"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/internal/redistest"
)

// rawConn is a RESP client that returns every reply as the bytes it came
// in, for comparing the proxy's replies with Redis's byte for byte.
type rawConn struct {
	t  testing.TB
	nc net.Conn
	r  *bufio.Reader
}

// dialRaw connects to addr, in RESP3 after HELLO 3 when resp3.
func dialRaw(t testing.TB, addr string, resp3 bool) *rawConn {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	c := &rawConn{t: t, nc: nc, r: bufio.NewReader(nc)}
	if resp3 {
		if r := c.do("HELLO", "3"); r[0] != '%' {
			t.Fatalf("HELLO 3: %q", r)
		}
	}
	return c
}

// do sends one command and returns its reply.
func (c *rawConn) do(args ...string) string {
	c.t.Helper()
	c.send(args...)
	return c.read()
}

func (c *rawConn) send(args ...string) {
	c.t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	c.nc.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := c.nc.Write([]byte(b.String())); err != nil {
		c.t.Fatal(err)
	}
}

func (c *rawConn) read() string {
	c.t.Helper()
	var b strings.Builder
	if err := readRaw(c.r, &b); err != nil {
		c.t.Fatalf("reading a reply: %v (so far %q)", err, b.String())
	}
	return b.String()
}

// readRaw copies one RESP2 or RESP3 reply from r to b.
func readRaw(r *bufio.Reader, b *strings.Builder) error {
	line, err := r.ReadString('\n')
	if err != nil {
		return err
	}
	b.WriteString(line)
	if len(line) < 3 {
		return fmt.Errorf("short line %q", line)
	}
	n, _ := strconv.Atoi(line[1 : len(line)-2])
	switch line[0] {
	case '$', '!', '=':
		if n < 0 {
			return nil
		}
		buf := make([]byte, n+2)
		if _, err := io_ReadFull(r, buf); err != nil {
			return err
		}
		b.Write(buf)
	case '*', '~', '>':
		for range max(n, 0) {
			if err := readRaw(r, b); err != nil {
				return err
			}
		}
	case '%':
		for range 2 * n {
			if err := readRaw(r, b); err != nil {
				return err
			}
		}
	case '|':
		for range 2 * n {
			if err := readRaw(r, b); err != nil {
				return err
			}
		}
		return readRaw(r, b)
	}
	return nil
}

func io_ReadFull(r *bufio.Reader, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		m, err := r.Read(buf[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// fencedEnv is one backend behind a real proxy, with raw connections.
type fencedEnv struct {
	backend *redistest.Server
	proxy   string
}

func startFencedEnv(t *testing.T) fencedEnv {
	t.Helper()
	_, nodes := startNodes(t, 1)
	backend := redistest.Start(t)
	addr := startApp(t, realConfig, "-backend", backend.Addr, "-lock-nodes", nodes)
	return fencedEnv{backend: backend, proxy: addr}
}

// transparencyCases are commands whose replies a script would change, or
// that show every RESP3 type: FENCED must give exactly Redis's reply.
var transparencyCases = []struct {
	setup [][]string
	cmd   []string
}{
	{[][]string{{"DEL", "k"}}, []string{"SET", "k", "v"}},
	{[][]string{{"SET", "k", "v"}}, []string{"GET", "k"}},
	{[][]string{{"DEL", "k"}}, []string{"GET", "k"}},
	{[][]string{{"SET", "k", "0"}}, []string{"INCRBY", "k", "9007199254740993"}},
	{[][]string{{"DEL", "h"}, {"HSET", "h", "z", "1", "a", "2", "m", "3", "b", "4"}}, []string{"HGETALL", "h"}},
	{[][]string{{"SET", "k", "1"}, {"DEL", "k2"}}, []string{"MGET", "k", "k2", "k"}},
	{[][]string{{"DEL", "l"}}, []string{"LPOP", "l", "3"}},
	{[][]string{{"DEL", "z"}, {"ZADD", "z", "1.5", "a", "2", "b", "3.25", "c"}}, []string{"ZSCORE", "z", "a"}},
	{[][]string{{"DEL", "z"}, {"ZADD", "z", "1.5", "a", "2", "b", "3.25", "c"}}, []string{"ZRANGE", "z", "0", "-1", "WITHSCORES"}},
	{[][]string{{"DEL", "s"}, {"SADD", "s", "x", "y", "1", "2"}}, []string{"SMEMBERS", "s"}},
	{[][]string{{"DEL", "k"}}, []string{"EVAL", "return {1,2,false,3}", "1", "k"}},
	{[][]string{{"DEL", "h"}, {"HSET", "h", "z", "1", "a", "2"}}, []string{"EVAL", "redis.setresp(3) return redis.call('hgetall', KEYS[1])", "1", "h"}},
	{[][]string{{"SET", "k", "v"}}, []string{"EVAL_RO", "return redis.call('get', KEYS[1])", "1", "k"}},
	{[][]string{{"SET", "k", "v"}}, []string{"FCALL", "fget", "1", "k"}},
	{[][]string{{"SET", "k", "v"}}, []string{"FCALL_RO", "fget_ro", "1", "k"}},
	{[][]string{{"SET", "k", "v"}}, []string{"LPUSH", "k", "x"}},
	{[][]string{{"DEL", "x"}, {"XADD", "x", "1-1", "f", "v", "g", "w"}}, []string{"XRANGE", "x", "-", "+"}},
	{[][]string{{"DEL", "x"}, {"XADD", "x", "1-1", "f", "v"}}, []string{"XREAD", "COUNT", "5", "STREAMS", "x", "0"}},
	{[][]string{{"SET", "k", "12345"}}, []string{"OBJECT", "ENCODING", "k"}},
	{[][]string{{"DEL", "l"}, {"RPUSH", "l", "c", "a", "b"}}, []string{"SORT", "l", "ALPHA"}},
	{[][]string{{"DEL", "z", "z2", "d"}, {"ZADD", "z", "1", "a"}, {"ZADD", "z2", "2", "a", "3", "b"}}, []string{"ZUNIONSTORE", "d", "2", "z", "z2"}},
	{[][]string{{"DEL", "k"}}, []string{"BITFIELD", "k", "INCRBY", "i5", "100", "1", "GET", "u4", "0"}},
	{[][]string{{"SET", "big", strings.Repeat("0123456789", 20000)}}, []string{"GET", "big"}},
	{[][]string{{"DEL", "h"}, {"HSET", "h", "a", "1"}}, []string{"HINCRBYFLOAT", "h", "a", "0.1"}},
	{[][]string{{"DEL", "g"}, {"GEOADD", "g", "13.361389", "38.115556", "Palermo"}}, []string{"GEOPOS", "g", "Palermo", "Nowhere"}},
	{[][]string{{"SET", "k", "v"}}, []string{"TYPE", "k"}},
}

const fencedLib = "#!lua name=fencedlib\n" +
	"redis.register_function('fget', function(keys, args) return redis.call('get', keys[1]) end)\n" +
	"redis.register_function{function_name='fget_ro', callback=function(keys, args) return redis.call('get', keys[1]) end, flags={'no-writes'}}\n"

// TestFencedTransparent: an accepted FENCED answers exactly as Redis
// answers the command alone, RESP2 and RESP3, whatever the reply's type.
func TestFencedTransparent(t *testing.T) {
	env := startFencedEnv(t)
	for _, resp3 := range []bool{false, true} {
		direct := dialRaw(t, env.backend.Addr, resp3)
		px := dialRaw(t, env.proxy, resp3)
		if r := direct.do("FUNCTION", "LOAD", "REPLACE", fencedLib); !strings.HasPrefix(r, "$") {
			t.Fatalf("FUNCTION LOAD: %q", r)
		}
		fence := 1
		for _, tc := range transparencyCases {
			for _, s := range tc.setup {
				direct.do(s...)
			}
			want := direct.do(tc.cmd...)
			for _, s := range tc.setup {
				direct.do(s...)
			}
			fence++
			got := px.do(append([]string{"FENCED", fmt.Sprint("t", resp3), strconv.Itoa(fence)}, tc.cmd...)...)
			if got != want {
				t.Errorf("RESP3 %v: FENCED %q\n got %q\nwant %q", resp3, tc.cmd, got, want)
			}
		}
	}
}

// TestFencedRules checks the contract's rules on one Redis, RESP2 and
// RESP3.
func TestFencedRules(t *testing.T) {
	env := startFencedEnv(t)
	direct := dialRaw(t, env.backend.Addr, false)
	for _, resp3 := range []bool{false, true} {
		direct.do("FLUSHALL")
		px := dialRaw(t, env.proxy, resp3)
		record := func(name string) string { return direct.do("GET", "lockproxy:fence:r:"+name) }
		expect := func(got, want string) {
			t.Helper()
			if got != want {
				t.Fatalf("RESP3 %v: got %q, want %q", resp3, got, want)
			}
		}
		null := "$-1\r\n"
		if resp3 {
			null = "_\r\n"
		}
		expect(px.do("FENCED", "res", "10", "SET", "a", "1"), "+OK\r\n")
		expect(record("res"), "$2\r\n10\r\n")
		// A write with an older fence is refused and runs nothing.
		expect(px.do("FENCED", "res", "9", "SET", "a", "2"), "-STALEFENCE fence 9 is below 10 for 'res'\r\n")
		expect(direct.do("GET", "a"), "$1\r\n1\r\n")
		// Equal fences pass.
		expect(px.do("FENCED", "res", "10", "SET", "a", "3"), "+OK\r\n")
		// A read checks and leaves the record as it is.
		expect(px.do("FENCED", "res", "9", "GET", "a"), "-STALEFENCE fence 9 is below 10 for 'res'\r\n")
		expect(px.do("FENCED", "res", "12", "GET", "a"), "$1\r\n3\r\n")
		expect(record("res"), "$2\r\n10\r\n")
		expect(px.do("FENCED", "res", "11", "EVAL_RO", "return redis.call('get', KEYS[1])", "1", "a"), "$1\r\n3\r\n")
		expect(record("res"), "$2\r\n10\r\n")
		// EVAL is a write.
		expect(px.do("FENCED", "res", "11", "EVAL", "return redis.call('get', KEYS[1])", "1", "a"), "$1\r\n3\r\n")
		expect(record("res"), "$2\r\n11\r\n")
		// Semaphore slots have records of their own.
		expect(px.do("FENCED", "res", "5", "PERMIT", "2", "SET", "b", "1"), "+OK\r\n")
		expect(direct.do("GET", "lockproxy:fence:p2:res"), "$1\r\n5\r\n")
		expect(px.do("FENCED", "res", "4", "PERMIT", "2", "SET", "b", "2"), "-STALEFENCE fence 4 is below 5 for 'res' slot 2\r\n")
		expect(px.do("FENCED", "res", "4", "PERMIT", "3", "SET", "b", "3"), "+OK\r\n")
		expect(record("res"), "$2\r\n11\r\n")
		// The record is raised once the check passes, whatever the
		// command's own reply.
		direct.do("SET", "w", "str")
		expect(px.do("FENCED", "res", "20", "LPUSH", "w", "x"), direct.do("LPUSH", "w", "x"))
		expect(record("res"), "$2\r\n20\r\n")
		// Commands Redis refuses before running them change no record
		// and get Redis's own error.
		expect(px.do("FENCED", "res", "30", "NOSUCH", "a", "b"), direct.do("NOSUCH", "a", "b"))
		expect(px.do("FENCED", "res", "30", "GET"), direct.do("GET"))
		expect(px.do("FENCED", "res", "30", "OBJECT", "NOSUCH", "a"), direct.do("OBJECT", "NOSUCH", "a"))
		expect(record("res"), "$2\r\n20\r\n")
		// Records never expire and forwarded commands cannot change them.
		expect(direct.do("PTTL", "lockproxy:fence:r:res"), ":-1\r\n")
		for _, cmd := range [][]string{
			{"DEL", "lockproxy:fence:r:res"},
			{"SET", "lockproxy:fence:r:res", "1"},
			{"EXPIRE", "lockproxy:fence:r:res", "1"},
			{"RENAME", "a", "lockproxy:fence:r:res"},
			{"EVAL", "return redis.call('del', KEYS[1])", "1", "lockproxy:fence:r:res"},
			{"FENCED", "res", "40", "DEL", "lockproxy:fence:r:res"},
		} {
			if r := px.do(cmd...); !strings.HasPrefix(r, "-ERR key 'lockproxy:fence:r:res' is a fence record") {
				t.Errorf("%q: %q, want a refusal", cmd, r)
			}
		}
		expect(px.do("GET", "lockproxy:fence:r:res"), "$2\r\n20\r\n")
		expect(record("res"), "$2\r\n20\r\n")
		// Another client raises the record between two FENCED of this
		// one (which keeps the record it read last under WATCH): the
		// older fence is refused all the same.
		other := dialRaw(t, env.proxy, resp3)
		expect(px.do("FENCED", "seq", "5", "SET", "sq", "a"), "+OK\r\n")
		expect(other.do("FENCED", "seq", "7", "SET", "sq", "b"), "+OK\r\n")
		expect(px.do("FENCED", "seq", "6", "SET", "sq", "c"), "-STALEFENCE fence 6 is below 7 for 'seq'\r\n")
		expect(px.do("FENCED", "seq", "7", "GET", "sq"), "$1\r\nb\r\n")
		// A record removed by FLUSHALL no longer refuses anything.
		direct.do("FLUSHALL")
		expect(px.do("FENCED", "seq", "3", "SET", "sq", "d"), "+OK\r\n")
		expect(direct.do("GET", "lockproxy:fence:r:seq"), "$1\r\n3\r\n")
		direct.do("SET", "lockproxy:fence:r:res", "20") // as before the FLUSHALL

		// Missing values come back in the client's protocol.
		expect(px.do("FENCED", "res", "20", "GET", "nothing"), null)

		// The client's database: key and record.
		expect(px.do("SELECT", "3"), "+OK\r\n")
		expect(px.do("FENCED", "dbres", "5", "SET", "dbk", "v3"), "+OK\r\n")
		expect(px.do("SELECT", "0"), "+OK\r\n")
		direct.do("SELECT", "3")
		expect(direct.do("GET", "dbk"), "$2\r\nv3\r\n")
		expect(direct.do("GET", "lockproxy:fence:r:dbres"), "$1\r\n5\r\n")
		direct.do("SELECT", "0")
		expect(direct.do("EXISTS", "dbk", "lockproxy:fence:r:dbres"), ":0\r\n")
		expect(px.do("FENCED", "dbres", "1", "SET", "dbk", "v0"), "+OK\r\n") // another database, another record

		// Inside MULTI: fails to queue, EXEC aborts, nothing ran.
		expect(px.do("MULTI"), "+OK\r\n")
		expect(px.do("SET", "m", "1"), "+QUEUED\r\n")
		expect(px.do("FENCED", "res", "50", "SET", "m", "2"), "-ERR Command not allowed inside a transaction\r\n")
		expect(px.do("EXEC"), "-EXECABORT Transaction discarded because of previous errors.\r\n")
		expect(direct.do("EXISTS", "m"), ":0\r\n")
		expect(record("res"), "$2\r\n20\r\n")

		// The client's own WATCH stays as it was: FENCED neither ends it
		// nor dirties it.
		empty := "*0\r\n"
		expect(px.do("WATCH", "wk"), "+OK\r\n")
		expect(px.do("FENCED", "res", "21", "SET", "other", "1"), "+OK\r\n")
		expect(px.do("MULTI"), "+OK\r\n")
		expect(px.do("EXEC"), empty)
		expect(px.do("WATCH", "wk"), "+OK\r\n")
		expect(px.do("FENCED", "res", "21", "SET", "other", "2"), "+OK\r\n")
		direct.do("SET", "wk", "changed")
		expect(px.do("MULTI"), "+OK\r\n")
		execNull := "*-1\r\n"
		if resp3 {
			execNull = "_\r\n"
		}
		expect(px.do("EXEC"), execNull)
	}
}

// fencedRefusals are the contract's -ERR refusals, sent before anything
// reaches the backend.
var fencedRefusals = [][]string{
	{"FENCED", "r", "7", "PING"},
	{"FENCED", "r", "7", "DBSIZE"},
	{"FENCED", "r", "7", "EVAL", "return 1", "0"},
	{"FENCED", "r", "7", "FCALL", "fget", "0"},
	{"FENCED", "r", "7", "BLPOP", "l", "0"},
	{"FENCED", "r", "7", "BLMOVE", "l", "m", "LEFT", "LEFT", "0"},
	{"FENCED", "r", "7", "BZPOPMIN", "z", "0"},
	{"FENCED", "r", "7", "XREAD", "BLOCK", "0", "STREAMS", "x", "$"},
	{"FENCED", "r", "7", "XREADGROUP", "GROUP", "g", "c", "BLOCK", "0", "STREAMS", "x", ">"},
	{"FENCED", "r", "7", "WAIT", "0", "0"},
	{"FENCED", "r", "7", "WAITAOF", "0", "0", "0"},
	{"FENCED", "r", "7", "MULTI"},
	{"FENCED", "r", "7", "EXEC"},
	{"FENCED", "r", "7", "DISCARD"},
	{"FENCED", "r", "7", "WATCH", "k"},
	{"FENCED", "r", "7", "SUBSCRIBE", "c"},
	{"FENCED", "r", "7", "SSUBSCRIBE", "c"},
	{"FENCED", "r", "7", "PSUBSCRIBE", "c*"},
	{"FENCED", "r", "7", "MONITOR"},
	{"FENCED", "r", "7", "SYNC"},
	{"FENCED", "r", "7", "PSYNC", "?", "-1"},
	{"FENCED", "r", "7", "LOCK", "x", "100"},
	{"FENCED", "r", "7", "lockinfo", "x"},
	{"FENCED", "r", "7", "FENCED", "r", "7", "GET", "k"},
	{"FENCED", "r", "0", "GET", "k"},
	{"FENCED", "r", "-1", "GET", "k"},
	{"FENCED", "r", "07", "GET", "k"},
	{"FENCED", "r", "+7", "GET", "k"},
	{"FENCED", "r", "7.0", "GET", "k"},
	{"FENCED", "r", "x", "GET", "k"},
	{"FENCED", "r", "9223372036854775808", "GET", "k"},
	{"FENCED", "r", "7", "PERMIT", "1024", "GET", "k"},
	{"FENCED", "r", "7", "PERMIT", "-1", "GET", "k"},
	{"FENCED", "r", "7", "PERMIT", "x", "GET", "k"},
	{"FENCED", "r", "7", "PERMIT", "1"},
	{"FENCED", "r", "7"},
	{"FENCED", "r"},
	{"FENCED", "r", "7", "DEL", "lockproxy:fence:r:r"},
}

// TestFencedRefusals: every refusal of the contract is an -ERR and sends
// nothing to the backend (INFO commandstats stays empty).
func TestFencedRefusals(t *testing.T) {
	env := startFencedEnv(t)
	direct := dialRaw(t, env.backend.Addr, false)
	for _, resp3 := range []bool{false, true} {
		px := dialRaw(t, env.proxy, resp3)
		// Loads the COMMAND table and opens the connections.
		if r := px.do("FENCED", "r", "1", "SET", "k", "v"); r != "+OK\r\n" {
			t.Fatalf("FENCED SET: %q", r)
		}
		direct.do("CONFIG", "RESETSTAT")
		for _, cmd := range fencedRefusals {
			if r := px.do(cmd...); !strings.HasPrefix(r, "-ERR ") {
				t.Errorf("%q: %q, want -ERR", cmd, r)
			}
		}
		stats := direct.do("INFO", "commandstats")
		if strings.Contains(strings.ReplaceAll(stats, "cmdstat_config|resetstat", ""), "cmdstat_") {
			t.Errorf("RESP3 %v: the refusals reached the backend: %q", resp3, stats)
		}
		// Inside MULTI, a refusal fails to queue too.
		px.do("MULTI")
		if r := px.do("FENCED", "r", "7", "PING"); !strings.HasPrefix(r, "-ERR ") {
			t.Errorf("FENCED PING in MULTI: %q", r)
		}
		if r := px.do("EXEC"); !strings.HasPrefix(r, "-EXECABORT") {
			t.Errorf("EXEC: %q", r)
		}
	}
	px := dialRaw(t, env.proxy, false)
	if r := px.do("COMMAND", "INFO", "fenced"); !strings.Contains(r, "fenced") {
		t.Errorf("COMMAND INFO fenced: %q", r)
	}
	if r := px.do("COMMAND", "DOCS", "fenced"); !strings.Contains(r, "STALEFENCE") {
		t.Errorf("COMMAND DOCS fenced: %q", r)
	}
	px.do("FENCED", "r", "1", "GET", "k")
	info := px.do("INFO", "lockproxy")
	if want := fmt.Sprintf("cmd_fenced:accepted=3,stale=0,error=0,bad_request=%d\r\n", 2*len(fencedRefusals)); !strings.Contains(info, want) {
		t.Errorf("INFO lockproxy lacks %q: %q", want, info)
	}
}

// TestFencedACL: FENCED runs as the client's backend user, so ACL applies
// to it as to its command: a command the user may not run gets Redis's
// own NOPERM and changes no record.
func TestFencedACL(t *testing.T) {
	env := startFencedEnv(t)
	direct := dialRaw(t, env.backend.Addr, false)
	if r := direct.do("ACL", "SETUSER", "app", "on", ">pw", "~*", "+@all", "-del"); r != "+OK\r\n" {
		t.Fatalf("ACL SETUSER: %q", r)
	}
	for _, resp3 := range []bool{false, true} {
		px := dialRaw(t, env.proxy, resp3)
		as := dialRaw(t, env.backend.Addr, resp3)
		for _, c := range []*rawConn{px, as} {
			if r := c.do("AUTH", "app", "pw"); r != "+OK\r\n" {
				t.Fatalf("AUTH: %q", r)
			}
		}
		if r := px.do("FENCED", "acl", "5", "SET", "ak", "1"); r != "+OK\r\n" {
			t.Fatalf("FENCED SET as app: %q", r)
		}
		want := as.do("DEL", "ak")
		if !strings.HasPrefix(want, "-NOPERM") {
			t.Fatalf("DEL as app directly: %q", want)
		}
		if got := px.do("FENCED", "acl", "6", "DEL", "ak"); got != want {
			t.Errorf("FENCED DEL as app: %q, want %q", got, want)
		}
		if r := direct.do("GET", "lockproxy:fence:r:acl"); r != "$1\r\n5\r\n" {
			t.Errorf("record after the refused DEL: %q", r)
		}
		direct.do("DEL", "lockproxy:fence:r:acl")
	}
}

// TestFencedConcurrentWriters: clients race FENCED writes with fences
// handed out in increasing order, so that some arrive after a larger one
// (refused) and many find the record changed under their WATCH (tried
// again): the list the writes append to never decreases, and holds exactly
// the accepted fences.
func TestFencedConcurrentWriters(t *testing.T) {
	env := startFencedEnv(t)
	var next atomic.Int64
	var mu sync.Mutex
	accepted := map[int64]bool{}
	stale := 0
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			c := dialRaw(t, env.proxy, w%2 == 1)
			for range 150 {
				f := next.Add(1)
				r := c.do("FENCED", "race", strconv.FormatInt(f, 10), "EVAL", "return redis.call('rpush', KEYS[1], ARGV[1])", "1", "race:list", strconv.FormatInt(f, 10))
				mu.Lock()
				switch {
				case strings.HasPrefix(r, ":"):
					accepted[f] = true
				case strings.HasPrefix(r, "-STALEFENCE fence "):
					stale++
				default:
					t.Errorf("fence %d: %q", f, r)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	direct := dialRaw(t, env.backend.Addr, false)
	list := strings.Split(strings.TrimSpace(direct.do("LRANGE", "race:list", "0", "-1")), "\r\n")
	var got []int64
	for i := 2; i < len(list); i += 2 {
		f, _ := strconv.ParseInt(list[i], 10, 64)
		got = append(got, f)
	}
	for i := 1; i < len(got); i++ {
		if got[i] < got[i-1] {
			t.Fatalf("fence %d appended after %d", got[i], got[i-1])
		}
	}
	if len(got) != len(accepted) {
		t.Errorf("%d fences in the list, %d accepted", len(got), len(accepted))
	}
	for _, f := range got {
		if !accepted[f] {
			t.Errorf("fence %d in the list was not accepted", f)
		}
	}
	t.Logf("%d accepted, %d refused", len(accepted), stale)
}
