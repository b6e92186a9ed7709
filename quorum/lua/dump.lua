
if redis.call('EXISTS', KEYS[1]) == 0 then
	return {0}
end
local r = redis.call('SCAN', ARGV[1], 'MATCH', ARGV[2], 'COUNT', ARGV[3])
local out = {1, r[1], redis.call('GET', KEYS[2]) or '0'}
for _, k in ipairs(r[2]) do
	local p = redis.call('PTTL', k)
	if p ~= -2 then
		local v = redis.pcall('GET', k)
		if type(v) == 'table' then
			v = hdump(k)
		end
		if v and string.byte(v, 1) ~= 120 then
			out[#out + 1] = k
			out[#out + 1] = v
			out[#out + 1] = p
		end
	end
end
return out
