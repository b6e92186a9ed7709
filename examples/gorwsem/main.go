// Command gorwsem uses lockproxy's read-write lock (RLOCK, LOCK) and
// semaphore (LOCK ... PERMITS k) from go-redis, in RESP2 and RESP3, and
// checks every reply (exit 1 on the first mismatch).
//
//	LOCKPROXY_ADDR=127.0.0.1:6380 go run ./examples/gorwsem
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

func main() {
	addr := os.Getenv("LOCKPROXY_ADDR")
	if addr == "" {
		addr = "127.0.0.1:6380"
	}
	ctx := context.Background()
	for _, protocol := range []int{2, 3} {
		// ReadTimeout must outlast WAIT; MaxRetries -1: never resend a LOCK.
		rdb := redis.NewClient(&redis.Options{Addr: addr, Protocol: protocol, ReadTimeout: 10 * time.Second, MaxRetries: -1})
		rw, sem := fmt.Sprintf("example:go:rw:%d", protocol), fmt.Sprintf("example:go:sem:%d", protocol)

		// Readers share the resource, each with its own token and fence.
		r1, err1 := rdb.Do(ctx, "RLOCK", rw, 10000).Slice()
		r2, err2 := rdb.Do(ctx, "RLOCK", rw, 10000).Slice()
		check(err1 == nil && err2 == nil && len(r1) == 3 && r2[2].(int64) > r1[2].(int64), "RLOCK", r1, r2, err1, err2)
		// The writer waits for them: null without WAIT.
		_, err := rdb.Do(ctx, "LOCK", rw, 10000).Slice()
		check(errors.Is(err, redis.Nil), "LOCK while read", err)
		// An upgrade would wait for itself.
		_, err = rdb.Do(ctx, "LOCK", rw, 10000, "TOKEN", r1[0]).Slice()
		check(err != nil && strings.HasPrefix(err.Error(), "DEADLOCK"), "upgrade", err)
		for _, r := range [][]any{r1, r2} {
			n, err := rdb.Do(ctx, "UNLOCK", rw, r[0]).Int64()
			check(err == nil && n == 1, "UNLOCK reader", n, err)
		}
		w, err := rdb.Do(ctx, "LOCK", rw, 10000, "WAIT", 2000).Slice()
		check(err == nil && w[2].(int64) > r2[2].(int64), "LOCK after the readers", w, err)
		n, err := rdb.Do(ctx, "UNLOCK", rw, w[0]).Int64()
		check(err == nil && n == 1, "UNLOCK writer", n, err)

		// A semaphore of 2: two permits in slots 0 and 1; a third is null.
		var permits [][]any
		slots := map[int64]bool{}
		for range 2 {
			p, err := rdb.Do(ctx, "LOCK", sem, 10000, "PERMITS", 2).Slice()
			check(err == nil && len(p) == 4, "PERMITS 2", p, err)
			slots[p[3].(int64)] = true
			permits = append(permits, p)
		}
		check(slots[0] && slots[1], "slots", slots)
		_, err = rdb.Do(ctx, "LOCK", sem, 10000, "PERMITS", 2).Slice()
		check(errors.Is(err, redis.Nil), "third permit", err)
		_, err = rdb.Do(ctx, "LOCK", sem, 10000, "PERMITS", 3).Slice()
		check(err != nil && err.Error() == "LOCKMODE held as a semaphore of 2 permits", "PERMITS 3", err)
		v, err := rdb.Do(ctx, "EXTEND", sem, 10000, permits[0][0]).Int64()
		check(err == nil && v > 0, "EXTEND a permit", v, err)
		for _, p := range permits {
			n, err := rdb.Do(ctx, "UNLOCK", sem, p[0]).Int64()
			check(err == nil && n == 1, "UNLOCK permit", n, err)
		}
		rdb.Close()
		fmt.Printf("go-redis rwsem RESP%d: ok\n", protocol)
	}
}
