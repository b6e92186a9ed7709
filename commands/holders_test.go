package commands

import (
	"strings"
	"testing"
)

// TestReleasedElsewhere: a holding released by its token through another
// connection no longer counts on the connection that took it. A takes two
// readers and a kept write lock; B releases A's first reader and the
// write lock by token; A's token-less UNLOCK then releases its one
// remaining reader instead of naming two, and A holds the write lock no
// more (no record, nothing for Close to release, the extender stopped).
func TestReleasedElsewhere(t *testing.T) {
	e := newEnv(t, 3)
	a, b := e.client(t, false), e.client(t, false)

	r1 := a.lock("RLOCK", "r", "10000")
	r2 := a.lock("RLOCK", "r", "10000")
	if got := a.do("EXTEND", "r", "10000"); !strings.Contains(got, "holds 'r' 2 times") {
		t.Fatalf("token-less EXTEND of two readers = %q", got)
	}
	if n := intReply(t, b.do("UNLOCK", "r", r1.token)); n != 1 {
		t.Fatalf("UNLOCK of A's first reader through B = %d, want 1", n)
	}
	if got := a.do("UNLOCK", "r"); got != ":1\r\n" {
		t.Fatalf("A's token-less UNLOCK after B released one reader = %q, want :1", got)
	}
	// The remaining reader was r2: the write lock is free now.
	w := b.lock("LOCK", "r", "10000")
	if w.fence <= r2.fence {
		t.Fatalf("write lock fence %d after reader %d", w.fence, r2.fence)
	}
	b.do("UNLOCK", "r", w.token)

	// A kept lock released elsewhere: A's record and extender end.
	k := a.lock("LOCK", "k", "10000", "KEEPALIVE")
	if n := intReply(t, b.do("UNLOCK", "k", k.token)); n != 1 {
		t.Fatalf("UNLOCK of A's kept lock through B = %d", n)
	}
	a.c.mu.Lock()
	hs := a.c.held["k"]
	if len(hs) != 1 || !hs[0].gone || hs[0].keep || hs[0].kept != 0 {
		t.Fatalf("A's record of k after B released it: %d records, %+v", len(hs), hs)
	}
	ext := hs[0].ext
	a.c.mu.Unlock()
	select {
	case <-ext.done:
	default:
		t.Fatal("the extender of the lock B released still runs")
	}
	// As after an expiry: 0 once, then the record is gone.
	if got := a.do("UNLOCK", "k"); got != ":0\r\n" {
		t.Fatalf("A's token-less UNLOCK of the released lock = %q, want :0", got)
	}
	if got := a.do("UNLOCK", "k"); got != "-"+errNoToken.Error()+"\r\n" {
		t.Fatalf("A's second token-less UNLOCK = %q", got)
	}

	// The index holds nothing once every record ended.
	for i := range e.h.holders.shards {
		s := &e.h.holders.shards[i]
		s.mu.Lock()
		n := len(s.m)
		s.mu.Unlock()
		if n != 0 {
			t.Fatalf("shard %d still indexes %d holdings", i, n)
		}
	}
}

// TestReleasedElsewhereSameToken: one token recorded on two connections
// (a LOCK ... TOKEN again on another connection, as after a reconnect)
// ends on both when either releases it; Close of a connection removes
// its records from the index.
func TestReleasedElsewhereSameToken(t *testing.T) {
	e := newEnv(t, 3)
	a, b := e.client(t, false), e.client(t, false)
	lk := a.lock("LOCK", "s", "10000")
	if again := b.lock("LOCK", "s", "10000", "TOKEN", lk.token); again.fence != lk.fence {
		t.Fatalf("LOCK TOKEN again: fence %d, want %d", again.fence, lk.fence)
	}
	if n := intReply(t, a.do("UNLOCK", "s")); n != 1 {
		t.Fatalf("UNLOCK through A = %d", n)
	}
	b.c.mu.Lock()
	gone := len(b.c.held["s"]) == 1 && b.c.held["s"][0].gone
	b.c.mu.Unlock()
	if !gone {
		t.Fatal("B's record of the token A released does not say so")
	}
	if got := b.do("EXTEND", "s", "1000"); got != ":0\r\n" {
		t.Fatalf("B's token-less EXTEND after A released = %q, want :0", got)
	}
	c := e.client(t, false)
	c.lock("RLOCK", "t", "10000")
	c.c.Close()
	for i := range e.h.holders.shards {
		if n := len(e.h.holders.shards[i].m); n != 0 {
			t.Fatalf("shard %d indexes %d holdings after every release and Close", i, n)
		}
	}
}
