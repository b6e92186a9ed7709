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
// the functions of a plain LOCK and UNLOCK (acquire, release), of EXTEND
// and of an attempt's cleanup are defined on every call; the others come in
// families (hash records, the rarer exclusive operations, the lock forms,
// and the handoff alone) that a call defines on its first use of one
// (lazyFamilies).
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
var opsScript = newScript(`
local n = #KEYS - 3
local counter, marker, recovery = KEYS[n + 1], KEYS[n + 2], KEYS[n + 3]
local channel = ARGV[5 * n + 1]

-- now returns the node's clock in ms, read once per call.
local nowMs
local function now()
	if not nowMs then
		-- TIME's two decimal strings: Lua's arithmetic converts them, with
		-- no call of tonumber or math.floor (about 1k instructions each).
		local t = redis.call('TIME')
		local us = t[2] + 0
		nowMs = t[1] * 1000 + (us - us % 1000) / 1000
	end
	return nowMs
end

-- held returns -1-pttl for a lock that another token holds.
local function held(key)
	return -1 - math.max(redis.call('PTTL', key), 0)
end

-- get returns the lock's value, false when there is none or it is a
-- tombstone of another attempt, or nil when the key holds another type;
-- other errors are raised. A tombstone of this attempt means that its
-- cleanup ran first: the request is late and does nothing.
local function get(v, attempt)
	if type(v) == 'table' then
		if string.sub(v.err, 1, 9) == 'WRONGTYPE' then
			return nil
		end
		error(v)
	end
	if v and string.byte(v, 1) == 120 then
		if attempt and string.sub(v, 3) == attempt then
			error({err = 'LATE the attempt was cleaned up before this request arrived'})
		end
		return false
	end
	return v
end

-- parse returns the fence, attempt and extension stored in v when token
-- owns it, otherwise nil. A value of the previous layout (no attempt) has
-- attempt ''; a value without an extension has ext ''.
local function parse(v, token)
	local sep = string.find(v, ':', 2, true)
	if not sep or string.sub(v, sep + 1) ~= token then
		return nil
	end
	-- The header is v from 2 to sep-1, its extension from its first ';'
	-- on; found in v, so that no copy of the header is made.
	local last, ext = sep - 1, ''
	local semi = string.find(v, ';', 2, true)
	if semi and semi < sep then
		last, ext = semi - 1, string.sub(v, semi, sep - 1)
	end
	local slash = string.find(v, '/', 2, true)
	if not slash or slash > last then
		return tonumber(string.sub(v, 2, last)), '', ext
	end
	return tonumber(string.sub(v, 2, slash - 1)), string.sub(v, slash + 1, last), ext
end

local function value(mark, fence, attempt, token, ext)
	return mark .. fence .. '/' .. attempt .. (ext or '') .. ':' .. token
end

-- holdsOf returns the hold count and its version that the extension ext
-- stores, or nil for a lock that was never taken with REENTRANT nor
-- re-entered (one hold).
local function holdsOf(ext)
	local d = string.byte(ext, 2)
	if not d or d < 48 or d > 57 then
		return nil -- no count digit: no pattern to match (a plain lock's value)
	end
	local h, ver = string.match(ext, '^;(%d+)%.(%d+)')
	if not h then
		return nil
	end
	return tonumber(h), tonumber(ver)
end

-- splitExt splits x, "<n>" or "<n>;<extension>", into n and the extension
-- (with its leading ';'), '' when there is none.
local function splitExt(x)
	-- One match, not a find and two subs: each C call costs about 1k
	-- instructions on a node, more than the pattern's few steps.
	return string.match(x, '^([^;]*)(.*)$')
end

-- relies reports whether attempt is one of the attempts in att, a list
-- "<a1>,<a2>,..." or '*' for more than maxAttempts.
local function relies(att, attempt)
	return att == '*' or string.find(',' .. att .. ',', ',' .. attempt .. ',', 1, true) ~= nil
end

-- addAttempt returns the list att with attempt added.
local function addAttempt(att, attempt)
	if relies(att, attempt) then
		return att
	end
	if att == '' then
		return '*' -- the previous layout's lock: no attempt may undo it
	end
	local _, commas = string.gsub(att, ',', '')
	if commas + 1 >= 8 then
		return '*'
	end
	return att .. ',' .. attempt
end

-- family returns the functions of a family of operations (see lazyFamilies):
-- 'hash' (hash records, hashLua), 'exclusive' (the exclusive operations that
-- a plain LOCK and UNLOCK do not use), 'forms' (LOCK ... REENTRANT,
-- LOCKINFO, MLOCK) or 'handoff'.
local family

-- refresh resets the ttl of v, a lock that token owns with fence and the
-- attempts att, and adds attempt to those that rely on it.
local function refresh(key, v, token, ttl, fence, att, attempt, ext)
	if relies(att, attempt) then
		redis.call('PEXPIRE', key, ttl)
		return fence
	end
	redis.call('SET', key, value(string.sub(v, 1, 1), fence, addAttempt(att, attempt), token, ext), 'PX', ttl)
	return fence
end

local function acquire(key, code, token, x, attempt)
	local ttl, ext = splitExt(x)
	local v
	if code == 'r' or code == 'rw' then
		v = get(redis.pcall('GET', key), attempt)
		if v == false then
			return -1
		end
	else
		local fence = redis.call('INCR', counter)
		-- Lua writes a number below 1e14 as its digits (%.14g) without the
		-- call of string.format that a larger one needs.
		local new = value('0', fence < 1e14 and fence or string.format('%d', fence), attempt, token, ext)
		v = redis.pcall('SET', key, new, 'NX', 'PX', ttl, 'GET')
		if v == false then
			return fence
		end
		v = get(v, attempt)
		if v == nil then
			local r = family('hash').hexclusive(key, code, token, ttl, attempt)
			if r ~= false then
				return r
			end
			redis.call('DEL', key) -- a hash that holds nothing: free
			v = false
		end
		if v == false then
			-- A tombstone of another attempt: the lock is free.
			redis.call('SET', key, new, 'PX', ttl)
			return fence
		end
	end
	if v == nil then
		return family('hash').hexclusive(key, code, token, ttl, attempt) or -1
	end
	local f, att, old = parse(v, token)
	if f then
		return refresh(key, v, token, ttl, f, att, attempt, old)
	end
	if (code == 'aw' or code == 'rw') and string.byte(v, 1) == 48 then
		redis.call('SETRANGE', key, 0, '1')
	end
	return held(key)
end

-- owned returns the lock's value, fence, attempt and extension when token
-- owns it, otherwise nil.
local function owned(key, token)
	local v = get(redis.pcall('GET', key))
	if not v then
		return nil
	end
	local f, att, ext = parse(v, token)
	if f then
		return v, f, att, ext
	end
	return nil
end

-- drop deletes the lock whose value is v and, with publish, tells the
-- waiters that marked it; it returns 1.
local function drop(key, v, publish, resource)
	redis.call('DEL', key)
	if publish and string.byte(v, 1) == 49 then
		redis.call('PUBLISH', channel, resource)
	end
	return 1
end

local function release(key, code, token, resource)
	local v = redis.pcall('GET', key)
	if v and not v.err and (code == 'up' or code == 'u') then
		-- The plain UNLOCK of a string (v.err is the string library's, nil;
		-- no call of type): a value that token owns and that stores no count
		-- of holds (no digit after its header's first ';') is dropped
		-- without parsing the rest of it; a count goes the long way below.
		local mark = string.byte(v, 1)
		if mark ~= 120 then -- not a tombstone (get)
			local sep = string.find(v, ':', 2, true)
			if not sep or string.sub(v, sep + 1) ~= token then
				return family('hash').hrelease(key, token, code ~= 'u', resource)
			end
			-- Anchored: one try over the header, where ';%d' unanchored
			-- would try every position of the value, holder and token too.
			-- The holder is escaped: no ';' or ':' in it.
			if not string.find(v, '^[^;:]*;%d') then
				redis.call('DEL', key)
				if code == 'up' and mark == 49 then
					redis.call('PUBLISH', channel, resource)
				end
				return 1
			end
		end
	end
	v = get(v)
	local f, _, ext
	if v then
		f, _, ext = parse(v, token)
	end
	if not f then
		return family('hash').hrelease(key, token, code ~= 'u', resource)
	end
	local h, ver = holdsOf(ext)
	if code == 'ul' then
		if not h then
			return {0, 1, 0, 0, f} -- no count: HOLD 1 does not apply
		end
	elseif code ~= 'uf' and h then
		-- A count of holds: the caller decides from a majority's count
		-- (reentrant.go), never this node alone.
		return {0, h, ver, 0, f}
	end
	return drop(key, v, code ~= 'u', resource)
end

-- cleanup undoes one attempt: it takes the attempt off the attempts that
-- rely on the lock, and deletes the lock when none is left; where the lock
-- is free, it leaves a tombstone, so that the attempt's acquisition, if it
-- arrives later, does nothing.
local function cleanup(key, code, token, x, attempt)
	local sep = string.find(x, ':', 1, true)
	local ttl, resource = string.sub(x, 1, sep - 1), string.sub(x, sep + 1)
	local v = get(redis.pcall('GET', key))
	if v == false then
		redis.call('SET', key, 'x/' .. attempt, 'PX', ttl)
		return 0
	end
	if v == nil then
		return family('hash').hcleanup(key, code, token, ttl, attempt, resource)
	end
	local f, att, ext = parse(v, token)
	if not f or att == '*' or not relies(att, attempt) then
		return 0
	end
	if att ~= attempt then
		local rest = string.sub(string.gsub(',' .. att .. ',', ',' .. attempt:gsub('%p', '%%%0') .. ',', ',', 1), 2, -2)
		redis.call('SET', key, value(string.sub(v, 1, 1), f, rest, token, ext), 'KEEPTTL')
		return 0
	end
	return drop(key, v, code == 'cp', resource)
end

local function extend(key, token, ttl)
	local v = get(redis.pcall('GET', key))
	if v == false then
		return -1
	end
	if v == nil then
		return family('hash').hextend(key, token, ttl)
	end
	local fence, _, ext = parse(v, token)
	if not fence then
		return 0
	end
	redis.call('PEXPIRE', key, ttl)
	if ext ~= '' then
		-- The count and the holder too, for healing (reentrant.go).
		local h, ver = holdsOf(ext)
		return {fence, h or 0, ver or 0, 0, fence, ext}
	end
	return fence
end

` + lazyFamilies(hashFamily, exclusiveFamily, formsFamily, handoffFamily) + `
-- width is the number of positions that the operation run last takes: a
-- group's size (set before anything can fail), 1 for the others.
local width
local function run(i)
	local key, code, token, x, attempt = KEYS[i], ARGV[5 * i - 4], ARGV[5 * i - 3], ARGV[5 * i - 2], ARGV[5 * i - 1]
	-- The plain LOCK's and UNLOCK's codes need no string.sub.
	local c
	if code == 'a' then
		c = 'a'
	elseif code == 'up' or code == 'u' then
		c = 'u'
	else
		c = string.sub(code, 1, 1)
		if c == 'm' then
			width = tonumber(string.match(x, ':(%d+)$')) or 1
		end
	end
	local deadline = ARGV[5 * i]
	-- deadline + 0: Lua's own conversion of the number, no call of tonumber.
	if deadline ~= '0' and now() > deadline + 0 then
		error({err = 'LATE the request arrived after its deadline'})
	end
	if c == 'a' or c == 'r' then
		return acquire(key, code, token, x, attempt)
	elseif c == 'q' then
		return family('hash').hacquire(key, code, token, x, attempt)
	elseif c == 'u' then
		return release(key, code, token, x)
	elseif c == 'c' then
		return cleanup(key, code, token, x, attempt)
	elseif c == 'e' then
		return extend(key, token, x)
	elseif c == 'f' then
		return family('exclusive').raise(key, token, x)
	elseif c == 'p' then
		return family('exclusive').place(key, token, x, attempt)
	elseif c == 's' then
		return family('exclusive').status()
	elseif c == 't' then
		return now()
	elseif c == 'h' then
		return family('handoff').handoff(key, token, x, attempt)
	elseif c == 'm' then
		return family('forms').group(i, code, token, x, attempt)
	elseif c == 'n' then
		return family('forms').enter(key, code, token, x, attempt)
	elseif c == 'k' then
		return family('forms').sethold(key, token, x)
	elseif c == 'y' then
		return family('forms').query(key, token)
	elseif c == 'v' then
		return family('forms').view(key, token)
	elseif c == 'i' then
		if redis.call('EXISTS', recovery) == 1 then
			return 0
		end
		redis.call('SET', marker, '1')
		return 1
	end
	error({err = 'ERR unknown lock operation ' .. code})
end

local res = {}
local i = 1
while i <= n do
	-- A group (code m...) is one unit over its size keys; its members'
	-- positions in the reply get 0.
	width = 1
	local ok, r = pcall(run, i)
	for j = i + 1, i + width - 1 do
		res[j] = 0
	end
	if ok then
		res[i] = r
	else
		-- A Redis error arrives as its text, code first; a Lua error as a
		-- bare message, which gets the generic code.
		if type(r) == 'table' then
			r = r.err
		end
		r = tostring(r)
		if not string.find(r, '^%u+ ') then
			r = 'ERR ' .. r
		end
		res[i] = {err = r}
	end
	i = i + width
end
if redis.call('EXISTS', marker) == 1 then
	res[n + 1] = 1
elseif redis.call('EXISTS', recovery) == 1 then
	res[n + 1] = -1
else
	res[n + 1] = 0
end
-- The node's clock (clock.go): its TIME and its offset against the
-- reference. A node with its marker that reads more than the band below the
-- caller's lower bound of the reference is moved up to it.
-- band and ref are decimal (ref '' when the caller has none): Lua's
-- arithmetic converts them, as it does the offset's digits.
local na = #ARGV
local clock, band, ref = ARGV[na - 2], ARGV[na - 1], ARGV[na]
local t = now()
local offset = redis.call('GET', clock)
if offset then
	offset = tonumber(offset) or 0
else
	offset = 0
end
if ref ~= '' and res[n + 1] == 1 and t - offset - ref < -band then
	offset = t - ref
	redis.call('SET', clock, string.format('%d', offset))
end
res[n + 2] = t
res[n + 3] = offset
return res
`)

