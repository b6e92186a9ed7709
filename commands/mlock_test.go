package commands

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/quorum"
)

// TestParseMLock: every argument rule of MLOCK, answered before any node
// is asked (the Handler has no Locker).
func TestParseMLock(t *testing.T) {
	cfg := testConfig
	cfg.MaxResources = 3
	h := mustNew(t, nil, cfg, nil)
	tests := []struct {
		give []string
		want string // the resources and options, or the error
	}{
		{give: []string{"MLOCK", "1", "a", "1000"}, want: "[a] 1s 0s  false"},
		{give: []string{"mlock", "3", "a", "b", "c", "500", "WAIT", "20", "TOKEN", "t", "KEEPALIVE"}, want: "[a b c] 500ms 20ms t true"},
		{give: []string{"MLOCK", "2", "a", "b", "100", "token", "reentrant"}, want: "[a b] 100ms 0s reentrant false"},
		{give: []string{"MLOCK", "1", "a"}, want: "ERR wrong number of arguments for 'mlock' command"},
		{give: []string{"MLOCK"}, want: "ERR wrong number of arguments for 'mlock' command"},
		{give: []string{"MLOCK", "x", "a", "1000"}, want: "ERR value is not an integer or out of range"},
		{give: []string{"MLOCK", "0", "a", "1000"}, want: "ERR numresources should be greater than 0"},
		{give: []string{"MLOCK", "-1", "a", "1000"}, want: "ERR numresources should be greater than 0"},
		{give: []string{"MLOCK", "4", "a", "b", "c", "d", "1000"}, want: "ERR numresources exceeds the maximum of 3"},
		{give: []string{"MLOCK", "3", "a", "b", "1000"}, want: "ERR fewer resources than numresources, or no ttl-ms after them"},
		{give: []string{"MLOCK", "2", "a", "a", "1000"}, want: "ERR resource 'a' is named twice"},
		{give: []string{"MLOCK", "3", "a", "b", "a", "1000"}, want: "ERR resource 'a' is named twice"},
		{give: []string{"MLOCK", "2", "a", "b", "1000", "REENTRANT"}, want: "ERR MLOCK does not take REENTRANT"},
		{give: []string{"MLOCK", "2", "a", "b", "1000", "KEEPALIVE", "permits", "2"}, want: "ERR MLOCK does not take PERMITS"},
		{give: []string{"MLOCK", "2", "a", "b", "0"}, want: "ERR invalid expire time in 'mlock' command"},
		{give: []string{"MLOCK", "2", "a", "b", "x"}, want: "ERR value is not an integer or out of range"},
		{give: []string{"MLOCK", "2", "a", "b", "1000", "NX"}, want: "ERR syntax error"},
		{give: []string{"MLOCK", "2", "a", "b", "1000", "WAIT"}, want: "ERR syntax error"},
		{give: []string{"MLOCK", "1", "a", "1000", "WAIT", "-1"}, want: "ERR WAIT timeout-ms is negative"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.give, " "), func(t *testing.T) {
			a, err := h.parseMLock(argv(tt.give...))
			got := errText(err)
			if err == nil {
				var rs []string
				for _, r := range a.resources {
					rs = append(rs, string(r))
				}
				got = fmt.Sprintf("%v %v %v %s %v", rs, a.ttl, a.wait, a.token, a.keepalive)
			}
			if got != tt.want {
				t.Errorf("parseMLock = %q, want %q", got, tt.want)
			}
		})
	}
}

// values returns key's value on each node ("" when it has none).
func (e *env) values(tb testing.TB, key string) []string {
	tb.Helper()
	var out []string
	for _, s := range e.nodes {
		c := redis.NewClient(&redis.Options{Addr: s.Addr})
		v, err := c.Get(context.Background(), key).Result()
		c.Close()
		if err != nil && err != redis.Nil {
			tb.Fatalf("GET %s on %s: %v", key, s.Addr, err)
		}
		out = append(out, v)
	}
	return out
}

// TestMLockMayWait: an MLOCK with WAIT may wait (so the proxy does not
// hold other commands of the connection behind it); one without may not.
func TestMLockMayWait(t *testing.T) {
	h := mustNew(t, nil, testConfig, nil)
	for _, tt := range []struct {
		give []string
		want bool
	}{
		{[]string{"MLOCK", "2", "a", "b", "100", "WAIT", "5"}, true},
		{[]string{"mlock", "1", "a", "100", "KEEPALIVE", "wait", "5"}, true},
		{[]string{"MLOCK", "2", "a", "b", "100"}, false},
		{[]string{"MLOCK", "1", "a", "100"}, false},
	} {
		if got := h.MayWait(argv(tt.give...)); got != tt.want {
			t.Errorf("MayWait(%q) = %v, want %v", tt.give, got, tt.want)
		}
	}
}

