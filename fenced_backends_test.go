package main

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/internal/redistest"
)

// TestFencedPausedHolder: A locks r and stops (a held goroutine) past its
// validity; B locks r through another proxy, gets a larger fence and
// writes with FENCED; A wakes up and writes with its older fence: the
// backend refuses it, and B's data is intact.
func TestFencedPausedHolder(t *testing.T) {
	_, nodes := startNodes(t, 3)
	backend := redistest.Start(t)
	p1 := startApp(t, realConfig, "-backend", backend.Addr, "-lock-nodes", nodes)
	p2 := startApp(t, realConfig, "-backend", backend.Addr, "-lock-nodes", nodes)
	ctx := context.Background()
	for _, protocol := range []int{2, 3} {
		a, b := newClient(t, p1, protocol), newClient(t, p2, protocol)
		res := fmt.Sprint("account-", protocol)
		la, err := lock(ctx, a, res, 300)
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Do(ctx, "FENCED", res, la.fence, "SET", res+":balance", "100").Err(); err != nil {
			t.Fatalf("A's first write: %v", err)
		}
		resume := make(chan struct{})
		done := make(chan error, 1)
		go func() {
			// A reads, then pauses past its validity before writing.
			v, err := a.Do(ctx, "FENCED", res, la.fence, "GET", res+":balance").Text()
			if err != nil || v != "100" {
				done <- fmt.Errorf("A's read: %q %v", v, err)
				return
			}
			<-resume
			done <- a.Do(ctx, "FENCED", res, la.fence, "SET", res+":balance", "0").Err()
		}()
		time.Sleep(la.validity + 50*time.Millisecond)
		var lb lockReply
		deadline := time.Now().Add(5 * time.Second)
		for {
			if lb, err = lock(ctx, b, res, 10000); err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("B could not lock: %v", err)
			}
			time.Sleep(20 * time.Millisecond)
		}
		if lb.fence <= la.fence {
			t.Fatalf("B's fence %d is not above A's %d", lb.fence, la.fence)
		}
		if err := b.Do(ctx, "FENCED", res, lb.fence, "INCRBY", res+":balance", "50").Err(); err != nil {
			t.Fatalf("B's write: %v", err)
		}
		close(resume)
		err = <-done
		want := fmt.Sprintf("STALEFENCE fence %d is below %d for '%s'", la.fence, lb.fence, res)
		if err == nil || err.Error() != want {
			t.Fatalf("A's write after its pause: %v, want %s", err, want)
		}
		if v, _ := b.Get(ctx, res+":balance").Result(); v != "150" {
			t.Fatalf("balance %q, want B's 150", v)
		}
		if err := b.Do(ctx, "UNLOCK", res, lb.token).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// clusterMaster returns the master serving slot.
func clusterMaster(t testing.TB, c *redistest.Cluster, slot int) *redistest.Server {
	t.Helper()
	cl := redis.NewClient(&redis.Options{Addr: c.Nodes[0].Addr})
	defer cl.Close()
	shards, err := cl.ClusterShards(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, sh := range shards {
		for _, r := range sh.Slots {
			if int(r.Start) > slot || slot > int(r.End) {
				continue
			}
			for _, n := range sh.Nodes {
				if n.Role != "master" {
					continue
				}
				addr := net.JoinHostPort(n.IP, strconv.FormatInt(n.Port, 10))
				for _, s := range c.Nodes {
					if s.Addr == addr {
						return s
					}
				}
			}
		}
	}
	t.Fatalf("no master serves slot %d", slot)
	return nil
}

// slotOf asks the cluster for key's hash slot.
func slotOf(t testing.TB, c *redistest.Cluster, key string) int {
	t.Helper()
	cl := redis.NewClient(&redis.Options{Addr: c.Nodes[0].Addr})
	defer cl.Close()
	n, err := cl.ClusterKeySlot(context.Background(), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	return int(n)
}

// moveSlot moves slot and its keys from one master to another, as
// redis-cli --cluster reshard does.
func moveSlot(t testing.TB, c *redistest.Cluster, slot int, from, to *redistest.Server) {
	t.Helper()
	finish := startMigration(t, slot, from, to)
	if err := finish(c); err != nil {
		t.Fatal(err)
	}
}

// startMigration marks slot as migrating from one master to another and
// returns the function that moves the keys still on from (MIGRATE) and
// gives the slot to the other master on every master.
func startMigration(t testing.TB, slot int, from, to *redistest.Server) func(c *redistest.Cluster) error {
	t.Helper()
	ctx := context.Background()
	fc := redis.NewClient(&redis.Options{Addr: from.Addr})
	tc := redis.NewClient(&redis.Options{Addr: to.Addr})
	t.Cleanup(func() { fc.Close(); tc.Close() })
	idFrom, _ := fc.Do(ctx, "CLUSTER", "MYID").Text()
	idTo, _ := tc.Do(ctx, "CLUSTER", "MYID").Text()
	if err := tc.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", idFrom).Err(); err != nil {
		t.Fatal(err)
	}
	if err := fc.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", idTo).Err(); err != nil {
		t.Fatal(err)
	}
	return func(c *redistest.Cluster) error {
		host, port, _ := net.SplitHostPort(to.Addr)
		for {
			keys, err := fc.ClusterGetKeysInSlot(ctx, slot, 100).Result()
			if err != nil {
				return err
			}
			if len(keys) == 0 {
				break
			}
			if err := migrateKeys(ctx, fc, host, port, keys...); err != nil {
				return err
			}
		}
		for _, n := range c.Nodes[:c.Masters] {
			nc := redis.NewClient(&redis.Options{Addr: n.Addr})
			err := nc.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", idTo).Err()
			nc.Close()
			if err != nil {
				return err
			}
		}
		return nil
	}
}

// migrateKeys moves keys to host:port with MIGRATE.
func migrateKeys(ctx context.Context, from *redis.Client, host, port string, keys ...string) error {
	args := []any{"MIGRATE", host, port, "", 0, 5000, "KEYS"}
	for _, k := range keys {
		args = append(args, k)
	}
	return from.Do(ctx, args...).Err()
}

// inSlot maps a transparency case's key names into the hash tag {t}.
func inSlot(args []string) []string {
	keys := map[string]bool{"k": true, "k2": true, "h": true, "l": true, "z": true, "z2": true, "d": true, "s": true, "x": true, "g": true, "big": true, "w": true}
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = a
		if keys[a] {
			out[i] = "{t}" + a
		}
	}
	return out
}

