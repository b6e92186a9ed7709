package quorum

import (
	"errors"
	"slices"
	"testing"
	"time"
)

// iterate runs a full iteration of list and returns the resources in the
// order returned, repeats included.
func iterate(t *testing.T, list func(uint64) (uint64, []Listed, error)) []string {
	t.Helper()
	var out []string
	cursor := uint64(0)
	for calls := 0; ; calls++ {
		next, found, err := list(cursor)
		if err != nil {
			t.Fatalf("Locks(%d): %v", cursor, err)
		}
		for _, f := range found {
			if f.Info.Mode == "none" || f.Info.Owned {
				t.Fatalf("Locks listed %+v", f)
			}
			out = append(out, f.Resource)
		}
		if next == 0 {
			return out
		}
		if calls > 10000 {
			t.Fatal("Locks does not end")
		}
		cursor = next
	}
}

func distinct(list []string) []string {
	out := slices.Clone(list)
	slices.Sort(out)
	return slices.Compact(out)
}

// TestLocksIteration: Locks lists every resource held on a majority,
// also one that the first node missed and while the first node lost its
// data; never a released one or one held on a minority only; LocksOnce
// lists each once; cursors no iteration returns are refused.
func TestLocksIteration(t *testing.T) {
	c := startCluster(t, 3)
	l := newLocker(t, c, testConfig())
	warm(t, c, l)
	ctx := ctxT(t)
	for _, r := range []string{"a", "b", "c", "gone"} {
		mustLock(t, l, r, time.Minute, Options{})
	}
	lk := mustLock(t, l, "released", time.Minute, Options{})
	mustUnlock(t, l, "released", lk.Token)
	// b missed by node 0 (it was down then), minority held on node 0 only.
	if err := c.admin[0].Del(ctx, "lockproxy:lock:b").Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.admin[0].Set(ctx, "lockproxy:lock:minority", "01/x:tok", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{1, 2} {
		if err := c.admin[i].Del(ctx, "lockproxy:lock:gone").Err(); err != nil {
			t.Fatal(err)
		}
	}
	want := []string{"a", "b", "c"}
	all := iterate(t, func(cur uint64) (uint64, []Listed, error) { return l.Locks(ctx, cur, "", 1) })
	if got := distinct(all); !slices.Equal(got, want) {
		t.Fatalf("Locks: %v, want %v", all, want)
	}
	once := iterate(t, func(cur uint64) (uint64, []Listed, error) { return l.LocksOnce(ctx, cur, "*", 1) })
	slices.Sort(once)
	if !slices.Equal(once, want) {
		t.Fatalf("LocksOnce: %v, want each of %v once", once, want)
	}
	if all := iterate(t, func(cur uint64) (uint64, []Listed, error) { return l.Locks(ctx, cur, "[bc]", 100) }); !slices.Equal(distinct(all), []string{"b", "c"}) {
		t.Fatalf("Locks MATCH [bc]: %v", all)
	}

	// Cursors that no iteration over 3 nodes returns: a node index past
	// the last, more nodes done than the node's index, or done all 2.
	for _, cur := range []uint64{3, 1 << 8, 2<<8 | 2, 255} {
		if _, _, err := l.Locks(ctx, cur, "", 10); !errors.Is(err, ErrInvalidCursor) {
			t.Errorf("Locks(%d): %v, want ErrInvalidCursor", cur, err)
		}
	}

	// Node 0 lost its data: skipped while it does not count.
	c.servers[0].RestartEmpty()
	eventually(t, "node 0 recovering", func() bool {
		_, err := l.Lock(ctx, "probe", time.Second, Options{})
		return err == nil && l.Status()[0].State != NodeUp
	})
	all = iterate(t, func(cur uint64) (uint64, []Listed, error) { return l.Locks(ctx, cur, "[abc]", 10) })
	if got := distinct(all); !slices.Equal(got, want) {
		t.Fatalf("Locks while node 0 recovers: %v, want %v", all, want)
	}
	waitRecovered(t, l, 0)

	for _, v := range l.NodeViews() {
		if v.State != NodeUp || v.ClockSuspect || v.RTT <= 0 || v.RTT > time.Second {
			t.Errorf("NodeViews: %+v", v)
		}
	}
}
