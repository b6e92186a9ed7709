package proxy

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/internal/redistest"
	"github.com/lockproxy/lockproxy/proxy/internal/acl"
)

// aclUsers are the users of the ACL tests, in aclfile form: key patterns
// with %R~ and %W~, categories, subcommands, channels, selectors,
// nopass and off.
var aclUsers = []string{
	"user alice on >pa ~app:* %R~shared:* &events:* +@read +@write -@dangerous +@connection",
	"user bob on >pb ~* &* +@all -flushall -flushdb -config|set -acl|setuser -acl|deluser -debug -shutdown",
	"user carol on nopass %W~w:* %R~r:* ~both:* +get +set +del +mget +mset +exists +ping +echo +hello +auth +acl|whoami +client|setname +client|getname +incr +append +getrange",
	"user dave on >pd ~k:* +@string +@list +@connection (~sel:* +@hash +ping) (%R~ro:* +get +strlen)",
	"user erin off >pe ~* &* +@all",
	"user frank on >pf resetchannels &news:* &chat:* ~* +@pubsub +@connection +get +set +config|get",
	"user gail on >pg ~* +@all -@write +set +acl|whoami +acl|dryrun",
}

// startACLPair starts a Redis with aclUsers loaded (direct), and a proxy
// defining the same users in front of another Redis (backend); extra
// edits the proxy's Config.
func startACLPair(t *testing.T, extra func(*Config)) (direct, backend *redistest.Server, addr string, p *Proxy) {
	t.Helper()
	direct = redistest.Start(t)
	for _, u := range aclUsers {
		args := append([]string{"ACL", "SETUSER"}, mustSplitACL(t, u)[1:]...)
		if r, err := direct.Do(args...); err != nil || r != "+OK" {
			t.Fatalf("%v: %q %v", args, r, err)
		}
	}
	if r, err := direct.Do("CONFIG", "SET", "requirepass", "dpw"); err != nil || r != "+OK" {
		t.Fatalf("requirepass: %q %v", r, err)
	}
	backend = redistest.Start(t)
	addr, p = startProxy(t, backend.Addr, func(c *Config) {
		c.ACL.Users = aclUsers
		c.Users = map[string]string{"default": "dpw"}
		if extra != nil {
			extra(c)
		}
	})
	return direct, backend, addr, p
}

