package quorum

import (
	"strings"
	"testing"
	"time"
)

// TestExtendHealsHolder: Extend heals a lock onto a node that lacks it with
// its holder (for LOCKINFO) and, for a reentrant lock, its hold count, as
// the nodes that hold it store them.
func TestExtendHealsHolder(t *testing.T) {
	c := startCluster(t, 3)
	l := newLocker(t, c, testConfig())
	ctx := ctxT(t)
	warm(t, c, l)
	holder := NewHolder("app@127.0.0.1:5000 via p1")
	c.servers[2].CutOff()
	plain := mustLock(t, l, "P", 10*time.Second, Options{Holder: holder}) // on nodes 0 and 1
	re := mustLock(t, l, "R", 10*time.Second, Options{Holder: holder, Reentrant: true})
	if _, err := l.Lock(ctx, "R", 10*time.Second, Options{Holder: holder, Reentrant: true, Token: re.Token}); err != nil {
		t.Fatal(err) // two holds
	}
	c.servers[2].Reconnect()
	header := func(resource string) string {
		v, _ := c.admin[2].Get(ctx, "lockproxy:lock:"+resource).Result()
		h, _, _ := strings.Cut(v, ":")
		return h
	}
	eventually(t, "node 2 healed", func() bool {
		_, err1 := l.Extend(ctx, "P", plain.Token, 10*time.Second)
		_, err2 := l.Extend(ctx, "R", re.Token, 10*time.Second)
		return err1 == nil && err2 == nil && c.holder(t, 2, "P") == plain.Token && c.holder(t, 2, "R") == re.Token
	})
	if holds, _, h := parseExt(header("P")); h != "app@127.0.0.1:5000 via p1" || holds != 1 {
		t.Errorf("healed plain lock %q: holder %q, holds %d, want the holder and one hold", header("P"), h, holds)
	}
	if holds, _, h := parseExt(header("R")); h != "app@127.0.0.1:5000 via p1" || holds != 2 {
		t.Errorf("healed reentrant lock %q: holder %q, holds %d, want the holder and two holds", header("R"), h, holds)
	}
}
