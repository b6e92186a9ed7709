package cluster

import (
	"bytes"
	"context"
	"errors"
	"math"
	"slices"
	"strconv"

	"github.com/redis/go-redis/v9"
	"github.com/tidwall/redcon"

	"github.com/lockproxy/lockproxy/proxy/internal/resp"
)

// Set and sorted-set reads across slots, in front of a Redis Cluster.
// SINTER, SUNION, SDIFF, SINTERCARD, ZINTER, ZUNION, ZDIFF and ZINTERCARD
// whose keys are in several slots are answered by the proxy: each key is
// read on its master (SMEMBERS, and ZRANGE ... WITHSCORES for the sorted
// set commands, which also take sets), and the result is computed as
// Redis 7.0 computes it, in the reply Redis sends:
//
//   - ZINTER, ZUNION, ZDIFF: Redis's result is a sorted set, so the order
//     (by score, then member) and the scores (weights, AGGREGATE, NaN as
//     0, Redis's %.17g) are the same bytes as one Redis's;
//   - SINTER: the members of the smallest set in its own order, as Redis
//     walks it; SUNION and SDIFF: sorted by value when Redis's result is
//     an intset (integers only, at most set-max-intset-entries), in the
//     order the proxy met them otherwise, where Redis's own order is that
//     of a hash table (no two Redis processes agree on it either);
//   - the errors as Redis checks them: WRONGTYPE in the order of the keys
//     (SINTER stops at a missing key first), and the options (LIMIT,
//     WEIGHTS, AGGREGATE, WITHSCORES) checked by the node itself: the
//     command is also sent, with every key replaced by one that does not
//     exist, to the master of that key, and its error is the client's.
//
// The keys are read one after the other on their masters: the result is
// not one snapshot of the data set, as an MGET across slots is not. The
// STORE forms (SINTERSTORE, ZUNIONSTORE, ...) write, and stay refused with
// CROSSSLOT: splitting them would show states one Redis never shows.

// joinKind is one of the commands answered here.
type joinKind uint8

const (
	joinSInter joinKind = iota
	joinSUnion
	joinSDiff
	joinSInterCard
	joinZInter
	joinZUnion
	joinZDiff
	joinZInterCard
)

var joinKinds = map[string]joinKind{
	"sinter": joinSInter, "sunion": joinSUnion, "sdiff": joinSDiff, "sintercard": joinSInterCard,
	"zinter": joinZInter, "zunion": joinZUnion, "zdiff": joinZDiff, "zintercard": joinZInterCard,
}

// probeKey stands for every key in the command sent to check its options:
// a key nobody uses, so that the node checks the options and finds no data.
var probeKey = []byte("lockproxy:probe:{options}")

// join is one command answered by joining what its keys hold.
type join struct {
	kind       joinKind
	keys       [][]byte
	limit      int64 // the *CARD commands' LIMIT; 0 for none
	weights    []float64
	agg        byte // 's'um, 'm'in, 'M'ax
	withScores bool
	probe      bool // the command has options, checked by a node
	resp3      bool
	intsetMax  int64 // set-max-intset-entries
}

func (k joinKind) sorted() bool { return k >= joinZInter }
func (k joinKind) card() bool   { return k == joinSInterCard || k == joinZInterCard }