func mustSplitACL(t *testing.T, line string) []string {
	t.Helper()
	a, err := acl.Split(line)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestACLSignIn: signing in through the proxy answers as Redis does:
// wrong passwords, a disabled user, nopass, HELLO ... AUTH, ACL WHOAMI,
// RESET; the refusals of forwarded commands are Redis's own.
func TestACLSignIn(t *testing.T) {
	direct, backend, addr, _ := startACLPair(t, nil)
	steps := []step{
		send("a", "GET app:1", "AUTH alice wrong", "AUTH erin pe", "AUTH nobody x", "AUTH alice pa", "ACL WHOAMI",
			"SET app:1 v", "GET app:1", "SET other v", "GET shared:1", "SET shared:1 v", "FLUSHALL", "PUBLISH events:x m", "PUBLISH other m"),
		send("b", "HELLO 3 AUTH carol anything SETNAME c1", "ACL WHOAMI", "CLIENT GETNAME", "SET w:1 v", "GET w:1", "GET r:1", "SET r:1 v", "SET both:1 v", "GET both:1", "HSET w:1 a b"),
		send("c", "AUTH dave pd", "SET k:1 v", "HSET sel:1 a b", "HGET sel:1 a", "HSET k:2 a b", "GET ro:1", "SET ro:1 v", "PING", "ACL WHOAMI", "RESET", "GET k:1", "AUTH bob pb", "ACL WHOAMI", "FLUSHALL", "CONFIG SET maxmemory 0", "CONFIG GET maxmemory", "GET k:1"),
		send("d", "AUTH frank pf", "PUBLISH news:1 x", "PUBLISH other x", "SET a 1", "CONFIG GET maxmemory", "CONFIG SET maxmemory 0", "GET a"),
		// Switching users, on the shared connections and on the client's own.
		send("f", "AUTH alice pa", "GET other", "AUTH default dpw", "GET other", "ACL WHOAMI", "AUTH alice pa", "GET other", "ACL WHOAMI", "AUTH bob pb", "GET other", "ACL WHOAMI"),
		send("g", "AUTH alice pa", "HELLO 2", "GET other", "AUTH bob pb", "GET other", "FLUSHALL", "CONFIG GET maxmemory", "AUTH alice pa", "CONFIG GET maxmemory",
			"AUTH default dpw", "CONFIG GET maxmemory", "ACL WHOAMI", "HELLO 3 AUTH dave pd", "GET other", "GET k:1", "HELLO 2 AUTH default dpw", "GET other", "ACL WHOAMI"),
		send("e", "AUTH gail pg", "SET a 3", "DEL a", "ACL WHOAMI", "ACL DRYRUN alice SET app:1 x", "ACL DRYRUN alice SET nope x", "ACL DRYRUN nobody GET x"),
	}
	compareACL(t, direct, backend, addr, steps)
}

// TestACLBackendRestartedEmpty: the users come back on a backend that
// restarted without them, at the next sign-in or connection of theirs.
func TestACLBackendRestartedEmpty(t *testing.T) {
	_, backend, addr, _ := startACLPair(t, nil)
	c := dial(t, addr)
	if got := string(c.do(args("AUTH alice pa"), args("SET app:1 v"))); got != "+OK\r\n+OK\r\n" {
		t.Fatalf("%q", got)
	}
	backend.RestartEmpty()
	c.do(args("GET app:1")) // answers "connection lost" or not: the old connection is gone either way
	if got := string(c.do(args("SET app:1 w"), args("GET app:1"), args("GET other"))); got != "+OK\r\n$1\r\nw\r\n-NOPERM this user has no permissions to access one of the keys used as arguments\r\n" {
		t.Fatalf("after the restart: %q", got)
	}
	backend.RestartEmpty()
	d := dial(t, addr)
	if got := string(d.do(args("AUTH dave pd"), args("SET k:1 v"), args("SET app:1 v"))); got != "+OK\r\n+OK\r\n-NOPERM this user has no permissions to access one of the keys used as arguments\r\n" {
		t.Fatalf("a new sign-in after the restart: %q", got)
	}
}

// TestACLRefusedRunsNothing: a command Redis's ACL refuses through the
// proxy runs nowhere: the backend refused it itself (its rejected_calls
// count it, its calls do not) and the key is untouched.
func TestACLRefusedRunsNothing(t *testing.T) {
	_, backend, addr, _ := startACLPair(t, nil)
	c := dial(t, addr)
	c.do(args("AUTH alice pa"), args("FLUSHALL"), args("SET other v"), args("CONFIG SET maxmemory 1"))
	ctx := context.Background()
	rc := redis.NewClient(&redis.Options{Addr: backend.Addr})
	defer rc.Close()
	stats, err := rc.Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"cmdstat_flushall:calls=0,", "cmdstat_config|set:calls=0,"} {
		if !strings.Contains(stats, want) || !strings.Contains(stats, "rejected_calls=1") {
			t.Errorf("commandstats lack %q:\n%s", want, stats)
		}
	}
	if n, err := rc.Exists(ctx, "other").Result(); err != nil || n != 0 {
		t.Errorf("the refused SET ran: %d %v", n, err)
	}
	// Redis's ACL LOG has the refusals, with the user's name.
	log, err := rc.Do(ctx, "ACL", "LOG").Slice()
	if err != nil || len(log) < 3 {
		t.Fatalf("ACL LOG: %v %v", log, err)
	}
	if got := fmt.Sprint(log[0]); !strings.Contains(got, "username:alice") {
		t.Errorf("ACL LOG's entry: %s", got)
	}
}

