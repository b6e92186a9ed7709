package proxy

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/lockproxy/lockproxy/internal/redistest"
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
	a, err := splitACL(line)
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
		send("e", "AUTH gail pg", "SET a 3", "DEL a", "ACL WHOAMI", "ACL DRYRUN alice SET app:1 x", "ACL DRYRUN alice SET nope x", "ACL DRYRUN nobody GET x"),
	}
	compareACL(t, direct, backend, addr, steps)
}

// compareACL plays steps on direct and through the proxy at addr, and
// requires the same bytes.
func compareACL(t *testing.T, direct, backend *redistest.Server, addr string, steps []step) {
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
}

var _ = fmt.Sprint
