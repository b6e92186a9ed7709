// Command lockfloor is a reference for the uncontended lock path: the least
// a Redlock proxy built on the same libraries as lockproxy (redcon towards
// the clients, go-redis towards the nodes) does for a LOCK and an UNLOCK.
// It is a measuring stick, not a lock service: lockbench runs it beside
// lockproxy (-floor) to show how much of lockproxy's cost per pair is the
// round trips and system calls any such proxy makes, and how much is its
// own work.
//
// What it does: LOCK resource ttl-ms sends SET key token NX PX ttl to every
// node, UNLOCK resource token a compare-and-delete script, and each answers
// once a majority of nodes said yes. As in lockproxy, every node has one
// batcher that sends the requests waiting for it as one pipeline, with one
// batch in flight. What it leaves out is everything lockproxy adds to
// Redlock: fences, validity and clock drift, a node's lost data, retries,
// WAIT, timeouts, metrics, forwarding and the arrival order. A node that does
// not answer blocks its callers.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"github.com/tidwall/redcon"
)

// release deletes the lock only when the token holds it, as every Redlock
// implementation does.
var release = redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)

// request is one LOCK or UNLOCK, sent to every node.
type request struct {
	acquire bool
	key     string
	token   string
	ttl     int64

	yes  atomic.Int32 // nodes that granted or released
	left atomic.Int32 // nodes that have not answered
	done chan struct{}
}

// node is one lock node and its batcher.
type node struct {
	c    *redis.Client
	reqs chan *request
}

// run sends what waits in n.reqs, one pipeline at a time, until quit is
// closed.
func (n *node) run(quit <-chan struct{}, wg *sync.WaitGroup) {
	defer wg.Done()
	ctx := context.Background()
	var batch []*request
	var cmds []*redis.Cmd
	for {
		select {
		case r := <-n.reqs:
			batch = append(batch[:0], r)
		case <-quit:
			return
		}
	more:
		for {
			select {
			case r := <-n.reqs:
				batch = append(batch, r)
			default:
				break more
			}
		}
		pipe := n.c.Pipeline()
		cmds = cmds[:0]
		for _, r := range batch {
			if r.acquire {
				cmds = append(cmds, pipe.Do(ctx, "SET", r.key, r.token, "NX", "PX", r.ttl))
			} else {
				cmds = append(cmds, pipe.EvalSha(ctx, release.Hash(), []string{r.key}, r.token))
			}
		}
		pipe.Exec(ctx) // each command keeps its own error
		for i, r := range batch {
			ok := cmds[i].Err() == nil
			if !r.acquire {
				v, err := cmds[i].Int64()
				ok = err == nil && v == 1
			}
			if ok {
				r.yes.Add(1)
			}
			if r.left.Add(-1) == 0 {
				close(r.done)
			}
		}
	}
}

// floor is the proxy: its nodes and their batchers.
type floor struct {
	nodes []*node
	quit  chan struct{} // closed by close: the batchers stop, callers give up
	wg    sync.WaitGroup
}

func newFloor(addrs []string) (*floor, error) {
	f := &floor{quit: make(chan struct{})}
	for _, addr := range addrs {
		c := redis.NewClient(&redis.Options{Addr: addr, Protocol: 2, DisableIdentity: true})
		if err := release.Load(context.Background(), c).Err(); err != nil {
			c.Close()
			f.close()
			return nil, fmt.Errorf("lock node %s: %w", addr, err)
		}
		f.nodes = append(f.nodes, &node{c: c, reqs: make(chan *request, 1024)})
	}
	for _, n := range f.nodes {
		f.wg.Add(1)
		go n.run(f.quit, &f.wg)
	}
	return f, nil
}

// close stops the batchers and waits for them. Clients still connected get
// a refusal from then on.
func (f *floor) close() {
	close(f.quit)
	f.wg.Wait()
	for _, n := range f.nodes {
		n.c.Close()
	}
}

// round sends r to every node and reports whether a majority said yes;
// false once the proxy is closing.
func (f *floor) round(r *request) bool {
	r.left.Store(int32(len(f.nodes)))
	r.done = make(chan struct{})
	for _, n := range f.nodes {
		select {
		case n.reqs <- r:
		case <-f.quit:
			return false
		}
	}
	select {
	case <-r.done:
	case <-f.quit:
		return false
	}
	return int(r.yes.Load()) > len(f.nodes)/2
}

func (f *floor) serve(conn redcon.Conn, cmd redcon.Command) {
	name := cmd.Args[0]
	switch {
	case bytes.EqualFold(name, []byte("ping")):
		conn.WriteString("PONG")
	case bytes.EqualFold(name, []byte("lock")) && len(cmd.Args) == 3:
		ttl, err := strconv.ParseInt(string(cmd.Args[2]), 10, 64)
		if err != nil || ttl <= 0 {
			conn.WriteError("ERR ttl-ms must be a positive integer")
			return
		}
		r := &request{acquire: true, key: "floor:" + string(cmd.Args[1]), token: uuid.NewString(), ttl: ttl}
		if !f.round(r) {
			conn.WriteNull()
			return
		}
		// The shape of lockproxy's reply: token, validity-ms, fence.
		conn.WriteArray(3)
		conn.WriteBulkString(r.token)
		conn.WriteInt64(ttl)
		conn.WriteInt(0)
	case bytes.EqualFold(name, []byte("unlock")) && len(cmd.Args) == 3:
		r := &request{key: "floor:" + string(cmd.Args[1]), token: string(cmd.Args[2])}
		if f.round(r) {
			conn.WriteInt(1)
		} else {
			conn.WriteInt(0)
		}
	default:
		conn.WriteError("ERR lockfloor answers PING, LOCK resource ttl-ms and UNLOCK resource token")
	}
}

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "lockfloor:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("lockfloor", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:6390", "address to serve on")
	nodes := fs.String("nodes", "", "comma-separated lock node addresses")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *nodes == "" {
		return errors.New("-nodes is required")
	}
	f, err := newFloor(strings.Split(*nodes, ","))
	if err != nil {
		return err
	}
	defer f.close()
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	srv := redcon.NewServer(*listen, f.serve, nil, nil)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	err = srv.Serve(ln)
	if ctx.Err() != nil {
		return nil
	}
	return err
}
