#!/usr/bin/env python3
"""lockproxy's MLOCK from redis-py: both accounts of a transfer or neither,
one fence per account, and per-resource EXTEND and UNLOCK, checking every
reply (exit 1 on the first mismatch).

    LOCKPROXY_ADDR=127.0.0.1:6380 python3 examples/mlock/python/mlock.py
"""
import os
import sys

import redis

HOST, _, PORT = os.environ.get("LOCKPROXY_ADDR", "127.0.0.1:6380").rpartition(":")

# Adds ARGV[2] to the balance in KEYS[1] unless a newer fence already wrote
# there: the storage side of fencing.
FENCED_ADD = """local f = tonumber(redis.call("HGET", KEYS[1], "fence") or "0")
if tonumber(ARGV[1]) < f then return nil end
redis.call("HSET", KEYS[1], "fence", ARGV[1])
return redis.call("HINCRBY", KEYS[1], "balance", ARGV[2])"""

# redis-py speaks RESP3 (protocol=3) from 5.0 on; Debian 12 ships 4.3.4.
RESP3 = int(redis.__version__.split(".")[0]) >= 5


def check(ok, what, got):
    if not ok:
        sys.exit(f"FAIL {what}: got {got!r}")


def connect(protocol):
    extra = {"protocol": 3} if protocol == 3 else {}
    # single_connection_client: token-less EXTEND/UNLOCK need the connection
    # that holds the locks. socket_timeout must outlast WAIT.
    return redis.Redis(host=HOST, port=int(PORT), decode_responses=True,
                       single_connection_client=True, socket_timeout=10, **extra)


def example(protocol):
    alice, bob, carol = (f"example:py:{n}{protocol}" for n in ("alice", "bob", "carol"))
    r = connect(protocol)
    reply = r.execute_command("MLOCK", 2, alice, bob, 10000, "WAIT", 2000)  # None: not acquired
    check(isinstance(reply, list) and len(reply) == 3, "MLOCK", reply)
    token, validity, fences = reply
    check(len(token) >= 16 and 0 < validity <= 10000 and len(fences) == 2 and min(fences) > 0,
          "MLOCK reply", reply)

    # The transfer, each account guarded by its own fence.
    check(r.eval(FENCED_ADD, 1, alice + ":balance", fences[0], -10) is not None, "debit", fences)
    check(r.eval(FENCED_ADD, 1, bob + ":balance", fences[1], 10) is not None, "credit", fences)
    check(r.eval(FENCED_ADD, 1, bob + ":balance", fences[1] - 1, 99) is None, "stale write", fences)

    # Another client: an overlapping pair is not acquired and leaves carol free.
    other = connect(protocol)
    got = other.execute_command("MLOCK", 2, bob, carol, 10000)
    check(got is None, "overlapping MLOCK", got)
    got = other.execute_command("LOCK", carol, 1000)
    check(isinstance(got, list), "LOCK carol after the failed MLOCK", got)
    check(other.execute_command("UNLOCK", carol, got[0]) == 1, "UNLOCK carol", got)

    # A set the token holds in part: DEADLOCK, nothing changes.
    try:
        other.execute_command("MLOCK", 2, alice, carol, 1000, "TOKEN", token)
        check(False, "MLOCK of a set held in part", "a reply")
    except redis.ResponseError as e:
        check(str(e).startswith("DEADLOCK"), "MLOCK of a set held in part", str(e))

    # The same set again with the token, in another order: the same fences.
    again = other.execute_command("MLOCK", 2, bob, alice, 10000, "TOKEN", token)
    check(again[2] == [fences[1], fences[0]], "idempotent MLOCK", again)

    # Per resource, without the token on the acquiring connection.
    got = r.execute_command("EXTEND", alice, 5000)
    check(isinstance(got, int) and got > 0, "EXTEND alice", got)
    check(r.execute_command("UNLOCK", alice) == 1, "UNLOCK alice", alice)
    check(r.execute_command("UNLOCK", bob, token) == 1, "UNLOCK bob", bob)
    check(r.execute_command("UNLOCK", bob, token) == 0, "UNLOCK bob again", bob)
    other.close()
    r.close()
    print(f"redis-py {redis.__version__} MLOCK RESP{protocol}: ok (fences {fences})")


example(2)
if RESP3:
    example(3)
else:
    print(f"redis-py {redis.__version__} MLOCK RESP3: not run (redis-py has protocol=3 from 5.0)")