// warmUp is e.warm, retried: a new deployment is used once every node has
// answered one round in time, which a loaded machine may miss at first.
func warmUp(t *testing.T, e *env) {
	t.Helper()
	c := e.client(t, false)
	if !eventually(10*time.Second, func() bool {
		return strings.HasPrefix(c.do("LOCK", "warm-up", "1000"), "*3")
	}) {
		t.Fatal("no LOCK succeeded on the new deployment in 10s")
	}
	c.do("UNLOCK", "warm-up")
	e.warm(t)
}

// mlockReply is MLOCK's success reply.
type mlockReply struct {
	token    string
	validity int64
	fences   []int64
}

// mlock runs an MLOCK that must succeed and returns its parsed reply:
// [token, validity, [fence, ...]] and nothing after it.
func (cl *client) mlock(args ...string) mlockReply {
	cl.tb.Helper()
	reply := cl.do(args...)
	var m mlockReply
	lines := strings.Split(strings.TrimSuffix(reply, "\r\n"), "\r\n")
	if len(lines) < 5 || lines[0] != "*3" || !strings.HasPrefix(lines[1], "$") || !strings.HasPrefix(lines[3], ":") || !strings.HasPrefix(lines[4], "*") {
		cl.tb.Fatalf("%q = %q: not [token, validity, [fences]]", args, reply)
	}
	m.token = lines[2]
	m.validity, _ = strconv.ParseInt(lines[3][1:], 10, 64)
	n, _ := strconv.Atoi(lines[4][1:])
	if len(lines) != 5+n {
		cl.tb.Fatalf("%q = %q: %d fences announced", args, reply, n)
	}
	for _, l := range lines[5:] {
		f, err := strconv.ParseInt(strings.TrimPrefix(l, ":"), 10, 64)
		if err != nil || !strings.HasPrefix(l, ":") {
			cl.tb.Fatalf("%q = %q: fence %q", args, reply, l)
		}
		m.fences = append(m.fences, f)
	}
	return m
}

// TestMLockReplies: MLOCK's replies in RESP2 and RESP3, the per-resource
// UNLOCK and EXTEND with and without the token, the refresh, -DEADLOCK,
// and nothing sent for bad arguments.
func TestMLockReplies(t *testing.T) {
	t.Parallel()
	forEachProtocol(t, func(t *testing.T, resp3 bool) {
		e := newEnv(t, 3)
		warmUp(t, e) // a new deployment: its markers first
		a, b := e.client(t, resp3), e.client(t, resp3)
		m := a.mlock("MLOCK", "3", "x", "y", "z", "10000")
		if len(m.fences) != 3 || m.validity <= 0 || m.validity > 10000 || len(m.token) < 32 {
			t.Fatalf("MLOCK = %+v", m)
		}
		for i, r := range []string{"x", "y", "z"} {
			want := "0" + strconv.FormatInt(m.fences[i], 10) + "/"
			for _, v := range e.values(t, keyPrefix+r) {
				if !strings.HasPrefix(v, want) || !strings.HasSuffix(v, ":"+m.token) {
					t.Errorf("%s on a node = %q, want a plain LOCK's value with fence %d", r, v, m.fences[i])
				}
			}
		}
		// Held: another set that overlaps gets null; so does LOCK.
		if reply := b.do("MLOCK", "2", "w", "z", "1000"); reply != nullReply(resp3) {
			t.Errorf("overlapping MLOCK = %q, want null", reply)
		}
		if reply := b.do("LOCK", "y", "1000"); reply != nullReply(resp3) {
			t.Errorf("LOCK of a resource of the set = %q, want null", reply)
		}
		for _, v := range e.onNodes(t, "EXISTS", keyPrefix+"w") {
			if v != ":0" {
				t.Errorf("the failed MLOCK left w on a node")
			}
		}
		// The idempotent refresh, the same set in another order.
		r := b.mlock("MLOCK", "3", "z", "x", "y", "20000", "TOKEN", m.token)
		if r.fences[0] != m.fences[2] || r.fences[1] != m.fences[0] || r.fences[2] != m.fences[1] {
			t.Errorf("refresh fences %v, want %v reordered", r.fences, m.fences)
		}
		// A set the token holds in part.
		if reply := b.do("MLOCK", "2", "x", "new", "1000", "TOKEN", m.token, "WAIT", "1000"); !strings.HasPrefix(reply, "-DEADLOCK ") {
			t.Errorf("MLOCK of a set held in part = %q, want -DEADLOCK", reply)
		}
		// Per resource, without the token on the owning connection.
		if v := intReply(t, a.do("EXTEND", "y", "30000")); v <= 20000 {
			t.Errorf("EXTEND y = %d", v)
		}
		if reply := a.do("UNLOCK", "x"); reply != ":1\r\n" {
			t.Errorf("UNLOCK x = %q", reply)
		}
		b.lock("LOCK", "x", "1000")
		if reply := b.do("UNLOCK", "y", m.token); reply != ":1\r\n" {
			t.Errorf("UNLOCK y with the token = %q", reply)
		}
		if reply := a.do("UNLOCK", "z"); reply != ":1\r\n" {
			t.Errorf("UNLOCK z = %q", reply)
		}
		// Bad arguments are answered before anything is sent.
		before := e.onNodes(t, "GET", "lockproxy:fence")
		for _, bad := range [][]string{
			{"MLOCK", "2", "p", "p", "1000"},
			{"MLOCK", "3", "p", "q", "1000"},
			{"MLOCK", "0", "1000"},
			{"MLOCK", "2", "p", "q", "1000", "REENTRANT"},
			{"MLOCK", "2", "p", "q", "1000", "PERMITS", "3"},
		} {
			if reply := b.do(bad...); !strings.HasPrefix(reply, "-ERR ") {
				t.Errorf("%q = %q, want -ERR", bad, reply)
			}
		}
		if after := e.onNodes(t, "GET", "lockproxy:fence"); strings.Join(after, "") != strings.Join(before, "") {
			t.Errorf("bad MLOCKs reached the nodes: counters %q, then %q", before, after)
		}
		if got := e.h.outcomes[mlockBadRequest].Load(); got != 5 {
			t.Errorf("mlock bad_request = %d, want 5", got)
		}
	})
}