// crossRead plans one of the commands above whose keys are in several
// slots; it reports false for any other command.
func CrossRead(ctx context.Context, r *Router, resp3 bool, m *SlotMap, name []byte, args [][]byte) (Call, bool) {
	switch string(name) {
	case "lcs":
		if len(args) >= 3 {
			return lcsCall(m, args, resp3), true
		}
	case "pfcount":
		return pfcountCall(m, args), true
	}
	kind, ok := joinKinds[string(name)]
	if !ok {
		return Call{}, false
	}
	j := &join{kind: kind, agg: 's', resp3: resp3}
	var rest [][]byte
	switch kind {
	case joinSInter, joinSUnion, joinSDiff:
		j.keys = args[1:]
	default:
		n, err := strconv.Atoi(string(args[1]))
		if err != nil || n < 1 || n > len(args)-2 {
			return Call{}, false // COMMAND GETKEYS refused it: never here
		}
		j.keys, rest = args[2:2+n], args[2+n:]
	}
	j.probe = len(rest) > 0
	for i := 0; i < len(rest); i++ {
		var sb [24]byte
		switch opt := string(resp.Lower(&sb, rest[i])); {
		case opt == "limit" && i+1 < len(rest):
			i++
			j.limit, _ = strconv.ParseInt(string(rest[i]), 10, 64)
		case opt == "weights":
			for ; i+1 < len(rest) && len(j.weights) < len(j.keys); i++ {
				w, _ := strconv.ParseFloat(string(rest[i+1]), 64)
				j.weights = append(j.weights, w)
			}
		case opt == "aggregate" && i+1 < len(rest):
			i++
			switch string(resp.Lower(&sb, rest[i])) {
			case "min":
				j.agg = 'm'
			case "max":
				j.agg = 'M'
			}
		case opt == "withscores":
			j.withScores = true
		}
	}
	if kind == joinSUnion || kind == joinSDiff {
		j.intsetMax = r.intsetEntries(ctx)
	}

	c := Call{Kind: CallMerge}
	if j.probe { // only the commands with numkeys have options
		c.Parts = append(c.Parts, probePart(m, args, 2, 2+len(j.keys)))
	}
	for _, k := range j.keys {
		sl := KeySlot(k)
		if kind.sorted() {
			c.Parts = append(c.Parts, Part{Slot: sl, Addr: m.Master(sl), Raw: command3("ZRANGE", k, "0", "-1", "WITHSCORES")})
		}
		c.Parts = append(c.Parts, Part{Slot: sl, Addr: m.Master(sl), Raw: command3("SMEMBERS", k)})
	}
	c.Fold = j.fold
	return c, true
}

// probePart is the command args with the keys at [from, to) replaced by
// probeKey, for probeKey's master: the node checks the options, and finds
// no data to work on.
func probePart(m *SlotMap, args [][]byte, from, to int) Part {
	raw := redcon.AppendArray(nil, len(args))
	for i, a := range args {
		if i >= from && i < to {
			a = probeKey
		}
		raw = redcon.AppendBulk(raw, a)
	}
	sl := KeySlot(probeKey)
	return Part{Slot: sl, Addr: m.Master(sl), Raw: raw}
}

// command3 encodes a request of a command name, a key and string
// arguments.
func command3(name string, key []byte, rest ...string) []byte {
	b := redcon.AppendArray(nil, 2+len(rest))
	b = redcon.AppendBulkString(b, name)
	b = redcon.AppendBulk(b, key)
	for _, a := range rest {
		b = redcon.AppendBulkString(b, a)
	}
	return b
}

// joinInput is what one key holds: its members in the order its master
// walks them, with their scores for a sorted set (1 for a set).
type joinInput struct {
	members [][]byte
	scores  []float64
	index   map[string]int
}

func (in *joinInput) has(m []byte) (float64, bool) {
	i, ok := in.index[string(m)]
	if !ok {
		return 0, false
	}
	return in.scores[i], true
}

func IsError(r []byte) bool { return len(r) > 0 && (r[0] == '-' || r[0] == '!') }

// fold makes the client's reply from the probe's and the keys' replies.
func (j *join) fold(replies [][]byte) ([]byte, bool) {
	var probeErr []byte
	if j.probe {
		if IsError(replies[0]) {
			probeErr = replies[0]
		}
		replies = replies[1:]
	}
	if probeErr != nil && j.kind.card() {
		return probeErr, true // LIMIT is read before the keys
	}
	per := 1
	if j.kind.sorted() {
		per = 2
	}
	inputs := make([]*joinInput, len(j.keys))
	for i := range j.keys {
		in, errReply := readInput(replies[i*per:(i+1)*per], j.kind.sorted())
		if errReply != nil {
			return errReply, true // Redis looks at every key's type first
		}
		inputs[i] = in
	}
	if probeErr != nil {
		return probeErr, true
	}
	switch j.kind {
	case joinSInter, joinSInterCard:
		return j.inter(inputs), false
	case joinSUnion, joinSDiff:
		return j.unionDiff(inputs), false
	}
	return j.zset(inputs), false
}

