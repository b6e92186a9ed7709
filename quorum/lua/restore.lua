
if redis.call('HGET', KEYS[1], 'id') ~= ARGV[1] then
	return 0
end
local counter = KEYS[2]
if tonumber(redis.call('GET', counter) or '0') < tonumber(ARGV[2]) then
	redis.call('SET', counter, ARGV[2])
end
-- owner returns the token and fence of a lock value, or nil for a value
-- that no token owns.
local function owner(v)
	local sep = string.find(v, ':', 2, true)
	if not sep then
		return nil
	end
	local h = string.sub(v, 2, sep - 1)
	local slash = string.find(h, '/', 1, true)
	if slash then
		h = string.sub(h, 1, slash - 1)
	end
	local fence = tonumber(h)
	if not fence then
		return nil
	end
	return string.sub(v, sep + 1), fence
end
-- extension returns the extension of a value that a token owns (the hold
-- count and the holder, from its ';'), '' when it has none.
local function extension(v)
	local h = string.sub(v, 2, string.find(v, ':', 2, true) - 1)
	local semi = string.find(h, ';', 1, true)
	if not semi then
		return ''
	end
	return string.sub(h, semi)
end
-- version returns the version of the hold count in an extension, -1 when
-- it has none.
local function version(e)
	return tonumber(string.match(e, '^;%d+%.(%d+)')) or -1
end
-- attempts returns the attempt list of a value that a token owns, '' for
-- the previous layout's.
local function attempts(v)
	local h = string.sub(v, 2, string.find(v, ':', 2, true) - 1)
	local semi = string.find(h, ';', 1, true)
	if semi then
		h = string.sub(h, 1, semi - 1)
	end
	local slash = string.find(h, '/', 1, true)
	if not slash then
		return ''
	end
	return string.sub(h, slash + 1)
end
-- union returns the attempts of both lists, so that no cleanup deletes a
-- holding that an attempt of either relies on ('*' for more than 8, or
-- when either is the previous layout's or '*').
local function union(a, b)
	if a == '' or b == '' or a == '*' or b == '*' then
		return '*'
	end
	local seen, out = {}, {}
	for s in string.gmatch(a .. ',' .. b, '[^,]+') do
		if not seen[s] then
			seen[s] = true
			out[#out + 1] = s
		end
	end
	if #out > 8 then
		return '*'
	end
	return table.concat(out, ',')
end
-- hrestoreLua
for i = 3, #KEYS do
	local key, v, p = KEYS[i], ARGV[2 * i - 3], tonumber(ARGV[2 * i - 2])
	-- A hash record is written by hrestore, whose table skips the rest.
	local cur = string.byte(v, 1) == 72 and hrestore(key, v) or redis.pcall('GET', key)
	if type(cur) ~= 'table' then
		local tok, fence = owner(v)
		local ctok, cfence
		if cur then
			ctok, cfence = owner(cur)
		end
		if tok and ctok == tok then
			-- The larger fence, a waiter's mark from either, and the
			-- attempts of both.
			local mark = '0'
			if string.byte(v, 1) == 49 or string.byte(cur, 1) == 49 then
				mark = '1'
			end
			-- The hold count of the later version (recovery carries it as
			-- live lock state).
			local ext, cext = extension(v), extension(cur)
			if version(cext) > version(ext) or (version(cext) == version(ext) and ext == '') then
				ext = cext
			end
			local nv = mark .. string.format('%d', math.max(fence, cfence)) .. '/' .. union(attempts(v), attempts(cur)) .. ext .. ':' .. tok
			if nv ~= cur then
				redis.call('SET', key, nv, 'KEEPTTL')
			end
			local cp = redis.call('PTTL', key)
			if p == -1 then
				redis.call('PERSIST', key)
			elseif cp ~= -1 and cp < p then
				redis.call('PEXPIRE', key, p)
			end
		elseif p == -1 then
			redis.call('SET', key, v)
		else
			redis.call('SET', key, v, 'PX', p)
		end
	end
end
return 1