// exclusiveFamily holds the exclusive operations that a plain LOCK and UNLOCK
// do not use: raise (f), place (p) and status (s).
var exclusiveFamily = luaFamily{"exclusive", `
local function raise(key, token, fence)
	local v, f, att, ext = owned(key, token)
	if not v then
		return family('hash').hraise(key, token, fence)
	end
	if tonumber(redis.call('GET', counter) or '0') < tonumber(fence) then
		redis.call('SET', counter, fence)
	end
	if f < tonumber(fence) then
		redis.call('SET', key, value(string.sub(v, 1, 1), fence, att, token, ext), 'KEEPTTL')
	end
	return 1
end

local function place(key, token, x, attempt)
	local sep = string.find(x, ':', 1, true)
	local ttl, fence, ext = string.sub(x, 1, sep - 1), splitExt(string.sub(x, sep + 1))
	local new = value('0', fence, attempt, token, ext)
	local v = redis.pcall('SET', key, new, 'NX', 'PX', ttl, 'GET')
	if v ~= false then
		v = get(v, attempt)
		if v == false then
			redis.call('SET', key, new, 'PX', ttl)
		end
	end
	if v == false then
		if tonumber(redis.call('GET', counter) or '0') < tonumber(fence) then
			redis.call('SET', counter, fence)
		end
		return tonumber(fence)
	end
	local f = v and parse(v, token)
	if f then
		return f
	end
	return held(key)
end

local function status()
	local deadline = tonumber(redis.call('HGET', recovery, 'deadline'))
	if not deadline then
		return -1
	end
	return math.max(deadline - now(), 0)
end
`, []string{"raise", "place", "status"}}

