"""Cluster locks: many keys pipelined (core.locks.RedisLocks.acquire_many) against redis-py's
``Lock`` taken key by key, the same round of 100 keys acquired and released, interleaved.

    python bench/lock_bench.py --redis redis://127.0.0.1:6379/8 --keys 100 --rounds 40

Uses (and cleans) keys under ``a2a:bench:lock:`` only; give it a Redis database of its own.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis  # noqa: E402
from redis.lock import Lock  # noqa: E402

from bench.common import write_results  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/8")
    parser.add_argument("--keys", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()
    client = redis.Redis.from_url(args.redis)
    script = client.register_script(Lock.LUA_RELEASE_SCRIPT)
    names = [f"a2a:bench:lock:{i}" for i in range(args.keys)]
    token = uuid.uuid4().hex

    def pipelined() -> None:
        pipe = client.pipeline(transaction=False)
        for name in names:
            pipe.set(name, token, nx=True, px=5000)
        assert all(pipe.execute())
        pipe = client.pipeline(transaction=False)
        for name in names:
            script(keys=[name], args=[token], client=pipe)
        pipe.execute()

    def one_by_one() -> None:
        locks = [Lock(client, name, timeout=5, blocking=False, thread_local=False)
                 for name in names]
        assert all(lock.acquire(token=token) for lock in locks)
        for lock in locks:
            lock.release()

    timings: dict[str, list[float]] = {"pipelined": [], "redis_py_lock": []}
    for _ in range(args.rounds):
        for label, run in (("pipelined", pipelined), ("redis_py_lock", one_by_one)):
            started = time.perf_counter()
            run()
            timings[label].append((time.perf_counter() - started) * 1000)
    result = {
        "keys": args.keys,
        "rounds": args.rounds,
        "median_ms": {k: round(statistics.median(v), 2) for k, v in timings.items()},
    }
    medians = result["median_ms"]
    result["ratio"] = round(medians["redis_py_lock"] / medians["pipelined"], 1)
    print(result)
    print("written:", write_results("locks", result))


if __name__ == "__main__":
    main()
