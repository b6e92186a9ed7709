package proxy

import (
	"context"
	"io"
	"strconv"
	"testing"

	"go.uber.org/zap"

	"github.com/lockproxy/lockproxy/commands"
	"github.com/lockproxy/lockproxy/internal/redistest"
)

// aclBenchUsers are BenchmarkACLForward's users: a password-only user
// (the proxy's own backend identity, full rights) and a user with rules,
// whose commands Redis checks on connections signed in as it.
var aclBenchUsers = []struct{ name, user, pass string }{
	{"password-only", "plain", "pp"},
	{"rules", "ruled", "pr"},
}

// startACLBenchProxy starts a backend with bench:key set and a proxy
// with aclBenchUsers.
func startACLBenchProxy(b *testing.B) string {
	b.Helper()
	srv := redistest.Start(b)
	if reply, err := srv.Do("SET", "bench:key", "xxx"); err != nil || reply != "+OK" {
		b.Fatalf("SET on the backend: %q, %v", reply, err)
	}
	addr, _ := startProxy(b, srv.Addr, func(c *Config) {
		c.Users = map[string]string{"plain": "pp"}
		c.ACL.Users = []string{"user ruled on >pr ~bench:* %R~other:* &* +@read +@write -@dangerous +@connection"}
	})
	return addr
}

// signIn sends AUTH user pass on bc's connection.
func (bc *benchConn) signIn(b *testing.B, user, pass string) {
	b.Helper()
	if _, err := bc.c.Write(encode([]string{"AUTH", user, pass})); err != nil {
		b.Fatal(err)
	}
	ok := make([]byte, len("+OK\r\n"))
	if _, err := io.ReadFull(bc.c, ok); err != nil || string(ok) != "+OK\r\n" {
		b.Fatalf("AUTH %s: %q, %v", user, ok, err)
	}
}

// BenchmarkACLForward is BenchmarkForward for a password-only user and
// for a user with Redis's ACL rules, one after the other on the same
// proxy: the cost of the rules on the forwarding path (README.md,
// Performance, compares the two).
func BenchmarkACLForward(b *testing.B) {
	addr := startACLBenchProxy(b)
	for _, depth := range []int{1, 16} {
		for _, tc := range forwardCases {
			for _, u := range aclBenchUsers {
				b.Run(tc.name+"/pipeline="+strconv.Itoa(depth)+"/"+u.name, func(b *testing.B) {
					bc := newBenchConn(b, addr, tc, depth)
					bc.signIn(b, u.user, u.pass)
					bc.loop(b)
				})
			}
		}
	}
}

// BenchmarkACLForwardParallel is BenchmarkForwardParallel (25 clients per
// GOMAXPROCS, one command or a pipeline of 16 per round trip) for each of
// aclBenchUsers.
func BenchmarkACLForwardParallel(b *testing.B) {
	const perProc = 25
	addr := startACLBenchProxy(b)
	for _, depth := range []int{1, 16} {
		for _, tc := range forwardCases {
			for _, u := range aclBenchUsers {
				b.Run(tc.name+"/pipeline="+strconv.Itoa(depth)+"/"+u.name, func(b *testing.B) {
					benchParallel(b, perProc, func() *benchConn {
						bc := newBenchConn(b, addr, tc, depth)
						bc.signIn(b, u.user, u.pass)
						return bc
					})
				})
			}
		}
	}
}

// BenchmarkACLLockCheck is what a lock command of a user with rules costs
// the proxy before it goes to the lock nodes (lockDenied): its category,
// its resource's access from the cache of ACL DRYRUN answers. The first
// check of the resource, outside the timer, asks Redis.
func BenchmarkACLLockCheck(b *testing.B) {
	srv := redistest.Start(b)
	_, p := startProxy(b, srv.Addr, func(c *Config) {
		c.ACL.Users = []string{"user ruled on >pr ~bench:* +@lock +set +get"}
		c.ACL.LockCategories, c.ACL.LockResources = commands.Categories(), commands.Resources
	})
	s := &session{p: p, ctx: context.Background(), log: zap.NewNop()}
	s.acl = aclClient{user: "ruled", name: "ruled"}
	lockArgs := [][]byte{[]byte("LOCK"), []byte("bench:resource"), []byte("10000")}
	if r := s.lockDenied(lockArgs); r != nil {
		b.Fatalf("%q", r)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if r := s.lockDenied(lockArgs); r != nil {
			b.Fatalf("%q", r)
		}
	}
}
