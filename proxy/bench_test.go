package proxy

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/internal/redistest"
)

// forwardCase is one request the benchmarks send through the proxy, with
// the exact reply the backend gives to it.
type forwardCase struct {
	name  string
	cmd   []string
	reply string
}

var forwardCases = []forwardCase{
	{name: "GET", cmd: []string{"GET", "bench:key"}, reply: "$3\r\nxxx\r\n"},
	{name: "SET", cmd: []string{"SET", "bench:key", "xxx"}, reply: "+OK\r\n"},
}

// benchConn is a client connection whose round trip allocates nothing, so
// that allocs/op counts the proxy's allocations only.
type benchConn struct {
	c     net.Conn
	req   []byte // the pipeline, encoded once
	want  []byte // the replies to it, byte for byte
	reply []byte // read buffer, len(want)
}

func newBenchConn(tb testing.TB, addr string, tc forwardCase, depth int) *benchConn {
	tb.Helper()
	cmds := make([][]string, depth)
	for i := range cmds {
		cmds[i] = tc.cmd
	}
	bc := &benchConn{
		c:    dial(tb, addr).c,
		req:  encode(cmds...),
		want: bytes.Repeat([]byte(tc.reply), depth),
	}
	bc.reply = make([]byte, len(bc.want))
	// One deadline for the whole run: a stuck proxy fails the benchmark
	// instead of hanging it, without a SetDeadline per round trip.
	bc.c.SetDeadline(time.Now().Add(5 * time.Minute))
	return bc
}

// roundTrip writes the pipeline in one write and reads all its replies.
func (bc *benchConn) roundTrip() error {
	if _, err := bc.c.Write(bc.req); err != nil {
		return err
	}
	if _, err := io.ReadFull(bc.c, bc.reply); err != nil {
		return err
	}
	if !bytes.Equal(bc.reply, bc.want) {
		return fmt.Errorf("replies %q, want %q", bc.reply, bc.want)
	}
	return nil
}

// startBenchProxy starts a backend with bench:key set and a proxy for it.
func startBenchProxy(b *testing.B) string {
	b.Helper()
	srv := redistest.Start(b)
	if reply, err := srv.Do("SET", "bench:key", "xxx"); err != nil || reply != "+OK" {
		b.Fatalf("SET on the backend: %q, %v", reply, err)
	}
	addr, _ := startProxy(b, srv.Addr, nil)
	return addr
}

// BenchmarkForward sends one command, or a pipeline of 16 in one write,
// through the proxy on one connection and waits for the replies. One op is
// one round trip; the bytes are the request and reply bytes of it.
func BenchmarkForward(b *testing.B) {
	addr := startBenchProxy(b)
	for _, depth := range []int{1, 16} {
		for _, tc := range forwardCases {
			b.Run(tc.name+"/pipeline="+strconv.Itoa(depth), func(b *testing.B) {
				bc := newBenchConn(b, addr, tc, depth)
				bc.loop(b)
			})
		}
	}
}

// BenchmarkForwardOwn is BenchmarkForward's GET from a client that set
// its name first, so that its commands go on a backend connection of its
// own rather than a shared one: one command, or a pipeline of 16, per
// round trip.
func BenchmarkForwardOwn(b *testing.B) {
	addr := startBenchProxy(b)
	for _, depth := range []int{1, 16} {
		b.Run("GET/pipeline="+strconv.Itoa(depth), func(b *testing.B) {
			bc := newBenchConn(b, addr, forwardCases[0], depth)
			setName(b, bc.c)
			bc.loop(b)
		})
	}
}

// loop measures bc's round trips, after a first one outside the timer
// (the backend connection is opened lazily).
func (bc *benchConn) loop(b *testing.B) {
	if err := bc.roundTrip(); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(bc.req) + len(bc.want)))
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if err := bc.roundTrip(); err != nil {
			b.Fatal(err)
		}
	}
}

