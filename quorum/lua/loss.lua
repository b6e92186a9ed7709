
redis.call('DEL', KEYS[1])
local ref = tonumber(ARGV[1])
if ref then
	local t = redis.call('TIME')
	local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
	redis.call('SET', KEYS[2], string.format('%d', now - ref))
end
return 1
