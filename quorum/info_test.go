package quorum

import (
	"errors"
	"testing"
	"time"
)

// TestInfo: Info reports a free resource, a plain and a reentrant holding
// with their fence, holds, holder and validity, ownership by token, and
// NoQuorumError when too few nodes answer.
func TestInfo(t *testing.T) {
	c := startCluster(t, 3)
	l := newLocker(t, c, testConfig())
	other := newLocker(t, c, testConfig())
	warm(t, c, l)

	in, err := l.Info(ctxT(t), "R", "")
	if err != nil || in.Mode != "none" || in.Holders != 0 || in.Permits != 0 || in.Holds != 0 || in.Fence != -1 || in.Validity != -1 || in.Nodes != 3 {
		t.Fatalf("Info of a free resource = %+v, %v", in, err)
	}

	lk := mustLock(t, l, "R", 10*time.Second, Options{Holder: NewHolder("worker:1@127.0.0.1:5000 via p1")})
	// A new Locker answers NOQUORUM until it has placed the nodes' clocks.
	eventually(t, "Info through the other Locker", func() bool {
		in, err = other.Info(ctxT(t), "R", lk.Token)
		return err == nil
	})
	want := Info{Mode: "exclusive", Holders: 1, Permits: 1, Holds: 1, Fence: lk.Fence, Owned: true, Holder: "worker:1@127.0.0.1:5000 via p1", Nodes: 3}
	got := in
	got.Validity = 0
	if got != want || in.Validity <= 0 || in.Validity > 10*time.Second {
		t.Fatalf("Info of a plain lock = %+v, want %+v with a validity in (0, 10s]", in, want)
	}
	if in, _ = other.Info(ctxT(t), "R", "someone else"); in.Owned {
		t.Fatalf("Info with another token says owned")
	}

	mustLock(t, other, "R", 10*time.Second, Options{Token: lk.Token, Reentrant: true})
	if in, _ = l.Info(ctxT(t), "R", ""); in.Holds != 2 || in.Holder != want.Holder || in.Fence != lk.Fence {
		t.Fatalf("Info after re-entry = %+v, want 2 holds and the first holder", in)
	}

	c.kill(1)
	c.kill(2)
	var nq *NoQuorumError
	if _, err := l.Info(ctxT(t), "R", ""); !errors.As(err, &nq) {
		t.Fatalf("Info with 1 of 3 nodes: %v, want NoQuorumError", err)
	}
}
