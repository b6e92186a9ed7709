
if redis.call('EXISTS', KEYS[1]) == 1 then
	return 1
end
local r = redis.call('HMGET', KEYS[2], 'id', 'deadline')
if r[1] ~= ARGV[1] then
	return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ref = tonumber(ARGV[4])
local ahead = now - tonumber(redis.call('GET', KEYS[4]) or '0') - ref
if ahead > tonumber(ARGV[5]) then
	redis.call('HSET', KEYS[2], 'id', ARGV[1] .. '+', 'deadline', string.format('%d', (tonumber(r[2]) or now) + ahead))
	redis.call('SET', KEYS[4], string.format('%d', now - ref))
	return 0
end
if ARGV[3] == '1' then
	if not tonumber(r[2]) or now < tonumber(r[2]) then
		return 0
	end
end
if tonumber(redis.call('GET', KEYS[3]) or '0') < tonumber(ARGV[2]) then
	redis.call('SET', KEYS[3], ARGV[2])
end
redis.call('SET', KEYS[4], string.format('%d', now - ref))
redis.call('SET', KEYS[1], '1')
redis.call('DEL', KEYS[2])
return 1
