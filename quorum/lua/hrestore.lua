
local function hrestore(key, v)
	local pos = 2
	local function take()
		local c = string.find(v, ':', pos, true)
		local n = tonumber(string.sub(v, pos, c - 1))
		pos = c + n + 1
		return string.sub(v, c + 1, c + n)
	end
	local function split(rest)
		local sep = string.find(rest, ':', 1, true)
		local h = string.sub(rest, 1, sep - 1)
		local slash = string.find(h, '/', 1, true)
		return tonumber(string.sub(h, 1, slash - 1)), string.sub(h, slash + 1), string.sub(rest, sep + 1)
	end
	local t = redis.call('TIME')
	local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
	local mode = take()
	local have, last = {}, 0
	local cur = redis.pcall('HGETALL', key)
	if cur.err then
		redis.call('DEL', key) -- a string lock written after the loss: it never counted
	else
		local curMode
		for j = 1, #cur, 2 do
			if cur[j] == 'm' then
				curMode = cur[j + 1]
			else
				have[cur[j]] = cur[j + 1]
			end
		end
		if #cur > 0 and curMode ~= mode then
			redis.call('DEL', key) -- another mode, written after the loss
			have = {}
		end
	end
	for f, x in pairs(have) do
		local bar = string.find(x, '|', 1, true)
		last = math.max(last, tonumber(bar and string.sub(x, 1, bar - 1) or x) or 0)
	end
	redis.call('HSET', key, 'm', mode)
	while pos <= #v do
		local f, left, rest = take(), tonumber(take()), take()
		local exp = now + left
		local old = have[f]
		local bar = old and string.find(old, '|', 1, true)
		if bar then
			local fence, att, token = split(rest)
			local ofence, oatt, otoken = split(string.sub(old, bar + 1))
			if otoken == token then
				exp = math.max(exp, tonumber(string.sub(old, 1, bar - 1)))
				rest = string.format('%d', math.max(fence, ofence)) .. '/' .. union(att, oatt) .. ':' .. token
			end
		end
		redis.call('HSET', key, f, string.format('%d', exp) .. '|' .. rest)
		last = math.max(last, exp)
	end
	redis.call('PEXPIRE', key, math.max(last - now, 1))
	return {}
end
