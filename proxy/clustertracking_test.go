package proxy

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/internal/redistest"
	"github.com/lockproxy/lockproxy/proxy/internal/cluster"
)

// TestClusterTrackingPushOrder checks that a RESP3 client tracking without
// REDIRECT in front of a cluster gets each invalidation where one Redis
// puts it among the replies: one its own write caused right after that
// write's reply (before the reply of a command to another master
// pipelined behind it), an eviction's before the reply of the command
// that evicted (Redis's "Tracking invalidation message of eviction keys
// should be before response"), and a FLUSHDB's in a transaction after
// EXEC's reply ("flushdb tracking invalidation message is not interleaved
// with transaction response").
func TestClusterTrackingPushOrder(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	addr, _ := startClusterProxy(t, c)
	r3 := dial(t, addr)
	r3.do(args("HELLO 3"))
	if got := string(r3.do(args("CLIENT TRACKING on"))); got != "+OK\r\n" {
		t.Fatalf("CLIENT TRACKING on: %q", got)
	}
	push := func(k string) string {
		return ">2\r\n$10\r\ninvalidate\r\n*1\r\n$" + strconv.Itoa(len(k)) + "\r\n" + k + "\r\n"
	}
	bulk := func(v string) string { return "$" + strconv.Itoa(len(v)) + "\r\n" + v + "\r\n" }

	// The client's own write: the invalidation after its reply, before the
	// reply of the GET behind it on another master.
	a, b := keyOn(0, "po:"), keyOn(1, "po:")
	r3.do(args("SET "+b+" vb"), args("GET "+a))
	for round := range 20 {
		r3.send(encode(args("SET "+a+" "+strconv.Itoa(round)), args("GET "+b), args("GET "+a)))
		want := "+OK\r\n" + push(a) + bulk("vb") + bulk(strconv.Itoa(round))
		if got := string(r3.read(4)); got != want {
			t.Fatalf("round %d: %q, want %q", round, got, want)
		}
	}

	// An eviction's invalidation before the reply of the command that
	// evicted: both keys on one master, whose memory limit is set just
	// above what it uses.
	vk, bk := "{ev}volatile-key", "{ev}big-key"
	node := c.Nodes[cluster.KeySlot([]byte(vk))*3/cluster.NumSlots].Addr
	m := dial(t, node)
	info := string(m.do(args("INFO memory")))
	used := infoField(t, info, "used_memory") - infoField(t, info, "mem_not_counted_for_evict")
	t.Cleanup(func() {
		m := dial(t, node)
		m.do(args("CONFIG SET maxmemory-policy noeviction"), args("CONFIG SET maxmemory 0"))
	})
	m.do(args("CONFIG SET maxmemory "+strconv.Itoa(used+100*1024)), args("CONFIG SET maxmemory-policy volatile-random"))
	r3.do(args("SETEX "+vk+" 10000 x"), args("GET "+vk))
	r3.do(args("SETBIT " + bk + " 1600000 0"))
	if got, want := string(r3.do(args("GETBIT "+bk+" 0"))), push(vk); got != want {
		t.Errorf("after the write past the limit: %q, want the eviction's invalidation %q first", got, want)
	}
	if got := string(r3.read(1)); got != ":0\r\n" {
		t.Errorf("GETBIT's reply after the invalidation: %q", got)
	}
	m.do(args("CONFIG SET maxmemory-policy noeviction"), args("CONFIG SET maxmemory 0"))

	// A FLUSHDB in a transaction: its invalidation (all keys, once) after
	// EXEC's reply.
	for round := range 10 {
		r3.do(args("GET " + a))
		r3.send(encode(args("MULTI"), args("FLUSHDB"), args("EXEC")))
		want := "+OK\r\n+QUEUED\r\n*1\r\n+OK\r\n>2\r\n$10\r\ninvalidate\r\n_\r\n"
		if got := string(r3.read(4)); got != want {
			t.Fatalf("round %d: %q, want %q", round, got, want)
		}
		if extra, err := r3.tryRead(1, 100*time.Millisecond); err == nil {
			t.Fatalf("round %d: a second invalidation for one FLUSHDB: %q", round, extra)
		}
	}
}

