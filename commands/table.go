package commands

import (
	"context"
	"fmt"
	"strings"
)

// spec is one lock command: everything that COMMAND, COMMAND INFO, COMMAND
// COUNT, COMMAND LIST, COMMAND DOCS, dispatch, the metrics and INFO know
// about it. specs is the only list of the commands: a new command is a new
// row, and every place that names the commands follows.
type spec struct {
	name  string // lower case ASCII letters
	arity int    // as in COMMAND INFO: -n means at least n arguments, the name included
	flags []string
	acl   []string // ACL categories, as in COMMAND INFO

	summary string // COMMAND DOCS
	args    []arg  // COMMAND DOCS

	// outcomes are the command's values of the outcome label of
	// lockproxy_commands_total, in the order INFO lists them.
	outcomes []outcome

	// serve answers the command: it appends exactly one reply to dst.
	serve func(c *Conn, ctx context.Context, dst []byte, args [][]byte, resp3 bool) []byte
	// mayWait reports whether the command in args may take longer than
	// its round trips to the lock nodes. nil: never.
	mayWait func(args [][]byte) bool
}

// arg is one argument in COMMAND DOCS.
type arg struct {
	name, typ, token string
	optional         bool
	multiple         bool // the argument may repeat
}

// specs are the commands a Handler answers.
var specs = [...]spec{
	{
		name: "lock", arity: -3, flags: []string{"write"}, acl: []string{"@write", "@slow", "@lock"},
		summary: "Acquires a distributed lock on the resource for ttl-ms, as Redlock across the lock nodes.",
		args: []arg{
			{name: "resource", typ: "string"},
			{name: "ttl-ms", typ: "integer"},
			{name: "timeout-ms", typ: "integer", token: "WAIT", optional: true},
			{name: "token", typ: "string", token: "TOKEN", optional: true},
			{name: "keepalive", typ: "pure-token", token: "KEEPALIVE", optional: true},
			{name: "k", typ: "integer", token: "PERMITS", optional: true},
			{name: "reentrant", typ: "pure-token", token: "REENTRANT", optional: true},
		},
		outcomes: []outcome{lockAcquired, lockNotAcquired, lockNoQuorum, lockError, lockBadRequest},
		serve:    (*Conn).lock,
		mayWait:  lockMayWait,
	},
	{
		name: "unlock", arity: -2, flags: []string{"write"}, acl: []string{"@write", "@slow", "@lock"},
		summary: "Releases the lock on the resource where the token still owns it; of a reentrant lock, one hold (HOLD n: the hold of the LOCK that replied n holds, idempotent).",
		args: []arg{
			{name: "resource", typ: "string"},
			{name: "token", typ: "string", optional: true},
			{name: "n", typ: "integer", token: "HOLD", optional: true},
		},
		outcomes: []outcome{unlockReleased, unlockNotHeld, unlockNoQuorum, unlockError, unlockBadRequest},
		serve:    (*Conn).unlock,
	},
	{
		name: "extend", arity: -3, flags: []string{"write"}, acl: []string{"@write", "@slow", "@lock"},
		summary: "Resets the lock's ttl to ttl-ms where the token still owns it.",
		args: []arg{
			{name: "resource", typ: "string"},
			{name: "ttl-ms", typ: "integer"},
			{name: "token", typ: "string", optional: true},
		},
		outcomes: []outcome{extendExtended, extendNotHeld, extendNoQuorum, extendError, extendBadRequest},
		serve:    (*Conn).extend,
	},
	{
		name: "mlock", arity: -4, flags: []string{"write"}, acl: []string{"@write", "@slow", "@lock"},
		summary: "Acquires distributed locks on all of the resources for ttl-ms, or on none of them.",
		args: []arg{
			{name: "numresources", typ: "integer"},
			{name: "resource", typ: "string", multiple: true},
			{name: "ttl-ms", typ: "integer"},
			{name: "timeout-ms", typ: "integer", token: "WAIT", optional: true},
			{name: "token", typ: "string", token: "TOKEN", optional: true},
			{name: "keepalive", typ: "pure-token", token: "KEEPALIVE", optional: true},
		},
		outcomes: []outcome{mlockAcquired, mlockNotAcquired, mlockNoQuorum, mlockError, mlockBadRequest},
		serve:    (*Conn).mlock,
		mayWait:  mlockMayWait,
	},
	rlockSpec,
	{
		name: "lockinfo", arity: 2, flags: []string{"readonly"}, acl: []string{"@read", "@slow", "@lock"},
		summary: "Reports what the lock nodes know of the resource: mode, holders, holds, fence, validity, waiters, ownership and holder. Never shows a token.",
		args: []arg{
			{name: "resource", typ: "string"},
		},
		outcomes: []outcome{lockinfoAnswered, lockinfoNoQuorum, lockinfoError, lockinfoBadRequest},
		serve:    (*Conn).lockinfo,
	},
	locksSpec,
	fencedSpec,
}

// Names returns the commands a Handler answers, in lower case, in a new
// slice.
func Names() []string {
	names := make([]string, len(specs))
	for i := range specs {
		names[i] = specs[i].name
	}
	return names
}

// lookup returns the command named name in any case, or nil. It does not
// allocate.
func lookup(name []byte) *spec {
	for i := range specs {
		if equalFold(name, specs[i].name) {
			return &specs[i]
		}
	}
	return nil
}

// find returns the command named name in lower case, or nil.
func find(name string) *spec {
	for i := range specs {
		if specs[i].name == name {
			return &specs[i]
		}
	}
	return nil
}

// outcomeLabels are the command and outcome labels of each outcome, taken
// from specs.
var outcomeLabels = func() [numOutcomes][2]string {
	var labels [numOutcomes][2]string
	for _, s := range specs {
		for _, o := range s.outcomes {
			labels[o] = [2]string{s.name, outcomeNames[o]}
		}
	}
	return labels
}()

// Info returns the lines of the lockproxy section of INFO about the lock
// commands ("key:value\r\n"): the counters of Stats and, for each command,
// its outcomes, as in "cmd_lock:acquired=3,not_acquired=1,...". It is safe
// for concurrent use.
func (h *Handler) Info() string {
	s := h.Stats()
	var b strings.Builder
	for _, kv := range []struct {
		k string
		v any
	}{
		{"proxy_id", h.id},
		{"locks_acquired", s.Acquired},
		{"locks_not_acquired", s.NotAcquired},
		{"locks_noquorum", s.NoQuorum},
		{"locks_released", s.Released},
		{"locks_extended", s.Extended},
		{"keepalive_extensions", s.KeepaliveExtensions},
		{"keepalive_lost", s.KeepaliveLost},
		{"locks_held", s.Held},
	} {
		fmt.Fprintf(&b, "%s:%v\r\n", kv.k, kv.v)
	}
	for _, sp := range specs {
		b.WriteString("cmd_" + sp.name + ":")
		for i, o := range sp.outcomes {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, "%s=%d", outcomeNames[o], h.outcomes[o].Load())
		}
		b.WriteString("\r\n")
	}
	return b.String()
}
