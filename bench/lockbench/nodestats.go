package main

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Node calls: what a run asked of the lock nodes, from their INFO
// commandstats read before and after it (-node-stats). The counts do not
// depend on how loaded the machine is, unlike the rates and the CPU times:
// they are what an A/B of two builds on a shared machine can compare
// exactly. Redis's usec per call is its own time inside the command
// (for a script, the whole script), which a loaded machine inflates less
// than the processes' CPU time, but still does.

// nodeStats is the sum over the lock nodes of their commandstats: calls and
// usec per command name (lower case, as INFO names them: "evalsha",
// "publish", ...).
type nodeStats struct {
	calls map[string]int64
	usec  map[string]int64
}

// measured reports whether s is a difference taken around a run.
func (s nodeStats) measured() bool { return s.calls != nil }

// readNodeStats reads and sums the commandstats of every lock node.
func (b *bench) readNodeStats() (nodeStats, error) {
	s := nodeStats{calls: map[string]int64{}, usec: map[string]int64{}}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for i, c := range b.nodes {
		info, err := c.Info(ctx, "commandstats").Result()
		if err != nil {
			return s, fmt.Errorf("lock node %s: INFO commandstats: %w", b.cfg.nodes[i], err)
		}
		if err := parseCommandStats(info, s); err != nil {
			return s, fmt.Errorf("lock node %s: %w", b.cfg.nodes[i], err)
		}
	}
	return s, nil
}

// parseCommandStats adds the lines "cmdstat_NAME:calls=N,usec=U,..." of
// info to s.
func parseCommandStats(info string, s nodeStats) error {
	for line := range strings.SplitSeq(info, "\n") {
		line = strings.TrimSpace(line)
		name, rest, ok := strings.Cut(strings.TrimPrefix(line, "cmdstat_"), ":")
		if !ok || !strings.HasPrefix(line, "cmdstat_") {
			continue
		}
		for field := range strings.SplitSeq(rest, ",") {
			k, v, _ := strings.Cut(field, "=")
			var dst map[string]int64
			switch k {
			case "calls":
				dst = s.calls
			case "usec":
				dst = s.usec
			default:
				continue
			}
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return fmt.Errorf("commandstats %q: %w", line, err)
			}
			dst[name] += n
		}
	}
	return nil
}

// sub returns s less before, leaving out the INFO calls that read them.
func (s nodeStats) sub(before nodeStats, nodes int) nodeStats {
	d := nodeStats{calls: map[string]int64{}, usec: map[string]int64{}}
	for k, v := range s.calls {
		if n := v - before.calls[k]; n > 0 {
			d.calls[k] = n
		}
	}
	for k, v := range s.usec {
		if n := v - before.usec[k]; n > 0 {
			d.usec[k] = n
		}
	}
	// Each node's INFO of the first reading is counted by the second.
	if d.calls["info"] -= int64(nodes); d.calls["info"] <= 0 {
		delete(d.calls, "info")
		delete(d.usec, "info")
	}
	return d
}

// total returns the calls and usec of every command together.
func (s nodeStats) total() (calls, usec int64) {
	for k, v := range s.calls {
		calls += v
		usec += s.usec[k]
	}
	return calls, usec
}

// scripts returns the script calls (EVAL, EVALSHA and FCALL, read-only
// forms included) and their usec.
func (s nodeStats) scripts() (calls, usec int64) {
	for k, v := range s.calls {
		if strings.HasPrefix(k, "eval") || strings.HasPrefix(k, "fcall") {
			calls += v
			usec += s.usec[k]
		}
	}
	return calls, usec
}

// breakdown lists the commands by calls per operation of r, most first:
// "evalsha 3.02, publish 0.51".
func (s nodeStats) breakdown(ops int) string {
	if ops == 0 {
		return ""
	}
	names := make([]string, 0, len(s.calls))
	for k := range s.calls {
		names = append(names, k)
	}
	sort.Slice(names, func(i, j int) bool {
		if s.calls[names[i]] != s.calls[names[j]] {
			return s.calls[names[i]] > s.calls[names[j]]
		}
		return names[i] < names[j]
	})
	parts := make([]string, len(names))
	for i, k := range names {
		parts[i] = fmt.Sprintf("%s %.2f", k, float64(s.calls[k])/float64(ops))
	}
	return strings.Join(parts, ", ")
}

// perOp divides n by r's operations.
func perOp(n int64, r result) float64 {
	if r.ops == 0 {
		return 0
	}
	return float64(n) / float64(r.ops)
}

// nodeSummary is the stderr line's part for the node calls of r.
func (r result) nodeSummary() string {
	if !r.node.measured() {
		return ""
	}
	calls, usec := r.node.total()
	return fmt.Sprintf(" nodes: %.2f calls/op (%s), %.1f usec/op", perOp(calls, r), r.node.breakdown(r.ops), perOp(usec, r))
}

// printNodeStats adds rows of node calls per operation to a table of
// columns rs (each a side's runs), when every run measured them.
func printNodeStats(w io.Writer, cols ...[]result) {
	for _, rs := range cols {
		for _, r := range rs {
			if !r.node.measured() {
				return
			}
		}
	}
	row := func(name string, f func(r result) float64, format string) {
		fmt.Fprintf(w, "| %s |", name)
		for _, rs := range cols {
			fmt.Fprintf(w, " %s |", cell(rs, format, f))
		}
		fmt.Fprintln(w)
	}
	row("node commands per operation, all nodes (INFO commandstats)", func(r result) float64 {
		c, _ := r.node.total()
		return perOp(c, r)
	}, "%.2f")
	row("of those, script calls (EVAL, EVALSHA, FCALL)", func(r result) float64 {
		c, _ := r.node.scripts()
		return perOp(c, r)
	}, "%.2f")
	row("nodes' own usec per operation (commandstats usec)", func(r result) float64 {
		_, u := r.node.total()
		return perOp(u, r)
	}, "%.1f")
}
