#!/usr/bin/env python3
"""lockproxy's LOCK, EXTEND and UNLOCK from redis-py, checking every reply
(exit 1 on the first mismatch).

    LOCKPROXY_ADDR=127.0.0.1:6380 python3 examples/python/lock.py
"""
import os
import sys

import redis

HOST, _, PORT = os.environ.get("LOCKPROXY_ADDR", "127.0.0.1:6380").rpartition(":")
RES, DATA = "example:python", "example:python:data"

# Writes ARGV[2] to KEYS[1] unless a newer fence already wrote there: the
# storage side of fencing.
FENCED_SET = """local f = tonumber(redis.call("HGET", KEYS[1], "fence") or "0")
if tonumber(ARGV[1]) < f then return 0 end
redis.call("HSET", KEYS[1], "fence", ARGV[1], "value", ARGV[2]) return 1"""

# redis-py speaks RESP3 (protocol=3) from 5.0 on; Debian 12 ships 4.3.4.
RESP3 = int(redis.__version__.split(".")[0]) >= 5


def check(ok, what, got):
    if not ok:
        sys.exit(f"FAIL {what}: got {got!r}")


def connect(protocol):
    extra = {"protocol": 3} if protocol == 3 else {}
    # single_connection_client: token-less EXTEND/UNLOCK need the connection
    # that holds the lock. socket_timeout must outlast WAIT.
    return redis.Redis(host=HOST, port=int(PORT), decode_responses=True,
                       single_connection_client=True, socket_timeout=10, **extra)


def example(protocol):
    r = connect(protocol)
    reply = r.execute_command("LOCK", RES, 10000, "WAIT", 2000)  # None: not acquired
    check(isinstance(reply, list) and len(reply) == 3, "LOCK", reply)
    token, validity, fence = reply
    check(len(token) >= 16 and 0 < validity <= 10000 and fence > 0, "LOCK reply", reply)

    # The work, guarded by the fence; an older fence is refused.
    check(r.eval(FENCED_SET, 1, DATA, fence, f"resp{protocol}") == 1, "fenced write", fence)
    check(r.eval(FENCED_SET, 1, DATA, fence - 1, "stale") == 0, "stale write", fence - 1)
    check(r.hget(DATA, "value") == f"resp{protocol}", "HGET", r.hget(DATA, "value"))

    # A second client without WAIT gets the null reply: None.
    other = connect(protocol)
    got = other.execute_command("LOCK", RES, 10000)
    check(got is None, "second LOCK", got)
    other.close()

    got = r.execute_command("EXTEND", RES, 10000, token)
    check(isinstance(got, int) and got > 0, "EXTEND", got)
    check(r.execute_command("UNLOCK", RES, token) == 1, "UNLOCK", token)
    check(r.execute_command("UNLOCK", RES, token) == 0, "UNLOCK again", token)

    # Again, leaving out the token on the connection that holds the lock.
    again = r.execute_command("LOCK", RES, 10000)
    check(isinstance(again, list) and again[2] > fence, "LOCK again", again)
    got = r.execute_command("EXTEND", RES, 5000)
    check(isinstance(got, int) and got > 0, "EXTEND without token", got)
    got = r.execute_command("UNLOCK", RES)
    check(got == 1, "UNLOCK without token", got)
    r.close()
    print(f"redis-py {redis.__version__} RESP{protocol}: ok (fence {fence}, then {again[2]})")


example(2)
if RESP3:
    example(3)
else:
    print(f"redis-py {redis.__version__} RESP3: not run (redis-py has protocol=3 from 5.0)")
