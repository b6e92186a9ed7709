
local count, seen = tonumber(ARGV[1]), tonumber(redis.call('GET', KEYS[2]) or '0')
redis.call('SET', KEYS[2], ARGV[1])
if count > seen then
	redis.call('DEL', KEYS[1])
	return 1
end
return 0
