
if redis.call('EXISTS', KEYS[1]) == 1 then
	return {1}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local wait = tonumber(ARGV[2])
local r = redis.call('HMGET', KEYS[2], 'id', 'detected', 'deadline')
local id, detected, deadline = r[1], tonumber(r[2]), tonumber(r[3])
if not id or not detected or not deadline then
	id, detected, deadline = ARGV[1], now, now + wait
	redis.call('HSET', KEYS[2], 'id', id, 'detected', string.format('%d', detected), 'deadline', string.format('%d', deadline))
elseif deadline < detected + wait then
	deadline = detected + wait
	redis.call('HSET', KEYS[2], 'deadline', string.format('%d', deadline))
end
return {0, id, now - detected, math.max(deadline - now, 0)}
