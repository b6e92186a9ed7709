package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockproxy/lockproxy/internal/redistest"
)

// locksStep is one LOCKS call's reply.
func locksStep(t testing.TB, ctx context.Context, c *redis.Client, cursor string, opts ...any) (string, []string) {
	t.Helper()
	v, err := c.Do(ctx, append([]any{"LOCKS", cursor}, opts...)...).Slice()
	if err != nil {
		t.Fatalf("LOCKS %s %v: %v", cursor, opts, err)
	}
	if len(v) != 2 {
		t.Fatalf("LOCKS %s: %v, want [cursor, [resource, ...]]", cursor, v)
	}
	next, ok := v[0].(string)
	list, ok2 := v[1].([]any)
	if !ok || !ok2 {
		t.Fatalf("LOCKS %s: %#v", cursor, v)
	}
	out := make([]string, len(list))
	for i, r := range list {
		out[i] = r.(string)
	}
	return next, out
}

// locksAll runs a full LOCKS iteration and returns every resource
// returned (repeats included) and the number of calls.
func locksAll(t testing.TB, ctx context.Context, c *redis.Client, opts ...any) ([]string, int) {
	t.Helper()
	var all []string
	cursor, calls := "0", 0
	for {
		next, got := locksStep(t, ctx, c, cursor, opts...)
		calls++
		all = append(all, got...)
		if next == "0" {
			return all, calls
		}
		if next == cursor && len(got) == 0 && calls > 1_000_000 {
			t.Fatal("LOCKS does not advance")
		}
		cursor = next
	}
}

// set returns the distinct resources of list, sorted.
func set(list []string) []string {
	out := slices.Clone(list)
	slices.Sort(out)
	return slices.Compact(out)
}