// infoField returns an integer field of an INFO reply.
func infoField(t *testing.T, info, name string) int {
	t.Helper()
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				t.Fatalf("INFO %s: %q", name, v)
			}
			return n
		}
	}
	t.Fatalf("INFO has no %s", name)
	return 0
}

// TestClusterTrackingRedirectQuit checks that once a REDIRECT target's
// QUIT has been answered, the tracker's next invalidation is a
// tracking-redir-broken push, as from one Redis (Redis's "RESP3 based
// basic tracking-redir-broken with client reply off").
func TestClusterTrackingRedirectQuit(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	addr, _ := startClusterProxy(t, c)
	tracker, w := dial(t, addr), dial(t, addr)
	tracker.do(args("HELLO 3"))
	k := keyOn(1, "rq:")
	for round := range 20 {
		target := dial(t, addr)
		id := strings.TrimSuffix(strings.TrimPrefix(string(target.do(args("CLIENT ID"))), ":"), "\r\n")
		if got := string(tracker.do(args("CLIENT TRACKING on REDIRECT " + id))); got != "+OK\r\n" {
			t.Fatalf("round %d: CLIENT TRACKING on REDIRECT: %q", round, got)
		}
		w.do(args("SET " + k + " a"))
		tracker.do(args("GET " + k))
		if got := string(target.do(args("QUIT"))); got != "+OK\r\n" {
			t.Fatalf("round %d: QUIT: %q", round, got)
		}
		w.do(args("SET " + k + " b"))
		want := ">2\r\n$21\r\ntracking-redir-broken\r\n:" + id + "\r\n"
		got, err := tracker.tryRead(1, 2*time.Second)
		if err != nil || string(got) != want {
			t.Fatalf("round %d: after the target's QUIT: %q (%v), want %q", round, got, err, want)
		}
		tracker.do(args("CLIENT TRACKING off"))
	}
}

// TestClusterTrackingTwoTrackersOneTarget checks that the invalidations
// of two clients redirecting to one target come to it in the order the
// master made them (Redis's "Different clients can redirect to the same
// connection"): one master's invalidations for one target come on one
// connection, whichever client they are for.
func TestClusterTrackingTwoTrackersOneTarget(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	addr, _ := startClusterProxy(t, c)
	target, r1, r2, w := dial(t, addr), dial(t, addr), dial(t, addr), dial(t, addr)
	id := strings.TrimSuffix(strings.TrimPrefix(string(target.do(args("CLIENT ID"))), ":"), "\r\n")
	target.do(args("SUBSCRIBE __redis__:invalidate"))
	for _, r := range []*client{r1, r2} {
		if got := string(r.do(args("CLIENT TRACKING on REDIRECT " + id))); got != "+OK\r\n" {
			t.Fatalf("CLIENT TRACKING on REDIRECT: %q", got)
		}
	}
	k1, k2 := "{tt}key1", "{tt}key2"
	msg := func(k string) string {
		return "*3\r\n$7\r\nmessage\r\n$20\r\n__redis__:invalidate\r\n*1\r\n$" + strconv.Itoa(len(k)) + "\r\n" + k + "\r\n"
	}
	for round := range 30 {
		w.do(args("MSET " + k1 + " 1 " + k2 + " 1"))
		r1.do(args("GET " + k1))
		r2.do(args("GET " + k2))
		w.do(args("INCR " + k1))
		w.do(args("INCR " + k2))
		if got, want := string(target.read(2)), msg(k1)+msg(k2); got != want {
			t.Fatalf("round %d: %q, want %q", round, got, want)
		}
	}
}
