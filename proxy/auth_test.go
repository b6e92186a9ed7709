package proxy

import (
	"bytes"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/internal/redistest"
)

// TestAuthLikeRedis: with a password required at the proxy, a session gets
// exactly the replies Redis with requirepass gives, while the proxy signs
// in to its own password-protected backend with its own credentials.
func TestAuthLikeRedis(t *testing.T) {
	direct, backend, addr := startAuthProxy(t)
	steps := []step{
		send("a", "GET a", "PING", "HELLO 3", "AUTH", "AUTH x y z", "AUTH wrong",
			"AUTH default wrong", "HELLO 3 AUTH default wrong", "GET a"),
		send("a", "AUTH pw", "SET a 1", "GET a"),
		send("a", "RESET", "GET a", "AUTH default pw", "GET a"),
		send("a", "HELLO 3 AUTH default pw SETNAME me", "CLIENT GETNAME", "GET a", "RESET", "GET a", "QUIT"),
	}
	compareAuth(t, direct, backend, addr, steps)
}

// startAuthProxy starts a Redis that requires the password pw, and a proxy
// that requires the same, in front of a Redis that requires the proxy's
// own (backend-secret).
func startAuthProxy(t *testing.T) (direct, backend *redistest.Server, addr string) {
	direct = redistest.Start(t, "--requirepass", "pw")
	backend = redistest.Start(t, "--requirepass", "backend-secret")
	addr, _ = startProxy(t, backend.Addr, func(c *Config) {
		c.Users = map[string]string{"default": "pw"}
		c.Backend.Password = "backend-secret"
	})
	return direct, backend, addr
}

// compareAuth plays steps on direct and through the proxy at addr, and
// requires the same bytes.
func compareAuth(t *testing.T, direct, backend *redistest.Server, addr string, steps []step) {
	t.Helper()
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

// TestResetAfterReplySkip: a RESET right after CLIENT REPLY SKIP gets no
// reply from Redis (the skip covers it; RESET then turns replies back
// on), and the proxy's own AUTH after it (the re-sign-in to its
// password-protected backend) must not take the place of the reply that
// never comes: the client's later replies stay its own, and a command the
// proxy answers itself does not wait for it.
func TestResetAfterReplySkip(t *testing.T) {
	direct, backend, addr := startAuthProxy(t)
	steps := []step{
		sendRead("a", 4, "AUTH pw", "CLIENT REPLY SKIP", "RESET", "PING", "AUTH pw", "PING"),
		sendRead("a", 4, "SET k v", "CLIENT REPLY OFF", "SET k w", "RESET", "AUTH pw", "GET k"),
		sendRead("b", 4, "AUTH pw", "SELECT 1", "CLIENT REPLY SKIP", "RESET", "GET k", "AUTH pw", "GET k"),
		// The proxy answers AUTH itself; the SKIP it spends is spent on
		// the backend too.
		sendRead("c", 3, "AUTH pw", "SELECT 1", "CLIENT REPLY SKIP", "AUTH pw", "ECHO x"),
		sendRead("c", 1, "CLIENT REPLY SKIP", "AUTH wrong", "ECHO y"),
	}
	t.Run("proxy authentication", func(t *testing.T) { compareAuth(t, direct, backend, addr, steps) })

	// Without proxy authentication, in front of a backend that needs the
	// proxy's password, and of one that needs none.
	plain := redistest.Start(t)
	for _, tt := range []struct {
		name    string
		backend *redistest.Server
		edit    func(*Config)
	}{
		{"backend password", backend, func(c *Config) {
			c.Backend.Password = "backend-secret"
			c.Info = func() string { return "answer:42\r\n" }
		}},
		{"no password", plain, func(c *Config) { c.Info = func() string { return "answer:42\r\n" } }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			addr, _ := startProxy(t, tt.backend.Addr, tt.edit)
			c := dial(t, addr)
			c.send(encode(args("CLIENT REPLY SKIP"), args("RESET"), args("PING"), args("ECHO x")))
			if got, err := c.tryRead(2, 5*time.Second); err != nil || string(got) != "+PONG\r\n$1\r\nx\r\n" {
				t.Errorf("CLIENT REPLY SKIP, RESET, PING, ECHO x: %q (%v), want +PONG and x as from Redis", got, err)
			}
			// A command the proxy answers itself comes after the replies
			// owed before it, and no phantom one.
			c.send(encode(args("CLIENT REPLY SKIP"), args("RESET"), args("INFO lockproxy")))
			if got, err := c.tryRead(1, 5*time.Second); err != nil || !bytes.Contains(got, []byte("answer:42")) {
				t.Errorf("CLIENT REPLY SKIP, RESET, INFO lockproxy: %q (%v)", trunc(got), err)
			}
		})
	}
}
