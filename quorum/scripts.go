package quorum

import "github.com/redis/go-redis/v9"

// The scripts run atomically on one node each. redis.Script.Run sends
// EVALSHA and falls back to EVAL on NOSCRIPT, so a node that restarted with
// an empty script cache keeps working.
//
// Key layout (every name starts with Config.KeyPrefix):
//
//	<prefix>lock:<resource>  hash {token, fence}, PX ttl; exists while held
//	<prefix>fence            integer, the node's fence counter (never expires)
//	<prefix>released         channel; payload is the released resource name

// acquireScript takes the lock if it is free, refreshes it if the token
// already owns it, and otherwise reports the holder's remaining ttl.
//
//	KEYS[1] lock hash, KEYS[2] fence counter
//	ARGV[1] token, ARGV[2] ttl in ms, ARGV[3] "1" to only refresh an existing
//	holding of the token (never take a free lock)
//
// Returns {1, fence} when held by the token afterwards (a fresh holding
// advances the counter and stores its value; a refresh keeps the stored
// fence), {0, pttl} when another token holds it, {0, 0} when refresh-only
// found it free.
var acquireScript = redis.NewScript(`
local owner = redis.call('HGET', KEYS[1], 'token')
if owner == ARGV[1] then
	redis.call('PEXPIRE', KEYS[1], ARGV[2])
	return {1, tonumber(redis.call('HGET', KEYS[1], 'fence'))}
end
if owner then
	return {0, redis.call('PTTL', KEYS[1])}
end
if ARGV[3] == '1' then
	return {0, 0}
end
local fence = redis.call('INCR', KEYS[2])
redis.call('HSET', KEYS[1], 'token', ARGV[1], 'fence', fence)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {1, fence}
`)

// raiseScript lifts a node that granted the lock with a smaller fence than
// the majority's maximum F: counter = max(counter, F) and the stored fence =
// F, but only while the token still owns the lock on this node.
//
//	KEYS[1] lock hash, KEYS[2] fence counter
//	ARGV[1] token, ARGV[2] F
//
// Returns 1 when raised, 0 when the token no longer owns the lock.
var raiseScript = redis.NewScript(`
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then
	return 0
end
if tonumber(redis.call('GET', KEYS[2]) or '0') < tonumber(ARGV[2]) then
	redis.call('SET', KEYS[2], ARGV[2])
end
redis.call('HSET', KEYS[1], 'fence', ARGV[2])
return 1
`)

// releaseScript deletes the lock if the token owns it and then, if asked,
// publishes the resource name so that waiters wake up.
//
//	KEYS[1] lock hash
//	ARGV[1] token, ARGV[2] channel, ARGV[3] resource, ARGV[4] "1" to publish
//
// Returns 1 when deleted, 0 otherwise.
var releaseScript = redis.NewScript(`
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then
	return 0
end
redis.call('DEL', KEYS[1])
if ARGV[4] == '1' then
	redis.call('PUBLISH', ARGV[2], ARGV[3])
end
return 1
`)

// extendScript resets the lock's ttl if the token owns it.
//
//	KEYS[1] lock hash
//	ARGV[1] token, ARGV[2] ttl in ms
//
// Returns 1 when extended, 0 otherwise.
var extendScript = redis.NewScript(`
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then
	return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
`)
