package proxy

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

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