// readInput reads one key's replies: SMEMBERS, or ZRANGE WITHSCORES and
// SMEMBERS. It returns nil for a missing key, or the error to answer.
func readInput(replies [][]byte, sorted bool) (*joinInput, []byte) {
	in := &joinInput{index: map[string]int{}}
	set := replies[len(replies)-1]
	if sorted && !IsError(replies[0]) {
		vals, err := scalars(nil, replies[0])
		if err != nil {
			return nil, resp.ErrorReply(err)
		}
		for i := 0; i+1 < len(vals); i += 2 {
			f, err := strconv.ParseFloat(string(vals[i+1]), 64)
			if err != nil {
				return nil, resp.ErrorReply(err)
			}
			in.add(vals[i], f)
		}
		if len(in.members) > 0 {
			return in, nil
		}
	}
	if IsError(set) {
		if sorted {
			return nil, replies[0]
		}
		return nil, set
	}
	vals, err := scalars(nil, set)
	if err != nil {
		return nil, resp.ErrorReply(err)
	}
	for _, v := range vals {
		in.add(v, 1)
	}
	if len(in.members) == 0 {
		return nil, nil
	}
	return in, nil
}

func (in *joinInput) add(m []byte, score float64) {
	in.index[string(m)] = len(in.members)
	in.members = append(in.members, m)
	in.scores = append(in.scores, score)
}

func (j *join) setType() byte {
	if j.resp3 {
		return '~'
	}
	return '*'
}

func (j *join) emptySet() []byte {
	if j.kind.card() {
		return []byte(":0\r\n")
	}
	if j.kind.sorted() {
		return []byte("*0\r\n")
	}
	return []byte{j.setType(), '0', '\r', '\n'}
}

// bySize returns the inputs from the smallest to the largest (a missing
// key is empty), keeping the keys' order among equals, as Redis sorts
// them before it intersects or unites.
func bySize(inputs []*joinInput) []*joinInput {
	out := slices.Clone(inputs)
	slices.SortStableFunc(out, func(a, b *joinInput) int { return size(a) - size(b) })
	return out
}

func size(in *joinInput) int {
	if in == nil {
		return 0
	}
	return len(in.members)
}

// inter answers SINTER and SINTERCARD.
func (j *join) inter(inputs []*joinInput) []byte {
	sets := bySize(inputs)
	if sets[0] == nil {
		return j.emptySet()
	}
	var out [][]byte
	count := int64(0)
	for _, m := range sets[0].members {
		in := true
		for _, other := range sets[1:] {
			if _, ok := other.has(m); !ok {
				in = false
				break
			}
		}
		if !in {
			continue
		}
		count++
		out = append(out, m)
		if j.limit > 0 && count >= j.limit {
			break
		}
	}
	if j.kind == joinSInterCard {
		return redcon.AppendInt(nil, count)
	}
	return appendMembers(j.setType(), out)
}

// unionDiff answers SUNION and SDIFF.
func (j *join) unionDiff(inputs []*joinInput) []byte {
	var out [][]byte
	seen := map[string]bool{}
	if j.kind == joinSUnion {
		for _, in := range inputs {
			for _, m := range members(in) {
				if !seen[string(m)] {
					seen[string(m)] = true
					out = append(out, m)
				}
			}
		}
		return appendMembers(j.setType(), j.intsetOrder(out))
	}
	first := inputs[0]
	for _, m := range members(first) {
		in := false
		for _, other := range inputs[1:] {
			if other == nil {
				continue
			}
			if _, ok := other.has(m); ok {
				in = true
				break
			}
		}
		if !in {
			out = append(out, m)
		}
	}
	// Redis builds the difference either from the members that remain
	// or by removing from all of the first set's, whichever is less work;
	// the result is an intset when what it was built from was one.
	built := out
	if first != nil {
		one, two := 0, 0
		for _, in := range inputs {
			if in != nil {
				one += len(first.members)
				two += len(in.members)
			}
		}
		if one/2 > two {
			built = first.members
		}
	}
	if j.isIntset(built) {
		sortInts(out)
	}
	return appendMembers(j.setType(), out)
}

