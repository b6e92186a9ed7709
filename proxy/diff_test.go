package proxy

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/internal/redistest"
)

// step is one move of a scripted session: send cmds (or raw bytes) on a
// named connection in one write, then read that many replies.
type step struct {
	on   string
	cmds [][]string
	raw  string
	read int // replies to read; -1 means len(cmds)
	// blocked waits until the server has this many blocked clients, so
	// that a blocking command is surely waiting before it is woken.
	blocked int
}

func send(on string, cmds ...string) step {
	s := step{on: on, read: -1}
	for _, c := range cmds {
		s.cmds = append(s.cmds, args(c))
	}
	return s
}

// sendNoRead sends without reading (a blocking command whose reply comes
// later).
func sendNoRead(on string, cmds ...string) step {
	s := send(on, cmds...)
	s.read = 0
	return s
}

func sendRead(on string, n int, cmds ...string) step {
	s := send(on, cmds...)
	s.read = n
	return s
}

func readOn(on string, n int) step { return step{on: on, read: n} }

func cmdArgs(on string, a ...string) step { return step{on: on, cmds: [][]string{a}, read: -1} }

// run plays steps against addr and returns everything read, labelled by
// step, so that a difference points at its step.
func run(t *testing.T, srv *redistest.Server, addr string, steps []step) []byte {
	t.Helper()
	conns := map[string]*client{}
	var out bytes.Buffer
	for i, s := range steps {
		if s.blocked > 0 {
			waitBlocked(t, srv, s.blocked)
			continue
		}
		c := conns[s.on]
		if c == nil {
			c = dial(t, addr)
			conns[s.on] = c
		}
		switch {
		case s.raw != "":
			c.send([]byte(s.raw))
		case len(s.cmds) > 0:
			c.send(encode(s.cmds...))
		}
		n := s.read
		if n < 0 {
			n = len(s.cmds)
			if s.raw != "" {
				n = 1
			}
		}
		if n > 0 {
			fmt.Fprintf(&out, "--- step %d on %s\n", i, s.on)
			b, err := c.tryRead(n, 10*time.Second)
			if err != nil {
				t.Fatalf("%s: step %d: read %d replies: %v (got %q)", addr, i, n, err, trunc(b))
			}
			out.Write(b)
		}
	}
	return out.Bytes()
}

// variable masks the parts of replies that differ between any two
// connections: the client id in HELLO's reply.
var variable = regexp.MustCompile(`(\$2\r\nid\r\n:)\d+`)

func mask(b []byte) []byte { return variable.ReplaceAll(b, []byte("${1}<id>")) }

// TestDifferential plays the same sessions against Redis directly and
// through the proxy and requires byte-identical replies.
func TestDifferential(t *testing.T) {
	for _, model := range []struct {
		name   string
		shared int
	}{{"shared connections", 2}, {"dedicated connections only", -1}} {
		t.Run(model.name, func(t *testing.T) {
			srv := redistest.Start(t)
			addr, _ := startProxy(t, srv.Addr, func(c *Config) { c.Backend.SharedConnections = model.shared })
			differential(t, srv, addr)
		})
	}
}