// TestLocksCommand runs every rule of LOCKS from the contract through a
// real proxy, in RESP2 and RESP3: held resources of every form are listed,
// free ones, tombstones and holdings on a minority never are, MATCH and
// COUNT, a resource missing on the first node scanned, a node down,
// -NOQUORUM, the argument errors as SCAN's, and no token in any reply.
func TestLocksCommand(t *testing.T) {
	backend := redistest.Start(t)
	nodes, addrs := startNodes(t, 3)
	addr := startApp(t, "lock: {node_timeout: 250ms, max_permits: 8}\n", "-backend", backend.Addr, "-lock-nodes", addrs)
	warmProxy(t, addr)
	ctx := context.Background()
	for _, proto := range []int{2, 3} {
		t.Run(fmt.Sprintf("RESP%d", proto), func(t *testing.T) {
			c := newClient(t, addr, proto)
			p := fmt.Sprintf("p%d:", proto)
			var tokens []string
			take := func(args ...any) {
				t.Helper()
				v, err := c.Do(ctx, args...).Slice()
				if err != nil {
					t.Fatalf("%v: %v", args, err)
				}
				if s, ok := v[0].(string); ok {
					tokens = append(tokens, s)
				}
			}
			take("LOCK", p+"plain", 30000)
			take("RLOCK", p+"read", 30000)
			take("RLOCK", p+"read", 30000)
			take("LOCK", p+"sem", 30000, "PERMITS", 3)
			take("LOCK", p+"re", 30000, "REENTRANT")
			take("MLOCK", 2, p+"m1", p+"m2", 30000)
			// MLOCK's resources are exclusive holdings: LOCKINFO names
			// their holder as LOCK's.
			if info := lockInfo(t, ctx, c, p+"m2"); info["mode"] != "exclusive" || !strings.Contains(info["holder"].(string), " via ") {
				t.Fatalf("LOCKINFO of an MLOCK resource: %v", info)
			}
			take("LOCK", p+"gone", 30000)
			if n, err := c.Do(ctx, "UNLOCK", p+"gone", tokens[len(tokens)-1]).Int64(); err != nil || n != 1 {
				t.Fatalf("UNLOCK: %v %v", n, err)
			}
			// A holding on one node only, and a tombstone: not held.
			if _, err := nodes[0].Do("SET", "lockproxy:lock:"+p+"minority", "01/a:secret-minority", "PX", "30000"); err != nil {
				t.Fatal(err)
			}
			if _, err := nodes[1].Do("SET", "lockproxy:lock:"+p+"tomb", "x/a", "PX", "30000"); err != nil {
				t.Fatal(err)
			}
			want := []string{p + "m1", p + "m2", p + "plain", p + "re", p + "read", p + "sem"}
			all, _ := locksAll(t, ctx, c, "MATCH", p+"*")
			if got := set(all); !slices.Equal(got, want) {
				t.Fatalf("LOCKS MATCH %s*: %v, want %v", p, got, want)
			}
			// COUNT 1: the same, in more calls.
			all, calls := locksAll(t, ctx, c, "MATCH", p+"*", "COUNT", 1)
			if got := set(all); !slices.Equal(got, want) || calls < 2 {
				t.Fatalf("LOCKS COUNT 1: %v in %d calls, want %v", got, calls, want)
			}
			// MATCH narrows; a glob with a class; options in any order,
			// the last of each wins (as SCAN).
			all, _ = locksAll(t, ctx, c, "COUNT", 5, "MATCH", "nothing", "MATCH", p+"m[12]")
			if got := set(all); !slices.Equal(got, []string{p + "m1", p + "m2"}) {
				t.Fatalf("LOCKS MATCH %sm[12]: %v", p, got)
			}
			// Case-insensitive command and options.
			if _, err := c.Do(ctx, "locks", "0", "match", "x", "count", "3").Slice(); err != nil {
				t.Fatalf("lower case: %v", err)
			}
			// A resource that the first node scanned missed (it was down
			// when the lock was taken) is still listed.
			take("LOCK", p+"missed", 30000)
			if _, err := nodes[0].Do("DEL", "lockproxy:lock:"+p+"missed"); err != nil {
				t.Fatal(err)
			}
			all, _ = locksAll(t, ctx, c, "MATCH", p+"missed")
			if !slices.Equal(set(all), []string{p + "missed"}) {
				t.Fatalf("a lock node 0 misses: %v", all)
			}
			// No token in any reply.
			all, _ = locksAll(t, ctx, c)
			for _, r := range all {
				for _, tok := range append(tokens, "secret-minority") {
					if strings.Contains(r, tok) {
						t.Fatalf("LOCKS shows a token: %q", r)
					}
				}
			}
		})
	}

	c := newClient(t, addr, 2)
	// Argument errors, as Redis answers SCAN's.
	scan := redis.NewClient(&redis.Options{Addr: backend.Addr})
	defer scan.Close()
	for _, args := range [][]any{
		{"abc"}, {"0", "COUNT", 0}, {"0", "COUNT", "x"}, {"0", "COUNT", -3},
		{"0", "FOO", "bar"}, {"0", "MATCH"}, {"0", "COUNT"}, {"18446744073709551616"},
	} {
		_, want := scan.Do(ctx, append([]any{"SCAN"}, args...)...).Result()
		_, got := c.Do(ctx, append([]any{"LOCKS"}, args...)...).Result()
		if want == nil || got == nil || got.Error() != want.Error() {
			t.Errorf("LOCKS %v: %v, SCAN: %v", args, got, want)
		}
	}
	// COMMAND INFO and COMMAND DOCS know it.
	if v, err := c.Do(ctx, "COMMAND", "INFO", "locks").Slice(); err != nil || len(v) != 1 || fmt.Sprint(v[0].([]any)[:2]) != "[locks -2]" {
		t.Errorf("COMMAND INFO locks: %v %v", v, err)
	}
	if v, err := c.Do(ctx, "COMMAND", "DOCS", "locks").Slice(); err != nil || len(v) != 2 || !strings.Contains(fmt.Sprint(v[1]), "MATCH") {
		t.Errorf("COMMAND DOCS locks: %v %v", v, err)
	}
	if _, err := c.Do(ctx, "LOCKS").Result(); err == nil || err.Error() != "ERR wrong number of arguments for 'locks' command" {
		t.Errorf("LOCKS without a cursor: %v", err)
	}
	// A cursor that no iteration returns.
	for _, cur := range []string{"3", "-1", "513", strconv.FormatUint(1<<16|7, 10)} {
		if _, err := c.Do(ctx, "LOCKS", cur).Result(); err == nil || err.Error() != "ERR invalid cursor" {
			t.Errorf("LOCKS %s: %v, want ERR invalid cursor", cur, err)
		}
	}

	// One node down: the iteration goes on over the other two.
	nodes[0].CutOff()
	time.Sleep(300 * time.Millisecond)
	all, _ := locksAll(t, ctx, c, "MATCH", "p2:*")
	if got := set(all); !slices.Contains(got, "p2:plain") || !slices.Contains(got, "p2:missed") || len(got) != 7 {
		t.Fatalf("LOCKS with node 0 down: %v", got)
	}
	// A node that goes down in the middle of its scan: the scan goes on
	// from the start of the next node.
	nodes[0].Reconnect()
	time.Sleep(300 * time.Millisecond)
	cursor, _ := locksStep(t, ctx, c, "0", "COUNT", 1, "MATCH", "p2:*")
	nodes[0].CutOff()
	time.Sleep(300 * time.Millisecond)
	var rest []string
	for cursor != "0" {
		var got []string
		cursor, got = locksStep(t, ctx, c, cursor, "COUNT", 1, "MATCH", "p2:*")
		rest = append(rest, got...)
	}
	if got := set(rest); len(got) != 7 {
		t.Fatalf("LOCKS after node 0 went down mid-scan: %v", got)
	}
	// Two of three down: -NOQUORUM.
	nodes[1].CutOff()
	time.Sleep(300 * time.Millisecond)
	if _, err := c.Do(ctx, "LOCKS", "0").Result(); err == nil || !strings.HasPrefix(err.Error(), "NOQUORUM ") {
		t.Fatalf("LOCKS with 2 of 3 nodes down: %v", err)
	}
	nodes[0].Reconnect()
	nodes[1].Reconnect()

	// The metrics count the outcomes.
	info, err := c.Do(ctx, "INFO", "lockproxy").Text()
	if err != nil || !strings.Contains(info, "cmd_locks:answered=") {
		t.Fatalf("INFO lockproxy: %v %q", err, info)
	}
	for _, want := range []string{"noquorum=1,", "bad_request=13"} {
		line := info[strings.Index(info, "cmd_locks:"):]
		line = line[:strings.Index(line, "\r\n")]
		if !strings.Contains(line, want) {
			t.Errorf("INFO %q lacks %q", line, want)
		}
	}
}

