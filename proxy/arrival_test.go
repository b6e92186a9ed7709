package proxy

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/internal/redistest"
)

// arrivalRounds runs the Redis test suite's "Blocking XREAD: key type
// changed with SET" rounds times against addr: one client sends XREAD
// BLOCK and, without waiting, another sends SET on the stream. The two
// writes leave one goroutine back to back, as the suite's Tcl client sends
// them. It returns how many rounds answered otherwise than Redis would:
// with the XREAD served first, the reader is still blocked after the SET
// and gets the entry added later.
func arrivalRounds(t *testing.T, addr string, rounds int, selectDB bool) (wrong int, sample string) {
	want := "*1\r\n*2\r\n$8\r\nmystream\r\n*1\r\n*2\r\n$5\r\n667-0\r\n*2\r\n$1\r\nf\r\n$1\r\nv\r\n"
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	for i := range rounds {
		a, b := dial(t, addr), dial(t, addr)
		if selectDB {
			// Both connected, and with a database selected, as the
			// suite's clients are: a connection of its own behind each.
			a.do(args("SELECT 9"))
			b.do(args("SELECT 9"))
		}
		b.do(args("DEL mystream"), args("XADD mystream 666 f v"))
		a.send(encode(args("XREAD BLOCK 0 STREAMS mystream $")))
		b.send(encode(args("SET mystream val1")))
		b.read(1)
		b.do(args("DEL mystream"), args("XADD mystream 667 f v"))
		got, err := a.tryRead(1, 2*time.Second)
		if err != nil || string(got) != want {
			wrong++
			sample = fmt.Sprintf("round %d: %q %v", i, got, err)
		}
		a.c.Close()
		b.c.Close()
	}
	return wrong, sample
}

// TestDifferentialArrivalOrder: commands that two clients send one right
// after the other reach Redis in the order the proxy received them, as
// when the clients talk to Redis directly. Without the arrival order, 75
// to 95 of the 100 rounds go wrong through the proxy on 2 CPUs; with it, 0
// to 4, and directly 0 to 19 (the kernel itself may deliver two sockets'
// packets out of order when the sender moves between CPUs).
func TestDifferentialArrivalOrder(t *testing.T) {
	srv := redistest.Start(t)
	const rounds = 100
	direct, sample := arrivalRounds(t, srv.Addr, rounds, true)
	t.Logf("directly, %d of %d rounds out of order %s", direct, rounds, sample)
	addr, _ := startProxy(t, srv.Addr, nil)
	proxied, sample := arrivalRounds(t, addr, rounds, true)
	t.Logf("through the proxy, %d of %d rounds out of order %s", proxied, rounds, sample)
	if proxied > rounds/4 {
		t.Fatalf("through the proxy, %d of %d rounds out of order (directly %d): %s", proxied, rounds, direct, sample)
	}
}