func differential(t *testing.T, srv *redistest.Server, addr string) {
	big := strings.Repeat("0123456789", 1<<20) // 10 MB
	pipeline := make([]string, 0, 1000)
	for i := range 500 {
		pipeline = append(pipeline, fmt.Sprintf("SET key:%d %d", i, i), fmt.Sprintf("GET key:%d", i))
	}

	tests := []struct {
		name  string
		steps []step
	}{
		{"strings", []step{send("a",
			"SET s hello", "GET s", "GET missing", "APPEND s world", "GETRANGE s 0 3",
			"INCR n", "INCRBY n 41", "INCRBYFLOAT f 1.5", "MGET s missing n", "SETNX s x",
			"SET s v GET", "GETDEL s", "STRLEN n", "SET e 1 PX 100000 NX", "TTL e", "TYPE n")}},
		{"lists", []step{send("a",
			"RPUSH l a b c d", "LPUSH l z", "LRANGE l 0 -1", "LINDEX l 99", "LPOP l 2",
			"LPOP nolist 2", "LPOP nolist", "LPOS l c", "LLEN l", "RPOPLPUSH l l2", "LMOVE l l2 LEFT RIGHT")}},
		{"hashes", []step{send("a",
			"HSET h f1 v1 f2 v2", "HGET h f1", "HMGET h f1 nope f2", "HGETALL h", "HINCRBY h n 5",
			"HINCRBYFLOAT h x 2.5", "HLEN h", "HEXISTS h nope", "HKEYS h", "HGETALL nohash")}},
		{"sets", []step{send("a",
			"SADD s 3 1 2", "SMEMBERS s", "SISMEMBER s 2", "SMISMEMBER s 1 9", "SCARD s",
			"SADD t 2 3 4", "SINTER s t", "SDIFF s t", "SREM s 1", "SMEMBERS nothing")}},
		{"zsets", []step{send("a",
			"ZADD z 1 a 2.5 b 3 c", "ZRANGE z 0 -1 WITHSCORES", "ZSCORE z b", "ZSCORE z nope",
			"ZRANK z c", "ZINCRBY z 0.5 a", "ZPOPMIN z", "ZRANGEBYSCORE z -inf +inf", "ZCARD z",
			"ZUNIONSTORE u 2 z z", "ZRANGE u 0 -1 WITHSCORES")}},
		{"streams", []step{send("a",
			"XADD st 1-1 a 1", "XADD st 1-2 b 2 c 3", "XLEN st", "XRANGE st - +",
			"XREAD COUNT 10 STREAMS st 0", "XREAD STREAMS st 9-9", "XGROUP CREATE st g 0",
			"XREADGROUP GROUP g c1 COUNT 1 STREAMS st >", "XPENDING st g", "XDEL st 1-1", "XRANGE st - +")}},
		{"scripting", []step{
			cmdArgs("a", "EVAL", "return {1, 'two', {3, 'four'}, redis.status_reply('OK'), false}", "0"),
			cmdArgs("a", "EVAL", "return redis.error_reply('MYERR custom')", "0"),
			cmdArgs("a", "EVAL", "return redis.call('SET', KEYS[1], ARGV[1])", "1", "k", "v"),
			cmdArgs("a", "EVAL", "return redis.call('INCR', KEYS[1])", "1", "k"),
			cmdArgs("a", "EVALSHA", "ffffffffffffffffffffffffffffffffffffffff", "0"),
			cmdArgs("a", "EVAL", "return 3.99", "0"),
		}},
		{"errors", []step{send("a",
			"SET w x", "LPUSH w y", "NOSUCHCOMMAND a b", "GET", "SET a", "ZADD z x a",
			"INCR w", "SET a b NX XX", "EXPIRE a notanumber", "OBJECT FOO")}},
		{"pipeline of 1000", []step{send("a", pipeline...)}},
		{"inline commands", []step{
			{on: "a", raw: "PING\r\n", read: 1},
			{on: "a", raw: "SET inline \"quoted value\"\r\nGET inline\r\n", read: 2},
		}},
		{"transactions", []step{
			send("a", "WATCH wk"),
			send("b", "SET wk changed"),
			send("a", "MULTI", "SET wk mine", "GET wk", "EXEC", "GET wk"),
			send("a", "MULTI", "INCR cnt", "INCR cnt", "EXEC"),
			send("a", "MULTI", "SET x", "EXEC"),
			send("a", "MULTI", "SET y 1", "DISCARD", "EXEC", "GET y"),
		}},
		{"pubsub", []step{
			send("a", "SUBSCRIBE c1 c2"),
			readOn("a", 1), // the second confirmation
			send("a", "PSUBSCRIBE p*"),
			send("b", "PUBLISH c1 hello", "PUBLISH pq world", "PUBLISH nobody x"),
			readOn("a", 2),
			send("a", "PING", "PING hi"),
			send("a", "GET x"),
			send("a", "UNSUBSCRIBE"),
			readOn("a", 1),
			send("a", "PUNSUBSCRIBE"),
			send("a", "GET x", "UNSUBSCRIBE"),
		}},
		{"blocking", []step{
			sendNoRead("a", "BLPOP q 10"),
			sendNoRead("c", "BRPOP q2 10"),
			send("b", "LPUSH q2 first"),
			readOn("c", 1),
			send("b", "RPUSH q v"),
			readOn("a", 1),
			send("a", "BLPOP q 0.01"),
			sendNoRead("a", "BLMOVE src dst LEFT RIGHT 10"),
			send("b", "RPUSH src m"),
			readOn("a", 1),
			sendNoRead("a", "BZPOPMIN zq 10"),
			send("b", "ZADD zq 1 m"),
			readOn("a", 1),
			sendNoRead("a", "XREAD BLOCK 10000 STREAMS xs $"),
			{blocked: 1},
			send("b", "XADD xs 5-1 f v"),
			readOn("a", 1),
			send("a", "WAIT 0 0"),
		}},
		{"resp3", []step{
			send("a", "HELLO 3"),
			send("a", "SET s v", "GET missing", "HSET h a 1", "HGETALL h", "ZADD z 1.5 m",
				"ZSCORE z m", "SADD st x", "SMEMBERS st", "EXISTS s", "LPOP nolist 2",
				"EVAL 'return 1' 0", "CONFIG GET maxmemory-policy", "XADD xs 1-1 a b", "XINFO STREAM xs"),
			send("a", "SUBSCRIBE ch"),
			send("b", "PUBLISH ch msg"),
			readOn("a", 1),
			send("a", "GET s", "PING"),
			send("a", "UNSUBSCRIBE ch"),
			send("a", "HELLO 2", "HGETALL h"),
		}},
		{"select", []step{send("a",
			"SELECT 1", "SET k one", "SELECT 0", "GET k", "SELECT 1", "GET k", "SELECT 99", "SELECT x")}},
		{"client", []step{send("a",
			"CLIENT GETNAME", "CLIENT SETNAME worker", "CLIENT GETNAME", "CLIENT SETNAME bad name",
			"CLIENT NOSUCH")}},
		{"client reply", []step{
			// CLIENT REPLY OFF and the SET after it answer nothing.
			sendRead("a", 2, "CLIENT REPLY OFF", "SET r 1", "CLIENT REPLY ON", "GET r"),
			sendRead("a", 1, "CLIENT REPLY SKIP", "SET r 2", "GET r"),
		}},
		{"reset", []step{send("a", "SELECT 2", "SET k v", "CLIENT SETNAME n", "RESET", "GET k", "CLIENT GETNAME")}},
		{"big value", []step{
			cmdArgs("a", "SET", "big", big),
			send("a", "GET big", "STRLEN big"),
			cmdArgs("a", "APPEND", "big", big[:1000]),
		}},
		{"quit", []step{send("a", "SET q 1", "QUIT")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { compare(t, srv, addr, tt.steps) })
	}
}

// compare plays steps against Redis directly and then through the proxy
// at addr, each time on an empty database, and requires the same bytes.
func compare(t *testing.T, srv *redistest.Server, addr string, steps []step) {
	t.Helper()
	mustFlush(t, srv)
	want := mask(run(t, srv, srv.Addr, steps))
	mustFlush(t, srv)
	got := mask(run(t, srv, addr, steps))
	if !bytes.Equal(got, want) {
		t.Errorf("replies differ\nthrough proxy: %q\ndirect:        %q", trunc(got), trunc(want))
		for i := range min(len(got), len(want)) {
			if got[i] != want[i] {
				t.Errorf("first difference at byte %d: proxy %q, direct %q", i,
					trunc(got[max(0, i-40):min(len(got), i+80)]), trunc(want[max(0, i-40):min(len(want), i+80)]))
				break
			}
		}
	}
}

// TestDifferentialNestedReplies requires replies nested as deeply as Redis
// can nest them (a Lua table that contains itself, converted until Lua's
// stack limit, about 8000 levels) to come through byte for byte, with the
// commands after them still in step, in RESP2 and RESP3, and RESP3's
// attributes and pushes among ordinary replies.
func TestDifferentialNestedReplies(t *testing.T) {
	const (
		selfArray = "local a = {}; local b = {a}; a[1] = b; return a"
		selfMap   = "local a = {map={}}; a.map.k = a; return a"
		selfSet   = "local a = {set={}}; a.set[a] = true; return a"
		// Nested but finite: a map in an array in a set, 3000 levels.
		mixed = "local t = 1; for i = 1, 1000 do t = {map={k={t, i}}}; t = {set={[t]=true}} end; return {t, 'end'}"
	)
	srv := redistest.Start(t, "--enable-debug-command", "yes")
	for _, model := range []struct {
		name   string
		shared int
	}{{"shared connections", 2}, {"dedicated connections only", -1}} {
		t.Run(model.name, func(t *testing.T) {
			addr, _ := startProxy(t, srv.Addr, func(c *Config) { c.Backend.SharedConnections = model.shared })
			tests := []struct {
				name  string
				steps []step
			}{
				{"resp2", []step{
					cmdArgs("a", "EVAL", selfArray, "0"),
					send("a", "PING", "SET k v", "GET k"),
					cmdArgs("a", "EVAL", selfMap, "0"),
					cmdArgs("a", "EVAL", selfSet, "0"),
					cmdArgs("a", "EVAL", mixed, "0"),
					send("a", "PING"),
				}},
				{"resp2 pipelined", []step{{on: "a", raw: string(encode(
					[]string{"EVAL", selfArray, "0"}, []string{"PING"},
					[]string{"EVAL", selfMap, "0"}, []string{"ECHO", "after"},
				)), read: 4}}},
				{"resp3", []step{
					send("a", "HELLO 3"),
					cmdArgs("a", "EVAL", selfArray, "0"),
					cmdArgs("a", "EVAL", selfMap, "0"),
					cmdArgs("a", "EVAL", selfSet, "0"),
					cmdArgs("a", "EVAL", mixed, "0"),
					send("a", "DEBUG PROTOCOL attrib", "DEBUG PROTOCOL push", "DEBUG PROTOCOL map",
						"DEBUG PROTOCOL set", "DEBUG PROTOCOL verbatim", "DEBUG PROTOCOL bignum", "PING"),
					// A push, then its reply; an attribute, then its reply.
					sendRead("a", 4, "DEBUG PROTOCOL push", "DEBUG PROTOCOL attrib"),
					send("a", "SUBSCRIBE ch"),
					send("b", "PUBLISH ch msg"),
					readOn("a", 1),
					send("a", "DEBUG PROTOCOL attrib", "PING"),
					send("a", "UNSUBSCRIBE ch"),
				}},
			}
			for _, tt := range tests {
				t.Run(tt.name, func(t *testing.T) { compare(t, srv, addr, tt.steps) })
			}
		})
	}
}

func waitBlocked(t *testing.T, srv *redistest.Server, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c := dial(t, srv.Addr)
		info := string(c.do(args("INFO clients")))
		c.c.Close()
		if strings.Contains(info, fmt.Sprintf("blocked_clients:%d\r\n", n)) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %d blocked clients: %s", n, info)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func mustFlush(t *testing.T, srv *redistest.Server) {
	t.Helper()
	if r, err := srv.Do("FLUSHALL"); err != nil || r != "+OK" {
		t.Fatalf("FLUSHALL: %q %v", r, err)
	}
}

// atoi is for tests that read a count out of a reply.
func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestDifferentialRequests sends raw requests, valid or not, to Redis
// directly and through the proxy (default limits, which are Redis's), and
// requires the same bytes back and the same outcome for the connection:
// closed, or still open and waiting. Each case is a list of writes; after
// each write the reply is read until the connection closes or stays quiet.
// The cases walk every branch of Redis 7.0's request parser
// (processInlineBuffer, processMultibulkBuffer): empty, zero, negative,
// malformed and oversized counts and lengths, inline and multibulk, and
// lines cut between writes.
func TestDifferentialRequests(t *testing.T) {
	const (
		ping  = "*1\r\n$4\r\nPING\r\n"
		limit = 64 << 10 // Redis's PROTO_INLINE_MAX_SIZE
	)
	// over makes a line of exactly one byte more than the limit after
	// prefix, so that Redis has read all of it when it gives up (unread
	// bytes would make it reset the connection instead of closing it).
	over := func(prefix string, fill byte) string {
		return prefix + strings.Repeat(string(fill), limit+1-len(prefix))
	}
	tests := []struct {
		name   string
		writes []string
	}{
		// Empty and skipped requests.
		{"empty line", []string{"\r\n", ping}},
		{"bare newline", []string{"\n" + ping}},
		{"line of blanks", []string{" \t\v\f\r\r\n", "PING\r\n"}},
		{"count zero", []string{"*0\r\n" + ping}},
		{"count minus one", []string{"*-1\r\nPING\r\n"}},
		{"negative count", []string{"*-10\r\n", "PING\r\n"}},
		{"most negative count", []string{"*-9223372036854775808\r\n" + ping}},
		{"skipped requests between others", []string{"PING\r\n*0\r\n" + ping + "\r\n*-3\r\nPING\r\n"}},
		// Counts Redis refuses.
		{"count minus zero", []string{"*-0\r\n" + ping}},
		{"count with a leading zero", []string{"*01\r\n" + ping}},
		{"count with a plus", []string{"*+1\r\n" + ping}},
		{"count with a blank", []string{"*1 \r\n" + ping}},
		{"empty count", []string{"*\r\n" + ping}},
		{"count of a minus", []string{"*-\r\n"}},
		{"count not a number", []string{"*abc\r\n"}},
		{"count past INT_MAX", []string{"*2147483648\r\n"}},
		{"out of range count", []string{"*3000000000\r\n"}},
		{"count past int64", []string{"*9223372036854775808\r\n"}},
		{"count of 20 digits", []string{"*99999999999999999999\r\n"}},
		{"count line never ends", []string{over("*", '1')}},
		{"count line hidden by a NUL", []string{over("*\x00", 'A')}},
		// Counts Redis accepts and then waits on.
		{"count INT_MAX", []string{"*2147483647\r\n", "$4\r\nPING\r\n"}},
		{"count above a million", []string{"*1048577\r\n$4\r\nECHO\r\n"}},
		{"count without its bulks", []string{"*2\r\n", "$4\r\nECHO\r\n", "$1\r\nx\r\n"}},
		// Bulk lengths.
		{"bulk length minus one", []string{"*1\r\n$-1\r\n"}},
		{"negative bulk length", []string{"*3\r\n$3\r\nSET\r\n$1\r\nx\r\n$-10\r\n"}},
		{"bulk length minus zero", []string{"*1\r\n$-0\r\n"}},
		{"bulk length with a leading zero", []string{"*1\r\n$04\r\nPING\r\n"}},
		{"empty bulk length", []string{"*1\r\n$\r\n"}},
		{"bulk length not a number", []string{"*3\r\n$3\r\nSET\r\n$1\r\nx\r\n$blabla\r\n"}},
		{"bulk length past proto-max-bulk-len", []string{"*3\r\n$3\r\nSET\r\n$1\r\nx\r\n$536870913\r\n"}},
		{"out of range bulk length", []string{"*3\r\n$3\r\nSET\r\n$1\r\nx\r\n$2000000000\r\n"}},
		{"bulk length at proto-max-bulk-len", []string{"*2\r\n$4\r\nECHO\r\n$536870912\r\n", "abc"}},
		{"bulk length line never ends", []string{over("*1\r\n$", '1')}},
		{"bulk length line hidden by a NUL", []string{over("*1\r\n$\x00", '1')}},
		{"empty bulk", []string{"*2\r\n$4\r\nECHO\r\n$0\r\n\r\n"}},
		{"empty command", []string{"*1\r\n$0\r\n\r\n", ping}},
		{"bulk holding a line break", []string{"*2\r\n$4\r\nECHO\r\n$3\r\na\r\n\r\n"}},
		// Redis does not look at the byte after a length line's '\r' or
		// at the two bytes after an argument.
		{"any byte after a count's CR", []string{"*1\rX$4\r\nPING\r\n"}},
		{"any byte after a length's CR", []string{"*1\r\n$4\rXPING\r\n"}},
		{"any bytes after an argument", []string{"*2\r\n$4\r\nECHO\r\n$2\r\nhi!!" + ping}},
		{"count's CR ending a write", []string{"*1\r", "\n$4\r\nPI", "NG\r", "\n"}},
		{"count skipped across writes", []string{"*-1", "0\r", "\n", ping}},
		// Missing '$'.
		{"bulk expected, got a letter", []string{"*3\r\n$3\r\nSET\r\n$1\r\nx\r\nfooz\r\n"}},
		{"bulk expected, got a line", []string{"*1\r\nfoo\r\n"}},
		{"bulk expected, got an integer", []string{"*1\r\n:1\r\n"}},
		{"bulk expected, got an empty line", []string{"*1\r\n\r\n"}},
		{"bulk expected, got a bare newline", []string{"*1\r\n\n\r\n"}},
		{"bulk expected, got a high byte", []string{"*1\r\n\x80\r\n"}},
		{"bulk expected, no line end yet", []string{"*1\r\nfoo", "bar\r", "\n"}},
		// Inline requests.
		{"inline", []string{"PING\r\nping\nECHO   a\t b\r\n"}},
		{"inline double quotes", []string{"ECHO \"a b\"\r\nECHO \"\"\r\nECHO \"\\x41\\x4a\\n\\t\\\\\\\"\\q\\xZZ\"\r\n"}},
		{"inline single quotes", []string{"ECHO 'a \"b\" \\'c\\' \\n'\r\n"}},
		{"inline quote inside an argument", []string{"ECHO a\"b c\"\r\nECHO x'y z'\r\n"}},
		{"inline vertical tab and form feed", []string{"ECHO a\vb\r\nECHO a\fb\r\n\vPING\f\r\n"}},
		{"inline carriage return inside", []string{"ECHO a\rb\r\nPING\r\r\n"}},
		{"inline empty command", []string{"\"\"\r\n", "PING\r\n"}},
		{"inline many arguments", []string{"RPUSH l" + strings.Repeat(" x", 5000) + "\r\nLLEN l\r\nDEL l\r\n"}},
		{"inline set with quoted value", []string{"SET k \"quoted value\"\r\nGET k\r\nDEL k\r\n"}},
		{"unbalanced quotes", []string{"set \"\"\"test-key\"\"\" test-value\r\nping\r\n"}},
		{"unterminated double quote", []string{"PING\r\nECHO \"abc\r\n"}},
		{"unterminated single quote", []string{"ECHO 'abc\r\n"}},
		{"escaped closing quote", []string{"ECHO \"abc\\\"\r\n"}},
		{"text after a closing quote", []string{"ECHO \"a\"b\r\n"}},
		{"text after a closing single quote", []string{"ECHO 'a'b\r\n"}},
		{"inline too big", []string{over("", 'a')}},
		{"inline too big after a NUL", []string{over("\x00", 'A')}},
		{"inline starting with a dollar", []string{over("$\x00", 'A')}},
		{"inline NUL hides the line end", []string{"PI\x00NG\r\nPING\r\n", ping}},
		{"inline across writes", []string{"EC", "HO 'a", " b'\r", "\n"}},
		// Good requests before a bad one are answered first.
		{"good requests first", []string{ping + "PING\r\n*1\r\n$-5\r\n"}},
		{"good requests in the same write as a bad count", []string{ping + "*x\r\n" + ping}},
	}
	srv := redistest.Start(t)
	addr, _ := startProxy(t, srv.Addr, nil)
	// Redis's answers first; the proxy's are then read up to the same
	// length or outcome, however slow the machine, before the check for
	// more. All cases run at once.
	direct := make([][]exchangeOutcome, len(tests))
	proxied := make([][]exchangeOutcome, len(tests))
	var wg sync.WaitGroup
	for i, tt := range tests {
		wg.Add(1)
		go func() {
			defer wg.Done()
			direct[i] = exchange(srv.Addr, tt.writes, nil)
			proxied[i] = exchange(addr, tt.writes, direct[i])
		}()
	}
	wg.Wait()
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got, want := fmt.Sprint(proxied[i]), fmt.Sprint(direct[i]); got != want {
				t.Errorf("through proxy:\n%s\ndirect:\n%s", got, want)
			}
		})
	}
}

