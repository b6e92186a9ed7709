package resp

import (
	"context"
	"fmt"
	"iter"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// KeySpec is where a command's keys stand, as COMMAND reports it.
type KeySpec struct {
	First, Last, Step int
	Movable           bool // only COMMAND GETKEYS can tell
	Container         bool // the keys depend on the subcommand
	Keyspace          bool // flagged readonly, write or may_replicate
	Write, Readonly   bool // flagged write, readonly (FENCED)
	Blocking          bool // flagged blocking (FENCED)
	Arity             int  // as COMMAND reports it (FENCED)
}

// All yields the arguments of args at the positions the spec gives
// (First, Last, Step; a negative Last counts from the end), for a
// command whose keys do not move.
func (spec KeySpec) All(args [][]byte) iter.Seq[[]byte] {
	return func(yield func([]byte) bool) {
		if spec.First <= 0 {
			return
		}
		last := spec.Last
		if last < 0 {
			last += len(args)
		}
		step := max(spec.Step, 1)
		for i := spec.First; i <= last && i < len(args); i += step {
			if !yield(args[i]) {
				return
			}
		}
	}
}

// Keys appends to dst the keys All yields.
func (spec KeySpec) Keys(dst [][]byte, args [][]byte) [][]byte {
	for k := range spec.All(args) {
		dst = append(dst, k)
	}
	return dst
}

// Table is a backend's COMMAND table, loaded once, at its first use;
// a load that fails is tried again at the next.
type Table struct {
	// table is read without a lock by every forwarded command. It is
	// never changed once stored.
	table atomic.Pointer[map[string]KeySpec]
	// load serialises loading the table, so that clients arriving before
	// it is loaded wait for one COMMAND instead of each sending their own.
	load sync.Mutex
}

// Get returns the table, loading it with command (which sends COMMAND)
// when it has none yet.
func (t *Table) Get(ctx context.Context, command func(context.Context) (any, error)) (map[string]KeySpec, error) {
	if m := t.table.Load(); m != nil {
		return *m, nil
	}
	t.load.Lock()
	defer t.load.Unlock()
	if m := t.table.Load(); m != nil {
		return *m, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	v, err := command(ctx)
	if err != nil {
		return nil, fmt.Errorf("COMMAND: %w", err)
	}
	reply, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("COMMAND: a %T instead of an array", v)
	}
	m := make(map[string]KeySpec, len(reply)*2)
	for _, c := range reply {
		addSpec(m, c)
	}
	t.table.Store(&m)
	return m, nil
}

// Loaded returns the table if it has been loaded, without loading it.
func (t *Table) Loaded() (map[string]KeySpec, bool) {
	if m := t.table.Load(); m != nil {
		return *m, true
	}
	return nil, false
}

// LookupSpec finds the entry of the command args (named name, in lower
// case) in a COMMAND table: a container command's (CONFIG, XINFO, ...) is
// its subcommand's.
func LookupSpec(table map[string]KeySpec, name []byte, args [][]byte) (KeySpec, bool) {
	spec, ok := table[string(name)]
	if ok && spec.Container && len(args) > 1 {
		var sb [24]byte
		sub := Lower(&sb, args[1])
		spec, ok = table[string(name)+"|"+string(sub)]
	}
	return spec, ok
}

// addSpec adds one COMMAND entry: name, arity, flags, first key, last key,
// step, and from Redis 7 on, the subcommands as entries of the same shape.
func addSpec(table map[string]KeySpec, c any) {
	e, ok := c.([]any)
	if len(e) < 6 || !ok {
		return
	}
	name, _ := e[0].(string)
	first, _ := e[3].(int64)
	last, _ := e[4].(int64)
	step, _ := e[5].(int64)
	arity, _ := e[1].(int64)
	spec := KeySpec{First: int(first), Last: int(last), Step: int(step), Arity: int(arity)}
	if flags, ok := e[2].([]any); ok {
		for _, f := range flags {
			switch f {
			case "movablekeys":
				spec.Movable = true
			case "readonly", "write", "may_replicate":
				spec.Keyspace = true
			}
			switch f {
			case "write":
				spec.Write = true
			case "readonly":
				spec.Readonly = true
			case "blocking":
				spec.Blocking = true
			}
		}
	}
	if len(e) >= 10 {
		if subs, ok := e[9].([]any); ok && len(subs) > 0 {
			spec.Container = true
			for _, s := range subs {
				addSpec(table, s)
			}
		}
	}
	table[strings.ToLower(name)] = spec
}

// MovableKeys returns the keys of a command whose keys move that the
// proxy finds without asking Redis (COMMAND GETKEYS), and reports whether
// it does: MIGRATE, whose AUTH and AUTH2 options carry a password that a
// COMMAND GETKEYS would show unredacted in the backend's SLOWLOG and
// MONITOR, where MIGRATE itself shows "(redacted)". name is in lower case.
// The keys are those COMMAND GETKEYS gives: the key argument, or with an
// empty one, every argument after a KEYS option; none when both are given.
func MovableKeys(name []byte, args [][]byte) ([][]byte, bool) {
	if string(name) != "migrate" {
		return nil, false
	}
	if len(args) < 6 {
		return nil, true // Redis refuses it: no keys
	}
	for i := 6; i < len(args); i++ {
		if strings.EqualFold(string(args[i]), "keys") {
			if len(args[3]) != 0 {
				return nil, true // Redis refuses a key with KEYS
			}
			return args[i+1:], true
		}
	}
	return args[3:4], true
}
