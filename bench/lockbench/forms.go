package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// The forms scenario (-only forms) measures what one lock form costs
// against a plain LOCK through the same proxy: clients each take their own
// resources and release them in a loop, uncontended, for -duration, with
// one client and with -clients. A pair is one acquisition and the release
// of everything it took: LOCK+UNLOCK, or MLOCK of n resources followed by
// their n UNLOCKs sent as one pipeline.

// formSizes are the MLOCK sizes measured; 0 is the plain LOCK.
var formSizes = []int{0, 1, 3, 10}

func formName(n int) string {
	if n == 0 {
		return "LOCK"
	}
	return "MLOCK " + strconv.Itoa(n)
}

// formScenario returns the run of form n (see formSizes) with clients
// clients.
func (b *bench) formScenario(n, clients int) func(time.Duration) (result, error) {
	return func(d time.Duration) (result, error) {
		col := newCollector(clients, false)
		ctx := context.Background()
		conns, err := clientConns(b.proxy, clients)
		if err != nil {
			return result{}, err
		}
		defer closeAll(conns)
		run := b.runs.Add(1)
		stop := time.Now().Add(d)
		side := "form" + strconv.Itoa(n)
		return col.runWorkers(clients, func(i int) {
			conn := conns[i]
			gen := 0
			var lat, acq []time.Duration
			for time.Now().Before(stop) {
				resources := formResources(side, run, i, gen, max(n, 1))
				t0 := time.Now()
				took, err := b.formPair(ctx, conn, n, resources)
				if err != nil {
					if errors.Is(err, redis.Nil) {
						col.failed.Add(1)
					} else {
						col.err(err)
					}
					gen++ // a failed attempt's clean-up may have timed out too
					continue
				}
				lat = append(lat, time.Since(t0))
				acq = append(acq, took)
			}
			col.add(lat, acq)
		}), nil
	}
}

// formResources returns the k resource names of one client's generation.
func formResources(side string, run int64, client, gen, k int) []string {
	out := make([]string, k)
	for j := range out {
		out[j] = resourceName(side, run, client, gen) + ":" + strconv.Itoa(j)
	}
	return out
}

// formPair takes resources with form n and releases them. It returns how
// long the acquisition took.
func (b *bench) formPair(ctx context.Context, conn *redis.Conn, n int, resources []string) (time.Duration, error) {
	args := []any{"LOCK", resources[0], b.ttlArg}
	if n > 0 {
		args = []any{"MLOCK", n}
		for _, r := range resources {
			args = append(args, r)
		}
		args = append(args, b.ttlArg)
	}
	t0 := time.Now()
	v, err := conn.Do(ctx, args...).Slice()
	took := time.Since(t0)
	if err != nil {
		return took, err
	}
	token, _ := v[0].(string)
	cmds, err := conn.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, r := range resources {
			p.Do(ctx, "UNLOCK", r, token)
		}
		return nil
	})
	if err != nil {
		return took, fmt.Errorf("UNLOCK: %w", err)
	}
	for _, c := range cmds {
		if n, err := c.(*redis.Cmd).Int(); n != 1 || err != nil {
			return took, fmt.Errorf("UNLOCK = %d, %v", n, err)
		}
	}
	return took, nil
}

// formScenarios returns the forms group: every form with one client and
// with -clients.
func (b *bench) formScenarios() (names []string, fns []func(time.Duration) (result, error)) {
	for _, clients := range []int{1, b.cfg.clients} {
		for _, n := range formSizes {
			names = append(names, fmt.Sprintf("%s x%d", formName(n), clients))
			fns = append(fns, b.formScenario(n, clients))
		}
	}
	return names, fns
}

// printForms reports the forms group: per form and client count, the pairs
// per second, against LOCK's, the pair latency and, when measured, the CPU
// of the proxy and the nodes per pair.
func printForms(w io.Writer, cfg config, results map[string][]result) {
	fmt.Fprintf(w, "\n#### Lock forms, uncontended: each client takes its own resources and releases them (%d rounds × %v, median (min–max))\n\n",
		cfg.rounds, cfg.duration)
	fmt.Fprintln(w, "A pair is the acquisition and the release of all it took: MLOCK n is followed by its n UNLOCKs in one pipeline (which the proxy answers one after another). \"acquire p50\" is the LOCK or MLOCK call alone.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| form | clients | pairs/s | vs LOCK | acquire p50 (ms) | pair p50 (ms) | pair p99 (ms) | CPU µs per pair: lockproxy | CPU µs per pair: nodes |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|")
	acq := func(r result) float64 { return msf(quantile(r.acquire, 0.5)) }
	rate := func(r result) float64 { return r.rate() }
	proxy := func(r result) float64 { return usPer(r.cpu.proxy, r) }
	nodes := func(r result) float64 { return usPer(r.cpu.nodes, r) }
	for _, clients := range []int{1, cfg.clients} {
		base := results[fmt.Sprintf("%s x%d", formName(0), clients)]
		for _, n := range formSizes {
			rs := results[fmt.Sprintf("%s x%d", formName(n), clients)]
			cpuP, cpuN := "–", "–"
			if len(rs) > 0 && rs[0].cpu.measured() {
				cpuP, cpuN = cell(rs, "%.1f", proxy), cell(rs, "%.1f", nodes)
			}
			fmt.Fprintf(w, "| %s | %d | %s | %s | %s | %s | %s | %s | %s |\n", formName(n), clients, cell(rs, "%.0f", rate), ratio(rs, base, rate),
				cell(rs, "%.2f", acq), cell(rs, "%.2f", msOf(0.5)), cell(rs, "%.2f", msOf(0.99)), cpuP, cpuN)
		}
	}
}