// compareACL plays steps on direct and through the proxy at addr, and
// requires the same bytes.
func compareACL(t *testing.T, direct, backend *redistest.Server, addr string, steps []step) []byte {
	t.Helper()
	want := mask(run(t, direct, direct.Addr, steps))
	got := mask(run(t, backend, addr, steps))
	if !bytes.Equal(got, want) {
		gl, wl := strings.Split(string(got), "\n"), strings.Split(string(want), "\n")
		for i := range min(len(gl), len(wl)) {
			if gl[i] != wl[i] {
				t.Fatalf("replies differ at line %d: through proxy %q, direct %q\nthrough proxy: %q\ndirect:        %q", i, gl[i], wl[i], got, want)
			}
		}
		t.Fatalf("replies differ\nthrough proxy: %q\ndirect:        %q", got, want)
	}
	return want
}

// aclSignIns are how each user of aclUsers signs in: its AUTH
// arguments (a wrong one for erin, who is off, and any for carol).
var aclSignIns = [][]string{
	{"alice", "pa"}, {"bob", "pb"}, {"carol", "anything"}, {"dave", "pd"},
	{"erin", "pe"}, {"frank", "pf"}, {"gail", "pg"},
}

// aclKeys are keys and channels under each user's patterns, and outside.
var aclKeys = []string{"app:", "shared:", "w:", "r:", "both:", "k:", "sel:", "ro:", "events:", "news:", "other:"}

// aclCommands are the commands each user sends in the equivalence test,
// for keys with suffix sfx: every family of commands (strings, hashes,
// lists, sets, sorted sets, streams, keys, pub/sub, scripting,
// connection, server, ACL) on every key of aclKeys.
func aclCommands(sfx string) [][]string {
	var out [][]string
	add := func(s string) { out = append(out, strings.Fields(s)) }
	for _, p := range aclKeys {
		k := p + sfx
		for _, c := range []string{
			"SET %[1]s v", "GET %[1]s", "APPEND %[1]s x", "STRLEN %[1]s", "GETRANGE %[1]s 0 1",
			"INCR %[1]s:n", "MGET %[1]s other:%[1]s", "EXISTS %[1]s", "TYPE %[1]s", "LLEN %[1]s",
			"HSET %[1]s:h f v", "HGET %[1]s:h f", "HGETALL %[1]s:h",
			"LPUSH %[1]s:l a b", "LRANGE %[1]s:l 0 -1", "RPOP %[1]s:l",
			"SADD %[1]s:s a", "SMEMBERS %[1]s:s", "ZADD %[1]s:z 1 a", "ZRANGE %[1]s:z 0 -1 WITHSCORES",
			"XADD %[1]s:x 1-1 f v", "XLEN %[1]s:x", "EXPIREAT %[1]s 4102444800", "EXPIRETIME %[1]s",
			"PUBLISH %[1]s m", "DEL %[1]s:s",
		} {
			add(fmt.Sprintf(c, k))
		}
	}
	for _, c := range []string{
		"PING", "ECHO hi", "ACL WHOAMI", "CLIENT SETNAME n" + sfx, "CLIENT GETNAME", "DBSIZE",
		"CONFIG GET maxmemory", "CONFIG SET maxmemory 0", "FLUSHDB", "EVAL return 1 0",
		"ACL DRYRUN alice GET app:1", "ACL DRYRUN dave HGET sel:1 f", "ACL SETUSER nobody", "ACL DELUSER nobody",
		"OBJECT ENCODING app:" + sfx, "COPY app:{" + sfx + "} app:{" + sfx + "}c", "RENAME w:{" + sfx + "} r:{" + sfx + "}",
		"SET app:{" + sfx + "} v", "SET w:{" + sfx + "} v", "COPY app:{" + sfx + "} app:{" + sfx + "}c", "RENAME w:{" + sfx + "} r:{" + sfx + "}",
		"PING",
	} {
		add(c)
	}
	return out
}

// TestACLEquivalence: seven users with different rules send the same
// commands (over 280 each, of every family) to a Redis with the same
// users and through the proxy, in RESP2 and RESP3, pipelined and not:
// the replies are the same, byte for byte.
func TestACLEquivalence(t *testing.T) {
	direct, backend, addr, _ := startACLPair(t, nil)
	aclEquivalence(t, direct, backend, addr)
}

