package proxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/lockproxy/lockproxy/internal/redistest"
)

// replica is a raw connection that asked for the replication stream, the
// way the Redis test suite's attach_to_replication_stream and redis-cli
// --replica do: no RESP client library, bytes as they come.
type replica struct {
	*client
}

// readLine reads one line, skipping the newlines Redis sends as keepalives
// before the payload; it returns the line with its CRLF.
func (r replica) readLine(t *testing.T) string {
	t.Helper()
	r.c.SetReadDeadline(time.Now().Add(20 * time.Second))
	for {
		line, err := r.r.ReadString('\n')
		if err != nil {
			t.Fatalf("read a line of the replication stream: %v (got %q)", err, line)
		}
		if line != "\n" {
			return line
		}
	}
}

var (
	fullResync = regexp.MustCompile(`^\+FULLRESYNC [0-9a-f]{40} [0-9]+\r\n$`)
	bulkHeader = regexp.MustCompile(`^\$([0-9]+)\r\n$`)
	eofHeader  = regexp.MustCompile(`^\$EOF:(.{40})\r\n$`)
)

// attach reads what answers a SYNC or PSYNC up to the end of the RDB
// payload, checks it, and returns its shape: the lines with the parts
// that differ between any two syncs (replication id, offset, payload length,
// EOF mark) masked.
func (r replica) attach(t *testing.T) string {
	t.Helper()
	var shape strings.Builder
	line := r.readLine(t)
	if strings.HasPrefix(line, "+") {
		if !fullResync.MatchString(line) {
			t.Fatalf("PSYNC answered %q", line)
		}
		shape.WriteString("+FULLRESYNC <replid> <offset>\r\n")
		line = r.readLine(t)
	}
	var payload []byte
	switch {
	case bulkHeader.MatchString(line):
		n := atoi(t, bulkHeader.FindStringSubmatch(line)[1])
		payload = make([]byte, n)
		if _, err := io.ReadFull(r.r, payload); err != nil {
			t.Fatalf("read the %d bytes of the payload: %v", n, err)
		}
		shape.WriteString("$<n>\r\n<n bytes of RDB>")
	case eofHeader.MatchString(line):
		mark := []byte(eofHeader.FindStringSubmatch(line)[1])
		for !bytes.HasSuffix(payload, mark) {
			b, err := r.r.ReadByte()
			if err != nil {
				t.Fatalf("read the payload up to its EOF mark: %v after %d bytes", err, len(payload))
			}
			payload = append(payload, b)
		}
		payload = payload[:len(payload)-len(mark)]
		shape.WriteString("$EOF:<mark>\r\n<RDB><mark>")
	default:
		t.Fatalf("SYNC answered %q", line)
	}
	// An RDB file: the magic and version, and at its end the EOF opcode
	// and an 8-byte checksum.
	if !bytes.HasPrefix(payload, []byte("REDIS00")) || len(payload) < 18 || payload[len(payload)-9] != 0xff {
		t.Fatalf("the payload is not an RDB file: %s", hex.EncodeToString(payload[:min(len(payload), 64)]))
	}
	return shape.String()
}

// commands reads the stream's commands up to and including the one that
// contains last, and returns their bytes. The master's keepalive PINGs
// that come first are left out: when they come depends on when the replica
// attached.
func (r replica) commands(t *testing.T, last string) []byte {
	t.Helper()
	var out bytes.Buffer
	for {
		b, err := r.tryRead(1, 10*time.Second)
		if err != nil {
			t.Fatalf("read the replication stream: %v (got %q after %q)", err, b, out.Bytes())
		}
		if out.Len() == 0 && string(b) == "*1\r\n$4\r\nPING\r\n" {
			continue
		}
		out.Write(b)
		if bytes.Contains(b, []byte(last)) {
			return out.Bytes()
		}
	}
}

