package quorum

import (
	"crypto/sha1"
	"encoding/hex"
	"strings"
)

// Key layout on every node (every name starts with Config.KeyPrefix):
//
//	<prefix>lock:<resource>  string "<w><fence>/<attempt>:<token>", PX ttl; exists
//	                         while held; or a tombstone "x/<attempt>" (see cleanup)
//	<prefix>fence            integer, the node's fence counter (never expires)
//	<prefix>intact           the marker: exists while the node keeps its data
//	<prefix>recovery         hash (id, detected, deadline): the node lost its
//	                         data and is being brought back (see recovery.go)
//	<prefix>evicted          the node's evicted_keys already taken for a loss
//	<prefix>clock            the node's clock offset in ms against the
//	                         deployment's reference clock (see clock.go)
//	<prefix>released         channel; payload is the released resource name
//
// A lock's value may carry an extension between its attempts and the ':'
// (reentrant.go): "<w><fence>/<attempt>;<holds>.<version>;<holder>:<token>",
// the hold count with its version (empty for a holding without a count:
// one hold) and the holder that LOCKINFO shows, escaped so that it holds
// no ':' or ';'. Every operation that rewrites a holding keeps its
// extension; one without an extension is the plain value above, which a
// proxy without a holder to store writes byte for byte as before.
//
// In a lock's value, <w> is '1' once a waiter asked to be told of the
// release and '0' before, <fence> is decimal and <attempt> lists the ids
// of the attempts of the token that rely on the lock, comma-separated (ids
// have no ',', ':' or '/'), or is '*' when more than 8 did (see late.go),
// so the first ':' after the fence ends the header whatever the token
// holds. A value without a ':' is a lock
// that no token owns (recovery writes one where the nodes it copied from
// disagreed on the owner): it reads as held by someone else until it
// expires. A tombstone "x/<attempt>" is a free lock for everyone but that
// attempt. The previous layout's "<w><fence>:<token>" reads as a holding of
// the token that no cleanup may delete ('*' once refreshed); that
// layout's proxies read this layout's values and tombstones as held by
// someone else (the fence does not parse). A lock key of another type (the
// hash an earlier layout used) reads as held by someone else too:
// acquisition fails and release, extend and raise leave it alone, so
// proxies of any of these layouts on the same nodes never grant one
// resource twice.
//
// A node's batcher sends all the requests of a batch as one call of
// opsScript (EVALSHA, and EVAL after NOSCRIPT, which caches the script
// again, so a node that restarted with an empty script cache keeps
// working). On a busy node most of a script's cost is fixed per call and
// per redis.call, not per line of Lua: one call for the whole batch, and as
// few redis.calls per operation as the operation allows, is what keeps the
// node's CPU per lock low.
// So is defining few Lua functions per call: every call runs the script's
// whole chunk, and each function it defines is a closure made anew. Only
// acquire, release, the loop's run and the families' dispatcher are
// defined on every call, and a plain LOCK of a free lock, the UNLOCK of
// the token's own plain lock and the handing of it to the next waiter
// call no other; the others come in families (core: what parses,
// refreshes, marks and cleans up lock values, and extend; hash records;
// the rarer exclusive operations; the lock forms; the handoff alone) that
// a call defines on its first use of one (lazyFamilies).
//
// The call is
//
//	EVALSHA sha n+3 key_1 .. key_n fence-counter marker recovery code_1 token_1 x_1 attempt_1 deadline_1 .. code_n token_n x_n attempt_n deadline_n channel clock band ref
//
// Each operation carries five arguments; the channel is ARGV[5n+1], and
// arguments after it are global ones, read relative to #ARGV. attempt is
// the id of the call the operation belongs to (see late.go), and deadline
// the time on the node's clock, in ms, after which the operation is late:
// it then does nothing and fails with a LATE error ("0": no deadline, for
// a node whose clock the Locker has not read yet).
//
// and replies with an array of n+3 elements: first the integer result of
// each operation or, if that operation failed, its error (the others still
// run), then the node's state, read in the same atomic call: 1 when the
// marker exists (the node kept its data), 0 when neither the marker nor a
// recovery exists (a node never used, or one whose loss nobody noticed
// yet), -1 when a recovery is under way; then the node's TIME in ms and its
// clock offset in ms (the key clock, "<prefix>clock", 0 when it does not
// exist), after moving the offset of a node with its marker that reads more
// than band ms below ref, the caller's lower bound of the reference clock
// in ms (empty when it has none; see clock.go). The global arguments after
// the operations' are read from the end of ARGV. The operations, by code:
//
//	a, aw  acquire: take the lock if it is free, refresh it if the token owns
//	       it; x is the ttl in ms, followed by the extension of a fresh
//	       holding when it has one ("<ttl>;<holds>.<version>;<holder>"). aw
//	       also marks a lock held by another token as waited for, so that
//	       its release is published.
//	r, rw  as a and aw, but only refresh an existing holding of the token,
//	       never take a free lock.
//	f      raise: counter = max(counter, x) and the stored fence = x, only
//	       while the token owns the lock. Lifts a node that granted a
//	       smaller fence than the majority's maximum x.
//	u, up  release: delete the lock if the token owns it; up then publishes
//	       x, the resource name, on the channel if a waiter marked the lock.
//	       A holding with a count of holds is not deleted: the reply is
//	       {0, holds, version, 0, fence}, and the caller decides from a
//	       majority's count (reentrant.go).
//	uf     release all holds: as up, whatever the count.
//	ul     release the last hold (HOLD 1): as uf for a holding with a
//	       count; one without is not deleted, the reply is {0, 1, 0, 0,
//	       fence}.
//	c, cp  cleanup of an attempt: x is "<ttl>:<resource>". If the token owns
//	       the lock and the attempt relies on it, take the attempt off the
//	       list, and delete the lock when no attempt is left (cp then
//	       publishes as up does); where the lock is free, leave a tombstone
//	       of the attempt for ttl ms, so that the attempt's acquisition,
//	       arriving late, does nothing (it fails with LATE).
//	e      extend: reset the ttl to x ms if the token owns the lock; a
//	       holding with an extension replies {fence, holds, version, 0,
//	       fence, extension} (holds and version 0 without a count), so
//	       that healing carries the count and the holder.
//	p      place: x is "<ttl>:<fence>[;<extension>]"; if the lock is free, take it for the
//	       token with that fence and ttl and raise the counter to the fence.
//	       Heals a lock that a majority holds onto a node that lacks it.
//	s      status: the ms left until the recovery's deadline (0 when it has
//	       passed), or -1 when no recovery is under way; the key is ignored.
//	t      time: the node's clock in Unix ms; the key is ignored.
//	n, nw, nr, nrw
//	       enter (LOCK ... REENTRANT): a, aw, r or rw, replying {g, holds,
//	       version, fresh, g}: g is what those reply, holds and version the
//	       count of the token's holding (1 and 0 without a count), fresh 1
//	       when this attempt's call took the lock afresh on the node (every
//	       attempt on its list is the call's: an attempt id "<call>+<k>";
//	       from k = 2 on, the call's earlier ids on the list are replaced
//	       with this one first, see reentrant.go); where the key is
//	       a hash record in another mode, acquire's {mode code, 0}.
//	k      sethold: x is "<holds>.<version>[:<fence>]"; store it as the
//	       count of the token's holding unless the node stores a later
//	       version, with the fence (a re-entry's) as the holding's stored
//	       fence, the counter raised to it. 1 when the token owns the lock,
//	       0 otherwise.
//	y      query: the token's holding as enter reports it, 0 when the token
//	       does not own the lock. Changes nothing.
//	v      view (LOCKINFO): {kind, pttl, header, mine, owner}, kind 'none',
//	       'exclusive' or 'other' (a key of another type), header the value
//	       up to the token, mine 1 when the token (if given) owns it, owner
//	       the SHA1 of the owning token. Never the token itself.
//	h      handoff: x is "<ttl>[;<extension>]:<next token>". Release the lock if the token
//	       owns it and, in the same call, take it for the next token with a
//	       new fence and that ttl (also when the lock was free, or refresh
//	       it when the next token holds it already); a waiter's mark stays.
//	       Replies {released, g}:
//	       released is 1 when the token owned the lock, g is what acquire
//	       would reply for the next token. A holding of the token with a
//	       count of holds is neither released nor handed: the reply is
//	       {-1, holds, version, 0, fence}, as release's.
//	i      init: create the marker unless a recovery is under way; 1 when
//	       the marker exists afterwards, 0 otherwise. Only for a deployment
//	       that no node has a marker or a recovery of.
//	m, mw  group acquire (MLOCK): x is "<ttl>[;<extension>]:<size>"; the operation and
//	       the size-1 operations after it (code g, their other arguments
//	       unused) are one unit over their keys, all or nothing: every key
//	       is read before any is set. When each key is free or owned by
//	       the token, and the token owns all of them or none, each is
//	       acquired as by a (taken, or refreshed keeping its fence);
//	       otherwise nothing changes. mw also marks, as aw does, the keys
//	       that another token holds. Replies, at the group's first
//	       position, {status, r_1, .., r_size} (the members' positions get
//	       0): status 1 when all were acquired (r_j the fence of key j), 3
//	       when all were the token's already and were refreshed; 0
//	       when another token holds some (r_j -1-pttl for those, the fence
//	       for the token's own, 0 for free ones); 2 when the token owns some
//	       of the keys but not all, whatever holds the others (an MLOCK of
//	       a set the token holds in part); r_j as for 0. A group that fails
//	       after it began setting keys (a Redis error) may leave some of
//	       them set: the caller takes its reply for no answer and cleans
//	       the attempt up on every key.
//	       4 when some keys are hash records in another mode (a
//	       semaphore) or read-held by the token: r_j is hexclusive's mode
//	       code for those keys, 0 for the others; nothing changes.
//	mr,mrw as m and mw, but only refresh: status -1 (nothing changes)
//	       when some key is free; all the token's: refreshed, status 3.
//	mp     as m, but a set the token holds in part is acquired too (its
//	       free keys taken, its own refreshed; status 1 or 3): for a token
//	       that holds every key on a majority of the nodes, though not all
//	       of them on the same nodes.
//	q, qw  shared or semaphore acquire (hashLua, shared.go): x is
//	       "<ttl>:<k>:<slot>", k 0 for a reader, else a permit of k with the
//	       proposed slot. Takes or refreshes the token's holding in the
//	       lock key's hash record; qw also marks the record for a release
//	       notification. Replies {slot, fence} when the token holds
//	       afterwards, {free slot or -1, -1-ms} when the slot (or, shared,
//	       the resource) is taken, {mode code, 0} for another mode.
//	qr     as q, but only refresh the token's holding: {-1, -1} without one.
//	qp     place, for a shared or semaphore holding: x is
//	       "<ttl>:<k>:<slot>:<fence>"; as q, but a new holding gets that
//	       fence and the counter is raised to it, and a holding of the
//	       token there keeps its expiry when that is the later (a late
//	       placement never shortens a refresh). Heals a holding that a
//	       majority holds onto a node that lacks it.
//
// Where the key is a hash (shared or semaphore holdings), a, aw, r and rw
// reply {mode code, 0} for a semaphore or for a reader's token, and record
// a waiting writer's intent (aw, rw); u, up, c, cp, e and f act on the
// token's holding in the hash (e then replies {form, fence}, see
// holdingForm, and -1 where the record holds nothing of the token); h releases a
// reader and hands the lock on when it was the last. See hashLua.
//
// Acquire returns the fence (at least 1) when the token holds the lock
// afterwards (a fresh holding advances the counter and stores its value; a
// refresh keeps the stored fence), -1-pttl when another token holds it, and
// -1 when refresh-only found it free. It advances the counter before its
// SET NX, also when the lock turns out to be held: a free lock, the common
// case, then costs two redis.calls instead of three, and the counter still
// only ever grows, which is all fencing needs of it. Extend returns the
// stored fence when the token owns the lock, -1 when the lock is free (so
// that the caller can place it there) and 0 when another token holds it.
// Place returns the fence when the token holds the lock afterwards and
// -1-pttl when another token holds it. Raise and release return 1 when done
// and 0 when the token does not own the lock; raise never lowers a stored
// fence. A refresh by another attempt of the same token (acquire, or
// handoff to a token that holds the lock already) adds the attempt to the
// lock's list, so that one attempt's cleanup never deletes a lock that
// another relies on; a holding-level release (u, up, h) ends it whatever
// the list.
var opsScript = newScript(splice(opsLua, "-- lazyFamilies(coreFamily, hashFamily, exclusiveFamily, formsFamily, handoffFamily)", lazyFamilies(coreFamily, hashFamily, exclusiveFamily, formsFamily, handoffFamily)))

