package proxy

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/internal/redistest"
)

// TestOwnConnection plays, against Redis directly and through the proxy,
// what a client of one Redis does on its connection of one (backend.NewOne),
// where the client's replyQueue, not the pending list, tells what each
// frame the connection's reader reads answers: pipelines that move the
// client off its shared connection in the middle, with a blocking
// command, CLIENT REPLY SKIP and OFF, and a transaction; frames that
// answer no command and come while the client sends nothing (messages to
// a client a transaction subscribed, RESP3 invalidation pushes); values
// larger than the write buffer it keeps; and pub/sub after SELECT.
func TestOwnConnection(t *testing.T) {
	srv := redistest.Start(t)
	addr, _ := startProxy(t, srv.Addr, nil)
	big := strings.Repeat("0123456789", 200_000) // 2 MB, past the write buffer kept between batches
	tests := []struct {
		name  string
		steps []step
	}{
		{"pipeline across the move", []step{send("a",
			"SET a 1", "GET a", "SELECT 1", "SET b 2", "MULTI", "GET b", "INCR b", "EXEC",
			"BLPOP nolist 0.01", "RPUSH l x", "BLPOP l 1", "SELECT 0", "GET a", "GET b")}},
		{"client reply in a pipeline", []step{
			sendRead("a", 4, "CLIENT SETNAME own", "CLIENT REPLY SKIP", "SET r 1", "GET r",
				"CLIENT REPLY OFF", "INCR r", "BLPOP nolist 0.01", "CLIENT REPLY ON", "GET r"),
			sendRead("a", 1, "CLIENT REPLY SKIP", "MULTI", "SET r 5", "EXEC"),
			send("a", "GET r"),
		}},
		{"transaction across the move", []step{
			send("a", "SET t 1", "WATCH t", "GET t"),
			send("b", "SET t 2"),
			send("a", "MULTI", "SET t 3", "EXEC", "GET t"),
			send("a", "SET u 1", "MULTI", "INCR u", "NOSUCH", "EXEC", "GET u"),
		}},
		{"messages after a transaction subscribed", []step{
			send("a", "CLIENT SETNAME own", "MULTI", "SUBSCRIBE ch", "EXEC"),
			send("b", "PUBLISH ch one", "PUBLISH ch two"),
			readOn("a", 2),
			send("a", "UNSUBSCRIBE"), // the next run's PUBLISH counts one subscriber
		}},
		{"invalidation pushes while idle", []step{
			send("a", "HELLO 3", "CLIENT TRACKING ON", "GET k"),
			send("b", "SET k 1"),
			readOn("a", 1),
			send("a", "GET k", "PING"),
			send("b", "DEL k"),
			readOn("a", 1),
		}},
		{"subscribe after select", []step{
			send("a", "SELECT 2", "SET s v", "SUBSCRIBE ch"),
			send("b", "PUBLISH ch hi"),
			readOn("a", 1),
			send("a", "PING", "UNSUBSCRIBE ch"),
			send("a", "GET s", "SELECT 0", "GET s"),
		}},
		{"big values", []step{
			send("a", "SELECT 3"),
			cmdArgs("a", "SET", "big", big),
			send("a", "GET big", "STRLEN big", "SET small 1", "GET small"),
			cmdArgs("a", "APPEND", "big", big),
			send("a", "STRLEN big", "GET small"),
		}},
		{"resp3 subscribe on the connection of one", []step{
			send("a", "HELLO 3", "SUBSCRIBE ch"),
			send("b", "PUBLISH ch hi"),
			readOn("a", 1),
			send("a", "GET nothing", "UNSUBSCRIBE ch", "PING"),
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { compare(t, srv, addr, tt.steps) })
	}
}

// TestOwnConnectionLostMidPipeline loses the backend connection of a
// client with state of its own while a pipeline with a blocking command
// waits on it: each command in flight answers connection lost, in order,
// and the next command goes on a new connection brought back to the
// client's database and name.
func TestOwnConnectionLostMidPipeline(t *testing.T) {
	srv := redistest.Start(t)
	addr, _ := startProxy(t, srv.Addr, nil)
	c := dial(t, addr)
	expect(t, c, "+OK\r\n+OK\r\n+OK\r\n", "SELECT 2", "CLIENT SETNAME keeper", "SET k v")
	c.send(encode(args("BLPOP nothing 0"), args("GET k"), args("PING")))
	waitBlocked(t, srv, 1)
	if n := killClients(t, srv); n == 0 {
		t.Fatal("no client connection to kill")
	}
	lost := string(replyConnLost)
	if got := string(c.read(3)); got != lost+lost+lost {
		t.Fatalf("commands in flight: %q", got)
	}
	expect(t, c, "$1\r\nv\r\n$6\r\nkeeper\r\n", "GET k", "CLIENT GETNAME")
}

// TestQuitWithRepliesOff: a QUIT whose +OK CLIENT REPLY keeps back still
// ends the connection once Redis has written what it owed before it, as
// Redis closes it; the proxy does not keep the client connected with a
// new backend connection for its next command.
func TestQuitWithRepliesOff(t *testing.T) {
	srv := redistest.Start(t)
	addr, _ := startProxy(t, srv.Addr, nil)
	tests := [][]string{
		{"SELECT 1", "CLIENT REPLY SKIP", "QUIT"},
		{"SELECT 1", "CLIENT REPLY OFF", "QUIT", "PING"},
	}
	for _, cmds := range tests {
		var enc [][]string
		for _, c := range cmds {
			enc = append(enc, args(c))
		}
		for _, target := range []string{srv.Addr, addr} {
			c := dial(t, target)
			c.send(encode(enc...))
			if rest, closed := c.closedAfter(3 * time.Second); !closed || rest != "+OK\r\n" {
				t.Errorf("%q on %s: read %q, closed %v; want +OK and the connection closed, as by Redis", cmds, target, rest, closed)
			}
		}
	}
}

// TestStateSetWhileRepliesOff: SELECT, HELLO and CLIENT SETNAME sent
// while CLIENT REPLY OFF or SKIP keeps their replies from the client
// still set the state a new backend connection is brought back to: after
// the connection is lost, the client's commands go to the database it
// selected, in the protocol it chose, and a SELECT Redis refused is not
// replayed. Nothing of the replies the proxy reads for that reaches the
// client, byte for byte as from Redis.
func TestStateSetWhileRepliesOff(t *testing.T) {
	srv := redistest.Start(t)
	addr, _ := startProxy(t, srv.Addr, nil)
	compare(t, srv, addr, []step{
		sendRead("a", 4, "SET k 0", "CLIENT REPLY OFF", "SELECT 1", "SET k 1", "SELECT 99", "CLIENT REPLY ON", "GET k",
			"CLIENT REPLY SKIP", "SELECT 2", "SET k 2"),
		sendRead("a", 2, "CLIENT REPLY SKIP", "HELLO 3", "GET k", "CLIENT REPLY SKIP", "CLIENT SETNAME n", "CLIENT GETNAME"),
		sendRead("a", 3, "CLIENT REPLY OFF", "HELLO 2", "CLIENT REPLY ON", "GET k", "PING"),
	})

	c := dial(t, addr)
	expectN(t, c, 1, "+OK\r\n", "CLIENT REPLY OFF", "SELECT 1", "SELECT 99", "CLIENT REPLY ON")
	expectN(t, c, 1, "+OK\r\n", "CLIENT REPLY SKIP", "HELLO 3", "CLIENT REPLY SKIP", "SELECT 2", "CLIENT REPLY SKIP", "CLIENT SETNAME n", "SET k here")
	if n := killClients(t, srv); n == 0 {
		t.Fatal("no client connection to kill")
	}
	c.do(args("PING")) // connection lost, or the new connection's answer
	expect(t, c, "$4\r\nhere\r\n$1\r\nn\r\n_\r\n", "GET k", "CLIENT GETNAME", "GET nothing")
}

// TestSkipSpentByProxyReply: CLIENT REPLY SKIP followed by a command the
// proxy answers itself (here INFO lockproxy) skips that reply, and only
// that one: the client's next command on its own connection is answered,
// though the backend saw the SKIP and not the command that spent it.
func TestSkipSpentByProxyReply(t *testing.T) {
	srv := redistest.Start(t)
	addr, _ := startProxy(t, srv.Addr, func(c *Config) { c.Info = func() string { return "answer:42\r\n" } })
	c := dial(t, addr)
	c.send(encode(args("SELECT 0"), args("CLIENT REPLY SKIP"), args("INFO lockproxy"), args("ECHO x")))
	if got, err := c.tryRead(2, 5*time.Second); err != nil || string(got) != "+OK\r\n$1\r\nx\r\n" {
		t.Errorf("SELECT 0, CLIENT REPLY SKIP, INFO lockproxy, ECHO x: %q (%v), want +OK and x", got, err)
	}
	c.send(encode(args("CLIENT REPLY SKIP"), args("INFO lockproxy"), args("CLIENT REPLY SKIP"), args("ECHO y"), args("INFO lockproxy"), args("ECHO z")))
	got, err := c.tryRead(2, 5*time.Second)
	if err != nil || !bytes.Contains(got, []byte("answer:42")) || !bytes.HasSuffix(got, []byte("\r\n$1\r\nz\r\n")) {
		t.Errorf("SKIP, INFO lockproxy, SKIP, ECHO y, INFO lockproxy, ECHO z: %q (%v), want INFO's reply and z", got, err)
	}
}