func members(in *joinInput) [][]byte {
	if in == nil {
		return nil
	}
	return in.members
}

// intsetOrder sorts the members of a result Redis holds as an intset.
func (j *join) intsetOrder(out [][]byte) [][]byte {
	if j.isIntset(out) {
		sortInts(out)
	}
	return out
}

// isIntset reports whether Redis would hold these members as an intset:
// all integers written as Redis writes them, and not too many.
func (j *join) isIntset(ms [][]byte) bool {
	if int64(len(ms)) > j.intsetMax {
		return false
	}
	for _, m := range ms {
		n, err := strconv.ParseInt(string(m), 10, 64)
		if err != nil || strconv.FormatInt(n, 10) != string(m) {
			return false
		}
	}
	return true
}

func sortInts(ms [][]byte) {
	slices.SortFunc(ms, func(a, b []byte) int {
		x, _ := strconv.ParseInt(string(a), 10, 64)
		y, _ := strconv.ParseInt(string(b), 10, 64)
		return cmpInt(x, y)
	})
}

func appendMembers(typ byte, ms [][]byte) []byte {
	b := append([]byte{typ}, strconv.Itoa(len(ms))...)
	b = append(b, '\r', '\n')
	for _, m := range ms {
		b = redcon.AppendBulk(b, m)
	}
	return b
}

// zset answers ZINTER, ZUNION, ZDIFF and ZINTERCARD as Redis computes
// them (zunionInterDiffGenericCommand): weighted scores with NaN taken as
// 0, aggregated in the order of the inputs from the smallest, and the
// result ordered by score, then member.
func (j *join) zset(inputs []*joinInput) []byte {
	weight := func(i int) float64 {
		if i < len(j.weights) {
			return j.weights[i]
		}
		return 1
	}
	type src struct {
		in *joinInput
		w  float64
	}
	srcs := make([]src, len(inputs))
	for i, in := range inputs {
		srcs[i] = src{in, weight(i)}
	}
	if j.kind != joinZDiff {
		slices.SortStableFunc(srcs, func(a, b src) int { return size(a.in) - size(b.in) })
	}
	var res joinInput
	res.index = map[string]int{}
	switch j.kind {
	case joinZInter, joinZInterCard:
		if srcs[0].in == nil {
			break
		}
		for k, m := range srcs[0].in.members {
			score := nanZero(srcs[0].w * srcs[0].in.scores[k])
			in := true
			for _, o := range srcs[1:] {
				if o.in == nil {
					in = false
					break
				}
				v, ok := o.in.has(m)
				if !ok {
					in = false
					break
				}
				score = j.aggregate(score, v*o.w)
			}
			if !in {
				continue
			}
			res.add(m, score)
			if j.kind == joinZInterCard && j.limit > 0 && int64(len(res.members)) >= j.limit {
				break
			}
		}
		if j.kind == joinZInterCard {
			return redcon.AppendInt(nil, int64(len(res.members)))
		}
	case joinZUnion:
		for _, s := range srcs {
			if s.in == nil {
				continue
			}
			for k, m := range s.in.members {
				score := nanZero(s.w * s.in.scores[k])
				if i, ok := res.index[string(m)]; ok {
					res.scores[i] = j.aggregate(res.scores[i], score)
				} else {
					res.add(m, score)
				}
			}
		}
	case joinZDiff:
		if srcs[0].in == nil {
			break
		}
		for k, m := range srcs[0].in.members {
			in := false
			for _, o := range srcs[1:] {
				if o.in == nil {
					continue
				}
				if _, ok := o.in.has(m); ok {
					in = true
					break
				}
			}
			if !in {
				res.add(m, srcs[0].in.scores[k])
			}
		}
	}
	order := make([]int, len(res.members))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int {
		if sa, sb := res.scores[a], res.scores[b]; sa != sb {
			if sa < sb {
				return -1
			}
			return 1
		}
		return bytes.Compare(res.members[a], res.members[b])
	})
	n := len(order)
	if j.withScores && !j.resp3 {
		n *= 2
	}
	b := redcon.AppendArray(nil, n)
	for _, i := range order {
		if j.withScores && j.resp3 {
			b = redcon.AppendArray(b, 2)
		}
		b = redcon.AppendBulk(b, res.members[i])
		if j.withScores {
			b = appendScore(b, res.scores[i], j.resp3)
		}
	}
	return b
}

