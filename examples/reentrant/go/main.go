// Command go uses lockproxy's reentrant holds and LOCKINFO from go-redis,
// in RESP2 and RESP3, and checks every reply (exit 1 on the first
// mismatch): a function that locks a resource calls another that locks it
// again with the same token, and each gives its own hold back.
//
//	LOCKPROXY_ADDR=127.0.0.1:6380 go run ./examples/reentrant/go
package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/redis/go-redis/v9"
)

const res = "example:reentrant:go"

func check(ok bool, what string, got ...any) {
	if !ok {
		fmt.Fprintf(os.Stderr, "FAIL %s: got %v\n", what, got)
		os.Exit(1)
	}
}

// lock takes one hold of res for the owner token and returns the hold
// count after it; release gives that hold back. The token, not the
// connection, is the owner: the pool may lend any connection.
func lock(ctx context.Context, rdb *redis.Client, token string) int64 {
	v, err := rdb.Do(ctx, "LOCK", res, 10000, "REENTRANT", "TOKEN", token, "WAIT", 2000).Slice()
	check(err == nil && len(v) == 4, "LOCK REENTRANT", v, err)
	holds, _ := v[3].(int64)
	return holds
}

func release(ctx context.Context, rdb *redis.Client, token string, holds int64) {
	// HOLD n is safe to send again after a lost reply: it removes one hold.
	n, err := rdb.Do(ctx, "UNLOCK", res, token, "HOLD", holds).Int()
	check(n == 1 && err == nil, "UNLOCK HOLD", n, err)
}

// info returns LOCKINFO's fields by name: a map in RESP3, names and
// values in RESP2.
func info(ctx context.Context, rdb *redis.Client) map[string]any {
	v, err := rdb.Do(ctx, "LOCKINFO", res).Result()
	check(err == nil, "LOCKINFO", v, err)
	out := map[string]any{}
	switch r := v.(type) {
	case map[any]any:
		for k, x := range r {
			out[k.(string)] = x
		}
	case []any:
		for i := 0; i+1 < len(r); i += 2 {
			out[r[i].(string)] = r[i+1]
		}
	}
	check(len(out) == 10, "LOCKINFO fields", v)
	return out
}

func transfer(ctx context.Context, rdb *redis.Client, token string) {
	holds := lock(ctx, rdb, token)
	defer release(ctx, rdb, token, holds)
	check(holds == 1, "outer hold", holds)
	audit(ctx, rdb, token) // locks res again: no deadlock, one more hold
	m := info(ctx, rdb)
	check(m["holds"] == int64(1), "holds after the inner release", m)
}

func audit(ctx context.Context, rdb *redis.Client, token string) {
	holds := lock(ctx, rdb, token)
	check(holds == 2, "inner hold", holds)
	m := info(ctx, rdb)
	check(m["mode"] == "exclusive" && m["holds"] == int64(2) && m["holder"] != "", "LOCKINFO while nested", m)
	// Another owner (its own token, or none) does not get in.
	_, err := rdb.Do(ctx, "LOCK", res, 10000, "REENTRANT").Slice()
	check(errors.Is(err, redis.Nil), "LOCK by another owner", err)
	release(ctx, rdb, token, holds)
	release(ctx, rdb, token, holds) // resent: removes nothing more
}

func main() {
	addr := os.Getenv("LOCKPROXY_ADDR")
	if addr == "" {
		addr = "127.0.0.1:6380"
	}
	ctx := context.Background()
	for _, protocol := range []int{2, 3} {
		rdb := redis.NewClient(&redis.Options{Addr: addr, Protocol: protocol, ReadTimeout: 10 * time.Second, MaxRetries: -1, ClientName: "example-go"})
		token := rand.Text() // one owner: a job, a request, a thread
		transfer(ctx, rdb, token)
		m := info(ctx, rdb)
		check(m["mode"] == "none" && m["holds"] == int64(0) && m["fence"] == int64(-1), "LOCKINFO after the last release", m)
		rdb.Close()
		fmt.Printf("go-redis reentrant RESP%d: ok\n", protocol)
	}
}
