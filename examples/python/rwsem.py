#!/usr/bin/env python3
"""lockproxy's read-write lock (RLOCK, LOCK) and semaphore (LOCK ... PERMITS
k) from redis-py, checking every reply (exit 1 on the first mismatch).

    LOCKPROXY_ADDR=127.0.0.1:6380 python3 examples/python/rwsem.py
"""
import os
import sys

import redis

HOST, _, PORT = os.environ.get("LOCKPROXY_ADDR", "127.0.0.1:6380").rpartition(":")
RW, SEM = "example:python:rw", "example:python:sem"

# redis-py speaks RESP3 (protocol=3) from 5.0 on; Debian 12 ships 4.3.4.
RESP3 = int(redis.__version__.split(".")[0]) >= 5


def check(ok, what, got):
    if not ok:
        sys.exit(f"FAIL {what}: got {got!r}")


def connect(protocol):
    extra = {"protocol": 3} if protocol == 3 else {}
    return redis.Redis(host=HOST, port=int(PORT), decode_responses=True,
                       socket_timeout=10, **extra)


def example(protocol):
    r = connect(protocol)
    rw, sem = f"{RW}:{protocol}", f"{SEM}:{protocol}"

    # Readers share the resource; each has its own token and fence.
    r1 = r.execute_command("RLOCK", rw, 10000)
    r2 = r.execute_command("RLOCK", rw, 10000)
    check(isinstance(r1, list) and len(r1) == 3 and r2[2] > r1[2], "RLOCK", (r1, r2))
    # The writer does not get it while they read...
    check(r.execute_command("LOCK", rw, 10000) is None, "LOCK while read", None)
    # ...and a reader cannot upgrade: it would wait for itself.
    try:
        r.execute_command("LOCK", rw, 10000, "TOKEN", r1[0])
        check(False, "upgrade", "no error")
    except redis.ResponseError as e:
        check(str(e).startswith("DEADLOCK"), "upgrade", str(e))
    for token in (r1[0], r2[0]):
        check(r.execute_command("UNLOCK", rw, token) == 1, "UNLOCK reader", token)
    w = r.execute_command("LOCK", rw, 10000, "WAIT", 2000)
    check(isinstance(w, list) and w[2] > r2[2], "LOCK after the readers", w)
    check(r.execute_command("UNLOCK", rw, w[0]) == 1, "UNLOCK writer", w)

    # A semaphore of 2: two permits, each with a slot; a third waits.
    permits = [r.execute_command("LOCK", sem, 10000, "PERMITS", 2) for _ in range(2)]
    check(all(isinstance(p, list) and len(p) == 4 for p in permits), "PERMITS 2", permits)
    check(sorted(p[3] for p in permits) == [0, 1], "slots", permits)
    check(r.execute_command("LOCK", sem, 10000, "PERMITS", 2) is None, "third permit", None)
    try:
        r.execute_command("LOCK", sem, 10000, "PERMITS", 3)
        check(False, "PERMITS 3 on a semaphore of 2", "no error")
    except redis.ResponseError as e:
        check(str(e) == "LOCKMODE held as a semaphore of 2 permits", "LOCKMODE", str(e))
    got = r.execute_command("EXTEND", sem, 10000, permits[0][0])
    check(isinstance(got, int) and got > 0, "EXTEND a permit", got)
    for p in permits:
        check(r.execute_command("UNLOCK", sem, p[0]) == 1, "UNLOCK permit", p)
    r.close()
    print(f"redis-py {redis.__version__} rwsem RESP{protocol}: ok")


example(2)
if RESP3:
    example(3)
else:
    print(f"redis-py {redis.__version__} rwsem RESP3: not run (redis-py has protocol=3 from 5.0)")
