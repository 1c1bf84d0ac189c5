"""Locks that keep discovery work single-flight across Celery workers and nodes.

Distributed mode (``settings.REDIS_URL``): Redis keys set with ``SET NX PX`` and released with a
compare-and-delete script, many at a time in one pipeline. Embedded mode: one process, so the
in-process single-flight of the card cache is all there is and :class:`LocalLocks` admits all.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
import uuid
from collections.abc import Iterable

from django.conf import settings

_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end
"""


class LocalLocks:
    """In-process only (embedded): every key is granted; threads meet in the in-flight map."""

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
        self._release = self.client.register_script(_RELEASE)
        self._held: set[str] = set()
        self._mutex = threading.Lock()

    def _key(self, name: str) -> str:
        return self.prefix + hashlib.sha1(name.encode()).hexdigest()

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
