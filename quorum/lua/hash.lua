
-- hload reads and prunes the hash record at key. It returns nil when key
-- is not a hash, or is an earlier layout's hash without a mode; otherwise
-- {mode, mark, intent, live = {field = holding}, n, tomb = {field = true},
-- last}, last being the latest expiry left in it.
local function hload(key)
	local all = redis.pcall('HGETALL', key)
	if all.err then
		if string.sub(all.err, 1, 9) == 'WRONGTYPE' then
			return nil
		end
		error(all)
	end
	local moded = false
	for i = 1, #all, 2 do
		if all[i] == 'm' then
			moded = true
			break
		end
	end
	if #all > 0 and not moded then
		return nil -- an earlier layout's hash: its fields are not this layout's
	end
	local h = {live = {}, n = 0, tomb = {}, last = 0}
	local t = now()
	local dead = {}
	for i = 1, #all, 2 do
		local f, v = all[i], all[i + 1]
		local c = string.byte(f, 1)
		if f == 'm' then
			h.mode = v
		elseif f == 'w' then
			h.mark = true
		elseif f == 'i' or c == 120 then
			local exp = tonumber(v) or 0
			if exp <= t then
				dead[#dead + 1] = f
			else
				if f == 'i' then
					h.intent = exp
				else
					h.tomb[f] = true
				end
				h.last = math.max(h.last, exp)
			end
		else
			local bar = string.find(v, '|', 1, true)
			local exp = tonumber(string.sub(v, 1, bar - 1))
			if exp <= t then
				dead[#dead + 1] = f
			else
				local rest = string.sub(v, bar + 1)
				local sep = string.find(rest, ':', 1, true)
				local hd = string.sub(rest, 1, sep - 1)
				local slash = string.find(hd, '/', 1, true)
				h.live[f] = {exp = exp, fence = tonumber(string.sub(hd, 1, slash - 1)), att = string.sub(hd, slash + 1), token = string.sub(rest, sep + 1)}
				h.n = h.n + 1
				h.last = math.max(h.last, exp)
			end
		end
	end
	if #dead > 0 then
		redis.call('HDEL', key, unpack(dead))
	end
	return h
end

-- hexpire sets the key's PX to the latest expiry in the record and exp.
local function hexpire(key, h, exp)
	if exp > h.last then
		h.last = exp
	end
	redis.call('PEXPIRE', key, math.max(h.last - now(), 1))
end

-- hset writes holding e of field f, with its expiry, and moves the key's
-- expiry out to it when it is the latest.
local function hset(key, h, f, e)
	redis.call('HSET', key, f, string.format('%d', e.exp) .. '|' .. e.fence .. '/' .. e.att .. ':' .. e.token)
	h.live[f] = e
	hexpire(key, h, e.exp)
end

-- hfind returns the field and holding of token in h, or nil.
local function hfind(h, token)
	local e = h.live['@' .. token]
	if e then
		return '@' .. token, e
	end
	for f, x in pairs(h.live) do
		if x.token == token then
			return f, x
		end
	end
	return nil
end

-- hremaining returns the ms until the first (or, with last, the latest)
-- holding of h expires.
local function hremaining(h, last)
	local t, r = now(), nil
	for _, e in pairs(h.live) do
		local left = e.exp - t
		if not r or (last and left > r) or (not last and left < r) then
			r = left
		end
	end
	return math.max(r or 0, 0)
end

-- hdrop deletes holding f of h, the whole key when nothing else lives in
-- it, and with publish tells the waiters that marked it.
local function hdrop(key, h, f, publish, resource)
	h.live[f] = nil
	h.n = h.n - 1
	if h.n == 0 and not h.intent and next(h.tomb) == nil then
		redis.call('DEL', key)
	else
		redis.call('HDEL', key, f)
		h.last = 0
		for _, e in pairs(h.live) do
			h.last = math.max(h.last, e.exp)
		end
		for t in pairs(h.tomb) do
			h.last = math.max(h.last, tonumber(redis.call('HGET', key, t)) or 0)
		end
		h.last = math.max(h.last, h.intent or 0)
		hexpire(key, h, 0)
	end
	if publish and h.mark then
		redis.call('PUBLISH', channel, resource)
	end
	return 1
end

-- hmode returns the mode code of h for a request in another mode: k for a
-- semaphore of k, -2 for shared.
local function hmode(h)
	if h.mode == 'r' then
		return -2
	end
	return tonumber(string.sub(h.mode, 2))
end

-- hexclusive is the slow branch of an exclusive acquisition (code a, aw,
-- r, rw) that met a hash. It returns false when the record holds nothing
-- (the caller takes the lock), or the reply: a mode code, -1-pttl while
-- readers hold it (a waiting writer records its intent for ttl ms and
-- marks the record), or LATE against a tombstone of this attempt.
local function hexclusive(key, code, token, ttl, attempt)
	local h = hload(key)
	if not h then
		return held(key)
	end
	if h.tomb['x/' .. attempt] then
		error({err = 'LATE the attempt was cleaned up before this request arrived'})
	end
	if h.n == 0 then
		return false
	end
	if h.mode ~= 'r' then
		return {hmode(h), 0}
	end
	if h.live['@' .. token] then
		return {-3, 0}
	end
	if code == 'aw' or code == 'rw' then
		local exp = now() + tonumber(ttl)
		h.intent, h.mark = exp, true
		redis.call('HSET', key, 'i', string.format('%d', exp), 'w', '1')
		hexpire(key, h, exp)
	end
	return -1 - hremaining(h, true)
end

-- hacquire takes or refreshes a shared holding (x "<ttl>:0:0") or a
-- semaphore permit (x "<ttl>:<k>:<slot>", the proposed slot). Codes: q
-- (acquire), qw (and mark the record for a release notification), qr
-- (only refresh the token's holding), qp (place, see opsScript: a
-- holding of the token there keeps its expiry when it is the later). It replies {slot, fence} when the
-- token holds afterwards (a refresh keeps its slot and fence), {free,
-- -1-ms} when the proposed slot (or, shared, the resource) is taken,
-- free being a free slot or -1 and ms the time until the refusal may end:
-- until the first holding expires for a permit, until a waiting writer's
-- intent ends for a reader (which the intent alone refuses, however soon
-- or late the readers there expire), {-1, -1} when qr found no holding
-- of the token, and {code, 0}
-- for another mode (-1 exclusive, -2 shared, k > 1 a semaphore of k, -3
-- RLOCK by the exclusive holder's token).
local function hacquire(key, code, token, x, attempt)
	local s1 = string.find(x, ':', 1, true)
	local s2 = string.find(x, ':', s1 + 1, true)
	local s3 = string.find(x, ':', s2 + 1, true)
	local ttl, k, slot = tonumber(string.sub(x, 1, s1 - 1)), tonumber(string.sub(x, s1 + 1, s2 - 1)), tonumber(string.sub(x, s2 + 1, (s3 or 0) - 1))
	local waits = code == 'qw'
	local h = hload(key)
	if not h then
		local v = get(redis.pcall('GET', key), attempt)
		if v == nil then
			return {-1, held(key)} -- an earlier layout's hash
		end
		if v then
			if k > 0 then
				return {-1, 0}
			end
			if parse(v, token) then
				return {-3, 0}
			end
			if waits and string.byte(v, 1) == 48 then
				redis.call('SETRANGE', key, 0, '1')
			end
			return {-1, held(key)}
		end
		redis.call('DEL', key) -- a tombstone of another attempt: free
		h = {live = {}, n = 0, tomb = {}, last = 0}
	end
	if h.tomb['x/' .. attempt] then
		error({err = 'LATE the attempt was cleaned up before this request arrived'})
	end
	local mode = 'r'
	if k > 0 then
		mode = 's' .. k
	end
	if h.n > 0 and h.mode ~= mode then
		return {hmode(h), 0}
	end
	local exp = now() + ttl
	local f, e = hfind(h, token)
	if f then
		-- A placement (qp) never shortens the holding: one that lands
		-- after the token refreshed it there carries the earlier ttl.
		if code ~= 'qp' or exp > e.exp then
			e.exp = exp
		end
		e.att = addAttempt(e.att, attempt)
		hset(key, h, f, e)
		if k == 0 then
			return {0, e.fence}
		end
		return {tonumber(string.sub(f, 2)), e.fence}
	end
	if code == 'qr' then
		return {-1, -1}
	end
	if k == 0 then
		f = '@' .. token
	else
		f = '#' .. slot
	end
	if h.live[f] or (k == 0 and h.intent) then
		if waits and not h.mark then
			h.mark = true
			redis.call('HSET', key, 'w', '1')
		end
		local free = -1
		if k > 0 and h.n < k then
			for j = 1, k - 1 do
				local s = (slot + j) % k
				if not h.live['#' .. s] then
					free = s
					break
				end
			end
		end
		if k == 0 then
			return {free, -1 - math.max(h.intent - now(), 0)}
		end
		return {free, -1 - hremaining(h, false)}
	end
	local fence
	if code == 'qp' then
		-- Healing: the holding's fence, and the counter raised to it.
		fence = tonumber(string.sub(x, s3 + 1))
		if tonumber(redis.call('GET', counter) or '0') < fence then
			redis.call('SET', counter, string.format('%d', fence))
		end
	else
		fence = redis.call('INCR', counter)
	end
	if h.mode ~= mode then
		h.mode = mode
		redis.call('HSET', key, 'm', mode)
	end
	hset(key, h, f, {exp = exp, fence = string.format('%d', fence), att = attempt, token = token})
	return {slot, fence}
end

-- hrelease deletes token's holding (release, u and up); 1 when done.
local function hrelease(key, token, publish, resource)
	local h = hload(key)
	local f = h and hfind(h, token)
	if not f then
		return 0
	end
	return hdrop(key, h, f, publish, resource)
end

-- hextend resets token's holding to ttl ms: {form, fence}, form being 2
-- for a reader and -10-(k*2^21+slot) for a permit (so that healing places
-- the same holding where it is missing, see holdingForm); -1 when the
-- record holds nothing of token, 0 when it is not a record with a mode.
local function hextend(key, token, ttl)
	local h = hload(key)
	if not h then
		return 0
	end
	local f, e = hfind(h, token)
	if not f then
		return -1
	end
	e.exp = now() + tonumber(ttl)
	hset(key, h, f, e)
	if string.byte(f, 1) == 64 then
		return {2, tonumber(e.fence)}
	end
	return {-10 - (tonumber(string.sub(h.mode, 2)) * 2097152 + tonumber(string.sub(f, 2))), tonumber(e.fence)}
end

-- hraise raises the counter and token's stored fence to fence; 1 when
-- token holds there.
local function hraise(key, token, fence)
	local h = hload(key)
	local f, e = nil, nil
	if h then
		f, e = hfind(h, token)
	end
	if not f then
		return 0
	end
	if tonumber(redis.call('GET', counter) or '0') < tonumber(fence) then
		redis.call('SET', counter, fence)
	end
	if tonumber(e.fence) < tonumber(fence) then
		e.fence = fence
		redis.call('HSET', key, f, string.format('%d', e.exp) .. '|' .. e.fence .. '/' .. e.att .. ':' .. e.token)
	end
	return 1
end

-- hcleanup undoes attempt in a hash record, as cleanup does for a string
-- lock: the attempt leaves the token's holding, which goes when no attempt
-- is left; without a holding of the token, a tombstone of the attempt
-- stays for ttl ms.
local function hcleanup(key, code, token, ttl, attempt, resource)
	local h = hload(key)
	if not h then
		return 0
	end
	local f, e = hfind(h, token)
	if not f then
		local exp = now() + tonumber(ttl)
		h.tomb['x/' .. attempt] = true
		redis.call('HSET', key, 'x/' .. attempt, string.format('%d', exp))
		hexpire(key, h, exp)
		return 0
	end
	if e.att == '*' or not relies(e.att, attempt) then
		return 0
	end
	if e.att ~= attempt then
		e.att = string.sub(string.gsub(',' .. e.att .. ',', ',' .. attempt:gsub('%p', '%%%0') .. ',', ',', 1), 2, -2)
		redis.call('HSET', key, f, string.format('%d', e.exp) .. '|' .. e.fence .. '/' .. e.att .. ':' .. e.token)
		return 0
	end
	return hdrop(key, h, f, code == 'cp', resource)
end