// TestMLockKeepAlive: KEEPALIVE keeps every resource of the set past its
// ttl and Close releases all of them.
func TestMLockKeepAlive(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 3)
	warmUp(t, e)
	a, b := e.client(t, false), e.client(t, false)
	a.mlock("MLOCK", "3", "k1", "k2", "k3", "600", "KEEPALIVE")
	e.waitExtensions(t, 6) // two extensions of each, at least: past the ttl
	time.Sleep(700 * time.Millisecond)
	for _, r := range []string{"k1", "k2", "k3"} {
		if reply := b.do("LOCK", r, "1000"); reply != "*-1\r\n" {
			t.Errorf("LOCK %s while kept = %q, want null", r, reply)
		}
	}
	a.c.Close()
	b.mlock("MLOCK", "3", "k3", "k1", "k2", "1000")
}

// TestMLockWait: a waiting MLOCK gets its set once the last of its
// resources is released, and holds none of them while it waits.
func TestMLockWait(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 3)
	warmUp(t, e)
	a, b, c := e.client(t, false), e.client(t, false), e.client(t, false)
	la := a.lock("LOCK", "w1", "10000")
	lc := c.lock("LOCK", "w3", "10000")
	done := make(chan mlockReply, 1)
	go func() { done <- b.mlock("MLOCK", "3", "w1", "w2", "w3", "5000", "WAIT", "10000") }()
	time.Sleep(100 * time.Millisecond)
	// w2 is not held while the MLOCK waits.
	if v := e.onNodes(t, "EXISTS", keyPrefix+"w2"); strings.Join(v, "") != ":0:0:0" {
		t.Errorf("w2 held while the MLOCK waits: %q", v)
	}
	a.do("UNLOCK", "w1", la.token)
	select {
	case m := <-done:
		t.Fatalf("MLOCK got the set while w3 was held: %+v", m)
	case <-time.After(100 * time.Millisecond):
	}
	c.do("UNLOCK", "w3", lc.token)
	select {
	case m := <-done:
		if len(m.fences) != 3 {
			t.Errorf("MLOCK = %+v", m)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiting MLOCK did not get its set after the releases")
	}
}

// TestProtocolDocumentMLock: every error text of MLOCK is in the protocol
// document.
func TestProtocolDocumentMLock(t *testing.T) {
	raw, err := os.ReadFile("../docs/PROTOCOL.md")
	if err != nil {
		t.Fatal(err)
	}
	h := mustNew(t, nil, DefaultConfig(), nil)
	texts := []string{"DEADLOCK " + "the token holds some but not all of the resources", "ERR resource '<resource>' is named twice"}
	for _, err := range []error{errArityMLock, errExpireMLock, errNumResources, errFewResources, errMLockReentant, errMLockPermits, h.errResourcesMax} {
		texts = append(texts, strings.Replace(err.Error(), "maximum of 64", "maximum of <max_resources>", 1))
	}
	for _, text := range texts {
		if !strings.Contains(string(raw), "`-"+text+"`") {
			t.Errorf("docs/PROTOCOL.md lacks `-%s`", text)
		}
	}
	reply := string(appendEngineErr(nil, &quorum.DeadlockError{Why: "the token holds some but not all of the resources"}))
	if !strings.HasPrefix(reply, "-"+texts[0]) {
		t.Errorf("DEADLOCK reply %q", reply)
	}
}
