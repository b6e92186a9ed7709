package proxy

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/internal/redistest"
)

// TestClusterShared checks the masters' shared connections: one client's
// pipeline over every master comes back byte for byte and in order, and
// many clients interleaving commands on one shared connection per master
// each get their own replies, on a handful of connections per master.
func TestClusterShared(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	srv := redistest.Start(t)
	addr, p := startProxy(t, "", func(cfg *Config) {
		cfg.Backend.Cluster = c.Seeds()[:2]
		cfg.Backend.SharedConnections = 1
	})

	t.Run("pipeline of 1000 over every master", func(t *testing.T) {
		cmds := make([]string, 0, 1000)
		for i := range 1000 {
			k := keyOn(i%3, fmt.Sprintf("p%d-", i))
			switch {
			case i%100 == 99:
				// Not on a shared connection: split over the masters,
				// or merged from all of them, in the same pipeline.
				cmds = append(cmds, "MGET "+keyOn(0, "p")+" "+keyOn(1, "p")+" "+keyOn(2, "p"), "DBSIZE")
			case i%4 == 0:
				cmds = append(cmds, fmt.Sprintf("SET %s v%d", k, i))
			case i%4 == 1:
				cmds = append(cmds, "GET "+keyOn((i-1)%3, fmt.Sprintf("p%d-", i-1)))
			case i%4 == 2:
				cmds = append(cmds, fmt.Sprintf("INCR c%d", i%7))
			default:
				cmds = append(cmds, "GET "+k, "LPUSH l"+k+" x", "ECHO e"+k)
			}
		}
		compareCluster(t, srv, c, addr, []step{send("a", cmds...)})
		if n := len(p.router.SharedList()); n != 3 {
			t.Errorf("%d shared connections to the masters, want one per master", n)
		}
	})

	t.Run("many clients on one shared connection per master", func(t *testing.T) {
		const clients, rounds = 30, 20
		conns := make([]*client, clients)
		for i := range conns {
			conns[i] = dial(t, addr)
		}
		var wg sync.WaitGroup
		for i, cl := range conns {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for r := range rounds {
					var cmds [][]string
					var want strings.Builder
					for m := range 3 {
						k := keyOn(m, fmt.Sprintf("c%d-%d-", i, m))
						v := fmt.Sprintf("client%d-round%d", i, r)
						cmds = append(cmds, []string{"SET", k, v}, []string{"GET", k}, []string{"INCR", k + "n"})
						fmt.Fprintf(&want, "+OK\r\n$%d\r\n%s\r\n:%d\r\n", len(v), v, r+1)
					}
					cl.send(encode(cmds...))
					got, err := cl.tryRead(len(cmds), 10*time.Second)
					if err != nil || string(got) != want.String() {
						t.Errorf("client %d round %d: %q (%v), want %q", i, r, got, err, want.String())
						return
					}
				}
			}()
		}
		wg.Wait()
		// Every client is still connected, and has used every master.
		for _, m := range c.Nodes {
			if n := connectedClients(t, m); n >= clients {
				t.Errorf("%s holds %d connections for %d clients", m.Addr, n, clients)
			}
		}
	})
}