// TestDifferentialReplication asks for the replication stream directly and
// through the proxy, as replicas and the tools built on the replication
// protocol do, and requires the same bytes: the same answer around the RDB
// payload, a valid payload, and byte-identical propagated commands.
func TestDifferentialReplication(t *testing.T) {
	srv := redistest.Start(t, "--repl-ping-replica-period", "3600")
	addr, _ := startProxy(t, srv.Addr, nil)
	seed := dial(t, srv.Addr)
	seed.do(args("SET seeded 1"), args("RPUSH list a b c"), args("SELECT 3"), args("SET other db"))

	tests := []struct {
		name     string
		diskless bool
		// before are sent, and their replies read, before sync.
		before []string
		sync   string
		want   string
	}{
		{name: "SYNC inline, as the Redis test suite sends it", sync: "SYNC\r\n",
			want: "$<n>\r\n<n bytes of RDB>"},
		{name: "SYNC", sync: "*1\r\n$4\r\nSYNC\r\n",
			want: "$<n>\r\n<n bytes of RDB>"},
		{name: "PSYNC ? -1", sync: string(encode(args("PSYNC ? -1"))),
			want: "+FULLRESYNC <replid> <offset>\r\n$<n>\r\n<n bytes of RDB>"},
		{name: "REPLCONF then PSYNC, as a replica does",
			before: []string{"REPLCONF listening-port 7777", "REPLCONF capa eof capa psync2"},
			sync:   string(encode(args("PSYNC ? -1"))),
			want:   "+FULLRESYNC <replid> <offset>\r\n$<n>\r\n<n bytes of RDB>"},
		{name: "diskless SYNC, as redis-cli --replica asks", diskless: true,
			before: []string{"REPLCONF capa eof", "REPLCONF rdb-filter-only"},
			sync:   "SYNC\r\n",
			want:   "$EOF:<mark>\r\n<RDB><mark>"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			diskless := "no"
			if tt.diskless {
				diskless = "yes"
			}
			for _, kv := range [][2]string{{"repl-diskless-sync", diskless}, {"repl-diskless-sync-delay", "0"}} {
				if r, err := srv.Do("CONFIG", "SET", kv[0], kv[1]); err != nil || r != "+OK" {
					t.Fatalf("CONFIG SET %s: %q %v", kv[0], r, err)
				}
			}
			start := func(at string) (replica, string, []byte) {
				r := replica{dial(t, at)}
				var before []byte
				for _, c := range tt.before {
					// An empty last argument, as redis-cli sends it.
					a := args(c)
					if strings.HasPrefix(c, "REPLCONF rdb-filter-only") {
						a = append(a, "")
					}
					before = append(before, r.do(a)...)
				}
				r.send([]byte(tt.sync))
				shape := r.attach(t)
				if tt.diskless {
					// After a payload with an EOF mark, Redis starts the
					// stream at the replica's first acknowledgement once
					// it has seen the transfer end.
					eventually(t, "the replica to be online", func() bool {
						info := replicationInfo(t, srv)
						return !strings.Contains(info, "state=wait_bgsave") && !strings.Contains(info, "state=send_bulk")
					})
					r.send(encode(args("REPLCONF ACK 0")))
				}
				return r, shape, before
			}
			direct, wantShape, wantBefore := start(srv.Addr)
			proxied, gotShape, gotBefore := start(addr)
			if string(gotBefore) != string(wantBefore) {
				t.Errorf("replies before the sync: through proxy %q, direct %q", gotBefore, wantBefore)
			}
			if gotShape != wantShape || wantShape != tt.want {
				t.Errorf("answer to %q: through proxy %q, direct %q, want %q", tt.sync, gotShape, wantShape, tt.want)
			}

			// Writes, from a client of the proxy, reach both replicas
			// alike; so does an acknowledgement sent up the stream.
			w := dial(t, addr)
			last := fmt.Sprintf("last-%d", i)
			w.do(args("SET a 1"), args("INCR n"), args("SELECT 3"), args("DEL other"),
				args("RPUSH list "+strings.Repeat("x", 100)), args("SET "+last+" done"))
			want := direct.commands(t, last)
			got := proxied.commands(t, last)
			if !bytes.Equal(got, want) {
				t.Errorf("propagated commands differ\nthrough proxy: %q\ndirect:        %q", got, want)
			}
			ack := string(encode(args("REPLCONF ACK 424242")))
			proxied.send([]byte(ack))
			eventually(t, "the proxied replica's REPLCONF ACK to reach Redis", func() bool {
				return strings.Contains(replicationInfo(t, srv), ",offset=424242,")
			})
			direct.send([]byte(ack))
			w.do(args("SET after ack"))
			want = direct.commands(t, "after")
			got = proxied.commands(t, "after")
			if !bytes.Equal(got, want) {
				t.Errorf("commands after REPLCONF ACK differ\nthrough proxy: %q\ndirect:        %q", got, want)
			}

			// Redis ending the stream ends the client's connection.
			srv.Do("CLIENT", "KILL", "TYPE", "replica")
			for name, r := range map[string]replica{"direct": direct, "through proxy": proxied} {
				if rest, closed := r.closedAfter(10 * time.Second); !closed {
					t.Errorf("%s: the replica's connection is still open after CLIENT KILL TYPE replica (read %q)", name, rest)
				}
			}
		})
	}
}

// replicationInfo returns the master's INFO replication.
func replicationInfo(t *testing.T, srv *redistest.Server) string {
	t.Helper()
	c := dial(t, srv.Addr)
	defer c.c.Close()
	return string(c.do(args("INFO replication")))
}

// TestReplicationStreamEndsWithClient checks that a replica hanging up
// ends the proxy's replication connection to the backend.
func TestReplicationStreamEndsWithClient(t *testing.T) {
	srv := redistest.Start(t, "--repl-diskless-sync", "no")
	addr, _ := startProxy(t, srv.Addr, nil)
	r := replica{dial(t, addr)}
	r.send([]byte("SYNC\r\n"))
	r.attach(t)
	if !strings.Contains(replicationInfo(t, srv), "connected_slaves:1\r\n") {
		t.Fatalf("no replica: %s", replicationInfo(t, srv))
	}
	r.c.Close()
	eventually(t, "the backend to lose its replica", func() bool {
		return strings.Contains(replicationInfo(t, srv), "connected_slaves:0\r\n")
	})
}

