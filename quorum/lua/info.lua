
local marker = redis.call('EXISTS', KEYS[1])
local all = redis.pcall('HGETALL', KEYS[2])
if all.err then
	return {marker, 0, 0, 0, 0, 0}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local mode, holders, fence, last = nil, 0, 0, 0
for i = 1, #all, 2 do
	local f, v = all[i], all[i + 1]
	local c = string.byte(f, 1)
	if f == 'm' then
		mode = v
	elseif c == 35 or c == 64 then
		local bar = string.find(v, '|', 1, true)
		local exp = tonumber(string.sub(v, 1, bar - 1))
		if exp > now then
			holders = holders + 1
			local slash = string.find(v, '/', bar, true)
			fence = math.max(fence, tonumber(string.sub(v, bar + 1, slash - 1)))
			last = math.max(last, exp - now)
		end
	end
end
if not mode or holders == 0 then
	return {marker, 0, 0, 0, 0, 0}
end
if mode == 'r' then
	return {marker, 1, holders, 0, fence, last}
end
return {marker, 2, holders, tonumber(string.sub(mode, 2)), fence, last}
