
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
