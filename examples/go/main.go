// Command go uses lockproxy's LOCK, EXTEND and UNLOCK from go-redis, in
// RESP2 and RESP3, and checks every reply (exit 1 on the first mismatch).
//
//	LOCKPROXY_ADDR=127.0.0.1:6380 go run ./examples/go
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/redis/go-redis/v9"
)

const res, data = "example:go", "example:go:data"

// fencedSet writes ARGV[2] to KEYS[1] unless a newer fence already wrote
// there: the storage side of fencing.
const fencedSet = `local f = tonumber(redis.call("HGET", KEYS[1], "fence") or "0")
if tonumber(ARGV[1]) < f then return 0 end
redis.call("HSET", KEYS[1], "fence", ARGV[1], "value", ARGV[2]) return 1`

func check(ok bool, what string, got ...any) {
	if !ok {
		fmt.Fprintf(os.Stderr, "FAIL %s: got %v\n", what, got)
		os.Exit(1)
	}
}

func main() {
	addr := os.Getenv("LOCKPROXY_ADDR")
	if addr == "" {
		addr = "127.0.0.1:6380"
	}
	ctx := context.Background()
	for _, protocol := range []int{2, 3} {
		// ReadTimeout must outlast WAIT; MaxRetries -1: never resend a LOCK.
		opts := &redis.Options{Addr: addr, Protocol: protocol, ReadTimeout: 10 * time.Second, MaxRetries: -1}
		rdb := redis.NewClient(opts)
		// Token-less EXTEND/UNLOCK need the connection that holds the lock;
		// rdb.Conn() pins one connection of the pool.
		conn := rdb.Conn()

		v, err := conn.Do(ctx, "LOCK", res, 10000, "WAIT", 2000).Slice() // redis.Nil: not acquired
		check(err == nil && len(v) == 3, "LOCK", v, err)
		token, _ := v[0].(string)
		validity, _ := v[1].(int64)
		fence, _ := v[2].(int64)
		check(len(token) >= 16 && validity > 0 && validity <= 10000 && fence > 0, "LOCK reply", v)

		// The work, guarded by the fence; an older fence is refused.
		n, err := rdb.Eval(ctx, fencedSet, []string{data}, fence, fmt.Sprint("resp", protocol)).Int()
		check(n == 1 && err == nil, "fenced write", n, err)
		n, err = rdb.Eval(ctx, fencedSet, []string{data}, fence-1, "stale").Int()
		check(n == 0 && err == nil, "stale write", n, err)
		s, err := rdb.HGet(ctx, data, "value").Result()
		check(s == fmt.Sprint("resp", protocol) && err == nil, "HGET", s, err)

		// A second client without WAIT gets a null reply: redis.Nil.
		other := redis.NewClient(opts)
		err = other.Do(ctx, "LOCK", res, 10000).Err()
		check(errors.Is(err, redis.Nil), "second LOCK", err)
		other.Close()

		ms, err := conn.Do(ctx, "EXTEND", res, 10000, token).Int64()
		check(ms > 0 && err == nil, "EXTEND", ms, err)
		n, err = conn.Do(ctx, "UNLOCK", res, token).Int()
		check(n == 1 && err == nil, "UNLOCK", n, err)
		n, err = conn.Do(ctx, "UNLOCK", res, token).Int()
		check(n == 0 && err == nil, "UNLOCK again", n, err)

		// Again, leaving out the token on the connection that holds the lock.
		v, err = conn.Do(ctx, "LOCK", res, 10000).Slice()
		check(err == nil && len(v) == 3 && v[2].(int64) > fence, "LOCK again", v, err)
		ms, err = conn.Do(ctx, "EXTEND", res, 5000).Int64()
		check(ms > 0 && err == nil, "EXTEND without token", ms, err)
		n, err = conn.Do(ctx, "UNLOCK", res).Int()
		check(n == 1 && err == nil, "UNLOCK without token", n, err)

		conn.Close()
		rdb.Close()
		fmt.Printf("go-redis RESP%d: ok (fence %d, then %v)\n", protocol, fence, v[2])
	}
}
