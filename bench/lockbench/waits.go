package main

import (
	"fmt"
	"io"
)

// printWaits reports the proxy's contended LOCK ... WAIT alone (-only
// waits): the contended scenario without redsync's side, for an A/B of two
// builds of the proxy.
func printWaits(w io.Writer, cfg config, px []result) {
	fmt.Fprintf(w, "\n#### LOCK ... WAIT, contended: %d clients, one resource, held %v (%d rounds × %v, median (min–max))\n\n",
		cfg.contenders, cfg.hold, cfg.rounds, cfg.contDur)
	fmt.Fprintln(w, "| metric | lockproxy LOCK ... WAIT |")
	fmt.Fprintln(w, "|---|---|")
	fmt.Fprintf(w, "| acquisitions/s | %s |\n", cell(px, "%.0f", func(r result) float64 { return r.rate() }))
	fmt.Fprintf(w, "| wait p50 (ms) | %s |\n", cell(px, "%.2f", msOf(0.5)))
	fmt.Fprintf(w, "| wait p99 (ms) | %s |\n", cell(px, "%.2f", msOf(0.99)))
	gap := func(q float64) func(r result) float64 {
		return func(r result) float64 { return msf(quantile(r.gaps, q)) }
	}
	fmt.Fprintf(w, "| handoff gap p50 (ms) | %s |\n", cell(px, "%.3f", gap(0.5)))
	fmt.Fprintf(w, "| handoff gap p99 (ms) | %s |\n", cell(px, "%.3f", gap(0.99)))
	fmt.Fprintf(w, "| handoff gap mean (ms) | %s |\n", cell(px, "%.3f", func(r result) float64 { return msf(mean(r.gaps)) }))
	fmt.Fprintf(w, "| hold mean (ms) | %s |\n", cell(px, "%.3f", func(r result) float64 { return msf(mean(r.holds)) }))
	fmt.Fprintf(w, "| fairness | %s |\n", cell(px, "%.2f", func(r result) float64 { return r.fairness() }))
	ov := func(r result) int64 { return r.overlaps }
	failed := func(r result) int64 { return r.failed }
	errs := func(r result) int64 { return r.errs }
	fmt.Fprintf(w, "| overlapping holders (must be 0) | %d |\n", sum(px, ov))
	fmt.Fprintf(w, "| LOCK calls that gave up / errors (all rounds) | %d / %d |\n", sum(px, failed), sum(px, errs))
	if len(px) > 0 && px[0].cpu.measured() {
		fmt.Fprintf(w, "| CPU µs per acquisition: lockproxy | %s |\n", cell(px, "%.1f", func(r result) float64 { return usPer(r.cpu.proxy, r) }))
		fmt.Fprintf(w, "| CPU µs per acquisition: the lock nodes | %s |\n", cell(px, "%.1f", func(r result) float64 { return usPer(r.cpu.nodes, r) }))
	}
	printNodeStats(w, px)
}