func nanZero(f float64) float64 {
	if math.IsNaN(f) {
		return 0
	}
	return f
}

// aggregate folds v into t as AGGREGATE says (zunionInterAggregate).
func (j *join) aggregate(t, v float64) float64 {
	switch j.agg {
	case 'm':
		if v < t {
			return v
		}
	case 'M':
		if v > t {
			return v
		}
	default:
		return nanZero(t + v)
	}
	return t
}

// appendScore writes a score as Redis 7.0 does: a bulk string in RESP2, a
// double in RESP3, with %.17g (inf and -inf spelled so).
func appendScore(b []byte, f float64, resp3 bool) []byte {
	var s string
	switch {
	case math.IsInf(f, 1):
		s = "inf"
	case math.IsInf(f, -1):
		s = "-inf"
	case math.IsNaN(f):
		s = "nan"
	default:
		s = strconv.FormatFloat(f, 'g', 17, 64)
	}
	if resp3 {
		return append(append(append(b, ','), s...), '\r', '\n')
	}
	return redcon.AppendBulkString(b, s)
}

// scalars appends the payloads of the scalar values of reply r (bulk,
// simple and verbatim strings, numbers), walking into aggregates, and
// checks that r is one whole reply.
func scalars(dst [][]byte, r []byte) ([][]byte, error) {
	dst, rest, err := scalarsAt(dst, r)
	if err == nil && len(rest) > 0 {
		err = errors.New("trailing bytes after a reply")
	}
	return dst, err
}

func scalarsAt(dst [][]byte, r []byte) ([][]byte, []byte, error) {
	i := bytes.IndexByte(r, '\n')
	if i < 2 || r[i-1] != '\r' {
		return dst, nil, errors.New("truncated reply")
	}
	line := r[1 : i-1]
	switch r[0] {
	case '+', ':', ',', '(', '#':
		return append(dst, line), r[i+1:], nil
	case '_':
		return dst, r[i+1:], nil
	case '$', '=':
		n, ok := resp.ParseLength(r[1 : i+1])
		if !ok || n < 0 {
			return dst, r[i+1:], nil // a null
		}
		end := i + 1 + int(n)
		if end+2 > len(r) {
			return dst, nil, errors.New("truncated reply")
		}
		v := r[i+1 : end]
		if r[0] == '=' && len(v) >= 4 {
			v = v[4:]
		}
		return append(dst, v), r[end+2:], nil
	case '*', '~', '%', '>':
		n, ok := resp.ParseLength(r[1 : i+1])
		if !ok {
			return dst, nil, errors.New("bad length")
		}
		if r[0] == '%' {
			n *= 2
		}
		r = r[i+1:]
		for range max(n, 0) {
			var err error
			if dst, r, err = scalarsAt(dst, r); err != nil {
				return dst, nil, err
			}
		}
		return dst, r, nil
	}
	return dst, nil, errors.New("unexpected reply " + strconv.Quote(string(line)))
}

// intsetEntries returns the cluster's set-max-intset-entries (Redis's
// default, 512, when no node answers), read once and again after a CONFIG
// SET through the proxy.
func (r *Router) intsetEntries(ctx context.Context) int64 {
	if n := r.intsetMax.Load(); n > 0 {
		return n
	}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	v, err := r.do(ctx, "CONFIG", "GET", "set-max-intset-entries")
	n := int64(512)
	var s string
	switch v := v.(type) {
	case []any:
		if len(v) == 2 {
			s, _ = v[1].(string)
		}
	case map[any]any:
		s, _ = v["set-max-intset-entries"].(string)
	}
	if x, perr := strconv.ParseInt(s, 10, 64); perr == nil && x > 0 {
		n = x
	}
	var rerr redis.Error
	if err == nil || errors.As(err, &rerr) {
		r.intsetMax.Store(n)
	}
	return n
}
