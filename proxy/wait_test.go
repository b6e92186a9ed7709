package proxy

import (
	"strconv"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/internal/redistest"
)

// TestWaitCoversSharedWrites: WAIT counts the replicas that have the
// client's earlier writes, also when those went on a shared connection
// and the WAIT is the client's first command on a connection of its own:
// with its replica paused, one Redis answers :0 after the timeout, and so
// must the proxy (a fresh connection's WAIT counts every replica).
func TestWaitCoversSharedWrites(t *testing.T) {
	primary := redistest.Start(t)
	replica := redistest.Start(t, "--replicaof", "127.0.0.1", strconv.Itoa(primary.Port()))
	addr, _ := startProxy(t, primary.Addr, nil)
	c := dial(t, addr)
	deadline := time.Now().Add(10 * time.Second)
	for string(c.do([]string{"SET", "k", "0"}, []string{"WAIT", "1", "100"})) != "+OK\r\n:1\r\n" {
		if time.Now().After(deadline) {
			t.Fatal("the replica never acknowledged a write")
		}
		time.Sleep(50 * time.Millisecond)
	}
	replica.Pause()
	defer replica.Resume()
	fresh := dial(t, addr)
	if got := string(fresh.do([]string{"SET", "k", "1"})); got != "+OK\r\n" {
		t.Fatalf("SET: %q", got)
	}
	if got := string(fresh.do([]string{"WAIT", "1", "200"})); got != ":0\r\n" {
		t.Errorf("WAIT 1 200 after a write the paused replica cannot have: %q, want :0 as from Redis", got)
	}
	// The proxy's mark leaves no key, and its reply reaches no client,
	// also after a skipped reply and inside a transaction.
	other := dial(t, addr)
	other.do([]string{"GET", "k"}) // on the shared connection
	other.send(encode([]string{"CLIENT", "REPLY", "SKIP"}, []string{"WAIT", "0", "0"}, []string{"MULTI"}, []string{"WAIT", "0", "0"}, []string{"EXEC"}, []string{"DBSIZE"}))
	got := string(other.read(4)) // no reply to the first two
	if want := "+OK\r\n+QUEUED\r\n*1\r\n:0\r\n:1\r\n"; got != want {
		t.Errorf("CLIENT REPLY SKIP, WAIT, MULTI, WAIT, EXEC, DBSIZE: %q, want %q", got, want)
	}
}
