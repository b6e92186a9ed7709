package cluster

import (
	"bytes"
	"cmp"
	"errors"
	"slices"
	"strconv"

	"github.com/tidwall/redcon"

	"github.com/lockproxy/lockproxy/proxy/internal/resp"
)

// LATENCY HISTOGRAM in front of a cluster: every master's reply, merged
// into what one Redis that ran every command would answer. For each
// command, the calls are summed and the cumulative histograms added
// bucket by bucket (a master's count at a bucket is its count at the
// last bucket it reported up to there, as each reports only the buckets
// where its count grows). A command the proxy sends to every master
// (CONFIG SET, CONFIG RESETSTAT, ...: resp.Fanned) ran once for the
// client and counts once: the first master's entry is taken.

// latencyEntry is one command's histogram: its calls and cumulative
// counts by bucket, in increasing buckets.
type latencyEntry struct {
	calls   int64
	buckets []int64
	counts  []int64
}

// errLatencyReply reports a LATENCY HISTOGRAM reply of unexpected shape.
var errLatencyReply = errors.New("unexpected LATENCY HISTOGRAM reply")

// parseLatency reads a master's LATENCY HISTOGRAM reply, in its order.
func parseLatency(b []byte) (names []string, entries map[string]*latencyEntry, err error) {
	n, rest, err := elements(asArray(b))
	if err != nil {
		return nil, nil, err
	}
	if b[0] == '*' {
		n /= 2
	}
	entries = map[string]*latencyEntry{}
	for range n {
		name, k, err := bulkAt(rest)
		if err != nil {
			return nil, nil, err
		}
		rest = rest[k:]
		k, err = valueLen(rest)
		if err != nil {
			return nil, nil, err
		}
		e, err := parseLatencyEntry(rest[:k])
		if err != nil {
			return nil, nil, err
		}
		rest = rest[k:]
		names = append(names, name)
		entries[name] = e
	}
	return names, entries, nil
}

// parseLatencyEntry reads one command's {calls, histogram_usec}.
func parseLatencyEntry(b []byte) (*latencyEntry, error) {
	_, rest, err := elements(asArray(b))
	if err != nil {
		return nil, err
	}
	e := &latencyEntry{}
	for len(rest) > 0 {
		field, k, err := bulkAt(rest)
		if err != nil {
			return nil, err
		}
		rest = rest[k:]
		k, err = valueLen(rest)
		if err != nil {
			return nil, err
		}
		v := rest[:k]
		rest = rest[k:]
		switch field {
		case "calls":
			e.calls, err = IntAt(v)
			if err != nil {
				return nil, err
			}
		case "histogram_usec":
			_, hs, err := elements(asArray(v))
			if err != nil {
				return nil, err
			}
			for len(hs) > 0 {
				bucket, err := IntAt(hs)
				if err != nil {
					return nil, err
				}
				k, _ := valueLen(hs)
				hs = hs[k:]
				count, err := IntAt(hs)
				if err != nil {
					return nil, err
				}
				k, _ = valueLen(hs)
				hs = hs[k:]
				e.buckets = append(e.buckets, bucket)
				e.counts = append(e.counts, count)
			}
		}
	}
	return e, nil
}

// asArray returns b with a map's header read as an array's (its count
// then being of pairs).
func asArray(b []byte) []byte {
	if len(b) > 0 && b[0] == '%' {
		return append([]byte{'*'}, b[1:]...)
	}
	return b
}

// bulkAt returns the bulk string at the start of b and its length.
func bulkAt(b []byte) (string, int, error) {
	k, err := valueLen(b)
	if err != nil || len(b) == 0 || b[0] != '$' {
		return "", 0, errLatencyReply
	}
	i := bytes.IndexByte(b, '\n')
	return string(b[i+1 : k-2]), k, nil
}

// intAt returns the integer at the start of b.
func IntAt(b []byte) (int64, error) {
	if len(b) == 0 || b[0] != ':' {
		return 0, errLatencyReply
	}
	i := bytes.IndexByte(b, '\r')
	if i < 0 {
		return 0, errLatencyReply
	}
	return strconv.ParseInt(string(b[1:i]), 10, 64)
}

// add adds o's histogram to e's.
func (e *latencyEntry) add(o *latencyEntry) {
	buckets := slices.Clone(e.buckets)
	for _, b := range o.buckets {
		if !slices.Contains(buckets, b) {
			buckets = append(buckets, b)
		}
	}
	slices.Sort(buckets)
	at := func(x *latencyEntry, b int64) int64 {
		var c int64
		for i, xb := range x.buckets {
			if xb > b {
				break
			}
			c = x.counts[i]
		}
		return c
	}
	counts := make([]int64, len(buckets))
	for i, b := range buckets {
		counts[i] = at(e, b) + at(o, b)
	}
	e.calls += o.calls
	e.buckets, e.counts = buckets, counts
}

