"""Cluster-wide locks: one job at a time across nodes and Celery workers.

Distributed mode (``settings.REDIS_URL``): :meth:`RedisLocks.hold` is redis-py's own
:class:`redis.lock.Lock` (one named lock: the discovery cycle, a periodic job's interval);
:meth:`RedisLocks.acquire_many` takes many at a time for the card cache's single-flight: the
same ``SET NX PX`` with a holder's token and the same compare-and-delete release script as
redis-py's ``Lock`` (``Lock.LUA_RELEASE_SCRIPT``), pipelined, because a cycle takes a lock per
card URL and one round trip per key costs about 7x more (100 keys: 8 ms pipelined, 55 ms through
``Lock`` one by one, measured on this 2-core machine with local Redis; docs/adr/0009).
Embedded mode: one process, so the in-process single-flight is all there is and
:class:`LocalLocks` admits all.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
import uuid
from collections.abc import Iterable

from django.conf import settings
from redis.lock import Lock


class _Granted:
    """What :meth:`LocalLocks.hold` grants: nothing to release."""

    def release(self) -> None:
        return None


class LocalLocks:
    """In-process only (embedded): every key is granted; threads meet in the in-flight map."""

    def hold(self, name: str, *, ttl: float) -> _Granted | None:
        return _Granted()

    def acquire_many(self, names: Iterable[str], *, ttl: float) -> set[str]:
        return set(names)

    def release_many(self, names: Iterable[str]) -> None:
        return None

    def wait_released(self, names: Iterable[str], *, timeout: float) -> set[str]:
        return set()


class RedisLocks:
    """Named locks in Redis, with a token per holder so only the holder releases."""

    prefix = "a2a:discovery:lock:"

    def __init__(self, url: str) -> None:
        import redis

        self.client = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=3)
        self.token = f"{os.getpid()}-{uuid.uuid4().hex}"
        self._release = self.client.register_script(Lock.LUA_RELEASE_SCRIPT)
        self._held: set[str] = set()
        self._mutex = threading.Lock()

    def _key(self, name: str) -> str:
        return self.prefix + hashlib.sha1(name.encode()).hexdigest()

    def hold(self, name: str, *, ttl: float) -> Lock | None:
        """redis-py's lock on ``name`` for ``ttl`` seconds if free now, else None. Release it
        with ``release()`` (redis-py raises ``LockNotOwnedError`` once it expired)."""
        lock = Lock(self.client, self._key(name), timeout=ttl, blocking=False,
                    thread_local=False)
        return lock if lock.acquire(token=self.token) else None

    def acquire_many(self, names: Iterable[str], *, ttl: float) -> set[str]:
        names = list(names)
        if not names:
            return set()
        pipe = self.client.pipeline(transaction=False)
        for name in names:
            pipe.set(self._key(name), self.token, nx=True, px=max(1, int(ttl * 1000)))
        got = {name for name, ok in zip(names, pipe.execute(), strict=True) if ok}
        with self._mutex:
            self._held |= got
        return got

    def release_many(self, names: Iterable[str]) -> None:
        names = list(names)
        if not names:
            return
        pipe = self.client.pipeline(transaction=False)
        for name in names:
            self._release(keys=[self._key(name)], args=[self.token], client=pipe)
        pipe.execute()
        with self._mutex:
            self._held -= set(names)

    def wait_released(self, names: Iterable[str], *, timeout: float) -> set[str]:
        """Wait until other holders release ``names``; returns those still held at timeout."""
        pending = list(names)
        deadline = time.monotonic() + timeout
        while pending:
            pipe = self.client.pipeline(transaction=False)
            for name in pending:
                pipe.exists(self._key(name))
            pending = [n for n, held in zip(pending, pipe.execute(), strict=True) if held]
            if not pending or time.monotonic() >= deadline:
                break
            time.sleep(0.02)
        return set(pending)


_default: dict[str, LocalLocks | RedisLocks] = {}


def default_locks() -> LocalLocks | RedisLocks:
    """Redis locks when ``REDIS_URL`` is set, else in-process only (one instance per process)."""
    url = settings.REDIS_URL
    key = f"{os.getpid()}:{url}"
    if key not in _default:
        _default[key] = RedisLocks(url) if url else LocalLocks()
    return _default[key]