// TestACLEquivalenceCluster is TestACLEquivalence in front of a Redis
// Cluster: the users are installed on every master, and each user's
// commands go over connections signed in as it there.
func TestACLEquivalenceCluster(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	direct, _, _, _ := startACLPair(t, nil)
	addr, _ := startProxy(t, "", func(cfg *Config) {
		cfg.Backend.Cluster = c.Seeds()[:2]
		cfg.ACL.Users = aclUsers
		cfg.Users = map[string]string{"default": "dpw"}
	})
	aclEquivalence(t, direct, c.Nodes[0], addr)
	// The users are on every master.
	for _, n := range c.Nodes {
		if r, err := n.Do("ACL", "DRYRUN", "alice", "GET", "app:1"); err != nil || r != "+OK" {
			t.Fatalf("%s: %q %v", n.Addr, r, err)
		}
	}
}

func aclEquivalence(t *testing.T, direct, backend *redistest.Server, addr string) {
	mode := 0
	for _, proto := range []string{"2", "3"} {
		for _, pipelined := range []bool{false, true} {
			mode++
			sfx := fmt.Sprintf("%dm", mode)
			var steps []step
			for _, u := range aclSignIns {
				on := u[0] + sfx
				steps = append(steps, cmdArgs(on, "HELLO", proto, "AUTH", u[0], u[1]))
				cmds := aclCommands(sfx)
				if pipelined {
					steps = append(steps, step{on: on, cmds: cmds, read: -1})
					continue
				}
				for _, c := range cmds {
					steps = append(steps, step{on: on, cmds: [][]string{c}, read: -1})
				}
			}
			t.Run(fmt.Sprintf("RESP%s pipelined=%v", proto, pipelined), func(t *testing.T) {
				want := compareACL(t, direct, backend, addr, steps)
				// Every kind of outcome is there: allowed, and refused
				// for the command, a key, a channel, the sign-in.
				for _, r := range []string{"+OK", "NOPERM this user has no permissions to run", "NOPERM this user has no permissions to access one of the keys",
					"NOPERM this user has no permissions to access one of the channels", "-WRONGPASS", "-NOAUTH", "WRONGTYPE", "$1\r\nv\r\n"} {
					if n := bytes.Count(want, []byte(r)); n < 1 {
						t.Errorf("only %d replies %q", n, r)
					}
				}
			})
		}
	}
}

// TestACLSentinelFailover: after a failover, the users are installed on
// the new primary (Redis does not replicate its ACL), and a client signed
// in before goes on as its user there.
func TestACLSentinelFailover(t *testing.T) {
	g := redistest.StartGroup(t, "aclmaster", 1, 3)
	cfg := DefaultConfig()
	cfg.Backend.Sentinel.MasterName = g.MasterName
	cfg.Backend.Sentinel.Addrs = g.SentinelAddrs()
	cfg.ACL.Users = aclUsers
	p, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	addr := serveProxy(t, p)
	old := g.Primary.Addr
	waitUntil(t, 10*time.Second, "the proxy knows the primary", func() bool { return p.Backend().Primary == old })
	c := dial(t, addr)
	if got := string(c.do(args("AUTH alice pa"), args("SET app:1 v"))); got != "+OK\r\n+OK\r\n" {
		t.Fatalf("%q", got)
	}
	g.Failover()
	waitUntil(t, 20*time.Second, "the proxy follows the new primary", func() bool {
		return p.Backend().Primary != old && p.Backend().Primary != ""
	})
	waitUntil(t, 20*time.Second, "a write as alice on the new primary", func() bool {
		return string(c.do(args("SET app:2 v"))) == "+OK\r\n"
	})
	if got := string(c.do(args("SET other v"), args("GET app:2"))); got != "-NOPERM this user has no permissions to access one of the keys used as arguments\r\n$1\r\nv\r\n" {
		t.Fatalf("alice on the new primary: %q", got)
	}
	d := dial(t, addr)
	if got := string(d.do(args("AUTH dave pd"), args("SET k:1 v"), args("SET app:1 v"))); got != "+OK\r\n+OK\r\n-NOPERM this user has no permissions to access one of the keys used as arguments\r\n" {
		t.Fatalf("a sign-in after the failover: %q", got)
	}
}