// coreFamily holds the functions that a plain LOCK of a free lock and the
// UNLOCK of the token's own plain lock do not call (core.lua): the ones
// that parse, refresh, mark and clean up lock values, cleanup and extend.
// Every other family has them as locals of the same names.
var coreFamily = luaFamily{name: "core", body: coreLua, exports: []string{"now", "held", "get", "parse", "value", "holdsOf", "splitExt", "relies", "addAttempt", "refresh", "owned", "drop", "cleanup", "extend"}}

// exclusiveFamily holds the exclusive operations that a plain LOCK and UNLOCK
// do not use: raise (f), place (p) and status (s).
var exclusiveFamily = luaFamily{name: "exclusive", body: exclusiveLua, exports: []string{"raise", "place", "status"}}

// handoffFamily holds handoff (h) of anything but the token's own plain
// lock, which release hands on with no function made (the cycle of a
// contended LOCK ... WAIT): a hash record's last reader, a count of holds,
// a lock the token does not hold. It calls family('core') itself, only
// where a lock exists (ownBase).
var handoffFamily = luaFamily{name: "handoff", body: handoffLua, exports: []string{"handoff"}, ownBase: true}

// hashFamily holds the operations on hash records (hashLua), which the
// exclusive operations reach only in their slow branch.
var hashFamily = luaFamily{name: "hash", body: hashLua, exports: []string{"hload", "hfind", "hdrop", "hexclusive", "hacquire", "hrelease", "hextend", "hraise", "hcleanup"}}

