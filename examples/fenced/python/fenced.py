#!/usr/bin/env python3
"""FENCED from redis-py, checking every reply (exit 1 on the first
mismatch): it locks an account, does a fenced read-modify-write of its
balance (the backend refuses it if a later holder has written since),
shows that an older fence is refused, and unlocks.

    LOCKPROXY_ADDR=127.0.0.1:6380 python3 examples/fenced/python/fenced.py
"""
import os
import sys

import redis

HOST, _, PORT = os.environ.get("LOCKPROXY_ADDR", "127.0.0.1:6380").rpartition(":")

# redis-py speaks RESP3 (protocol=3) from 5.0 on; Debian 12 ships 4.3.4.
RESP3 = int(redis.__version__.split(".")[0]) >= 5

# The read, the sum and the write are one script on the backend, run only
# when the fence is not older than the last fence that wrote the account.
DEPOSIT = """local b = tonumber(redis.call('GET', KEYS[1]) or '0') + tonumber(ARGV[1])
redis.call('SET', KEYS[1], b)
return b"""


def check(ok, what, got):
    if not ok:
        sys.exit(f"FAIL {what}: got {got!r}")


def example(protocol):
    extra = {"protocol": 3} if protocol == 3 else {}
    r = redis.Redis(host=HOST, port=int(PORT), decode_responses=True, socket_timeout=10, **extra)
    res = f"example:fenced:python:{protocol}"
    balance = res + ":balance"

    # An earlier holder, whose lock ran out while it was paused: its fence
    # is older than any later holder's.
    reply = r.execute_command("LOCK", res, 10000, "WAIT", 2000)
    check(reply is not None and len(reply) == 3, "LOCK (earlier holder)", reply)
    old_fence = reply[2]
    r.execute_command("UNLOCK", res, reply[0])

    # 1. Lock: [token, validity-ms, fence].
    reply = r.execute_command("LOCK", res, 10000, "WAIT", 2000)
    check(reply is not None and len(reply) == 3 and reply[2] > old_fence, "LOCK", reply)
    token, fence = reply[0], reply[2]

    # 2. Fenced read-modify-write.
    before = r.execute_command("FENCED", res, fence, "GET", balance)
    start = int(before or 0)
    after = r.execute_command("FENCED", res, fence, "EVAL", DEPOSIT, 1, balance, 25)
    check(after == start + 25, "FENCED EVAL deposit", after)
    check(int(r.get(balance)) == after, "GET balance", r.get(balance))

    # The earlier holder wakes up and writes with its older fence: the
    # backend refuses it and nothing runs.
    try:
        r.execute_command("FENCED", res, old_fence, "SET", balance, 0)
        check(False, "FENCED with an older fence", "accepted")
    except redis.ResponseError as e:
        check(str(e).startswith("STALEFENCE fence "), "FENCED with an older fence", str(e))
    check(int(r.get(balance)) == after, "balance after the refused write", r.get(balance))

    # 3. Unlock with the token.
    n = r.execute_command("UNLOCK", res, token)
    check(n == 1, "UNLOCK", n)
    r.close()


example(2)
print("redis-py FENCED RESP2: ok")
if RESP3:
    example(3)
    print("redis-py FENCED RESP3: ok")
else:
    print(f"redis-py FENCED RESP3: not run (redis-py {redis.__version__} has no RESP3)")
