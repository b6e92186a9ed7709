
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