// formsFamily holds the operations that only the lock forms use: LOCK ...
// REENTRANT (enter, sethold, query), LOCKINFO (view) and MLOCK (group).
var formsFamily = luaFamily{name: "forms", body: formsLua, exports: []string{"enter", "sethold", "query", "view", "group"}}

// luaFamily is a family of opsScript's operations: Lua (body) that defines
// local functions, of which the ones named by exports are called from
// outside the family. A family other than the first of lazyFamilies has
// the first's exports as locals, made with it, unless ownBase: then its
// body calls family(<first>) where it needs them.
type luaFamily struct {
	name    string
	body    string
	exports []string
	ownBase bool
}

// lazyFamilies returns the Lua that assigns opsScript's function family:
// family(name) makes the functions of the family name on its first call in
// a call of the script, and returns a table of its exports. Every call of a
// script runs its whole chunk, and each Lua function that the chunk
// defines is a closure made anew, with its upvalues, on every call (and
// garbage for the node's Lua collector afterwards): the functions of a
// family that a call does not use cost it nothing but this one closure,
// whatever the number of families. The exports of the first family, base,
// are locals of the same names in every other family, which makes base
// first, except in one with ownBase, which calls family(<base>) itself
// where it needs them. A table per call holds the families made.
func lazyFamilies(base luaFamily, fams ...luaFamily) string {
	var b strings.Builder
	b.WriteString("local families\nfamily = function(name)\n\tif not families then\n\t\tfamilies = {}\n\tend\n\tlocal f = families[name]\n\tif f then\n\t\treturn f\n\tend\n")
	fams = append([]luaFamily{base}, fams...)
	for i, fam := range fams {
		if i == 0 {
			b.WriteString("\tif")
		} else {
			b.WriteString("\telseif")
		}
		b.WriteString(" name == '" + fam.name + "' then\n\t\tf = (function()\n")
		if i > 0 && !fam.ownBase && len(base.exports) > 0 {
			// base's exports as locals of the same names.
			names := strings.Join(base.exports, ", ")
			fields := "base." + strings.Join(base.exports, ", base.")
			b.WriteString("local " + names + "\ndo\n\tlocal base = family('" + base.name + "')\n\t" + names + " = " + fields + "\nend\n")
		}
		b.WriteString(fam.body)
		b.WriteString("\nreturn {")
		for j, e := range fam.exports {
			if j > 0 {
				b.WriteString(", ")
			}
			b.WriteString(e + " = " + e)
		}
		b.WriteString("}\n\t\tend)()\n")
	}
	b.WriteString("\tend\n\tfamilies[name] = f\n\treturn f\nend\n")
	return b.String()
}