// TestFencedCluster: FENCED in front of a Redis Cluster, RESP2 and RESP3:
// the record lives in the hash slot of the command's keys, replies are the
// cluster's own, CROSSSLOT as the cluster answers, and a slot that moves
// takes its record along (MOVED followed).
func TestFencedCluster(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	_, nodes := startNodes(t, 1)
	cfg := fmt.Sprintf("%sbackend: {addr: \"\", cluster: [%s]}\n", realConfig, strings.Join(c.Seeds(), ", "))
	addr := startApp(t, cfg, "-lock-nodes", nodes)

	tslot := slotOf(t, c, "{t}")
	tmaster := clusterMaster(t, c, tslot)
	for _, resp3 := range []bool{false, true} {
		direct := dialRaw(t, tmaster.Addr, resp3)
		px := dialRaw(t, addr, resp3)
		if r := direct.do("FUNCTION", "LOAD", "REPLACE", fencedLib); !strings.HasPrefix(r, "$") {
			t.Fatalf("FUNCTION LOAD: %q", r)
		}
		res := fmt.Sprint("t", resp3)
		for i, tc := range transparencyCases {
			for _, s := range tc.setup {
				direct.do(inSlot(s)...)
			}
			want := direct.do(inSlot(tc.cmd)...)
			for _, s := range tc.setup {
				direct.do(inSlot(s)...)
			}
			got := px.do(append([]string{"FENCED", res, strconv.Itoa(i + 1)}, inSlot(tc.cmd)...)...)
			if got != want {
				t.Errorf("RESP3 %v: FENCED %q\n got %.300q\nwant %.300q", resp3, inSlot(tc.cmd), got, want)
			}
		}
		// The record is in the slot of the keys, in the node's db 0.
		keys := direct.do("KEYS", "lockproxy:fence:*"+res)
		if !strings.Contains(keys, "r:"+res+"\r\n") {
			t.Fatalf("no record of %s on the master of {t}: %q", res, keys)
		}
	}

	a, b := "{a}k", "{b}k"
	// The rules in RESP3 too, on a resource of their own.
	px3 := dialRaw(t, addr, true)
	for _, step := range [][2]string{
		{"FENCED r3 5 SET {a}k3 1", "+OK\r\n"},
		{"FENCED r3 4 SET {a}k3 2", "-STALEFENCE fence 4 is below 5 for 'r3'\r\n"},
		{"FENCED r3 4 GET {a}k3", "-STALEFENCE fence 4 is below 5 for 'r3'\r\n"},
		{"FENCED r3 5 GET {a}k3", "$1\r\n1\r\n"},
		{"FENCED r3 5 GET {a}missing", "_\r\n"},
		{"FENCED r3 1 SET {b}k3 1", "+OK\r\n"},
		{"FENCED r3 2 PERMIT 0 HSET {b}h3 f 1", ":1\r\n"},
		{"FENCED r3 1 PERMIT 0 HSET {b}h3 f 2", "-STALEFENCE fence 1 is below 2 for 'r3' slot 0\r\n"},
		{"FENCED r3 2 PERMIT 0 HGETALL {b}h3", "%1\r\n$1\r\nf\r\n$1\r\n1\r\n"},
		{"FENCED r3 9 MSET {a}x 1 {b}y 2", "-CROSSSLOT Keys in request don't hash to the same slot\r\n"},
		{"FENCED r3 9 PING", "-ERR FENCED needs a command with keys: 'ping' has none here\r\n"},
	} {
		if got := px3.do(strings.Fields(step[0])...); got != step[1] {
			t.Errorf("RESP3 %s: %q, want %q", step[0], got, step[1])
		}
	}

	px := dialRaw(t, addr, false)
	if slotOf(t, c, a) == slotOf(t, c, b) {
		t.Fatal("test keys share a slot")
	}
	expect := func(got, want string) {
		t.Helper()
		if got != want {
			t.Fatalf("got %q, want %q", got, want)
		}
	}
	expect(px.do("FENCED", "r", "5", "SET", a, "1"), "+OK\r\n")
	expect(px.do("FENCED", "r", "4", "SET", a, "2"), "-STALEFENCE fence 4 is below 5 for 'r'\r\n")
	// Each hash slot keeps its own record.
	expect(px.do("FENCED", "r", "4", "SET", b, "1"), "+OK\r\n")
	expect(px.do("FENCED", "r", "3", "PERMIT", "1", "SET", b, "1"), "+OK\r\n")
	expect(px.do("FENCED", "r", "2", "PERMIT", "1", "SET", b, "1"), "-STALEFENCE fence 2 is below 3 for 'r' slot 1\r\n")
	// Keys of several slots: the cluster's own CROSSSLOT.
	expect(px.do("FENCED", "r", "9", "MSET", a, "1", b, "2"), dialRaw(t, c.Nodes[0].Addr, false).do("MSET", a, "1", b, "2"))
	expect(px.do("FENCED", "r", "9", "EVAL", "return 1", "2", a, b), "-CROSSSLOT Keys in request don't hash to the same slot\r\n")
	// Records cannot be changed by forwarded commands.
	recs := dialRaw(t, clusterMaster(t, c, slotOf(t, c, a)).Addr, false).do("KEYS", "lockproxy:fence:*}r:r")
	rec := strings.Split(recs, "\r\n")[2]
	if got := px.do("DEL", rec); !strings.Contains(got, "is a fence record") {
		t.Errorf("DEL %s: %q", rec, got)
	}
	if got := slotOf(t, c, rec); got != slotOf(t, c, a) {
		t.Errorf("record %s in slot %d, want %d", rec, got, slotOf(t, c, a))
	}

	// The slot of a moves to another master, its record with it.
	aslot := slotOf(t, c, a)
	from := clusterMaster(t, c, aslot)
	to := clusterMaster(t, c, slotOf(t, c, b))
	moveSlot(t, c, aslot, from, to)
	expect(px.do("FENCED", "r", "4", "SET", a, "3"), "-STALEFENCE fence 4 is below 5 for 'r'\r\n")
	expect(px.do("FENCED", "r", "6", "SET", a, "4"), "+OK\r\n")
	expect(px.do("GET", a), "$1\r\n4\r\n")

	// While the slot of b migrates, its data key has moved and its record
	// has not: FENCED waits (TRYAGAIN) until the record is beside the
	// key, and an older fence is still refused.
	bslot := slotOf(t, c, b)
	from = clusterMaster(t, c, bslot)
	for _, n := range c.Nodes[:c.Masters] {
		if n != from {
			to = n
		}
	}
	finish := startMigration(t, bslot, from, to)
	fc := redis.NewClient(&redis.Options{Addr: from.Addr})
	defer fc.Close()
	host, port, _ := net.SplitHostPort(to.Addr)
	if err := migrateKeys(context.Background(), fc, host, port, b); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		time.Sleep(300 * time.Millisecond)
		done <- finish(c)
	}()
	expect(px.do("FENCED", "r", "3", "SET", b, "x"), "-STALEFENCE fence 3 is below 4 for 'r'\r\n")
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	expect(px.do("FENCED", "r", "4", "SET", b, "y"), "+OK\r\n")
	expect(px.do("GET", b), "$1\r\ny\r\n")

	// While the slot of c migrates with every key of it moved already,
	// the old master answers ASK: FENCED follows it (ASKING) and checks
	// the record that moved.
	ck := "{c}k"
	expect(px.do("FENCED", "r", "2", "SET", ck, "1"), "+OK\r\n")
	cslot := slotOf(t, c, ck)
	from = clusterMaster(t, c, cslot)
	for _, n := range c.Nodes[:c.Masters] {
		if n != from {
			to = n
		}
	}
	finish = startMigration(t, cslot, from, to)
	fc2 := redis.NewClient(&redis.Options{Addr: from.Addr})
	defer fc2.Close()
	keys, err := fc2.ClusterGetKeysInSlot(context.Background(), cslot, 100).Result()
	if err != nil || len(keys) != 2 {
		t.Fatalf("keys of slot %d: %q %v", cslot, keys, err)
	}
	host, port, _ = net.SplitHostPort(to.Addr)
	if err := migrateKeys(context.Background(), fc2, host, port, keys...); err != nil {
		t.Fatal(err)
	}
	expect(px.do("FENCED", "r", "1", "SET", ck, "x"), "-STALEFENCE fence 1 is below 2 for 'r'\r\n")
	expect(px.do("FENCED", "r", "3", "SET", ck, "y"), "+OK\r\n")
	if err := finish(c); err != nil {
		t.Fatal(err)
	}
	expect(px.do("GET", ck), "$1\r\ny\r\n")
	expect(px.do("FENCED", "r", "2", "GET", ck), "-STALEFENCE fence 2 is below 3 for 'r'\r\n")
}

