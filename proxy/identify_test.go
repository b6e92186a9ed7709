package proxy

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/internal/redistest"
)

// whoLocal answers WHOAMI with the name and address its proxy last gave
// it (ClientLocal), as LOCKINFO's holder shows them.
type whoLocal struct {
	mu         sync.Mutex
	name, addr string
}

func (w *whoLocal) SetClient(name, addr string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.name, w.addr = name, addr
}

func (w *whoLocal) Close() {}

func (w *whoLocal) Serve(ctx context.Context, dst []byte, args [][]byte, resp3 bool) []byte {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.name + "@" + w.addr
	return append(dst, fmt.Sprintf("$%d\r\n%s\r\n", len(s), s)...)
}

// TestLocalKnowsClientName: a local command learns the client's name from
// CLIENT SETNAME and HELLO ... SETNAME, and its address, in front of one
// Redis and of a cluster.
func TestLocalKnowsClientName(t *testing.T) {
	local := func(c *Config) {
		c.IsLocal = func(name []byte) bool { return strings.EqualFold(string(name), "whoami") }
		c.NewLocal = func() Local { return &whoLocal{} }
	}
	one := redistest.Start(t)
	cluster := redistest.StartCluster(t, 3, 0)
	for _, tc := range []struct {
		name string
		edit func(*Config)
	}{
		{"one Redis", local},
		{"cluster", func(c *Config) { c.Backend.Addr, c.Backend.Cluster = "", cluster.Seeds(); local(c) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr, _ := startProxy(t, one.Addr, tc.edit)
			c := dial(t, addr)
			me := c.c.LocalAddr().String()
			want := func(name string) {
				t.Helper()
				if got, exp := string(c.do([]string{"WHOAMI"})), fmt.Sprintf("$%d\r\n%s@%s\r\n", len(name)+1+len(me), name, me); got != exp {
					t.Errorf("WHOAMI = %q, want %q", got, exp)
				}
			}
			want("")
			c.do([]string{"CLIENT", "SETNAME", "worker-1"})
			want("worker-1")
			c.do([]string{"HELLO", "2", "SETNAME", "worker-2"})
			want("worker-2")
		})
	}
}

// TestClientKillByID: CLIENT KILL ID of the id CLIENT ID gave another
// client closes that client's connection, as Redis does, in front of one
// Redis and of a cluster, whether or not the client tracks keys. A kill
// that kills nothing, a kill by other filters and a client's kill of its
// own id (SKIPME yes) leave the clients connected.
func TestClientKillByID(t *testing.T) {
	srv := redistest.Start(t)
	c := redistest.StartCluster(t, 3, 0)
	one, _ := startProxy(t, srv.Addr, nil)
	cl, _ := startClusterProxy(t, c)
	for _, tt := range []struct{ name, addr string }{{"one Redis", one}, {"cluster", cl}} {
		for _, tracking := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s tracking %v", tt.name, tracking), func(t *testing.T) {
				victim, killer := dial(t, tt.addr), dial(t, tt.addr)
				victim.do(args("HELLO 3"))
				if tracking {
					victim.do(args("CLIENT TRACKING ON"))
				}
				victim.do(args("GET k"))
				id := strings.TrimSpace(strings.TrimPrefix(string(victim.do(args("CLIENT ID"))), ":"))
				if got := string(victim.do(args("CLIENT KILL ID " + id))); got != ":0\r\n" {
					t.Errorf("CLIENT KILL of its own id (SKIPME yes): %q, want :0", got)
				}
				if got := string(killer.do(args("CLIENT KILL ID " + id + " TYPE pubsub"))); got != ":0\r\n" {
					t.Errorf("CLIENT KILL ID %s TYPE pubsub: %q, want :0", id, got)
				}
				if got := string(killer.do(args("CLIENT KILL ID 999999"))); got != ":0\r\n" {
					t.Errorf("CLIENT KILL of an unknown id: %q, want :0", got)
				}
				if got := string(victim.do(args("PING"))); got != "+PONG\r\n" {
					t.Fatalf("PING after the kills that killed nothing: %q", got)
				}
				if got := string(killer.do(args("CLIENT KILL ID " + id))); got != ":1\r\n" {
					t.Fatalf("CLIENT KILL ID %s: %q, want :1", id, got)
				}
				if rest, closed := victim.closedAfter(5 * time.Second); !closed {
					t.Fatalf("the killed client is still connected (got %q)", rest)
				}
				if got := string(killer.do(args("PING"))); got != "+PONG\r\n" {
					t.Fatalf("the killer's PING: %q", got)
				}
			})
		}
	}
}