// script is a Lua script and its SHA1, the name EVALSHA runs it by.
type script struct {
	src string
	sha any // hex SHA1 of src, boxed once
}

func newScript(src string) *script {
	sum := sha1.Sum([]byte(src))
	return &script{src: src, sha: hex.EncodeToString(sum[:])}
}

// The operation codes of opsScript, boxed once.
var (
	codeAcquire, codeAcquireWait = any("a"), any("aw")
	codeRefresh, codeRefreshWait = any("r"), any("rw")
	codeRaise                    = any("f")
	codeRelease, codeReleasePub  = any("u"), any("up")
	codeCleanup, codeCleanupPub  = any("c"), any("cp")
	codeExtend                   = any("e")
	codePlace                    = any("p")
	codeStatus                   = any("s")
	codeTime                     = any("t")
	codeInit                     = any("i")
	codeHandoff                  = any("h")
	codeGroup, codeGroupWait     = any("m"), any("mw")
	codeGroupRefresh             = any("mr")
	codeGroupRefreshWait         = any("mrw")
	codeGroupAnyPart             = any("mp")
	codeMember                   = any("g")
	codeShared, codeSharedWait   = any("q"), any("qw")
	codeSharedRefresh            = any("qr")
	codeSharedPlace              = any("qp")
	codeReleaseAll               = any("uf")
	codeReleaseLast              = any("ul")
	codeEnter, codeEnterWait     = any("n"), any("nw")
	codeReenter, codeReenterWait = any("nr"), any("nrw")
	codeSetHold                  = any("k")
	codeQuery                    = any("y")
	codeView                     = any("v")
)

