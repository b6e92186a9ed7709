package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/internal/redistest"
)

// aclYAML is a configuration with Redis's ACL users, in front of backend
// with lock nodes nodes.
func aclYAML(backend, nodes string, users ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "backend: {addr: %q}\nlock: {nodes: [%s]}\nauth:\n  requirepass: dpw\n  acl:\n", backend, nodes)
	for _, u := range users {
		fmt.Fprintf(&b, "    - %q\n", u)
	}
	return b.String()
}

// quotedList quotes each address for a YAML flow list.
func quotedList(addrs string) string {
	parts := strings.Split(addrs, ",")
	for i, p := range parts {
		parts[i] = fmt.Sprintf("%q", p)
	}
	return strings.Join(parts, ", ")
}

// userClient is a client of addr signed in as user.
func userClient(t *testing.T, addr, user, pass string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, Username: user, Password: pass, MaxRetries: -1, PoolSize: 1})
	t.Cleanup(func() { c.Close() })
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("%s: %v", user, err)
	}
	return c
}

// expect runs cmd on c and requires that the reply (an error's text, or
// the value printed with %v) contains want.
func expect(t *testing.T, c *redis.Client, want string, cmd ...any) {
	t.Helper()
	v, err := c.Do(context.Background(), cmd...).Result()
	got := fmt.Sprint(v)
	if err != nil {
		got = err.Error()
	}
	if !strings.Contains(got, want) {
		t.Fatalf("%v: got %q, want it to contain %q", cmd, got, want)
	}
}

// lockKeys returns the keys of lock state on the lock nodes (all but
// the proxy's mark of an intact node).
func lockKeys(t *testing.T, nodes []*redistest.Server) []string {
	t.Helper()
	var out []string
	for _, n := range nodes {
		c := redis.NewClient(&redis.Options{Addr: n.Addr})
		keys, err := c.Keys(context.Background(), "*").Result()
		c.Close()
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			if k != "lockproxy:intact" {
				out = append(out, n.Addr+" "+k)
			}
		}
	}
	return out
}

