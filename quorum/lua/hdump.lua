
local function hdump(key)
	local all = redis.call('HGETALL', key)
	local t = redis.call('TIME')
	local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
	local function ns(s)
		return #s .. ':' .. s
	end
	local mode, out = nil, {}
	for i = 1, #all, 2 do
		local f, v = all[i], all[i + 1]
		local c = string.byte(f, 1)
		if f == 'm' then
			mode = v
		elseif c == 35 or c == 64 then
			local bar = string.find(v, '|', 1, true)
			local left = tonumber(string.sub(v, 1, bar - 1)) - now
			if left > 0 then
				out[#out + 1] = ns(f) .. ns(string.format('%d', left)) .. ns(string.sub(v, bar + 1))
			end
		end
	end
	if not mode then
		return ''
	end
	if #out == 0 then
		return 'x'
	end
	return 'H' .. ns(mode) .. table.concat(out)
end