// The node states that opsScript reports after the operations' results.
const (
	stateRecovering = -1 // no marker, a recovery under way
	statePristine   = 0  // no marker and no recovery: never used, or lost unnoticed
	stateIntact     = 1  // the marker exists: the node kept its data
)

// The recovery scripts run on one node each, outside the batches (see
// recovery.go). Times are the node's own clock in ms, so that every Locker
// reads the same deadline from the node.

// beginScript registers a node's recovery, or finds the one under way.
//
//	EVALSHA sha 2 marker recovery id wait
//
// It replies {1} when the marker exists (nothing to recover), otherwise
// {0, id, ms since the loss was first seen, ms left until the deadline}.
// The recovery is created with the given id and a deadline of wait ms from
// now when there is none; a Locker with a longer wait (a larger MaxTTL)
// pushes the deadline out to wait ms after the loss was first seen.
var beginScript = newScript(beginLua)

// lossScript takes a node whose clock jumped forward for one that lost its
// data: it deletes the marker and, when ref is given, sets the clock offset
// so that the node reads ref, the reference clock in ms, from then on (the
// recovery's end checks that it still does; see clock.go).
//
//	EVALSHA sha 2 marker clock ref
var lossScript = newScript(lossLua)

// dumpScript reads one SCAN step of the live locks of a node that kept its
// data.
//
//	EVALSHA sha 2 marker counter cursor pattern count
//
// It replies {0} when the node has no marker, otherwise {1, next cursor,
// counter, key_1, value_1, pttl_1, ...}. A lock key of another type is
// reported with an empty value, for a lock that no token owns, except a
// hash record (shared or semaphore holdings), which is reported as one
// value (recovery_shared.go); a tombstone is no lock and left out.
var dumpScript = newScript(hdumpLua + dumpLua)

// peekScript reads locks of a node that kept its data again.
//
//	EVALSHA sha n+1 marker key_1 .. key_n
//
// It replies {0} when the node has no marker, otherwise {1, value_1,
// pttl_1, ...}, with an empty value for a key of another type, and an
// empty value and pttl -2 for a key that is gone or a tombstone, and a
// hash record as dumpScript reports it.
var peekScript = newScript(hdumpLua + peekLua)

// restoreScript writes copied locks onto a recovering node.
//
//	EVALSHA sha n+2 recovery counter key_1 .. key_n id floor value_1 pttl_1 .. value_n pttl_n
//
// It replies 0, and writes nothing, unless the node's recovery has the
// given id (a node that restarted again has lost what was written before).
// Otherwise it raises the counter to floor and sets each key to its value
// with that pttl (-1: no expiry), except that a holding of the same token
// keeps the larger fence and the longer ttl, and a key of another type is
// left alone; it replies 1. A holding of the same token gets the attempts
// of both values: a node that lost its locks to a clock jump kept its
// data, and a later attempt of the token may have taken the lock there
// afresh; its cleanup must not delete the holding copied onto it. Whatever else the node holds for a key was
// written after the loss and no grant counted on it (see recovery.go). A
// value that starts with 'H' is a hash record (shared or semaphore
// holdings), which hrestore writes (recovery_shared.go).
var restoreScript = newScript(splice(restoreLua, "-- hrestoreLua", hrestoreLua))

// evictedScript takes a node that evicted keys since the last call for one
// that lost its data.
//
//	EVALSHA sha 2 marker evicted count
//
// count is the node's evicted_keys (INFO stats); the key evicted holds the
// count already handled. When count is larger, the marker is deleted and
// the script replies 1; otherwise (also after CONFIG RESETSTAT) it records
// count and replies 0.
var evictedScript = newScript(evictedLua)

// finishScript ends a node's recovery: it raises the counter to floor,
// sets the clock offset so that the node reads ref, the reference clock in
// ms (see clock.go), creates the marker and deletes the recovery.
//
//	EVALSHA sha 4 marker recovery counter clock id floor byDeadline ref band
//
// It replies 1 when the marker exists afterwards, and 0, changing nothing,
// when the recovery does not have the given id or, with byDeadline "1",
// its deadline has not passed on the node's clock. A node whose clock reads
// more than band ms ahead of ref jumped during its recovery: the locks
// copied to it may have expired early, and its deadline came early. Then
// the script moves the deadline out by the jump, gives the recovery a new
// id (so that it is copied again), sets the offset to read ref, and
// replies 0.
var finishScript = newScript(finishLua)