// handoffFamily holds handoff (h), the one operation of a contended LOCK
// ... WAIT's cycle after the first: a family of its own, so that a handing
// call makes one closure more than a plain call, not the exclusive
// family's four.
var handoffFamily = luaFamily{"handoff", `
local function handoff(key, token, x, attempt)
	-- One match, not a find, two subs and splitExt: the extension is
	-- escaped (no ':'), so the first ':' ends it.
	local ttl, ext, next = string.match(x, '^([^;:]*)([^:]*):(.*)$')
	local v = get(redis.pcall('GET', key), attempt)
	local released, mark = 0, '0'
	if v == nil then
		-- A hash: the last reader hands the lock to the waiting writer.
		local hr = family('hash')
		local h = hr.hload(key)
		local f = h and hr.hfind(h, token)
		if not f then
			return {0, held(key)}
		end
		hr.hdrop(key, h, f, false, '')
		if h.n > 0 then
			return {1, held(key)}
		end
		redis.call('DEL', key)
		released = 1
		if h.mark then
			mark = '1'
		end
	elseif v then
		local tf, _, text = parse(v, token)
		if tf then
			local h, ver = holdsOf(text)
			if h then
				-- A count of holds: not released here (see release).
				return {-1, h, ver, 0, tf}
			end
			-- Keep the mark of waiters elsewhere, so that the next release
			-- is published.
			released, mark = 1, string.sub(v, 1, 1)
		else
			local f, att, old = parse(v, next)
			if f then
				return {0, refresh(key, v, next, ttl, f, att, attempt, old)}
			end
			return {0, held(key)}
		end
	end
	local fence = redis.call('INCR', counter)
	-- As acquire: below 1e14 Lua writes the digits without string.format.
	redis.call('SET', key, value(mark, fence < 1e14 and fence or string.format('%d', fence), attempt, next, ext), 'PX', ttl)
	return {released, fence}
end
`, []string{"handoff"}}

