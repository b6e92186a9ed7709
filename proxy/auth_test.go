package proxy

import (
	"bytes"
	"testing"

	"github.com/lockproxy/lockproxy/internal/redistest"
)

// TestAuthLikeRedis: with a password required at the proxy, a session gets
// exactly the replies Redis with requirepass gives, while the proxy signs
// in to its own password-protected backend with its own credentials.
func TestAuthLikeRedis(t *testing.T) {
	direct := redistest.Start(t, "--requirepass", "pw")
	backend := redistest.Start(t, "--requirepass", "backend-secret")
	addr, _ := startProxy(t, backend.Addr, func(c *Config) {
		c.Users = map[string]string{"default": "pw"}
		c.Backend.Password = "backend-secret"
	})
	steps := []step{
		send("a", "GET a", "PING", "HELLO 3", "AUTH", "AUTH x y z", "AUTH wrong",
			"AUTH default wrong", "HELLO 3 AUTH default wrong", "GET a"),
		send("a", "AUTH pw", "SET a 1", "GET a"),
		send("a", "RESET", "GET a", "AUTH default pw", "GET a"),
		send("a", "HELLO 3 AUTH default pw SETNAME me", "CLIENT GETNAME", "GET a", "RESET", "GET a", "QUIT"),
	}
	want := mask(run(t, direct, direct.Addr, steps))
	got := mask(run(t, backend, addr, steps))
	if !bytes.Equal(got, want) {
		t.Fatalf("replies differ\nthrough proxy: %q\ndirect:        %q", got, want)
	}
}

// TestAuthForwardedWithoutProxyUsers: with no users at the proxy, AUTH is
// the backend's business and survives a backend restart.
func TestAuthForwardedWithoutProxyUsers(t *testing.T) {
	backend := redistest.Start(t, "--requirepass", "pw")
	addr, _ := startProxy(t, backend.Addr, nil)
	c := dial(t, addr)
	if got := string(c.do(args("GET a"), args("AUTH pw"), args("SET a 1"))); got != "-NOAUTH Authentication required.\r\n+OK\r\n+OK\r\n" {
		t.Fatalf("%q", got)
	}
	backend.Restart()
	c.do(args("GET a")) // answers "connection lost" or not: the old connection is gone either way
	if got := string(c.do(args("SET b 2"))); got != "+OK\r\n" {
		t.Fatalf("AUTH was not replayed on the new backend connection: %q", got)
	}
}
