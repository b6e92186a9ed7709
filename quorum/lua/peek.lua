
if redis.call('EXISTS', KEYS[1]) == 0 then
	return {0}
end
local out = {1}
for i = 2, #KEYS do
	local v = redis.pcall('GET', KEYS[i])
	if type(v) == 'table' then
		v = hdump(KEYS[i])
	end
	if type(v) ~= 'string' then
		v = ''
	end
	if string.byte(v, 1) == 120 then
		-- A tombstone: no lock.
		out[#out + 1] = ''
		out[#out + 1] = -2
	else
		out[#out + 1] = v
		out[#out + 1] = redis.call('PTTL', KEYS[i])
	end
end
return out
