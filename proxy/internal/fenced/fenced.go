package fenced

import (
	"bytes"
	"fmt"
	"strconv"
	"sync"

	"github.com/lockproxy/lockproxy/proxy/internal/cluster"
	"github.com/lockproxy/lockproxy/proxy/internal/resp"
)

// Request is a parsed FENCED.
type Request struct {
	Resource []byte
	Fence    int64
	Slot     int64    // the PERMIT slot, -1 without PERMIT
	Command  [][]byte // the command to run, its name first
}

// Outcome is what became of one FENCED.
type Outcome int

// The outcomes of FENCED.
const (
	Accepted   Outcome = iota // the command ran
	Stale                     // -STALEFENCE, nothing ran
	Failed                    // the backend was unavailable or refused the command before running it
	BadRequest                // -ERR before anything was sent
)

// Prefix starts the name of every fence record. Forwarded commands
// cannot reach keys with this prefix (GuardSpec).
const Prefix = "lockproxy:fence:"

// tries bounds how often a FENCED is sent again after its EXEC
// found the record changed by another FENCED meanwhile.
const tries = 64

// refusedInner are the commands FENCED never runs, whatever the COMMAND
// table says, and why.
var refusedInner = map[string]string{
	"multi": "a transaction command", "exec": "a transaction command", "discard": "a transaction command",
	"watch": "a transaction command", "unwatch": "a transaction command",
	"subscribe": "a subscription", "psubscribe": "a subscription", "ssubscribe": "a subscription",
	"unsubscribe": "a subscription", "punsubscribe": "a subscription", "sunsubscribe": "a subscription",
	"monitor": "MONITOR", "sync": "replication", "psync": "replication", "replconf": "replication",
	"wait": "a command that can block", "waitaof": "a command that can block",
	"fenced": "the proxy's own command",
}

// Refuses returns why FENCED never runs the command name (lower case),
// whatever the COMMAND table says; ok is false for the others.
func Refuses(name string) (why string, ok bool) {
	why, ok = refusedInner[name]
	return why, ok
}

// Plan is what a FENCED runs, once its arguments are checked. Exec and
// Probe fill in RefusedReply.
type Plan struct {
	Req    Request
	Name   string // the inner command's, lower case
	Raw    []byte // the inner command, encoded
	Write  bool
	Keys   [][]byte
	Slot   int // the keys' hash slot in front of a cluster, else cluster.NoSlot
	Record []byte
	// refusedReply is set to the error that refused the command before
	// it ran.
	RefusedReply []byte
}

// ArityOK reports whether n arguments (the name included) fit arity as
// COMMAND reports it: exactly arity, or at least -arity.
func ArityOK(arity, n int) bool {
	if arity >= 0 {
		return n == arity
	}
	return n >= -arity
}

// Blocking reports whether a command can block: flagged so, except
// XREAD and XREADGROUP, which block only with BLOCK.
func Blocking(name string, spec resp.KeySpec, args [][]byte) bool {
	switch name {
	case "xread", "xreadgroup":
		for _, a := range args[1:] {
			if bytes.EqualFold(a, []byte("streams")) {
				return false
			}
			if bytes.EqualFold(a, []byte("block")) {
				return true
			}
		}
		return false
	}
	return spec.Blocking
}

// RecordKey is the name of a fence record: the resource's, or one of its
// semaphore slots' (permit >= 0); in front of a cluster (slot >= 0) with
// a hash tag that puts it in the hash slot of the command's keys.
func RecordKey(resource []byte, permit int64, slot int) []byte {
	b := make([]byte, 0, len(Prefix)+len(resource)+16)
	b = append(b, Prefix...)
	if slot >= 0 {
		b = append(b, '{')
		b = append(b, slotTags()[slot]...)
		b = append(b, '}')
	}
	if permit >= 0 {
		b = append(b, 'p')
		b = strconv.AppendInt(b, permit, 10)
	} else {
		b = append(b, 'r')
	}
	b = append(b, ':')
	return append(b, resource...)
}

// slotTags are, for each hash slot, a short string whose hash slot it is.
var slotTags = sync.OnceValue(func() *[cluster.NumSlots]string {
	var tags [cluster.NumSlots]string
	left := cluster.NumSlots
	for i := 0; left > 0; i++ {
		t := strconv.FormatInt(int64(i), 36)
		slot := cluster.KeySlot([]byte(t))
		if tags[slot] == "" {
			tags[slot] = t
			left--
		}
	}
	return &tags
})

// RecordError refuses a command that would change a fence record: only
// FENCED changes them.
type RecordError struct{ Key string }

// Error says which key is a fence record.
func (e *RecordError) Error() string {
	return fmt.Sprintf("key '%s' is a fence record: only FENCED changes it", e.Key)
}

// GuardSpec refuses args, whose argument hit has the records' prefix,
// unless the command only reads or names no record as a key.
func GuardSpec(spec resp.KeySpec, args [][]byte, hit int) error {
	if spec.Readonly {
		return nil
	}
	if spec.Movable {
		return &RecordError{Key: string(args[hit])}
	}
	for _, k := range spec.Keys(nil, args) {
		if bytes.HasPrefix(k, []byte(Prefix)) {
			return &RecordError{Key: string(k)}
		}
	}
	return nil
}