// setName names the client on c (CLIENT SETNAME), which gives it
// connection state of its own.
func setName(b *testing.B, c net.Conn) {
	b.Helper()
	if _, err := c.Write(encode([]string{"CLIENT", "SETNAME", "own"})); err != nil {
		b.Fatal(err)
	}
	ok := make([]byte, len("+OK\r\n"))
	if _, err := io.ReadFull(c, ok); err != nil || string(ok) != "+OK\r\n" {
		b.Fatalf("CLIENT SETNAME: %q, %v", ok, err)
	}
}

// BenchmarkForwardParallel runs 25 clients per GOMAXPROCS (50 on two
// cores, as redis-benchmark -c 50), each on its own connection, sending
// one command per round trip. This is where batching across clients
// shows.
func BenchmarkForwardParallel(b *testing.B) {
	const perProc = 25
	addr := startBenchProxy(b)
	for _, tc := range forwardCases {
		b.Run(tc.name, func(b *testing.B) {
			benchParallel(b, perProc, func() *benchConn { return newBenchConn(b, addr, tc, 1) })
		})
	}
}

// benchParallel opens perProc connections per GOMAXPROCS with open, each
// checked by one round trip before the timer starts, and spreads b.N round
// trips over perProc goroutines per GOMAXPROCS, one connection each.
func benchParallel(b *testing.B, perProc int, open func() *benchConn) {
	conns := make([]*benchConn, perProc*runtime.GOMAXPROCS(0))
	for i := range conns {
		conns[i] = open()
		if err := conns[i].roundTrip(); err != nil {
			b.Fatal(err)
		}
	}
	var next atomic.Int64
	b.SetParallelism(perProc)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		bc := conns[next.Add(1)-1]
		for pb.Next() {
			if err := bc.roundTrip(); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkGuardCheck runs the key guard's check of a GET from many
// goroutines at once, as the clients' forwarders do: the loaded COMMAND
// table is read without a lock.
func BenchmarkGuardCheck(b *testing.B) {
	srv := redistest.Start(b)
	_, p := startProxy(b, srv.Addr, func(c *Config) { c.ProtectedPrefix = "lock:" })
	name, args := []byte("get"), [][]byte{[]byte("GET"), []byte("bench:key")}
	if err := p.guardCheck(name, args); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := p.guardCheck(name, args); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkClusterOwn sends GETs through the proxy in front of a cluster
// of three masters from a client that set its name, so that its commands
// go on connections of its own (clustercall.go), one command or a
// pipeline of 16 per round trip.
func BenchmarkClusterOwn(b *testing.B) {
	c := redistest.StartCluster(b, 3, 0)
	addr, _ := startClusterProxy(b, c)
	for _, depth := range []int{1, 16} {
		b.Run("GET/pipeline="+strconv.Itoa(depth), func(b *testing.B) {
			bc := newBenchConn(b, addr, forwardCases[0], depth)
			setName(b, bc.c)
			bc.want = bytes.Repeat([]byte("$-1\r\n"), depth)
			bc.reply = make([]byte, len(bc.want))
			if err := bc.roundTrip(); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if err := bc.roundTrip(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkFenced is BenchmarkForward's SET and GET, plain and as FENCED
// (the fence check on the backend: a transaction on a connection of the
// proxy's own), one command or a pipeline of 16 per round trip.
func BenchmarkFenced(b *testing.B) {
	srv := redistest.Start(b)
	if reply, err := srv.Do("SET", "bench:key", "xxx"); err != nil || reply != "+OK" {
		b.Fatalf("SET on the backend: %q, %v", reply, err)
	}
	addr, _ := startProxy(b, srv.Addr, func(c *Config) { c.Fencing = testFencing(nil) })
	for _, depth := range []int{1, 16} {
		for _, tc := range forwardCases {
			fenced := forwardCase{name: "FENCED " + tc.name, cmd: append([]string{"FENCED", "bench:r", "1"}, tc.cmd...), reply: tc.reply}
			for _, c := range []forwardCase{tc, fenced} {
				b.Run(c.name+"/pipeline="+strconv.Itoa(depth), func(b *testing.B) {
					bc := newBenchConn(b, addr, c, depth)
					bc.loop(b)
				})
			}
		}
	}
}
