package quorum

import (
	"crypto/sha1"
	"encoding/hex"
)

// Key layout on every node (every name starts with Config.KeyPrefix):
//
//	<prefix>lock:<resource>  string "<w><fence>:<token>", PX ttl; exists while held
//	<prefix>fence            integer, the node's fence counter (never expires)
//	<prefix>released         channel; payload is the released resource name
//
// In a lock's value, <w> is '1' once a waiter asked to be told of the
// release and '0' before, and <fence> is decimal, so the first ':' after it
// ends the fence whatever the token holds. A lock key of another type (the
// hash an earlier layout used) reads as held by someone else: acquisition
// fails and release, extend and raise leave it alone, so proxies of either
// layout on the same nodes never grant one resource twice.
//
// A node's batcher sends all the requests of a batch as one call of
// opsScript (EVALSHA, and EVAL after NOSCRIPT, which caches the script
// again, so a node that restarted with an empty script cache keeps
// working). On a busy node most of a script's cost is fixed per call and
// per redis.call, not per line of Lua: one call for the whole batch, and as
// few redis.calls per operation as the operation allows, is what keeps the
// node's CPU per lock low.
//
// The call is
//
//	EVALSHA sha n+1 key_1 .. key_n fence-counter code_1 token_1 x_1 .. code_n token_n x_n channel
//
// and replies with an array of n elements, each the integer result of one
// operation or, if that operation failed, its error (the others still run).
// The operations, by code:
//
//	a, aw  acquire: take the lock if it is free, refresh it if the token owns
//	       it; x is the ttl in ms. aw also marks a lock held by another
//	       token as waited for, so that its release is published.
//	r, rw  as a and aw, but only refresh an existing holding of the token,
//	       never take a free lock.
//	f      raise: counter = max(counter, x) and the stored fence = x, only
//	       while the token owns the lock. Lifts a node that granted a
//	       smaller fence than the majority's maximum x.
//	u, up  release: delete the lock if the token owns it; up then publishes
//	       x, the resource name, on the channel if a waiter marked the lock.
//	e      extend: reset the ttl to x ms if the token owns the lock.
//
// Acquire returns the fence (at least 1) when the token holds the lock
// afterwards (a fresh holding advances the counter and stores its value; a
// refresh keeps the stored fence), -1-pttl when another token holds it, and
// -1 when refresh-only found it free. It advances the counter before its
// SET NX, also when the lock turns out to be held: a free lock, the common
// case, then costs two redis.calls instead of three, and the counter still
// only ever grows, which is all fencing needs of it. Raise, release and
// extend return 1 when done and 0 when the token does not own the lock.
var opsScript = newScript(`
local n = #KEYS - 1
local counter, channel = KEYS[n + 1], ARGV[3 * n + 1]

-- held returns -1-pttl for a lock that another token holds.
local function held(key)
	return -1 - math.max(redis.call('PTTL', key), 0)
end

-- get returns the lock's value, false when there is none, or nil when the
-- key holds another type; other errors are raised.
local function get(v)
	if type(v) == 'table' then
		if string.sub(v.err, 1, 9) == 'WRONGTYPE' then
			return nil
		end
		error(v)
	end
	return v
end

-- fenceOf returns the fence stored in v when token owns it, otherwise nil.
local function fenceOf(v, token)
	local sep = string.find(v, ':', 2, true)
	if sep and string.sub(v, sep + 1) == token then
		return tonumber(string.sub(v, 2, sep - 1))
	end
	return nil
end

local function acquire(key, code, token, ttl)
	local v
	if code == 'r' or code == 'rw' then
		v = get(redis.pcall('GET', key))
		if v == false then
			return -1
		end
	else
		local fence = redis.call('INCR', counter)
		v = get(redis.pcall('SET', key, '0' .. string.format('%d', fence) .. ':' .. token, 'NX', 'PX', ttl, 'GET'))
		if v == false then
			return fence
		end
	end
	if v == nil then
		return held(key)
	end
	local fence = fenceOf(v, token)
	if fence then
		redis.call('PEXPIRE', key, ttl)
		return fence
	end
	if (code == 'aw' or code == 'rw') and string.byte(v, 1) == 48 then
		redis.call('SETRANGE', key, 0, '1')
	end
	return held(key)
end

-- owned returns the lock's value when token owns it, otherwise nil.
local function owned(key, token)
	local v = get(redis.pcall('GET', key))
	if v and fenceOf(v, token) then
		return v
	end
	return nil
end

local function raise(key, token, fence)
	local v = owned(key, token)
	if not v then
		return 0
	end
	if tonumber(redis.call('GET', counter) or '0') < tonumber(fence) then
		redis.call('SET', counter, fence)
	end
	redis.call('SET', key, string.sub(v, 1, 1) .. fence .. ':' .. token, 'KEEPTTL')
	return 1
end

local function release(key, code, token, resource)
	local v = owned(key, token)
	if not v then
		return 0
	end
	redis.call('DEL', key)
	if code == 'up' and string.byte(v, 1) == 49 then
		redis.call('PUBLISH', channel, resource)
	end
	return 1
end

local function extend(key, token, ttl)
	if not owned(key, token) then
		return 0
	end
	redis.call('PEXPIRE', key, ttl)
	return 1
end

local function run(i)
	local key, code, token, x = KEYS[i], ARGV[3 * i - 2], ARGV[3 * i - 1], ARGV[3 * i]
	local c = string.sub(code, 1, 1)
	if c == 'a' or c == 'r' then
		return acquire(key, code, token, x)
	elseif c == 'u' then
		return release(key, code, token, x)
	elseif c == 'e' then
		return extend(key, token, x)
	elseif c == 'f' then
		return raise(key, token, x)
	end
	error({err = 'ERR unknown lock operation ' .. code})
end

local res = {}
for i = 1, n do
	local ok, r = pcall(run, i)
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
end
return res
`)

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
	codeExtend                   = any("e")
)