// cmdstat returns the calls of command on s (INFO commandstats).
func cmdstat(t testing.TB, s *redistest.Server, command string) int64 {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer c.Close()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	_, line, ok := strings.Cut(info, "cmdstat_"+command+":calls=")
	if !ok {
		return 0
	}
	n, _ := strconv.ParseInt(line[:strings.IndexByte(line, ',')], 10, 64)
	return n
}

// TestLocksTenThousand lists 10,000 held resources on nodes of which the
// first holds a million other keys: a full iteration returns each at least
// once, and every call does one SCAN step on one node whatever the number
// of keys (bounded work, never KEYS).
func TestLocksTenThousand(t *testing.T) {
	backend := redistest.Start(t)
	nodes, addrs := startNodes(t, 3)
	metricsAddr := unusedAddr(t)
	addr := startApp(t, fmt.Sprintf("metrics: {listen: %q}\nlock: {node_timeout: 1s}\n", metricsAddr),
		"-backend", backend.Addr, "-lock-nodes", addrs)
	warmProxy(t, addr)
	ctx := context.Background()
	c := newClient(t, addr, 3)
	const n = 10_000
	var tokens []string
	// Pipelined, 1000 at a time. Under such a burst the engine now and
	// then answers one LOCK -NOQUORUM ("3 new") although every node keeps
	// its marker; those are taken again.
	todo := make([]string, n)
	for i := range todo {
		todo[i] = fmt.Sprintf("many:%05d", i)
	}
	for try := 0; len(todo) > 0; try++ {
		if try == 5 {
			t.Fatalf("%d LOCKs still fail after %d tries", len(todo), try)
		}
		var again []string
		for from := 0; from < len(todo); from += 1000 {
			part := todo[from:min(from+1000, len(todo))]
			cmds, _ := c.Pipelined(ctx, func(p redis.Pipeliner) error {
				for _, r := range part {
					p.Do(ctx, "LOCK", r, 120000)
				}
				return nil
			})
			for i, cmd := range cmds {
				if v, err := cmd.(*redis.Cmd).Slice(); err == nil {
					tokens = append(tokens, v[0].(string))
				}
				if err := cmd.Err(); err != nil {
					if !strings.HasPrefix(err.Error(), "NOQUORUM") {
						t.Fatalf("LOCK %s: %v", part[i], err)
					}
					again = append(again, part[i])
				}
			}
		}
		todo = again
	}
	// A million keys that are no locks on the node scanned first.
	big := redis.NewClient(&redis.Options{Addr: nodes[0].Addr, ReadTimeout: time.Minute})
	defer big.Close()
	if err := big.Eval(ctx, "for i = 1, 1000000 do redis.call('SET', 'other:' .. i, 'x') end", nil).Err(); err != nil && err != redis.Nil {
		t.Fatal(err)
	}

	const count = 1000
	scans := func() int64 {
		var s int64
		for _, nd := range nodes {
			s += cmdstat(t, nd, "scan")
		}
		return s
	}
	seen := make(map[string]int, n)
	cursor, calls := "0", 0
	for {
		before := scans()
		next, got := locksStep(t, ctx, c, cursor, "MATCH", "many:*", "COUNT", count)
		if d := scans() - before; d != 1 {
			t.Fatalf("LOCKS %s ran %d SCAN steps on the nodes, want 1", cursor, d)
		}
		if len(got) > 2*count {
			t.Fatalf("LOCKS %s COUNT %d returned %d resources", cursor, count, len(got))
		}
		for _, r := range got {
			seen[r]++
		}
		calls++
		if next == "0" {
			break
		}
		cursor = next
	}
	if len(seen) != n {
		t.Fatalf("a full iteration returned %d of %d resources", len(seen), n)
	}
	if cmdstat(t, nodes[0], "keys")+cmdstat(t, nodes[1], "keys")+cmdstat(t, nodes[2], "keys") != 0 {
		t.Fatal("KEYS ran on a lock node")
	}
	t.Logf("%d resources in %d calls of COUNT %d over a node with 1,000,000 other keys", len(seen), calls, count)

	// The page's JSON, paged by cursor: every resource once (the nodes do
	// not change), no token.
	if len(tokens) != n {
		t.Fatalf("%d tokens", len(tokens))
	}
	shown := make(map[string]int, n)
	cursor, pages := "0", 0
	for {
		resp, err := http.Get("http://" + metricsAddr + "/locks.json?match=many:*&count=1000&cursor=" + cursor)
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("/locks.json: %d %v %s", resp.StatusCode, err, body)
		}
		var page struct {
			Next  string
			Error string
			Locks []struct {
				Resource   string
				Mode       string
				ValidityMS int64 `json:"validity_ms"`
			}
			Nodes []struct{ State string }
		}
		if err := json.Unmarshal(body, &page); err != nil {
			t.Fatal(err)
		}
		if page.Error != "" || len(page.Nodes) != 3 || len(page.Locks) > 1100 {
			t.Fatalf("/locks.json page %d: error %q, %d nodes, %d locks", pages, page.Error, len(page.Nodes), len(page.Locks))
		}
		for _, l := range page.Locks {
			if l.Mode != "exclusive" || l.ValidityMS <= 0 {
				t.Fatalf("/locks.json: %+v", l)
			}
			shown[l.Resource]++
		}
		for _, tok := range tokens[:200] {
			if bytes.Contains(body, []byte(tok)) {
				t.Fatal("/locks.json holds a token")
			}
		}
		pages++
		if page.Next == "0" {
			break
		}
		cursor = page.Next
	}
	if len(shown) != n {
		t.Fatalf("/locks.json showed %d of %d resources in %d pages", len(shown), n, pages)
	}
	for r, k := range shown {
		if k != 1 {
			t.Fatalf("/locks.json showed %s on %d pages", r, k)
		}
	}
	t.Logf("/locks.json showed the %d resources in %d pages of 1000", n, pages)
}
