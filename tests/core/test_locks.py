"""core.locks against a real Redis: one holder at a time, across holders (nodes, workers)."""

from __future__ import annotations

import time

from core.locks import LocalLocks, RedisLocks


def test_one_holder_at_a_time_and_free_again_after_release(redis_url):
    node_a, node_b = RedisLocks(redis_url), RedisLocks(redis_url)
    name = f"test-hold-{time.monotonic_ns()}"
    held = node_a.hold(name, ttl=30)
    assert held is not None
    assert node_b.hold(name, ttl=30) is None  # another holder's token: refused
    held.release()
    again = node_b.hold(name, ttl=30)
    assert again is not None
    again.release()


def test_a_lock_expires_after_its_ttl(redis_url):
    node_a, node_b = RedisLocks(redis_url), RedisLocks(redis_url)
    name = f"test-expiry-{time.monotonic_ns()}"
    assert node_a.hold(name, ttl=0.2) is not None
    time.sleep(0.4)
    later = node_b.hold(name, ttl=30)
    assert later is not None
    later.release()


def test_many_at_once_only_the_free_ones_and_only_the_holder_releases(redis_url):
    node_a, node_b = RedisLocks(redis_url), RedisLocks(redis_url)
    stamp = time.monotonic_ns()
    names = [f"test-many-{stamp}-{i}" for i in range(5)]
    assert node_a.acquire_many(names[:3], ttl=30) == set(names[:3])
    assert node_b.acquire_many(names, ttl=30) == set(names[3:])
    node_b.release_many(names[:3])  # not b's: nothing released
    assert node_b.acquire_many(names[:3], ttl=30) == set()
    node_a.release_many(names[:3])
    assert node_b.acquire_many(names[:3], ttl=30) == set(names[:3])
    node_b.release_many(names)


def test_embedded_locks_grant_everything():
    locks = LocalLocks()
    assert locks.hold("x", ttl=1) is not None
    assert locks.acquire_many(["a", "b"], ttl=1) == {"a", "b"}
