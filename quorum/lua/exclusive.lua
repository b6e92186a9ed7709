
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
