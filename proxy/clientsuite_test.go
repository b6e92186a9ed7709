package proxy

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/internal/redistest"
)

// The defects that go-redis's own test suite (bench/clientsuite.sh) showed
// in the proxy in front of a Redis Cluster, each with the test that the
// fix makes pass.

// TestClusterLongPipelineOwnConnection sends 20000 commands in one
// pipeline on a client's own connection to a master (in a transaction,
// and after CLIENT SETNAME): the replies to the first ones arrive while the
// rest are still being written, and the connection must be kept for them.
// go-redis's "Tx should exec bulks" got -ERR backend unavailable:
// connection lost, then EXECABORT, where one Redis answers every INCR.
func TestClusterLongPipelineOwnConnection(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	addr, _ := startClusterProxy(t, c)
	const n = 20000
	tests := []struct {
		name        string
		first, last []string
		queued      string // each INCR's own reply, when not its value
		want        func(b *bytes.Buffer)
	}{
		{name: "transaction", first: args("MULTI"), last: args("EXEC"), queued: "+QUEUED\r\n",
			want: func(b *bytes.Buffer) { fmt.Fprintf(b, "*%d\r\n", n) }},
		{name: "client name", first: args("CLIENT SETNAME long"), last: args("PING"),
			want: func(b *bytes.Buffer) {}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := dial(t, addr)
			key := "long:" + tt.name
			a.do(args("DEL " + key))
			cmds := [][]string{tt.first}
			for range n {
				cmds = append(cmds, []string{"INCR", key})
			}
			cmds = append(cmds, tt.last)

			var want bytes.Buffer
			want.WriteString("+OK\r\n")
			for i := range n {
				if tt.queued != "" {
					want.WriteString(tt.queued)
				} else {
					fmt.Fprintf(&want, ":%d\r\n", i+1)
				}
			}
			tt.want(&want)
			if tt.queued != "" {
				for i := range n {
					fmt.Fprintf(&want, ":%d\r\n", i+1)
				}
			} else {
				want.WriteString("+PONG\r\n")
			}

			// Written while the replies are read: neither side waits
			// for the other's buffers.
			raw := encode(cmds...)
			sent := make(chan error, 1)
			go func() {
				_, err := a.c.Write(raw)
				sent <- err
			}()
			got := a.read(len(cmds))
			if err := <-sent; err != nil {
				t.Fatalf("write: %v", err)
			}
			if !bytes.Equal(got, want.Bytes()) {
				i := 0
				for i < min(len(got), want.Len()) && got[i] == want.Bytes()[i] {
					i++
				}
				t.Fatalf("replies differ at byte %d of %d: got %q, want %q", i, want.Len(),
					trunc(got[i:min(len(got), i+120)]), trunc(want.Bytes()[i:min(want.Len(), i+120)]))
			}
		})
	}
}

// TestClusterSlowlogCopies counts the slow log as one Redis does: the
// CONFIG SET and SLOWLOG RESET that the proxy applies to every master are
// logged by each, and count once. go-redis's "SlowLog returns the number
// of slow queries" got 4 and 3 where one Redis answers 2 and 1.
func TestClusterSlowlogCopies(t *testing.T) {
	steps := [][]string{
		args("SET test true"),
		args("SLOWLOG RESET"),
		args("CONFIG SET slowlog-log-slower-than 0"),
		args("SET test true"),
		args("SLOWLOG LEN"),
		args("SLOWLOG RESET"),
		args("SLOWLOG LEN"),
	}
	sameAsOneRedis(t, func(addr string) string {
		a := dial(t, addr)
		var out []byte
		for _, s := range steps {
			out = append(out, a.do(s)...)
		}
		// The entries' commands, newest first: SLOWLOG LEN, SLOWLOG RESET.
		got := string(a.do(args("SLOWLOG GET")))
		a.do(args("CONFIG SET slowlog-log-slower-than 10000"))
		names := ""
		for _, w := range []string{"len", "reset"} {
			names += fmt.Sprintf(" %s:%d", w, strings.Count(strings.ToLower(got), "$"+fmt.Sprint(len(w))+"\r\n"+w+"\r\n"))
		}
		return string(out) + strings.SplitN(got, "\r\n", 2)[0] + names
	})
}

// TestClusterShardPubsubInfo lists the shard channels subscribed through
// the proxy on every master, as one Redis lists them: each SSUBSCRIBE
// pins its client to the master of its channel, and PUBSUB SHARDCHANNELS
// and SHARDNUMSUB asked only the slot-0 master, which knew a third of
// them.
func TestClusterShardPubsubInfo(t *testing.T) {
	chans := []string{keyOn(0, "ch"), keyOn(1, "ch"), keyOn(2, "ch")}
	sameAsOneRedis(t, func(addr string) string {
		for _, ch := range chans {
			for range 2 {
				dial(t, addr).do(args("SSUBSCRIBE " + ch))
			}
		}
		a := dial(t, addr)
		list := strings.Split(string(a.do(args("PUBSUB SHARDCHANNELS"))), "\r\n")
		slices.Sort(list[1:]) // the order of one Redis's hash table
		out := strings.Join(list, " ")
		out += string(a.do(args("PUBSUB SHARDCHANNELS " + chans[1])))
		numsub := args("PUBSUB SHARDNUMSUB " + strings.Join(chans, " ") + " nope")
		out += string(a.do(numsub))
		a.do(args("HELLO 3"))
		return out + string(a.do(numsub))
	})
}

// TestClusterACLLog reads the ACL log of every master, as one Redis keeps
// it: a command refused by the ACL is logged by the master of its key, and
// ACL LOG asked only the slot-0 master (go-redis's "should ACL LOG" saw 1
// entry of 3).
func TestClusterACLLog(t *testing.T) {
	sameAsOneRedis(t, func(addr string) string {
		a := dial(t, addr)
		a.do(args("ACL LOG RESET"), args("ACL SETUSER test >test on allkeys +get"))
		u := dial(t, addr)
		u.do(args("AUTH test test"))
		for i := range 3 {
			u.do(args("SET " + keyOn(i, "acl") + " v"))
		}
		time.Sleep(5 * time.Millisecond) // ACL LOG's ages are in milliseconds
		u.do(args("HSET " + keyOn(1, "acl") + " f v"))
		out := ""
		for _, q := range []string{"ACL LOG", "ACL LOG 1", "ACL LOG RESET", "ACL LOG"} {
			r := string(a.do(args(q)))
			out += strings.SplitN(r, "\r\n", 2)[0] + " "             // the number of entries
			out += fmt.Sprint(strings.Count(r, "age-seconds")) + " " // and that they are entries
			for _, o := range []string{"set", "hset"} {              // each refusal's count
				if i := strings.Index(r, "\r\n"+o+"\r\n"); i >= 0 {
					out += o + strings.SplitN(r[strings.LastIndex(r[:i], "count\r\n:")+7:], "\r\n", 2)[0] + " "
				}
			}
		}
		a.do(args("ACL DELUSER test"))
		return out
	})
}

// sameAsOneRedis plays the same session through a proxy in front of a
// 3-master cluster and against one Redis, and requires the same outcome.
func sameAsOneRedis(t *testing.T, play func(addr string) string) {
	t.Helper()
	c := redistest.StartCluster(t, 3, 0)
	srv := redistest.Start(t)
	addr, _ := startClusterProxy(t, c)
	want := play(srv.Addr)
	if got := play(addr); got != want {
		t.Errorf("through the proxy in front of the cluster %q, one Redis %q", got, want)
	}
}
