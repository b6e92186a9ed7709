package commands

import (
	"context"
	"errors"
	"fmt"
	"strconv"
)

// fencedSpec is FENCED in the table of commands. The proxy runs it on
// the backend (proxy/fenced.go): this package parses its arguments
// (ParseFenced), counts its outcomes (CountFenced) and describes it to
// COMMAND, COMMAND DOCS, INFO and the metrics.
var fencedSpec = spec{
	name: "fenced", arity: -4, flags: []string{"write", "movablekeys"}, acl: []string{"@write", "@slow", "@lock"},
	summary: "Runs the command on the backend only when fence is not below the resource's fence record; a write raises the record to fence. Refused: -STALEFENCE.",
	args: []arg{
		{name: "resource", typ: "string"},
		{name: "fence", typ: "integer"},
		{name: "slot", typ: "integer", token: "PERMIT", optional: true},
		{name: "command", typ: "string"},
		{name: "arg", typ: "string", optional: true, multiple: true},
	},
	outcomes: []outcome{fencedAccepted, fencedStale, fencedError, fencedBadRequest},
	serve:    (*Conn).fenced,
}

// fenced answers FENCED when nothing runs it on a backend: a Handler
// alone has no backend to run the command on.
func (c *Conn) fenced(_ context.Context, dst []byte, args [][]byte, _ bool) []byte {
	if _, err := c.h.ParseFenced(args); err != nil {
		c.h.count(fencedBadRequest)
		return appendErr(dst, err)
	}
	c.h.count(fencedError)
	return appendErr(dst, errors.New("ERR FENCED needs a backend to run its command on"))
}

// Fenced is a parsed FENCED resource fence [PERMIT slot] command [arg ...].
type Fenced struct {
	Resource []byte
	Fence    int64
	// Slot is the semaphore slot of PERMIT, or -1 without it.
	Slot int64
	// Command is the command to run, its name first; it shares the
	// memory of the arguments parsed.
	Command [][]byte
}

// FencedOutcome is what became of one FENCED, for CountFenced.
type FencedOutcome int

const (
	// FencedAccepted: the fence passed and the command ran (whatever
	// its own reply).
	FencedAccepted FencedOutcome = iota
	// FencedStale: refused with -STALEFENCE, nothing ran.
	FencedStale
	// FencedError: the backend could not be asked or refused the command
	// before running it (unknown command, wrong arity, NOPERM ...).
	FencedError
	// FencedBadRequest: refused with -ERR before anything was sent.
	FencedBadRequest
)

// CountFenced counts one FENCED's outcome in lockproxy_commands_total and
// INFO lockproxy (cmd_fenced). It is safe for concurrent use.
func (h *Handler) CountFenced(o FencedOutcome) {
	switch o {
	case FencedAccepted:
		h.count(fencedAccepted)
	case FencedStale:
		h.count(fencedStale)
	case FencedError:
		h.count(fencedError)
	default:
		h.count(fencedBadRequest)
	}
}

// ParseFenced parses FENCED's arguments, args[0] being FENCED itself. The
// errors are the -ERR replies of the contract, before anything is sent:
// wrong arity, a fence that is not an integer from 1 to 2^63-1 written as
// Redis writes integers, a PERMIT slot that is not from 0 to the maximum
// of LOCK ... PERMITS minus one. What the inner command may be is the
// proxy's to check, with the backend's COMMAND table.
func (h *Handler) ParseFenced(args [][]byte) (Fenced, error) {
	if len(args) < 4 {
		return Fenced{}, errArity("fenced")
	}
	f := Fenced{Resource: args[1], Slot: -1}
	fence, ok := redisInt(args[2])
	if !ok || fence < 1 {
		return Fenced{}, errors.New("ERR fence is not a positive integer")
	}
	f.Fence = fence
	rest := args[3:]
	if equalFold(rest[0], "permit") {
		if len(rest) < 3 {
			return Fenced{}, errArity("fenced")
		}
		slot, ok := redisInt(rest[1])
		if !ok || slot < 0 || slot >= h.maxPerm {
			return Fenced{}, fmt.Errorf("ERR PERMIT slot is not an integer from 0 to %d", h.maxPerm-1)
		}
		f.Slot = slot
		rest = rest[2:]
	}
	f.Command = rest
	return f, nil
}

// errArity is Redis's error for a wrong number of arguments.
func errArity(name string) error {
	return fmt.Errorf("ERR wrong number of arguments for '%s' command", name)
}

// redisInt parses b as Redis writes a 64-bit integer: an optional minus,
// digits without a leading zero (0 alone), nothing else.
func redisInt(b []byte) (int64, bool) {
	if len(b) == 0 || len(b) > 20 {
		return 0, false
	}
	digits := b
	if digits[0] == '-' {
		digits = digits[1:]
	}
	if len(digits) == 0 || (digits[0] == '0' && len(b) > 1) {
		return 0, false
	}
	for _, c := range digits {
		if c < '0' || c > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(string(b), 10, 64)
	return n, err == nil
}