// hashFamily holds the operations on hash records (hashLua), which the
// exclusive operations reach only in their slow branch.
var hashFamily = luaFamily{"hash", hashLua, []string{"hload", "hfind", "hdrop", "hexclusive", "hacquire", "hrelease", "hextend", "hraise", "hcleanup"}}

// formsFamily holds the operations that only the lock forms use: LOCK ...
// REENTRANT (enter, sethold, query), LOCKINFO (view) and MLOCK (group).
var formsFamily = luaFamily{"forms", `
-- ofCall reports whether every attempt in the list att is one of the
-- call's (its id starts with call, "<id>+").
local function ofCall(att, call)
	if att == '' or att == '*' then
		return false
	end
	for a in string.gmatch(att, '[^,]+') do
		if string.sub(a, 1, #call) ~= call then
			return false
		end
	end
	return true
end

-- takeOver replaces, in the attempts that rely on token's lock, those of
-- the call's earlier attempts with attempt: they failed (only a call's
-- last attempt succeeds), so none relies on the lock any more, and their
-- cleanups, arriving later, leave it to this one. The list keeps at most
-- one id per call, however many attempts the call makes.
local function takeOver(key, token, call, attempt)
	local v = redis.pcall('GET', key)
	if type(v) ~= 'string' or string.byte(v, 1) == 120 then
		return
	end
	local f, att, ext = parse(v, token)
	if not f or att == '' or att == '*' then
		return
	end
	local rest, took, has = {}, false, false
	for a in string.gmatch(att, '[^,]+') do
		if a == attempt then
			has = true
			rest[#rest + 1] = a
		elseif string.sub(a, 1, #call) == call then
			took = true
		else
			rest[#rest + 1] = a
		end
	end
	if not took then
		return
	end
	if not has then
		rest[#rest + 1] = attempt
	end
	redis.call('SET', key, value(string.sub(v, 1, 1), f, table.concat(rest, ','), token, ext), 'KEEPTTL')
end

-- enter is acquire for LOCK ... REENTRANT: code n, nw, nr or nrw runs
-- acquire's a, aw, r or rw and replies {g, holds, version, fresh, g}, g
-- being what acquire replies, holds and version the count stored with the
-- token's holding (1 and 0 for a holding without a count), fresh 1 when
-- this attempt's call took the lock here afresh: every attempt that
-- relies on it is this call's. A reentrant call's attempts have ids
-- "<call>+<k>" (k from 1, base 36; reentrant.go): from the second on,
-- the call's earlier attempts are taken over first (takeOver).
local function enter(key, code, token, x, attempt)
	local c = string.sub(code, 2)
	if c == '' then
		c = 'a'
	elseif c == 'w' then
		c = 'aw'
	end
	local call, k = string.match(attempt, '^(.+%+)(%w+)$')
	if call and k ~= '1' then
		takeOver(key, token, call, attempt)
	end
	local g = acquire(key, c, token, x, attempt)
	if type(g) == 'table' then
		return g -- a hash record in another mode: {mode code, 0}, as acquire
	end
	if g <= 0 then
		return {g, 0, 0, 0, 0}
	end
	local _, att, ext = parse(redis.call('GET', key), token)
	local h, ver = holdsOf(ext)
	local fresh = 0
	if att == attempt or (call and ofCall(att, call)) then
		fresh = 1
	end
	return {g, h or 1, ver or 0, fresh, g}
end

-- sethold writes x, "<holds>.<version>[:<fence>]", as the count of
-- token's holding unless the holding stores a later version; it keeps the
-- rest of the extension (the holder) and the ttl. With a fence (a
-- re-entry's: the holding's), the holding stores that fence, and the
-- counter is raised to it. It returns 1 when token owns the lock, 0
-- otherwise.
local function sethold(key, token, x)
	local v, f, att, ext = owned(key, token)
	if not v then
		return 0
	end
	local nh, nv, nf = string.match(x, '^(%d+)%.(%d+):?(%d*)$')
	local _, ver = holdsOf(ext)
	if ver and ver > tonumber(nv) then
		return 1
	end
	if nf ~= '' then
		f = nf
		if tonumber(redis.call('GET', counter) or '0') < tonumber(nf) then
			redis.call('SET', counter, nf)
		end
	end
	local rest = string.match(ext, '^;[^;]*(;.*)$') or ''
	redis.call('SET', key, value(string.sub(v, 1, 1), f, att, token, ';' .. nh .. '.' .. nv .. rest), 'KEEPTTL')
	return 1
end

-- query reports token's holding without changing it: {fence, holds,
-- version, 0, fence} as enter does, or 0 when token does not own the lock.
local function query(key, token)
	local v, f, _, ext = owned(key, token)
	if not v then
		return 0
	end
	local h, ver = holdsOf(ext)
	return {f, h or 1, ver or 0, 0, f}
end

-- view reports what the node holds for key, for LOCKINFO: {kind, pttl,
-- header, mine, owner}. kind is 'none' (free, or a tombstone),
-- 'exclusive' (a lock value: header is the value up to its token, owner
-- the token's SHA1, never the token) or 'other' (a key of another type);
-- mine is 1 when token, if not empty, owns the exclusive lock.
local function view(key, token)
	local v = redis.pcall('GET', key)
	if type(v) == 'table' then
		if string.sub(v.err, 1, 9) == 'WRONGTYPE' then
			return {'other', redis.call('PTTL', key), '', 0, ''}
		end
		error(v)
	end
	if not v or string.byte(v, 1) == 120 then
		return {'none', -2, '', 0, ''}
	end
	local sep = string.find(v, ':', 2, true)
	local mine, header, owner = 0, v, ''
	if sep then
		header = string.sub(v, 1, sep - 1)
		owner = redis.sha1hex(string.sub(v, sep + 1))
		if token ~= '' and string.sub(v, sep + 1) == token then
			mine = 1
		end
	end
	return {'exclusive', redis.call('PTTL', key), header, mine, owner}
end

-- group runs the group acquire (m, mr, mw, mrw) over KEYS[i] .. and the
-- keys of the group's members.
local function group(i, code, token, x, attempt)
	local sep = string.find(x, ':', 1, true)
	local ttl, size = string.sub(x, 1, sep - 1), tonumber(string.sub(x, sep + 1))
	local refreshOnly, waits = string.byte(code, 2) == 114, string.byte(code, -1) == 119
	local anyPart = string.byte(code, 2) == 112
	local out, own, other, free = {0}, 0, false, false
	local modes -- {0, code_1, ..}: keys held in another mode (hash records)
	for j = 1, size do
		local key = KEYS[i + j - 1]
		local v = get(redis.pcall('GET', key), attempt)
		local f = v and parse(v, token)
		local h -- for a hash record: hexclusive's verdict
		if v == nil then
			h = family('hash').hexclusive(key, 'r', token, ttl, attempt)
		end
		if f then
			own = own + 1
			out[j + 1] = f
		elseif v == false or h == false then
			free = true
			out[j + 1] = 0
		elseif type(h) == 'table' then
			modes = modes or {4}
			modes[j + 1] = h[1]
		else
			other = true
			out[j + 1] = h or held(key)
		end
	end
	if modes then
		for j = 2, size + 1 do
			modes[j] = modes[j] or 0
		end
		return modes
	end
	if own > 0 and own < size and not anyPart then
		out[1] = 2
		return out
	end
	if other then
		if waits then
			for j = 1, size do
				if out[j + 1] < 0 then
					-- Marks the key, as aw does: its release is published.
					out[j + 1] = acquire(KEYS[i + j - 1], 'rw', token, ttl, attempt)
				end
			end
		end
		return out
	end
	if refreshOnly and free then
		out[1] = -1
		return out
	end
	for j = 1, size do
		out[j + 1] = acquire(KEYS[i + j - 1], 'a', token, ttl, attempt)
	end
	out[1] = 1
	if own == size then
		out[1] = 3
	end
	return out
end
`, []string{"enter", "sethold", "query", "view", "group"}}

