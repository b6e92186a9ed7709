package quorum

import (
	_ "embed"
	"strings"
)

// The Lua of the scripts lives in lua/, one file per script or part of a
// script, embedded as is: a script's text (and so its SHA1, the name that
// EVALSHA runs it by) is the bytes of its files, assembled as the script's
// declaration says. A file that another part is spliced into marks the
// place with a comment line of that part's name (see splice).
var (
	//go:embed lua/ops.lua
	opsLua string
	//go:embed lua/core.lua
	coreLua string
	//go:embed lua/exclusive.lua
	exclusiveLua string
	//go:embed lua/handoff.lua
	handoffLua string
	//go:embed lua/forms.lua
	formsLua string
	//go:embed lua/begin.lua
	beginLua string
	//go:embed lua/loss.lua
	lossLua string
	//go:embed lua/dump.lua
	dumpLua string
	//go:embed lua/peek.lua
	peekLua string
	//go:embed lua/restore.lua
	restoreLua string
	//go:embed lua/evicted.lua
	evictedLua string
	//go:embed lua/finish.lua
	finishLua string
	//go:embed lua/info.lua
	infoLua string
)

// splice returns src with its one line mark (a Lua comment naming what
// goes there) replaced by part. It panics, at package initialisation, when
// src does not hold mark exactly once on a line of its own.
func splice(src, mark, part string) string {
	before, after, ok := strings.Cut(src, "\n"+mark+"\n")
	if !ok || strings.Contains(after, "\n"+mark+"\n") {
		panic("quorum: Lua splice mark " + mark + " not found once")
	}
	return before + "\n" + part + "\n" + after
}
