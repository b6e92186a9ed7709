
local n = #KEYS - 3
local counter, marker, recovery = KEYS[n + 1], KEYS[n + 2], KEYS[n + 3]
local channel = ARGV[5 * n + 1]

-- The node's clock in ms, read once per call, first: every call reports it
-- (see the end), and every operation with a deadline compares it. TIME's
-- two decimal strings: Lua's arithmetic converts them, with no call of
-- tonumber or math.floor (about 1k instructions each).
local nowMs
do
	local t = redis.call('TIME')
	local us = t[2] + 0
	nowMs = t[1] * 1000 + (us - us % 1000) / 1000
end

-- family returns the functions of a family of operations (see
-- lazyFamilies): 'core' (core.lua: every function that a plain LOCK of a
-- free lock and the UNLOCK of the token's own plain lock do not call),
-- 'hash' (hash records, hashLua), 'exclusive' (the exclusive operations
-- that a plain LOCK and UNLOCK do not use), 'forms' (LOCK ... REENTRANT,
-- LOCKINFO, MLOCK) or 'handoff'. Every call of a script runs its whole
-- chunk, and each function it defines is a closure made anew: the plain
-- LOCK and UNLOCK make only acquire, release, run and this one.
local family

-- acquire runs a, aw, r and rw.
local function acquire(key, code, token, x, attempt)
	-- splitExt and value, written out: a free lock needs no function of
	-- core.
	local ttl, ext = string.match(x, '^([^;]*)(.*)$')
	local v, k
	if code == 'r' or code == 'rw' then
		k = family('core')
		v = k.get(redis.pcall('GET', key), attempt)
		if v == false then
			return -1
		end
	else
		local fence = redis.call('INCR', counter)
		-- Lua writes a number below 1e14 as its digits (%.14g) without the
		-- call of string.format that a larger one needs.
		local new = '0' .. (fence < 1e14 and fence or string.format('%d', fence)) .. '/' .. attempt .. ext .. ':' .. token
		v = redis.pcall('SET', key, new, 'NX', 'PX', ttl, 'GET')
		if v == false then
			return fence
		end
		k = family('core')
		v = k.get(v, attempt)
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
	local f, att, old = k.parse(v, token)
	if f then
		return k.refresh(key, v, token, ttl, f, att, attempt, old)
	end
	if (code == 'aw' or code == 'rw') and string.byte(v, 1) == 48 then
		redis.call('SETRANGE', key, 0, '1')
	end
	return k.held(key)
end

-- release runs u, up, uf and ul, and h (handoff): the token's own plain
-- lock is handed on here, everything else by the family 'handoff'.
local function release(key, code, token, resource, attempt)
	local v = redis.pcall('GET', key)
	local h = code == 'h'
	if v and not v.err and (code == 'up' or code == 'u' or h) then
		-- The plain UNLOCK of a string (v.err is the string library's, nil;
		-- no call of type): a value that token owns and that stores no count
		-- of holds (no digit after its header's first ';') is dropped
		-- without parsing the rest of it; a count goes the long way below.
		local mark = string.byte(v, 1)
		if mark ~= 120 then -- not a tombstone (get)
			local sep = string.find(v, ':', 2, true)
			if not sep or string.sub(v, sep + 1) ~= token then
				if h then
					return family('handoff').handoff(key, token, resource, attempt)
				end
				return family('hash').hrelease(key, token, code ~= 'u', resource)
			end
			-- Anchored: one try over the header, where ';%d' unanchored
			-- would try every position of the value, holder and token too.
			-- The holder is escaped: no ';' or ':' in it.
			if not string.find(v, '^[^;:]*;%d') then
				if h then
					-- Handed to the next token (x, here resource: see
					-- handoff), the waiters' mark kept, with no function
					-- made: the cycle of a contended LOCK ... WAIT.
					local ttl, ext, next = string.match(resource, '^([^;:]*)([^:]*):(.*)$')
					local fence = redis.call('INCR', counter)
					redis.call('SET', key, string.sub(v, 1, 1) .. (fence < 1e14 and fence or string.format('%d', fence)) .. '/' .. attempt .. ext .. ':' .. next, 'PX', ttl)
					return {1, fence}
				end
				redis.call('DEL', key)
				if code == 'up' and mark == 49 then
					redis.call('PUBLISH', channel, resource)
				end
				return 1
			end
		end
	end
	if h then
		return family('handoff').handoff(key, token, resource, attempt)
	end
	local k = family('core')
	v = k.get(v)
	local f, _, ext
	if v then
		f, _, ext = k.parse(v, token)
	end
	if not f then
		return family('hash').hrelease(key, token, code ~= 'u', resource)
	end
	local h, ver = k.holdsOf(ext)
	if code == 'ul' then
		if not h then
			return {0, 1, 0, 0, f} -- no count: HOLD 1 does not apply
		end
	elseif code ~= 'uf' and h then
		-- A count of holds: the caller decides from a majority's count
		-- (reentrant.go), never this node alone.
		return {0, h, ver, 0, f}
	end
	return k.drop(key, v, code ~= 'u', resource)
end

-- lazyFamilies(coreFamily, hashFamily, exclusiveFamily, formsFamily, handoffFamily)
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
	if deadline ~= '0' and nowMs > deadline + 0 then
		error({err = 'LATE the request arrived after its deadline'})
	end
	if c == 'a' or c == 'r' then
		return acquire(key, code, token, x, attempt)
	elseif c == 'u' or c == 'h' then
		return release(key, code, token, x, attempt)
	elseif c == 'q' then
		return family('hash').hacquire(key, code, token, x, attempt)
	elseif c == 'c' then
		return family('core').cleanup(key, code, token, x, attempt)
	elseif c == 'e' then
		return family('core').extend(key, token, x)
	elseif c == 'f' then
		return family('exclusive').raise(key, token, x)
	elseif c == 'p' then
		return family('exclusive').place(key, token, x, attempt)
	elseif c == 's' then
		return family('exclusive').status()
	elseif c == 't' then
		return nowMs
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
local t = nowMs
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