// luaFamily is a family of opsScript's operations: Lua (body) that defines
// local functions, of which the ones named by exports are called from
// outside the family.
type luaFamily struct {
	name    string
	body    string
	exports []string
}

// lazyFamilies returns the Lua that assigns opsScript's function family:
// family(name) makes the functions of the family name on its first call in
// a call of the script, and returns a table of its exports. Every call of a
// script runs its whole chunk, and each Lua function that the chunk
// defines is a closure made anew, with its upvalues, on every call (and
// garbage for the node's Lua collector afterwards): the functions of a
// family that a call does not use cost it nothing but this one closure,
// whatever the number of families.
func lazyFamilies(fams ...luaFamily) string {
	var b strings.Builder
	b.WriteString("local families = {}\nfamily = function(name)\n\tlocal f = families[name]\n\tif f then\n\t\treturn f\n\tend\n")
	for i, fam := range fams {
		if i == 0 {
			b.WriteString("\tif")
		} else {
			b.WriteString("\telseif")
		}
		b.WriteString(" name == '" + fam.name + "' then\n\t\tf = (function()\n")
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
var beginScript = newScript(`
if redis.call('EXISTS', KEYS[1]) == 1 then
	return {1}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local wait = tonumber(ARGV[2])
local r = redis.call('HMGET', KEYS[2], 'id', 'detected', 'deadline')
local id, detected, deadline = r[1], tonumber(r[2]), tonumber(r[3])
if not id or not detected or not deadline then
	id, detected, deadline = ARGV[1], now, now + wait
	redis.call('HSET', KEYS[2], 'id', id, 'detected', string.format('%d', detected), 'deadline', string.format('%d', deadline))
elseif deadline < detected + wait then
	deadline = detected + wait
	redis.call('HSET', KEYS[2], 'deadline', string.format('%d', deadline))
end
return {0, id, now - detected, math.max(deadline - now, 0)}
`)

// lossScript takes a node whose clock jumped forward for one that lost its
// data: it deletes the marker and, when ref is given, sets the clock offset
// so that the node reads ref, the reference clock in ms, from then on (the
// recovery's end checks that it still does; see clock.go).
//
//	EVALSHA sha 2 marker clock ref
var lossScript = newScript(`
redis.call('DEL', KEYS[1])
local ref = tonumber(ARGV[1])
if ref then
	local t = redis.call('TIME')
	local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
	redis.call('SET', KEYS[2], string.format('%d', now - ref))
end
return 1
`)

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
var dumpScript = newScript(hdumpLua + `
if redis.call('EXISTS', KEYS[1]) == 0 then
	return {0}
end
local r = redis.call('SCAN', ARGV[1], 'MATCH', ARGV[2], 'COUNT', ARGV[3])
local out = {1, r[1], redis.call('GET', KEYS[2]) or '0'}
for _, k in ipairs(r[2]) do
	local p = redis.call('PTTL', k)
	if p ~= -2 then
		local v = redis.pcall('GET', k)
		if type(v) == 'table' then
			v = hdump(k)
		end
		if v and string.byte(v, 1) ~= 120 then
			out[#out + 1] = k
			out[#out + 1] = v
			out[#out + 1] = p
		end
	end
end
return out
`)

// peekScript reads locks of a node that kept its data again.
//
//	EVALSHA sha n+1 marker key_1 .. key_n
//
// It replies {0} when the node has no marker, otherwise {1, value_1,
// pttl_1, ...}, with an empty value for a key of another type, and an
// empty value and pttl -2 for a key that is gone or a tombstone, and a
// hash record as dumpScript reports it.
var peekScript = newScript(hdumpLua + `
if redis.call('EXISTS', KEYS[1]) == 0 then
	return {0}
end
local out = {1}
for i = 2, #KEYS do
	local v = redis.pcall('GET', KEYS[i])
	if type(v) == 'table' then
		v = hdump(KEYS[i])
	end
	if type(v) ~= 'string' then
		v = ''
	end
	if string.byte(v, 1) == 120 then
		-- A tombstone: no lock.
		out[#out + 1] = ''
		out[#out + 1] = -2
	else
		out[#out + 1] = v
		out[#out + 1] = redis.call('PTTL', KEYS[i])
	end
end
return out
`)

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
var restoreScript = newScript(`
if redis.call('HGET', KEYS[1], 'id') ~= ARGV[1] then
	return 0
end
local counter = KEYS[2]
if tonumber(redis.call('GET', counter) or '0') < tonumber(ARGV[2]) then
	redis.call('SET', counter, ARGV[2])
end
-- owner returns the token and fence of a lock value, or nil for a value
-- that no token owns.
local function owner(v)
	local sep = string.find(v, ':', 2, true)
	if not sep then
		return nil
	end
	local h = string.sub(v, 2, sep - 1)
	local slash = string.find(h, '/', 1, true)
	if slash then
		h = string.sub(h, 1, slash - 1)
	end
	local fence = tonumber(h)
	if not fence then
		return nil
	end
	return string.sub(v, sep + 1), fence
end
-- extension returns the extension of a value that a token owns (the hold
-- count and the holder, from its ';'), '' when it has none.
local function extension(v)
	local h = string.sub(v, 2, string.find(v, ':', 2, true) - 1)
	local semi = string.find(h, ';', 1, true)
	if not semi then
		return ''
	end
	return string.sub(h, semi)
end
-- version returns the version of the hold count in an extension, -1 when
-- it has none.
local function version(e)
	return tonumber(string.match(e, '^;%d+%.(%d+)')) or -1
end
-- attempts returns the attempt list of a value that a token owns, '' for
-- the previous layout's.
local function attempts(v)
	local h = string.sub(v, 2, string.find(v, ':', 2, true) - 1)
	local semi = string.find(h, ';', 1, true)
	if semi then
		h = string.sub(h, 1, semi - 1)
	end
	local slash = string.find(h, '/', 1, true)
	if not slash then
		return ''
	end
	return string.sub(h, slash + 1)
end
-- union returns the attempts of both lists, so that no cleanup deletes a
-- holding that an attempt of either relies on ('*' for more than 8, or
-- when either is the previous layout's or '*').
local function union(a, b)
	if a == '' or b == '' or a == '*' or b == '*' then
		return '*'
	end
	local seen, out = {}, {}
	for s in string.gmatch(a .. ',' .. b, '[^,]+') do
		if not seen[s] then
			seen[s] = true
			out[#out + 1] = s
		end
	end
	if #out > 8 then
		return '*'
	end
	return table.concat(out, ',')
end
` + hrestoreLua + `
for i = 3, #KEYS do
	local key, v, p = KEYS[i], ARGV[2 * i - 3], tonumber(ARGV[2 * i - 2])
	-- A hash record is written by hrestore, whose table skips the rest.
	local cur = string.byte(v, 1) == 72 and hrestore(key, v) or redis.pcall('GET', key)
	if type(cur) ~= 'table' then
		local tok, fence = owner(v)
		local ctok, cfence
		if cur then
			ctok, cfence = owner(cur)
		end
		if tok and ctok == tok then
			-- The larger fence, a waiter's mark from either, and the
			-- attempts of both.
			local mark = '0'
			if string.byte(v, 1) == 49 or string.byte(cur, 1) == 49 then
				mark = '1'
			end
			-- The hold count of the later version (recovery carries it as
			-- live lock state).
			local ext, cext = extension(v), extension(cur)
			if version(cext) > version(ext) or (version(cext) == version(ext) and ext == '') then
				ext = cext
			end
			local nv = mark .. string.format('%d', math.max(fence, cfence)) .. '/' .. union(attempts(v), attempts(cur)) .. ext .. ':' .. tok
			if nv ~= cur then
				redis.call('SET', key, nv, 'KEEPTTL')
			end
			local cp = redis.call('PTTL', key)
			if p == -1 then
				redis.call('PERSIST', key)
			elseif cp ~= -1 and cp < p then
				redis.call('PEXPIRE', key, p)
			end
		elseif p == -1 then
			redis.call('SET', key, v)
		else
			redis.call('SET', key, v, 'PX', p)
		end
	end
end
return 1
`)

// evictedScript takes a node that evicted keys since the last call for one
// that lost its data.
//
//	EVALSHA sha 2 marker evicted count
//
// count is the node's evicted_keys (INFO stats); the key evicted holds the
// count already handled. When count is larger, the marker is deleted and
// the script replies 1; otherwise (also after CONFIG RESETSTAT) it records
// count and replies 0.
var evictedScript = newScript(`
local count, seen = tonumber(ARGV[1]), tonumber(redis.call('GET', KEYS[2]) or '0')
redis.call('SET', KEYS[2], ARGV[1])
if count > seen then
	redis.call('DEL', KEYS[1])
	return 1
end
return 0
`)

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
var finishScript = newScript(`
if redis.call('EXISTS', KEYS[1]) == 1 then
	return 1
end
local r = redis.call('HMGET', KEYS[2], 'id', 'deadline')
if r[1] ~= ARGV[1] then
	return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ref = tonumber(ARGV[4])
local ahead = now - tonumber(redis.call('GET', KEYS[4]) or '0') - ref
if ahead > tonumber(ARGV[5]) then
	redis.call('HSET', KEYS[2], 'id', ARGV[1] .. '+', 'deadline', string.format('%d', (tonumber(r[2]) or now) + ahead))
	redis.call('SET', KEYS[4], string.format('%d', now - ref))
	return 0
end
if ARGV[3] == '1' then
	if not tonumber(r[2]) or now < tonumber(r[2]) then
		return 0
	end
end
if tonumber(redis.call('GET', KEYS[3]) or '0') < tonumber(ARGV[2]) then
	redis.call('SET', KEYS[3], ARGV[2])
end
redis.call('SET', KEYS[4], string.format('%d', now - ref))
redis.call('SET', KEYS[1], '1')
redis.call('DEL', KEYS[2])
return 1
`)