// TestFencedSentinel: behind a Sentinel-managed primary, the record
// replicates with the writes it guards and survives a failover: after it,
// an older fence is still refused on the new primary.
func TestFencedSentinel(t *testing.T) {
	g := redistest.StartGroup(t, "mymaster", 1, 1)
	_, nodes := startNodes(t, 1)
	cfg := fmt.Sprintf("%sbackend:\n  addr: \"\"\n  sentinel: {master_name: mymaster, addrs: [%s]}\n", realConfig, g.Sentinels[0].Addr)
	addr := startApp(t, cfg, "-lock-nodes", nodes)
	ctx := context.Background()
	for _, protocol := range []int{2, 3} {
		c := newClient(t, addr, protocol)
		res := fmt.Sprint("s", protocol)
		deadline := time.Now().Add(20 * time.Second)
		for c.Do(ctx, "FENCED", res, 10, "SET", res+":k", "a").Err() != nil {
			if time.Now().After(deadline) {
				t.Fatal("no FENCED write through the proxy")
			}
			time.Sleep(50 * time.Millisecond)
		}
		if err := c.Do(ctx, "FENCED", res, 9, "SET", res+":k", "b").Err(); err == nil || !strings.HasPrefix(err.Error(), "STALEFENCE") {
			t.Fatalf("older fence before the failover: %v", err)
		}
		old := g.CurrentPrimary()
		// The replica has the record before the failover.
		var next *redistest.Server
		for _, s := range g.Servers() {
			if s != old {
				next = s
			}
		}
		rc := redis.NewClient(&redis.Options{Addr: next.Addr})
		for {
			v, _ := rc.Get(ctx, "lockproxy:fence:r:"+res).Result()
			if v == "10" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the replica lacks the record: %q", v)
			}
			time.Sleep(20 * time.Millisecond)
		}
		rc.Close()
		failover(t, g)
		g.WaitRole(next, "master", 20*time.Second)
		// Until the proxy follows, FENCED may answer backend unavailable.
		for {
			err := c.Do(ctx, "FENCED", res, 9, "SET", res+":k", "c").Err()
			if err != nil && strings.HasPrefix(err.Error(), "STALEFENCE fence 9 is below 10") {
				if cur := g.CurrentPrimary(); cur == next {
					break
				}
			} else if err == nil {
				t.Fatalf("an older fence was accepted after the failover")
			}
			if time.Now().After(deadline) {
				t.Fatalf("after the failover: %v", err)
			}
			time.Sleep(50 * time.Millisecond)
		}
		if err := c.Do(ctx, "FENCED", res, 11, "SET", res+":k", "d").Err(); err != nil {
			t.Fatalf("a newer fence after the failover: %v", err)
		}
		if v, _ := c.Get(ctx, res+":k").Result(); v != "d" {
			t.Fatalf("value %q, want d", v)
		}
		g.WaitRole(old, "slave", 20*time.Second)
	}
}

// failover asks a Sentinel to fail over, again while it answers that no
// replica is suitable yet (a replica that was the primary a moment ago).
func failover(t testing.TB, g *redistest.Group) {
	t.Helper()
	sc := redis.NewSentinelClient(&redis.Options{Addr: g.Sentinels[0].Addr})
	defer sc.Close()
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := sc.Failover(context.Background(), g.MasterName).Err()
		if err == nil {
			return
		}
		if !strings.Contains(err.Error(), "NOGOODSLAVE") || time.Now().After(deadline) {
			t.Fatalf("SENTINEL FAILOVER: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
