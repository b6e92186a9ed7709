#!/usr/bin/env python3
"""lockproxy's reentrant holds and LOCKINFO from redis-py, checking every
reply (exit 1 on the first mismatch): a function that locks a resource
calls another that locks it again with the same token, and each gives its
own hold back.

    LOCKPROXY_ADDR=127.0.0.1:6380 python3 examples/reentrant/python/reentrant.py
"""
import os
import secrets
import sys

import redis

HOST, _, PORT = os.environ.get("LOCKPROXY_ADDR", "127.0.0.1:6380").rpartition(":")
RES = "example:reentrant:python"

# redis-py speaks RESP3 (protocol=3) from 5.0 on; Debian 12 ships 4.3.4.
RESP3 = int(redis.__version__.split(".")[0]) >= 5


def check(ok, what, got):
    if not ok:
        sys.exit(f"FAIL {what}: got {got!r}")


def lock(r, token):
    """Takes one hold of RES for the owner token; returns the count."""
    reply = r.execute_command("LOCK", RES, 10000, "REENTRANT", "TOKEN", token, "WAIT", 2000)
    check(reply is not None and len(reply) == 4, "LOCK REENTRANT", reply)
    return reply[3]


def release(r, token, holds):
    # HOLD n is safe to send again after a lost reply: it removes one hold.
    n = r.execute_command("UNLOCK", RES, token, "HOLD", holds)
    check(n == 1, "UNLOCK HOLD", n)


def info(r):
    """LOCKINFO's fields: a dict in RESP3, names and values in RESP2."""
    reply = r.execute_command("LOCKINFO", RES)
    if isinstance(reply, dict):
        fields = {k if isinstance(k, str) else k.decode(): v for k, v in reply.items()}
    else:
        fields = dict(zip(reply[::2], reply[1::2]))
    check(len(fields) == 10, "LOCKINFO fields", reply)
    return fields


def audit(r, token):
    holds = lock(r, token)
    check(holds == 2, "inner hold", holds)
    m = info(r)
    check(m["mode"] == "exclusive" and m["holds"] == 2 and m["holder"].startswith("example-py@"), "LOCKINFO while nested", m)
    other = r.execute_command("LOCK", RES, 10000, "REENTRANT")  # another owner
    check(other is None, "LOCK by another owner", other)
    release(r, token, holds)
    release(r, token, holds)  # resent: removes nothing more


def transfer(r, token):
    holds = lock(r, token)
    check(holds == 1, "outer hold", holds)
    try:
        audit(r, token)  # locks RES again: no deadlock, one more hold
        check(info(r)["holds"] == 1, "holds after the inner release", info(r))
    finally:
        release(r, token, holds)


def example(protocol):
    extra = {"protocol": 3} if protocol == 3 else {}
    r = redis.Redis(host=HOST, port=int(PORT), decode_responses=True, socket_timeout=10,
                    client_name="example-py", **extra)
    token = secrets.token_hex(16)  # one owner: a job, a request, a thread
    transfer(r, token)
    m = info(r)
    check(m["mode"] == "none" and m["holds"] == 0 and m["fence"] == -1, "LOCKINFO after the last release", m)
    r.close()


example(2)
print("redis-py reentrant RESP2: ok")
if RESP3:
    example(3)
    print("redis-py reentrant RESP3: ok")
else:
    print(f"redis-py reentrant RESP3: not run (redis-py {redis.__version__} has no RESP3)")