// TestClusterOrderBehindSlowCommand is TestDifferentialOrderBehindSlowCommand
// in front of a cluster: a SET waiting on a master's shared connection
// behind another client's slow command reaches the master before a GET
// another client sends afterwards, on a connection of its own or on the
// other shared connection, as with one Redis. The slow command is a SORT
// of a long list (a script, which may run past busy-reply-threshold,
// goes on its client's own connection in front of a cluster).
func TestClusterOrderBehindSlowCommand(t *testing.T) {
	for _, tc := range []struct {
		name   string
		shared int
		other  [][]string // what the GET's client sends first
	}{
		// Its own connection to k's master is open before the script
		// runs: a dial would wait for the script too.
		{name: "own connection", shared: 1, other: [][]string{{"CLIENT", "SETNAME", "g"}, {"GET", "k"}}},
		{name: "other shared", shared: 2, other: [][]string{{"PING"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t)
			c := redistest.StartCluster(t, 3, 0)
			addr, p := startProxy(t, "", func(cfg *Config) {
				cfg.Backend.Cluster = c.Seeds()[:2]
				cfg.Backend.SharedConnections = tc.shared
			})
			// A list of 600 000 numbers on k's slot, made by a
			// script; sorting it keeps Redis busy for a good part of
			// a second or more.
			setup := [][]string{{"EVAL", "for i = 1, 600000 do redis.call('rpush', KEYS[1], (i * 7919) % 1000003) end return 1", "1", "{k}long"}}
			slow := []string{"SORT", "{k}long", "LIMIT", "0", "1"}
			want := playBehindSlowCmd(t, srv.Addr, tc.other, func() { mustFlush(t, srv) }, nil, setup, slow)
			got := playBehindSlowCmd(t, addr, tc.other, func() { flushCluster(t, c) }, p, setup, slow)
			if !bytes.Equal(got, want) {
				t.Fatalf("replies differ\nthrough proxy: %q\ndirect:        %q", got, want)
			}
		})
	}
}

// TestClusterSharedAccessChange: after a client changes who the masters
// let in (CONFIG SET requirepass), the clients connected before keep their
// access and the new ones must sign in, as with one Redis, whose
// connections keep what they had when they opened; and the masters'
// shared connections go on serving everyone: new clients share new ones,
// and the old ones close with the last client that used them.
func TestClusterSharedAccessChange(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	srv := redistest.Start(t)
	addr, p := startProxy(t, "", func(cfg *Config) {
		cfg.Backend.Cluster = c.Seeds()[:2]
		cfg.Backend.SharedConnections = 1
	})
	defer func() {
		for _, m := range append([]*redistest.Server{srv}, c.Nodes...) {
			raw := dial(t, m.Addr)
			raw.do(args("AUTH x"), []string{"CONFIG", "SET", "requirepass", ""})
		}
	}()
	// play runs the steps against addr and returns every reply.
	play := func(addr string) string {
		var out strings.Builder
		old, admin := dial(t, addr), dial(t, addr)
		defer old.c.Close()
		defer admin.c.Close()
		for m := range 3 {
			out.Write(old.do([]string{"SET", keyOn(m, "a"), "v"}))
		}
		out.Write(admin.do(args("CONFIG SET requirepass x")))
		for m := range 3 {
			out.Write(old.do([]string{"GET", keyOn(m, "a")})) // still let in
		}
		nc := dial(t, addr)
		defer nc.c.Close()
		out.Write(nc.do([]string{"GET", keyOn(1, "a")}, args("AUTH x"), []string{"GET", keyOn(1, "a")}))
		out.Write(admin.do(args("AUTH x"), []string{"CONFIG", "SET", "requirepass", ""}))
		return out.String()
	}
	want := play(srv.Addr)
	if got := play(addr); got != want {
		t.Fatalf("replies differ\nthrough proxy: %q\ndirect:        %q", got, want)
	}

	// Sharing goes on: many new clients, a few connections per master.
	const clients = 20
	for i := range clients {
		cl := dial(t, addr)
		for m := range 3 {
			k := keyOn(m, fmt.Sprintf("n%d-", i))
			if got := string(cl.do([]string{"SET", k, "v"}, []string{"GET", k})); got != "+OK\r\n$1\r\nv\r\n" {
				t.Fatalf("client %d on master %d: %q", i, m, got)
			}
		}
		defer cl.c.Close()
	}
	for _, m := range c.Nodes {
		if n := connectedClients(t, m); n >= clients {
			t.Errorf("%s holds %d connections for %d clients after the change", m.Addr, n, clients)
		}
	}
	// The clients of before are gone: so are their shared connections.
	eventually(t, "the earlier shared connections closed", func() bool { return len(p.router.SharedList()) == 3 })
}
