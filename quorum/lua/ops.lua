
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

-- lazyFamilies(hashFamily, exclusiveFamily, formsFamily, handoffFamily)
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
