package quorum

import (
	"crypto/sha1"
	"encoding/hex"
)

// The scripts run atomically on one node each. A node's batcher sends them
// as EVALSHA and runs a request that got NOSCRIPT again with EVAL (which
// caches the script), so a node that restarted with an empty script cache
// keeps working.
//
// Key layout (every name starts with Config.KeyPrefix):
//
//	<prefix>lock:<resource>  hash {token, fence[, waiting]}, PX ttl; exists while held
//	<prefix>fence            integer, the node's fence counter (never expires)
//	<prefix>released         channel; payload is the released resource name

// acquireScript takes the lock if it is free, refreshes it if the token
// already owns it, and otherwise reports the holder's remaining ttl and, for
// a caller that will wait, marks the lock as waited for, so that its release
// is published.
//
//	KEYS[1] lock hash, KEYS[2] fence counter
//	ARGV[1] token, ARGV[2] ttl in ms, ARGV[3] "1" to only refresh an existing
//	holding of the token (never take a free lock), ARGV[4] "1" when the
//	caller waits for a release notification if it does not get the lock
//
// Returns the fence (at least 1) when held by the token afterwards (a fresh
// holding advances the counter and stores its value; a refresh keeps the
// stored fence), -1-pttl when another token holds it, and -1 when
// refresh-only found it free. One integer rather than an array keeps the
// reply cheap to read.
var acquireScript = newScript("acquire", `
local owner = redis.call('HGET', KEYS[1], 'token')
if owner == ARGV[1] then
	redis.call('PEXPIRE', KEYS[1], ARGV[2])
	return tonumber(redis.call('HGET', KEYS[1], 'fence'))
end
if owner then
	if ARGV[4] == '1' then
		redis.call('HSET', KEYS[1], 'waiting', '1')
	end
	return -1 - math.max(redis.call('PTTL', KEYS[1]), 0)
end
if ARGV[3] == '1' then
	return -1
end
local fence = redis.call('INCR', KEYS[2])
redis.call('HSET', KEYS[1], 'token', ARGV[1], 'fence', fence)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return fence
`)

// raiseScript lifts a node that granted the lock with a smaller fence than
// the majority's maximum F: counter = max(counter, F) and the stored fence =
// F, but only while the token still owns the lock on this node.
//
//	KEYS[1] lock hash, KEYS[2] fence counter
//	ARGV[1] token, ARGV[2] F
//
// Returns 1 when raised, 0 when the token no longer owns the lock.
var raiseScript = newScript("raise", `
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then
	return 0
end
if tonumber(redis.call('GET', KEYS[2]) or '0') < tonumber(ARGV[2]) then
	redis.call('SET', KEYS[2], ARGV[2])
end
redis.call('HSET', KEYS[1], 'fence', ARGV[2])
return 1
`)

// releaseScript deletes the lock if the token owns it and then, if asked
// and a waiter marked the lock (see acquireScript), publishes the resource
// name so that waiters wake up. A lock nobody waited for is released without
// a message: that is the common case, and every message costs the node a
// write to every subscribed Locker.
//
//	KEYS[1] lock hash
//	ARGV[1] token, ARGV[2] channel, ARGV[3] resource, ARGV[4] "1" to publish
//
// Returns 1 when deleted, 0 otherwise.
var releaseScript = newScript("release", `
local h = redis.call('HMGET', KEYS[1], 'token', 'waiting')
if h[1] ~= ARGV[1] then
	return 0
end
redis.call('DEL', KEYS[1])
if ARGV[4] == '1' and h[2] then
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
var extendScript = newScript("extend", `
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then
	return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
`)

// newScript returns the op that runs src, whose reply is an integer.
func newScript(name, src string) *op {
	sum := sha1.Sum([]byte(src))
	return &op{name: name, src: src, sha: hex.EncodeToString(sum[:])}
}
