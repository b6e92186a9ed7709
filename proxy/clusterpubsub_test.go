package proxy

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/internal/redistest"
	"github.com/lockproxy/lockproxy/proxy/internal/cluster"
)

// namesOn returns, for each master of the proxy's slot map, n names with
// the prefix whose slots that master serves.
func namesOn(t *testing.T, p *Proxy, prefix string, n int) [][]string {
	t.Helper()
	m, err := p.router.Current(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := make([][]string, len(m.Masters))
	index := map[string]int{}
	for i, a := range m.Masters {
		index[a] = i
	}
	for i, left := 0, n*len(m.Masters); left > 0; i++ {
		if i > 100000 {
			t.Fatal("no names found on every master")
		}
		name := fmt.Sprintf("%s%d", prefix, i)
		j := index[m.Master(cluster.KeySlot([]byte(name)))]
		if len(out[j]) < n {
			out[j] = append(out[j], name)
			left--
		}
	}
	return out
}

// TestClusterPubsub plays pub/sub sessions through the proxy in front of
// a cluster, with channels on every master, and compares them byte for
// byte with one standalone Redis.
func TestClusterPubsub(t *testing.T) {
	c := redistest.StartCluster(t, 3, 1)
	srv := redistest.Start(t)
	addr, p := startClusterProxy(t, c)

	chans := namesOn(t, p, "ch:", 2)
	all := append(append(append([]string{}, chans[0]...), chans[1]...), chans[2]...)
	keys := namesOn(t, p, "k:", 1)
	shard := namesOn(t, p, "sh:", 1)
	var publish []string
	for i, ch := range all {
		publish = append(publish, fmt.Sprintf("PUBLISH %s m%d", ch, i))
	}
	publish = append(publish, "PUBLISH p:x pat", "PUBLISH nobody x")
	var spublish []string
	for i, sh := range shard {
		spublish = append(spublish, fmt.Sprintf("SPUBLISH %s s%d", sh[0], i))
	}

	tests := []struct {
		name  string
		steps []step
	}{
		{"resp2", []step{
			send("a", "SUBSCRIBE "+strings.Join(all, " ")),
			readOn("a", len(all)-1),
			send("a", "PSUBSCRIBE p:*"),
			send("b", publish...),
			readOn("a", len(all)+1),
			send("a", "PING", "PING hi"),
			send("a", "GET "+keys[1][0], "GET "+keys[2][0], "DBSIZE", "OBJECT ENCODING "+keys[2][0]),
			// (UNSUBSCRIBE of several lists them in the order of a hash
			// table Redis seeds at random: named here.)
			send("a", "UNSUBSCRIBE "+all[0]),
			send("a", "UNSUBSCRIBE "+strings.Join(all[1:], " ")),
			readOn("a", len(all)-2),
			send("a", "UNSUBSCRIBE", "PUNSUBSCRIBE"),
			// Subscribed to nothing: an ordinary client again.
			send("a", "SET "+keys[0][0]+" 0", "SET "+keys[1][0]+" 1", "SET "+keys[2][0]+" 2",
				"MGET "+keys[0][0]+" "+keys[1][0]+" "+keys[2][0], "UNSUBSCRIBE"),
			send("a", "SUBSCRIBE "+all[5]),
			send("b", "PUBLISH "+all[5]+" again"),
			readOn("a", 1),
			send("a", "RESET", "GET "+keys[2][0]),
		}},
		{"resp3", []step{
			send("a", "HELLO 3"),
			send("a", "SET "+keys[1][0]+" v", "SUBSCRIBE "+all[0]+" "+all[3]),
			readOn("a", 1),
			send("a", "PSUBSCRIBE p:*"),
			send("b", "PUBLISH "+all[3]+" one", "PUBLISH p:y two"),
			readOn("a", 2),
			// A subscribed RESP3 client may run any command, on any master.
			send("a", "GET "+keys[1][0], "HSET "+keys[2][0]+" f v", "HGETALL "+keys[2][0], "PING", "MGET "+keys[0][0]+" "+keys[1][0]),
			send("b", "PUBLISH "+all[0]+" three"),
			readOn("a", 1),
			send("a", "UNSUBSCRIBE "+all[3]+" "+all[0]),
			readOn("a", 1),
			send("a", "PUNSUBSCRIBE", "GET "+keys[1][0]),
			send("a", "HELLO 2", "HGETALL "+keys[2][0]),
		}},
		{"shard channels", []step{
			send("a", "SSUBSCRIBE "+shard[0][0]),
			send("c", "SSUBSCRIBE "+shard[1][0]),
			send("d", "HELLO 3", "SSUBSCRIBE "+shard[2][0]),
			send("b", spublish...),
			readOn("a", 1),
			readOn("c", 1),
			readOn("d", 1),
			send("a", "SUBSCRIBE "+all[4]),
			send("b", "PUBLISH "+all[4]+" both"),
			readOn("a", 1),
			send("a", "SUNSUBSCRIBE", "UNSUBSCRIBE"),
			send("c", "SUNSUBSCRIBE "+shard[1][0]),
			send("d", "SUNSUBSCRIBE", "GET "+keys[0][0]),
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { compareCluster(t, srv, c, addr, tt.steps) })
	}

	// Where the cluster answers differently on purpose.
	a := dial(t, addr)
	if got, want := string(a.do(args("SSUBSCRIBE "+shard[0][0]+" "+shard[1][0]))), string(cluster.ReplyCrossSlot); got != want {
		t.Errorf("SSUBSCRIBE across slots: %q, want %q", got, want)
	}
	a.do(args("SSUBSCRIBE " + shard[0][0]))
	if got, want := string(a.do(args("SSUBSCRIBE "+shard[1][0]))), string(refuseOtherShard("ssubscribe")); got != want {
		t.Errorf("SSUBSCRIBE in another shard: %q, want %q", got, want)
	}
	// With no subscription left, the client may move to another shard.
	a.do(args("SUNSUBSCRIBE"))
	want := fmt.Sprintf("*3\r\n$10\r\nssubscribe\r\n$%d\r\n%s\r\n:1\r\n", len(shard[1][0]), shard[1][0])
	if got := string(a.do(args("SSUBSCRIBE " + shard[1][0]))); got != want {
		t.Errorf("SSUBSCRIBE after SUNSUBSCRIBE: %q, want %q", got, want)
	}
}

// TestClusterPubsubNodeLost kills the node a subscribed client's
// connection is on: the client is disconnected, so that it subscribes
// again, and once the replica has taken over, subscribing works again.
func TestClusterPubsubNodeLost(t *testing.T) {
	c := redistest.StartCluster(t, 3, 1)
	addr, p := startClusterProxy(t, c)
	ch := namesOn(t, p, "sh:", 1)[1][0] // a channel of the second master's
	sub := dial(t, addr)
	sub.do(args("SUBSCRIBE news"))
	ssub := dial(t, addr)
	ssub.do(args("SSUBSCRIBE " + ch))
	pub := dial(t, addr)
	if got := string(pub.do(args("PUBLISH news hello"))); got != ":1\r\n" {
		t.Fatalf("PUBLISH: %q", got)
	}
	if got := string(sub.read(1)); got != "*3\r\n$7\r\nmessage\r\n$4\r\nnews\r\n$5\r\nhello\r\n" {
		t.Fatalf("message: %q", got)
	}
	// The master serving slot 0 goes: the SUBSCRIBE client's node.
	c.Nodes[0].Kill()
	if rest, closed := sub.closedAfter(10 * time.Second); !closed {
		t.Fatalf("the subscribed client was not disconnected (got %q)", rest)
	}
	// The shard subscriber's node is alive: it stays.
	if got := string(pub.do(args("SPUBLISH " + ch + " still"))); got != ":1\r\n" {
		t.Fatalf("SPUBLISH: %q", got)
	}
	want := fmt.Sprintf("*3\r\n$8\r\nsmessage\r\n$%d\r\n%s\r\n$5\r\nstill\r\n", len(ch), ch)
	if got := string(ssub.read(1)); got != want {
		t.Fatalf("smessage: %q, want %q", got, want)
	}
	// After the failover, a new subscription gets the messages.
	again := dial(t, addr)
	waitFor(t, 20*time.Second, func() bool {
		b := string(again.do(args("SUBSCRIBE news")))
		if b != "*3\r\n$9\r\nsubscribe\r\n$4\r\nnews\r\n:1\r\n" {
			if !strings.HasPrefix(b, "-ERR backend unavailable") {
				t.Fatalf("SUBSCRIBE while the master fails over: %q", b)
			}
			return false
		}
		return string(pub.do(args("PUBLISH news back"))) == ":1\r\n"
	})
	if got := string(again.read(1)); got != "*3\r\n$7\r\nmessage\r\n$4\r\nnews\r\n$4\r\nback\r\n" {
		t.Fatalf("message after the failover: %q", got)
	}
}

// TestClusterFirstPsubscribe subscribes fresh clients with PSUBSCRIBE and
// with a keyspace SUBSCRIBE first, in RESP2 and RESP3. The subscription is
// made on every master (the mirrors) and confirmed by each before the
// client's confirmation: that comes at once, not after the dial timeout
// (a minute here, so that a confirmation the proxy fails to see shows), and
// a PUBLISH right after it reaches the client once.
func TestClusterFirstPsubscribe(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	addr, _ := startProxy(t, "", func(cfg *Config) {
		cfg.Backend.Cluster = c.Seeds()[:2]
		cfg.Backend.DialTimeout = time.Minute
	})
	pub := dial(t, addr)
	for _, tt := range []struct{ name, hello, sub, confirm, publish, msg string }{
		{"psubscribe resp2", "", "PSUBSCRIBE p:*", "*3\r\n$10\r\npsubscribe\r\n$3\r\np:*\r\n:1\r\n",
			"PUBLISH p:x hello", "*4\r\n$8\r\npmessage\r\n$3\r\np:*\r\n$3\r\np:x\r\n$5\r\nhello\r\n"},
		{"psubscribe resp3", "HELLO 3", "PSUBSCRIBE p:*", ">3\r\n$10\r\npsubscribe\r\n$3\r\np:*\r\n:1\r\n",
			"PUBLISH p:x hello", ">4\r\n$8\r\npmessage\r\n$3\r\np:*\r\n$3\r\np:x\r\n$5\r\nhello\r\n"},
		{"keyspace subscribe resp2", "", "SUBSCRIBE __keyspace@0__:k", "*3\r\n$9\r\nsubscribe\r\n$16\r\n__keyspace@0__:k\r\n:1\r\n",
			"PUBLISH __keyspace@0__:k hello", "*3\r\n$7\r\nmessage\r\n$16\r\n__keyspace@0__:k\r\n$5\r\nhello\r\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			sub := dial(t, addr)
			if tt.hello != "" {
				sub.do(args(tt.hello))
			}
			start := time.Now()
			if got := string(sub.do(args(tt.sub))); got != tt.confirm {
				t.Fatalf("%s: %q, want %q", tt.sub, got, tt.confirm)
			}
			if d := time.Since(start); d > 20*time.Second {
				t.Fatalf("%s confirmed after %v: the proxy waited for the mirrors' confirmations until its dial timeout", tt.sub, d)
			}
			if got := string(pub.do(args(tt.publish))); got != ":1\r\n" {
				t.Errorf("%s: %q, want :1", tt.publish, got)
			}
			if got := string(sub.read(1)); got != tt.msg {
				t.Fatalf("message: %q, want %q", got, tt.msg)
			}
			// Once only: the PING's reply comes next.
			pong := "*2\r\n$4\r\npong\r\n$0\r\n\r\n"
			if tt.hello != "" {
				pong = "+PONG\r\n"
			}
			if got := string(sub.do(args("PING"))); got != pong {
				t.Fatalf("after the message: %q, want %q", got, pong)
			}
		})
	}
}