// mergeLatencyHistogram merges the masters' LATENCY HISTOGRAM replies.
func mergeLatencyHistogram(replies [][]byte) ([]byte, bool) {
	return allOK(replies, func() []byte {
		var order []string
		merged := map[string]*latencyEntry{}
		for i, r := range replies {
			names, entries, err := parseLatency(r)
			if err != nil {
				return resp.ErrorReply(err)
			}
			for _, name := range names {
				e := entries[name]
				have := merged[name]
				switch {
				case have == nil:
					order = append(order, name)
					merged[name] = e
				case i > 0 && fannedName(name):
					// Counted once: the first master's.
				default:
					have.add(e)
				}
			}
		}
		resp3 := len(replies[0]) > 0 && replies[0][0] == '%'
		var out []byte
		if resp3 {
			out = appendMapHeader(out, len(order))
		} else {
			out = redcon.AppendArray(out, 2*len(order))
		}
		for _, name := range order {
			e := merged[name]
			out = redcon.AppendBulkString(out, name)
			if resp3 {
				out = appendMapHeader(out, 2)
			} else {
				out = redcon.AppendArray(out, 4)
			}
			out = redcon.AppendBulkString(out, "calls")
			out = redcon.AppendInt(out, e.calls)
			out = redcon.AppendBulkString(out, "histogram_usec")
			var prev int64
			var pairs [][2]int64
			for i, b := range e.buckets {
				if e.counts[i] > prev {
					pairs = append(pairs, [2]int64{b, e.counts[i]})
				}
				prev = e.counts[i]
			}
			if resp3 {
				out = appendMapHeader(out, len(pairs))
			} else {
				out = redcon.AppendArray(out, 2*len(pairs))
			}
			for _, p := range pairs {
				out = redcon.AppendInt(out, p[0])
				out = redcon.AppendInt(out, p[1])
			}
		}
		return out
	})
}

// appendMapHeader appends a RESP3 map header of n pairs.
func appendMapHeader(b []byte, n int) []byte {
	return append(strconv.AppendInt(append(b, '%'), int64(n), 10), '\r', '\n')
}

// fannedName reports whether a command named as LATENCY HISTOGRAM names
// it ("config|set") is one the proxy sends to every master.
func fannedName(name string) bool {
	cmd, sub, _ := bytes.Cut([]byte(name), []byte("|"))
	args := [][]byte{cmd}
	if len(sub) > 0 {
		args = append(args, sub)
	}
	return resp.Of(cmd, args).Has(resp.Fanned)
}

// LATENCY LATEST and LATENCY HISTORY in front of a cluster: every
// master's events, as one Redis that had them all would report them. For
// LATEST, an event's entry is the one with the latest timestamp, with the
// largest maximum of all the masters'; for HISTORY, the masters' samples
// in time order (the newest 160 when there are more, as one Redis
// keeps).

// latencyHistoryMax is how many samples one Redis keeps per event.
const latencyHistoryMax = 160

// mergeLatencyLatest merges the masters' LATENCY LATEST replies.
func mergeLatencyLatest(replies [][]byte) ([]byte, bool) {
	return allOK(replies, func() []byte {
		type latest struct {
			name              []byte
			at, last, highest int64
		}
		var order []string
		byName := map[string]*latest{}
		err := eachRow(replies, func(e []byte) error {
			name, kn, err := bulkAt(e)
			if err != nil {
				return err
			}
			e = e[kn:]
			var v [3]int64
			for i := range v {
				if v[i], err = IntAt(e); err != nil {
					return err
				}
				kv, _ := valueLen(e)
				e = e[kv:]
			}
			l := byName[name]
			if l == nil {
				order = append(order, name)
				byName[name] = &latest{name: []byte(name), at: v[0], last: v[1], highest: v[2]}
				return nil
			}
			if v[0] > l.at {
				l.at, l.last = v[0], v[1]
			}
			l.highest = max(l.highest, v[2])
			return nil
		})
		if err != nil {
			return resp.ErrorReply(err)
		}
		out := redcon.AppendArray(nil, len(order))
		for _, name := range order {
			l := byName[name]
			out = redcon.AppendArray(out, 4)
			out = redcon.AppendBulk(out, l.name)
			out = redcon.AppendInt(out, l.at)
			out = redcon.AppendInt(out, l.last)
			out = redcon.AppendInt(out, l.highest)
		}
		return out
	})
}

// mergeLatencyHistory merges the masters' LATENCY HISTORY replies.
func mergeLatencyHistory(replies [][]byte) ([]byte, bool) {
	return allOK(replies, func() []byte {
		var samples [][2]int64
		err := eachRow(replies, func(e []byte) error {
			at, err := IntAt(e)
			if err != nil {
				return err
			}
			kv, _ := valueLen(e)
			ms, err := IntAt(e[kv:])
			if err != nil {
				return err
			}
			samples = append(samples, [2]int64{at, ms})
			return nil
		})
		if err != nil {
			return resp.ErrorReply(err)
		}
		slices.SortStableFunc(samples, func(a, b [2]int64) int { return cmp.Compare(a[0], b[0]) })
		if len(samples) > latencyHistoryMax {
			samples = samples[len(samples)-latencyHistoryMax:]
		}
		out := redcon.AppendArray(nil, len(samples))
		for _, s := range samples {
			out = redcon.AppendArray(out, 2)
			out = redcon.AppendInt(out, s[0])
			out = redcon.AppendInt(out, s[1])
		}
		return out
	})
}

// eachRow calls row with the elements of each array in each master's
// reply, an array of arrays (LATENCY LATEST's events, HISTORY's samples),
// and stops at the first error.
func eachRow(replies [][]byte, row func(e []byte) error) error {
	for _, r := range replies {
		n, rest, err := elements(r)
		if err != nil {
			return err
		}
		for range n {
			k, err := valueLen(rest)
			if err != nil {
				return err
			}
			_, e, err := elements(rest[:k])
			rest = rest[k:]
			if err != nil {
				return err
			}
			if err := row(e); err != nil {
				return err
			}
		}
	}
	return nil
}
