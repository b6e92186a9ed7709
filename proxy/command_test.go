package proxy

import (
	"strconv"
	"strings"
	"testing"

	"github.com/tidwall/redcon"

	"github.com/lockproxy/lockproxy/internal/redistest"
)

var testDocs = &Docs{
	Names: []string{"lock"},
	AppendInfo: func(dst []byte, name string, resp3 bool) []byte {
		return redcon.AppendBulkString(redcon.AppendArray(dst, 1), "info:"+name)
	},
	AppendDocs: func(dst []byte, name string, resp3 bool) []byte {
		return redcon.AppendBulkString(dst, "docs:"+name)
	},
}

func TestCommandListsOwnCommands(t *testing.T) {
	srv := redistest.Start(t)
	addr, _ := startProxy(t, srv.Addr, func(c *Config) { c.Docs = testDocs })
	checkOwnCommands(t, dial(t, srv.Addr), dial(t, addr))
}

// checkOwnCommands requires the proxy's answers to COMMAND on c to be
// direct's (one Redis) with the proxy's commands (testDocs) added.
func checkOwnCommands(t *testing.T, direct, c *client) {
	t.Helper()
	n := string(direct.do(args("COMMAND COUNT")))
	count, _ := strconv.Atoi(strings.TrimSpace(n[1:]))
	if got := string(c.do(args("COMMAND COUNT"))); got != ":"+strconv.Itoa(count+1)+"\r\n" {
		t.Fatalf("COMMAND COUNT: %q, backend %q", got, n)
	}
	list := string(direct.do(args("COMMAND LIST")))
	i := strings.Index(list, "\r\n")
	listed, _ := strconv.Atoi(list[1:i])
	if got, want := string(c.do(args("COMMAND LIST"))), "*"+strconv.Itoa(listed+1)+list[i:]+"$4\r\nlock\r\n"; got != want {
		t.Fatalf("COMMAND LIST: %q", trunc([]byte(got)))
	}
	get := string(direct.do(args("COMMAND INFO get")))[len("*1\r\n"):]
	want := "*3\r\n" + get + "*1\r\n$9\r\ninfo:lock\r\n" + get
	if got := string(c.do(args("COMMAND INFO get LOCK get"))); got != want {
		t.Fatalf("COMMAND INFO:\n got %q\nwant %q", got, want)
	}
	if got := string(c.do(args("COMMAND INFO lock"))); got != "*1\r\n*1\r\n$9\r\ninfo:lock\r\n" {
		t.Fatalf("COMMAND INFO lock: %q", got)
	}
	if got := string(c.do(args("COMMAND"))); !strings.HasSuffix(got, "*1\r\n$9\r\ninfo:lock\r\n") {
		t.Fatalf("COMMAND: %q", trunc([]byte(got)))
	}
	ttlDocs := string(direct.do(args("COMMAND DOCS ttl")))[len("*2\r\n"):]
	if got := string(c.do(args("COMMAND DOCS ttl lock"))); got != "*4\r\n"+ttlDocs+"$4\r\nlock\r\n$9\r\ndocs:lock\r\n" {
		t.Fatalf("COMMAND DOCS: %q", got)
	}
	c.do(args("HELLO 3"))
	if got := string(c.do(args("COMMAND DOCS lock"))); got != "%1\r\n$4\r\nlock\r\n$9\r\ndocs:lock\r\n" {
		t.Fatalf("COMMAND DOCS in RESP3: %q", got)
	}
	// Everything else about COMMAND is the backend's.
	if got, want := string(c.do(args("COMMAND GETKEYS SET k v"))), string(direct.do(args("COMMAND GETKEYS SET k v"))); got != want {
		t.Fatalf("COMMAND GETKEYS: %q, want %q", got, want)
	}
}

func TestCommandInTransactionIsQueued(t *testing.T) {
	srv := redistest.Start(t)
	addr, _ := startProxy(t, srv.Addr, func(c *Config) {
		c.Docs = testDocs
		c.Info = func() string { return "answer:42\r\n" }
	})
	direct, c := dial(t, srv.Addr), dial(t, addr)
	// Inside MULTI, Redis queues COMMAND and INFO and answers them in
	// EXEC's array; so does the proxy, with the backend's answers.
	tx := [][]string{args("MULTI"), args("COMMAND COUNT"), args("INFO lockproxy"), args("EXEC")}
	if got, want := string(c.do(tx...)), string(direct.do(tx...)); got != want {
		t.Fatalf("in MULTI:\n got %q\nwant %q", got, want)
	}
	// After EXEC, DISCARD and RESET they are the proxy's again.
	for _, end := range []string{"EXEC", "DISCARD", "RESET"} {
		got := string(c.do(args("MULTI"), args(end), args("INFO lockproxy")))
		if !strings.HasSuffix(got, "answer:42\r\n\r\n") {
			t.Fatalf("after MULTI, %s: %q", end, got)
		}
	}
}

func TestInfoSection(t *testing.T) {
	srv := redistest.Start(t)
	addr, _ := startProxy(t, srv.Addr, func(c *Config) { c.Info = func() string { return "answer:42\r\n" } })
	c := dial(t, addr)
	body := "# Lockproxy\r\nanswer:42\r\n"
	if got := string(c.do(args("INFO LockProxy"))); got != "$"+strconv.Itoa(len(body))+"\r\n"+body+"\r\n" {
		t.Fatalf("INFO lockproxy: %q", got)
	}
	if got := string(c.do(args("INFO server"))); !strings.Contains(got, "redis_version:") {
		t.Fatalf("INFO server is not the backend's: %q", trunc([]byte(got)))
	}
	c.do(args("HELLO 3"))
	if got := string(c.do(args("INFO lockproxy"))); got != "="+strconv.Itoa(len(body)+4)+"\r\ntxt:"+body+"\r\n" {
		t.Fatalf("INFO lockproxy in RESP3: %q", got)
	}
}
