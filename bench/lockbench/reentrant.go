package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/redis/go-redis/v9"
)

// The reentrant scenarios (-only reentrant), interleaved with plain LOCK
// in every round: what LOCK ... REENTRANT and a re-entry cost next to
// LOCK+UNLOCK, each client on a resource of its own.
//
//   - plain:     LOCK r ttl, UNLOCK r token
//   - reentrant: LOCK r ttl REENTRANT, UNLOCK r token HOLD 1 (one hold: taken
//     and released; HOLD 1 releases in one round, a token-less or HOLD-less
//     UNLOCK of a lock with a count reads the count first)
//   - re-entry:  with a first hold kept, LOCK r ttl REENTRANT TOKEN t (the second
//     hold), UNLOCK r t HOLD 2 (gives that hold back; the lock stays)

func (b *bench) plainPairs(d time.Duration) (result, error) {
	return b.pairs(d, "plain")
}

func (b *bench) reentrantPairs(d time.Duration) (result, error) {
	return b.pairs(d, "reentrant")
}

func (b *bench) reentryPairs(d time.Duration) (result, error) {
	return b.pairs(d, "re-entry")
}

// pairs runs the clients' loop of one reentrant scenario through the proxy
// for d.
func (b *bench) pairs(d time.Duration, mode string) (result, error) {
	col := newCollector(b.cfg.clients, false)
	ctx := context.Background()
	conns, err := clientConns(b.proxy, b.cfg.clients)
	if err != nil {
		return result{}, err
	}
	defer closeAll(conns)
	run := b.runs.Add(1)
	stop := time.Now().Add(d)
	res := col.runWorkers(b.cfg.clients, func(i int) {
		conn := conns[i]
		gen := 0
		resource := resourceName(mode, run, i, gen)
		token := fmt.Sprintf("%s-%d-%d", mode, run, i)
		if mode == "re-entry" {
			if err := conn.Do(ctx, "LOCK", resource, b.ttlArg, "REENTRANT", "TOKEN", token).Err(); err != nil {
				col.err(fmt.Errorf("first hold: %w", err))
				return
			}
			defer conn.Do(ctx, "UNLOCK", resource, token)
		}
		var lat []time.Duration
		for time.Now().Before(stop) {
			t0 := time.Now()
			var (
				v   []any
				err error
			)
			switch mode {
			case "plain":
				v, err = conn.Do(ctx, "LOCK", resource, b.ttlArg).Slice()
			case "reentrant":
				v, err = conn.Do(ctx, "LOCK", resource, b.ttlArg, "REENTRANT").Slice()
			default:
				v, err = conn.Do(ctx, "LOCK", resource, b.ttlArg, "REENTRANT", "TOKEN", token).Slice()
			}
			if err != nil {
				if errors.Is(err, redis.Nil) {
					col.failed.Add(1)
				} else {
					col.err(err)
				}
				if mode != "re-entry" {
					gen++ // the failed attempt's clean-up may have timed out too
					resource = resourceName(mode, run, i, gen)
				}
				continue
			}
			tok, _ := v[0].(string)
			unlock := []any{"UNLOCK", resource, tok}
			switch mode {
			case "reentrant":
				unlock = append(unlock, "HOLD", 1)
			case "re-entry":
				unlock = append(unlock, "HOLD", 2)
			}
			if n, err := conn.Do(ctx, unlock...).Int(); err != nil || n != 1 {
				col.err(fmt.Errorf("UNLOCK = %d, %v", n, err))
				if mode != "re-entry" {
					gen++
					resource = resourceName(mode, run, i, gen)
				}
				continue
			}
			lat = append(lat, time.Since(t0))
		}
		col.add(lat, nil)
	})
	return res, nil
}

func printReentrant(w io.Writer, cfg config, plain, re, again []result) {
	fmt.Fprintf(w, "\n#### Reentrant holds: %d clients, each on its own resource (%d rounds × %v, median (min–max))\n\n",
		cfg.clients, cfg.rounds, cfg.duration)
	fmt.Fprintln(w, "| metric | LOCK+UNLOCK | LOCK REENTRANT+UNLOCK HOLD 1 | re-entry+UNLOCK HOLD 2 | reentrant/plain | re-entry/plain |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|")
	rate := func(r result) float64 { return r.rate() }
	fmt.Fprintf(w, "| pairs/s | %s | %s | %s | **%s** | **%s** |\n", cell(plain, "%.0f", rate), cell(re, "%.0f", rate), cell(again, "%.0f", rate), ratio(re, plain, rate), ratio(again, plain, rate))
	fmt.Fprintf(w, "| pair latency p50 (ms) | %s | %s | %s | %s | %s |\n", cell(plain, "%.2f", msOf(0.5)), cell(re, "%.2f", msOf(0.5)), cell(again, "%.2f", msOf(0.5)), ratio(re, plain, msOf(0.5)), ratio(again, plain, msOf(0.5)))
	fmt.Fprintf(w, "| pair latency p99 (ms) | %s | %s | %s | %s | %s |\n", cell(plain, "%.2f", msOf(0.99)), cell(re, "%.2f", msOf(0.99)), cell(again, "%.2f", msOf(0.99)), ratio(re, plain, msOf(0.99)), ratio(again, plain, msOf(0.99)))
	if len(plain) > 0 && plain[0].cpu.measured() {
		proxy := func(r result) float64 { return usPer(r.cpu.proxy, r) }
		nodes := func(r result) float64 { return usPer(r.cpu.nodes, r) }
		fmt.Fprintf(w, "| CPU µs per pair: lockproxy | %s | %s | %s | %s | %s |\n", cell(plain, "%.1f", proxy), cell(re, "%.1f", proxy), cell(again, "%.1f", proxy), ratio(re, plain, proxy), ratio(again, plain, proxy))
		fmt.Fprintf(w, "| CPU µs per pair: the lock nodes | %s | %s | %s | %s | %s |\n", cell(plain, "%.1f", nodes), cell(re, "%.1f", nodes), cell(again, "%.1f", nodes), ratio(re, plain, nodes), ratio(again, plain, nodes))
	}
}

// printPlain reports the proxy's LOCK+UNLOCK alone (-only plain).
func printPlain(w io.Writer, cfg config, plain []result) {
	fmt.Fprintf(w, "\n#### LOCK+UNLOCK: %d clients, each on its own resource (%d rounds × %v, median (min–max))\n\n",
		cfg.clients, cfg.rounds, cfg.duration)
	fmt.Fprintf(w, "| pairs/s | %s |\n", cell(plain, "%.0f", func(r result) float64 { return r.rate() }))
	if len(plain) > 0 && plain[0].cpu.measured() {
		fmt.Fprintf(w, "| CPU µs per pair: lockproxy | %s |\n", cell(plain, "%.1f", func(r result) float64 { return usPer(r.cpu.proxy, r) }))
		fmt.Fprintf(w, "| CPU µs per pair: the lock nodes | %s |\n", cell(plain, "%.1f", func(r result) float64 { return usPer(r.cpu.nodes, r) }))
	}
	printNodeStats(w, plain)
}