// exchangeOutcome is what came back after one write: the bytes, and whether the
// connection was closed.
type exchangeOutcome struct {
	out    string
	closed bool
}

func (o exchangeOutcome) String() string {
	state := "open"
	if o.closed {
		state = "closed"
	}
	return fmt.Sprintf("%q, %s\n", trunc([]byte(o.out)), state)
}

// exchange makes the writes on a new connection to addr and returns what
// came back after each. Without want, a write's answer is what arrives
// before 300 ms of quiet; with want, it is read until it is as long as
// the wanted one, or closed, within 10 s, and then until the connection
// closes (if the wanted one did) or stays quiet.
func exchange(addr string, writes []string, want []exchangeOutcome) []exchangeOutcome {
	nc, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return []exchangeOutcome{{out: "dial: " + err.Error()}}
	}
	defer nc.Close()
	var got []exchangeOutcome
	buf := make([]byte, 64<<10)
	for i, w := range writes {
		nc.SetWriteDeadline(time.Now().Add(10 * time.Second))
		_, werr := nc.Write([]byte(w))
		var o exchangeOutcome
		var b bytes.Buffer
		read := func(d time.Duration) bool { // reports whether reading ended
			nc.SetReadDeadline(time.Now().Add(d))
			n, err := nc.Read(buf)
			b.Write(buf[:n])
			if err != nil {
				var ne net.Error
				o.closed = !errors.As(err, &ne) || !ne.Timeout()
				return true
			}
			return false
		}
		ended := false
		if i < len(want) {
			for !ended && b.Len() < len(want[i].out) {
				ended = read(10 * time.Second)
			}
			for !ended && want[i].closed {
				ended = read(10 * time.Second)
			}
		}
		for !ended {
			ended = read(300 * time.Millisecond)
		}
		o.out = b.String()
		o.closed = o.closed || werr != nil
		got = append(got, o)
		if o.closed {
			break
		}
	}
	return got
}
