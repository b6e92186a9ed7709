// Command go uses FENCED from go-redis, in RESP2 and RESP3, and checks
// every reply (exit 1 on the first mismatch): it locks an account, does a
// fenced read-modify-write of its balance (the backend refuses it if a
// later holder has written since), shows that an older fence is refused,
// and unlocks.
//
//	LOCKPROXY_ADDR=127.0.0.1:6380 go run ./examples/fenced/go
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

func check(ok bool, what string, got ...any) {
	if !ok {
		fmt.Fprintf(os.Stderr, "FAIL %s: got %v\n", what, got)
		os.Exit(1)
	}
}

// deposit adds amount to the balance, fenced: the read, the sum and the
// write are one script on the backend, run only when fence is not older
// than the last fence that wrote the account.
const deposit = `local b = tonumber(redis.call('GET', KEYS[1]) or '0') + tonumber(ARGV[1])
redis.call('SET', KEYS[1], b)
return b`

func example(ctx context.Context, protocol int) {
	rdb := redis.NewClient(&redis.Options{Addr: addr(), Protocol: protocol})
	defer rdb.Close()
	res := fmt.Sprintf("example:fenced:go:%d", protocol)
	balance := res + ":balance"

	// An earlier holder, whose lock ran out while it was paused: its fence
	// is older than any later holder's.
	v, err := rdb.Do(ctx, "LOCK", res, 10000, "WAIT", 2000).Slice()
	check(err == nil && len(v) == 3, "LOCK (earlier holder)", v, err)
	oldFence := v[2].(int64)
	rdb.Do(ctx, "UNLOCK", res, v[0])

	// 1. Lock: [token, validity-ms, fence].
	v, err = rdb.Do(ctx, "LOCK", res, 10000, "WAIT", 2000).Slice()
	check(err == nil && len(v) == 3 && v[2].(int64) > oldFence, "LOCK", v, err)
	token, fence := v[0].(string), v[2].(int64)

	// 2. Fenced read-modify-write: FENCED resource fence EVAL ...
	before, err := rdb.Do(ctx, "FENCED", res, fence, "GET", balance).Result()
	check(err == nil || errors.Is(err, redis.Nil), "FENCED GET", before, err)
	start := int64(0)
	if s, ok := before.(string); ok {
		fmt.Sscan(s, &start)
	}
	after, err := rdb.Do(ctx, "FENCED", res, fence, "EVAL", deposit, 1, balance, 25).Int64()
	check(err == nil && after == start+25, "FENCED EVAL deposit", after, err)
	got, err := rdb.Get(ctx, balance).Int64()
	check(err == nil && got == after, "GET balance", got, err)

	// The earlier holder wakes up and writes with its older fence: the
	// backend refuses it and nothing runs.
	err = rdb.Do(ctx, "FENCED", res, oldFence, "SET", balance, 0).Err()
	check(err != nil && strings.HasPrefix(err.Error(), "STALEFENCE fence "), "FENCED with an older fence", err)
	got, _ = rdb.Get(ctx, balance).Int64()
	check(got == after, "balance after the refused write", got)

	// 3. Unlock with the token.
	n, err := rdb.Do(ctx, "UNLOCK", res, token).Int()
	check(err == nil && n == 1, "UNLOCK", n, err)
	fmt.Printf("go-redis FENCED RESP%d: ok\n", protocol)
}

func addr() string {
	if a := os.Getenv("LOCKPROXY_ADDR"); a != "" {
		return a
	}
	return "127.0.0.1:6380"
}

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	example(ctx, 2)
	example(ctx, 3)
}
