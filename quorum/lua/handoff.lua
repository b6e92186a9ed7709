
-- handoff runs h where release (ops.lua) did not hand the lock on: a lock
-- that is not the token's own plain one, or none (handed with no function
-- of core).
local function handoff(key, token, x, attempt)
	-- One match, not a find, two subs and splitExt: the extension is
	-- escaped (no ':'), so the first ':' ends it.
	local ttl, ext, next = string.match(x, '^([^;:]*)([^:]*):(.*)$')
	local v = redis.pcall('GET', key)
	local released, mark = 0, '0'
	if v then
		local k = family('core')
		v = k.get(v, attempt)
		if v == nil then
			-- A hash: the last reader hands the lock to the waiting writer.
			local hr = family('hash')
			local h = hr.hload(key)
			local f = h and hr.hfind(h, token)
			if not f then
				return {0, k.held(key)}
			end
			hr.hdrop(key, h, f, false, '')
			if h.n > 0 then
				return {1, k.held(key)}
			end
			redis.call('DEL', key)
			released = 1
			if h.mark then
				mark = '1'
			end
		elseif v then
			local tf, _, text = k.parse(v, token)
			if tf then
				local h, ver = k.holdsOf(text)
				if h then
					-- A count of holds: not released here (see release).
					return {-1, h, ver, 0, tf}
				end
				-- Keep the mark of waiters elsewhere, so that the next
				-- release is published.
				released, mark = 1, string.sub(v, 1, 1)
			else
				local f, att, old = k.parse(v, next)
				if f then
					return {0, k.refresh(key, v, next, ttl, f, att, attempt, old)}
				end
				return {0, k.held(key)}
			end
		end
	end
	local fence = redis.call('INCR', counter)
	-- As acquire: below 1e14 Lua writes the digits without string.format,
	-- and the value is value's, written out.
	redis.call('SET', key, mark .. (fence < 1e14 and fence or string.format('%d', fence)) .. '/' .. attempt .. ext .. ':' .. next, 'PX', ttl)
	return {released, fence}
end
