// Command go moves money between two accounts under one MLOCK from
// go-redis, in RESP2 and RESP3, and checks every reply (exit 1 on the first
// mismatch): both accounts or neither, one fence per account, a transfer
// over an overlapping pair waiting for the first (MLOCK ... WAIT holds
// nothing while it waits), per-resource EXTEND and UNLOCK.
//
//	LOCKPROXY_ADDR=127.0.0.1:6380 go run ./examples/mlock/go
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/redis/go-redis/v9"
)

// fencedAdd adds ARGV[2] to the balance in KEYS[1] unless a newer fence
// already wrote there: the storage side of fencing.
const fencedAdd = `local f = tonumber(redis.call("HGET", KEYS[1], "fence") or "0")
if tonumber(ARGV[1]) < f then return nil end
redis.call("HSET", KEYS[1], "fence", ARGV[1])
return redis.call("HINCRBY", KEYS[1], "balance", ARGV[2])`

func check(ok bool, what string, got ...any) {
	if !ok {
		fmt.Fprintf(os.Stderr, "FAIL %s: got %v\n", what, got)
		os.Exit(1)
	}
}

// mlock runs MLOCK and returns its token and fences; ok is false for the
// null reply (not acquired).
func mlock(ctx context.Context, c interface {
	Do(context.Context, ...any) *redis.Cmd
}, args ...any) (token string, fences []int64, ok bool) {
	v, err := c.Do(ctx, append([]any{"MLOCK"}, args...)...).Slice()
	if errors.Is(err, redis.Nil) {
		return "", nil, false
	}
	check(err == nil && len(v) == 3, "MLOCK", v, err)
	token, _ = v[0].(string)
	validity, _ := v[1].(int64)
	fs, _ := v[2].([]any)
	for _, f := range fs {
		n, _ := f.(int64)
		fences = append(fences, n)
	}
	check(len(token) >= 16 && validity > 0 && len(fences) == len(fs), "MLOCK reply", v)
	return token, fences, true
}

// transfer moves amount from one account to the other, guarded by their
// fences.
func transfer(ctx context.Context, rdb *redis.Client, from, to string, fences []int64, amount int) {
	for i, k := range []string{from, to} {
		delta := -amount
		if i == 1 {
			delta = amount
		}
		_, err := rdb.Eval(ctx, fencedAdd, []string{k + ":balance"}, fences[i], delta).Int()
		check(err == nil, "fenced add "+k, err)
	}
}

func main() {
	addr := os.Getenv("LOCKPROXY_ADDR")
	if addr == "" {
		addr = "127.0.0.1:6380"
	}
	ctx := context.Background()
	for _, protocol := range []int{2, 3} {
		p := fmt.Sprint(protocol)
		alice, bob, carol := "example:go:alice"+p, "example:go:bob"+p, "example:go:carol"+p
		// ReadTimeout must outlast WAIT; MaxRetries -1: never resend an MLOCK.
		opts := &redis.Options{Addr: addr, Protocol: protocol, ReadTimeout: 10 * time.Second, MaxRetries: -1}
		rdb := redis.NewClient(opts)
		conn := rdb.Conn() // token-less EXTEND/UNLOCK need the acquiring connection
		check(rdb.Del(ctx, alice+":balance", bob+":balance", carol+":balance").Err() == nil, "DEL balances")

		token, fences, ok := mlock(ctx, conn, 2, alice, bob, 10000, "WAIT", 2000)
		check(ok && len(fences) == 2 && fences[0] > 0 && fences[1] > 0, "MLOCK alice bob", fences)
		transfer(ctx, rdb, alice, bob, fences, 10)

		// Another client: a pair that overlaps (bob) is not acquired, and
		// carol, which it would have taken too, stays free.
		other := redis.NewClient(opts)
		_, _, ok = mlock(ctx, other, 2, bob, carol, 10000)
		check(!ok, "overlapping MLOCK without WAIT")
		v, err := other.Do(ctx, "LOCK", carol, 1000).Slice()
		check(err == nil && len(v) == 3, "LOCK carol: the failed MLOCK left nothing", v, err)
		n, err := other.Do(ctx, "UNLOCK", carol, v[0]).Int()
		check(n == 1 && err == nil, "UNLOCK carol", n, err)

		// With WAIT it gets both once alice and bob are released; it
		// holds neither bob nor carol meanwhile.
		waited := make(chan []int64, 1)
		go func() {
			tok, fs, ok := mlock(ctx, other, 2, carol, bob, 10000, "WAIT", 5000)
			check(ok, "MLOCK carol bob WAIT")
			transfer(ctx, rdb, bob, carol, []int64{fs[1], fs[0]}, 5)
			for _, r := range []string{carol, bob} {
				n, err := other.Do(ctx, "UNLOCK", r, tok).Int()
				check(n == 1 && err == nil, "UNLOCK "+r, n, err)
			}
			waited <- fs
		}()

		// Per resource, without the token on the acquiring connection.
		ms, err := conn.Do(ctx, "EXTEND", alice, 5000).Int64()
		check(ms > 0 && err == nil, "EXTEND alice", ms, err)
		n, err = conn.Do(ctx, "UNLOCK", alice).Int()
		check(n == 1 && err == nil, "UNLOCK alice", n, err)
		n, err = conn.Do(ctx, "UNLOCK", bob, token).Int()
		check(n == 1 && err == nil, "UNLOCK bob", n, err)

		fs := <-waited
		check(fs[1] > fences[1], "bob's fence grew", fs, fences)
		b, err := rdb.HGet(ctx, bob+":balance", "balance").Int()
		check(b == 5 && err == nil, "bob's balance", b, err)
		conn.Close()
		other.Close()
		rdb.Close()
		fmt.Printf("go-redis MLOCK RESP%d: ok (bob's fence %d, then %d)\n", protocol, fences[1], fs[1])
	}
}