// TestRefusedSyncKeepsCommands checks that a SYNC Redis refuses leaves
// the connection a request/reply one: the commands after it are the
// proxy's to answer again.
func TestRefusedSyncKeepsCommands(t *testing.T) {
	srv := redistest.Start(t)
	addr, _ := startProxy(t, srv.Addr, nil)
	steps := []step{
		send("a", "MULTI"),
		{on: "a", raw: "SYNC\r\n", read: 1},
		send("a", "EXEC", "PSYNC", "SET k v", "GET k"),
	}
	mustFlush(t, srv)
	want := run(t, srv, srv.Addr, steps)
	mustFlush(t, srv)
	got := run(t, srv, addr, steps)
	if !bytes.Equal(got, want) {
		t.Errorf("replies differ\nthrough proxy: %q\ndirect:        %q", got, want)
	}
}

// TestRedisCLIReplication runs redis-cli's two tools built on the
// replication protocol, --rdb (a backup) and --replica (a live view of the
// writes), directly and through the proxy.
func TestRedisCLIReplication(t *testing.T) {
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Fatalf("redis-cli is missing (Debian package redis-tools): %v", err)
	}
	srv := redistest.Start(t, "--repl-diskless-sync", "no", "--repl-ping-replica-period", "3600")
	addr, _ := startProxy(t, srv.Addr, nil)
	seed := dial(t, srv.Addr)
	seed.do(args("SET seeded 1"), args("HSET h f v"))
	hostPort := func(a string) []string {
		host, port, _ := net.SplitHostPort(a)
		return []string{"-h", host, "-p", port}
	}

	t.Run("--rdb", func(t *testing.T) {
		for _, at := range []string{srv.Addr, addr} {
			file := filepath.Join(t.TempDir(), "dump.rdb")
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			out, err := exec.CommandContext(ctx, cli, append(hostPort(at), "--rdb", file)...).CombinedOutput()
			cancel()
			if err != nil {
				t.Fatalf("redis-cli --rdb via %s: %v: %s", at, err, out)
			}
			b, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.HasPrefix(b, []byte("REDIS00")) || len(b) < 18 || b[len(b)-9] != 0xff {
				t.Fatalf("redis-cli --rdb via %s wrote no RDB file: %q", at, trunc(b))
			}
			ctx, cancel = context.WithTimeout(context.Background(), 20*time.Second)
			out, err = exec.CommandContext(ctx, "redis-check-rdb", file).CombinedOutput()
			cancel()
			if err != nil || !strings.Contains(string(out), "RDB looks OK") {
				t.Fatalf("redis-check-rdb on the file from %s: %v: %s", at, err, out)
			}
		}
	})

	t.Run("--replica", func(t *testing.T) {
		start := func(at string) *bufio.Reader {
			ctx, cancel := context.WithCancel(context.Background())
			cmd := exec.CommandContext(ctx, cli, append(hostPort(at), "--replica")...)
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			stderr, err := cmd.StderrPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				cancel()
				cmd.Wait()
			})
			// redis-cli says on stderr when the payload is behind it.
			lines := bufio.NewScanner(stderr)
			ready := make(chan string, 1)
			go func() {
				var seen strings.Builder
				for lines.Scan() {
					seen.WriteString(lines.Text() + "\n")
					if strings.Contains(lines.Text(), "Logging commands from master") {
						ready <- ""
						io.Copy(io.Discard, stderr)
						return
					}
				}
				ready <- seen.String()
			}()
			select {
			case msg := <-ready:
				if msg != "" {
					t.Fatalf("redis-cli --replica via %s: %s", at, msg)
				}
			case <-time.After(20 * time.Second):
				t.Fatalf("redis-cli --replica via %s did not start logging commands", at)
			}
			return bufio.NewReader(stdout)
		}
		direct, proxied := start(srv.Addr), start(addr)
		w := dial(t, addr)
		w.do(args("SET a 1"), args("SELECT 2"), args("HSET h2 f v"), args("SET last 1"))
		readUntil := func(r *bufio.Reader) string {
			got := make(chan string, 1)
			go func() {
				var b strings.Builder
				for {
					line, err := r.ReadString('\n')
					b.WriteString(line)
					if err != nil || strings.Contains(line, `"last"`) {
						got <- b.String()
						return
					}
				}
			}()
			select {
			case s := <-got:
				return s
			case <-time.After(20 * time.Second):
				t.Fatal("redis-cli --replica printed no commands")
				return ""
			}
		}
		want, got := readUntil(direct), readUntil(proxied)
		if got != want || !strings.Contains(want, `"SET","last","1"`) {
			t.Errorf("redis-cli --replica printed\nthrough proxy: %q\ndirect:        %q", got, want)
		}
	})
}