// TestACLLockResources: a lock command's resources are checked as keys of
// the same name (write access to take, change or release a holding, read
// access for LOCKINFO), the lock commands form the category @lock, a
// refused command leaves nothing on any node, and a change of the users
// through the proxy (ACL SETUSER) or a reload applies to a connected
// client's next command.
func TestACLLockResources(t *testing.T) {
	backend := redistest.Start(t)
	nodes, nodeAddrs := startNodes(t, 3)
	path := filepath.Join(t.TempDir(), "config.yaml")
	users := []string{
		"user locker on >pl ~locks:* %R~view:* +@lock +set +get +@connection",
		"user reader on >pr ~* +@read +@connection",
		"user nolock on >pn ~* &* +@all -@lock",
		"user few on >pf ~* +set +get +lock +unlock +@connection",
		"user admin on >pa ~* &* +@all",
	}
	os.WriteFile(path, []byte(aclYAML(backend.Addr, quotedList(nodeAddrs), users...)), 0o600)
	addr := startApp(t, "", "-config", path)
	ctx := context.Background()

	locker := userClient(t, addr, "locker", "pl")
	reader := userClient(t, addr, "reader", "pr")
	nolock := userClient(t, addr, "nolock", "pn")
	few := userClient(t, addr, "few", "pf")
	admin := userClient(t, addr, "admin", "pa")

	// The lock nodes answer (a new deployment counts once every node has).
	deadline := time.Now().Add(10 * time.Second)
	for admin.Do(ctx, "LOCKINFO", "warmup").Err() != nil {
		if time.Now().After(deadline) {
			t.Fatal("the lock nodes do not answer")
		}
		time.Sleep(20 * time.Millisecond)
	}

	keyRefused := "NOPERM this user has no permissions to access one of the keys used as arguments"
	cmdRefused := func(name string) string {
		return "NOPERM this user has no permissions to run the '" + name + "' command"
	}
	// Refused: nothing reaches the lock nodes.
	expect(t, locker, keyRefused, "LOCK", "other", 10000)
	expect(t, locker, keyRefused, "LOCK", "view:1", 10000) // read-only pattern
	expect(t, locker, keyRefused, "MLOCK", 2, "locks:a", "other", 10000)
	expect(t, locker, keyRefused, "RLOCK", "other", 10000)
	expect(t, locker, keyRefused, "LOCK", "other", 10000, "PERMITS", 3)
	expect(t, locker, keyRefused, "UNLOCK", "other", "tok")
	expect(t, locker, keyRefused, "EXTEND", "other", 1000, "tok")
	expect(t, locker, keyRefused, "LOCKINFO", "other")
	expect(t, reader, cmdRefused("lock"), "LOCK", "locks:a", 10000)
	expect(t, nolock, cmdRefused("lock"), "LOCK", "locks:a", 10000)
	expect(t, nolock, cmdRefused("lockinfo"), "LOCKINFO", "locks:a")
	expect(t, few, cmdRefused("extend"), "EXTEND", "locks:a", 1000, "tok")
	expect(t, few, cmdRefused("mlock"), "MLOCK", 1, "locks:a", 10000)
	// Arity first, as in Redis.
	expect(t, locker, "ERR wrong number of arguments for 'lock' command", "LOCK", "other")
	if keys := lockKeys(t, nodes); len(keys) > 0 {
		t.Fatalf("refused lock commands left keys on the lock nodes: %v", keys)
	}

	// Allowed.
	r, err := locker.Do(ctx, "LOCK", "locks:a", 10000).Slice()
	if err != nil || len(r) != 3 {
		t.Fatalf("LOCK locks:a: %v %v", r, err)
	}
	expect(t, locker, "mode:exclusive", "LOCKINFO", "locks:a")
	expect(t, locker, "mode:none", "LOCKINFO", "view:1")
	expect(t, reader, "mode:exclusive", "LOCKINFO", "locks:a")
	expect(t, locker, "", "EXTEND", "locks:a", 10000, r[0])
	expect(t, locker, "1", "UNLOCK", "locks:a", r[0])
	expect(t, few, "[", "LOCK", "anything", 10000)
	expect(t, locker, "[", "MLOCK", 2, "locks:b", "locks:c", 10000)

	// FENCED: the resource as a key to write, and the inner command as
	// Redis would check it alone.
	held, err := locker.Do(ctx, "LOCK", "locks:f", 10000).Slice()
	if err != nil || len(held) != 3 {
		t.Fatalf("LOCK locks:f: %v %v", held, err)
	}
	fence := held[2]
	expect(t, locker, "OK", "FENCED", "locks:f", fence, "SET", "locks:data", "v")
	expect(t, locker, keyRefused, "FENCED", "locks:f", fence, "SET", "other", "v")
	expect(t, locker, cmdRefused("del"), "FENCED", "locks:f", fence, "DEL", "locks:data")
	expect(t, locker, keyRefused, "FENCED", "view:1", fence, "SET", "locks:data", "w")
	expect(t, few, cmdRefused("fenced"), "FENCED", "locks:f", fence, "SET", "locks:data", "w")
	expect(t, locker, "v", "GET", "locks:data")
	expect(t, admin, "OK", "ACL", "DRYRUN", "locker", "FENCED", "locks:f", 1, "SET", "locks:data", "v")
	expect(t, admin, "This user has no permissions to access the 'other' key", "ACL", "DRYRUN", "locker", "FENCED", "locks:f", 1, "SET", "other", "v")
	expect(t, admin, "This user has no permissions to access the 'view:2' key", "ACL", "DRYRUN", "locker", "FENCED", "view:2", 1, "SET", "locks:data", "v")

	// LOCKS lists only what the user may read.
	listed := func(c *redis.Client) string {
		t.Helper()
		v, err := c.Do(ctx, "LOCKS", 0, "COUNT", 1000).Slice()
		if err != nil || len(v) != 2 {
			t.Fatalf("LOCKS: %v %v", v, err)
		}
		return fmt.Sprint(v[1])
	}
	if got := listed(locker); !strings.Contains(got, "locks:b") || !strings.Contains(got, "locks:c") || strings.Contains(got, "anything") {
		t.Fatalf("LOCKS as locker: %s", got)
	}
	if got := listed(reader); !strings.Contains(got, "locks:b") || !strings.Contains(got, "anything") {
		t.Fatalf("LOCKS as reader: %s", got)
	}
	expect(t, nolock, cmdRefused("locks"), "LOCKS", 0)

	// ACL DRYRUN answers for the lock commands as Redis does for its own.
	expect(t, admin, "OK", "ACL", "DRYRUN", "locker", "LOCK", "locks:z", 1000)
	expect(t, admin, "This user has no permissions to access the 'other' key", "ACL", "DRYRUN", "locker", "LOCK", "other", 1000)
	expect(t, admin, "This user has no permissions to run the 'lock' command", "ACL", "DRYRUN", "reader", "LOCK", "x", 1000)
	expect(t, admin, "ERR User 'nobody' not found", "ACL", "DRYRUN", "nobody", "LOCK", "x", 1000)

	// A change through the proxy applies to the next command.
	expect(t, locker, keyRefused, "LOCK", "moved:1", 10000)
	expect(t, admin, "OK", "ACL", "SETUSER", "locker", "~moved:*")
	expect(t, locker, "[", "LOCK", "moved:1", 10000)
	expect(t, admin, "OK", "ACL", "SETUSER", "locker", "resetkeys", "~elsewhere:*")
	expect(t, locker, keyRefused, "LOCK", "moved:2", 10000)
	expect(t, locker, keyRefused, "GET", "moved:2") // Redis's own refusal
	expect(t, locker, "", "GET", "elsewhere:1")

	// A reload applies to the next command too.
	users[0] = "user locker on >pl ~reloaded:* +@lock +set +get +@connection"
	os.WriteFile(path, []byte(aclYAML(backend.Addr, quotedList(nodeAddrs), users...)), 0o600)
	syscall.Kill(os.Getpid(), syscall.SIGHUP)
	deadline = time.Now().Add(5 * time.Second)
	for {
		_, err := locker.Do(ctx, "LOCK", "reloaded:1", 10000).Slice()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the reloaded rules did not apply: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	expect(t, locker, keyRefused, "LOCK", "locks:d", 10000)
	expect(t, locker, keyRefused, "GET", "locks:d")
}
