#!/usr/bin/env bash
# lockproxy from redis-cli: LOCK, a write guarded by the fence, EXTEND,
# UNLOCK, and the null reply a second client gets. Every reply is checked;
# the script exits non-zero on the first mismatch.
#   LOCKPROXY_ADDR=127.0.0.1:6380 examples/cli/lock.sh
set -euo pipefail
addr=${LOCKPROXY_ADDR:-127.0.0.1:6380}
host=${addr%:*} port=${addr##*:}
res=example:cli data=example:cli:data

# check WHAT GOT REGEX: stop with a message unless GOT matches REGEX.
fail() { echo "FAIL $*" >&2; exit 1; }
check() { [[ $2 =~ $3 ]] || fail "$1: got '$2', want /$3/"; }

# Write ARGV[2] to KEYS[1] only if ARGV[1] is not older than the fence
# already stored there: the storage side of fencing.
fenced_set='local f = tonumber(redis.call("HGET", KEYS[1], "fence") or "0")
if tonumber(ARGV[1]) < f then return 0 end
redis.call("HSET", KEYS[1], "fence", ARGV[1], "value", ARGV[2]) return 1'

for proto in 2 3; do # redis-cli -2 speaks RESP2, -3 RESP3 (HELLO 3)
  # Each cli call is a new connection (a new client) printing raw replies.
  cli() { redis-cli -h "$host" -p "$port" "-$proto" "$@"; }

  # LOCK: [token, validity-ms, fence], one per line.
  mapfile -t r < <(cli LOCK "$res" 10000 WAIT 2000)
  token=${r[0]:-} validity=${r[1]:-} fence=${r[2]:-}
  check "LOCK token" "$token" '^[[:graph:]]{16,}$'
  check "LOCK validity" "$validity" '^[1-9][0-9]*$'
  ((validity <= 10000)) || fail "LOCK validity $validity > ttl 10000"
  check "LOCK fence" "$fence" '^[1-9][0-9]*$'

  # The work: a fenced write; a writer with an older fence is refused.
  check "fenced write" "$(cli EVAL "$fenced_set" 1 "$data" "$fence" "proto $proto")" '^1$'
  check "stale write" "$(cli EVAL "$fenced_set" 1 "$data" $((fence - 1)) stale)" '^0$'
  check "HGET value" "$(cli HGET "$data" value)" "^proto $proto\$"

  # Another client without WAIT gets the null reply at once.
  check "second LOCK" "$(cli --no-raw LOCK "$res" 10000)" '^\(nil\)$'

  check "EXTEND" "$(cli EXTEND "$res" 10000 "$token")" '^[1-9][0-9]*$'
  check "UNLOCK" "$(cli UNLOCK "$res" "$token")" '^1$'
  check "UNLOCK again" "$(cli UNLOCK "$res" "$token")" '^0$'

  # Token-less EXTEND/UNLOCK need the connection that holds the lock:
  # commands on stdin go through one redis-cli connection.
  mapfile -t r < <(printf '%s\n' "LOCK $res 10000" "EXTEND $res 5000" "UNLOCK $res" | cli)
  check "LOCK (one connection)" "${r[0]:-}" '^[[:graph:]]{16,}$'
  ((${r[2]:-0} > fence)) || fail "fence did not grow: '${r[2]:-}' after $fence"
  check "EXTEND without token" "${r[3]:-}" '^[1-9][0-9]*$'
  check "UNLOCK without token" "${r[4]:-}" '^1$'
  echo "redis-cli RESP$proto: ok (token ${token:0:8}..., fence $fence, then ${r[2]})"
done
