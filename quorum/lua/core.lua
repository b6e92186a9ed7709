
-- The functions of opsScript that a plain LOCK and UNLOCK do not call on
-- their way (acquire's free lock, release's own plain lock): the family
-- 'core' (see lazyFamilies), whose exports every other family has as
-- locals of the same names.

-- now returns the node's clock in ms, read once per call (ops.lua).
local function now()
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
