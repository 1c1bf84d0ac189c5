"""Registrations per tenant in a sliding window (``Tenant.max_registrations_per_minute``;
docs/tenants.md "Quotas", docs/adr/0015-tenant-rate-quotas.md).

The window is a *sliding window counter*: the count of the current fixed window plus the
previous window's count weighted by how much of it still overlaps the sliding one
(``previous * (1 - elapsed / window) + current``). It is exact while registrations arrive
evenly and never admits more than the limit in any sliding window by more than the previous
window's unevenness (a fixed window alone admits up to twice the limit across a boundary).

Distributed mode (``REDIS_URL``): the counts are Redis keys
(``a2a:quota:{cluster}:registrations:{tenant}:{window number}``, expiring after two windows),
read, checked and counted by one script on Redis's own clock, so every node shares them. One
round trip per registration of a *limited* tenant (tenants without the quota ask nothing),
waiting at most :data:`REDIS_WAIT_SECONDS`; when Redis does not answer, the node counts the
tenants' registrations in its own memory (the limit per node instead of per cluster) for
:data:`RETRY_REDIS_SECONDS` before asking Redis again, and logs it at most every
:data:`WARN_EVERY_SECONDS`. Embedded mode: in the process's memory.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Any

from django.conf import settings

from core.cluster import REDIS_NOW_MS, cluster_of

logger = logging.getLogger(__name__)

#: How long a registration waits for Redis before its node counts on its own.
REDIS_WAIT_SECONDS = 0.5
#: A failing Redis is logged at most this often.
WARN_EVERY_SECONDS = 30.0
#: After Redis failed to answer, the node counts alone this long before asking it again (a
#: registration pays the bounded wait once per this time, not each).
RETRY_REDIS_SECONDS = 5.0
KEY_PREFIX = "a2a:quota:{cluster}:registrations:"
_MAX_TENANTS = 10_000

#: KEYS[1]: the tenant's key prefix; ARGV: the window (ms), the limit, whether to count
#: (1) or only read (0). Returns {admitted (1/0), the estimate x1000, retry after (ms)}.
_TAKE = REDIS_NOW_MS + """
local window = tonumber(ARGV[1])
local limit = tonumber(ARGV[2])
local index = math.floor(now / window)
local current_key = KEYS[1] .. index
local current = tonumber(redis.call('GET', current_key) or '0')
local previous = tonumber(redis.call('GET', KEYS[1] .. (index - 1)) or '0')
local elapsed = now - index * window
local estimate = previous * (window - elapsed) / window + current
if ARGV[3] == '0' then return {1, math.floor(estimate * 1000), 0} end
if estimate + 1 > limit then
  local wait
  if current + 1 <= limit then
    wait = window - elapsed - (limit - current - 1) * window / previous
  else
    wait = window - elapsed + window * (1 - math.max(limit - 1, 0) / current)
  end
  return {0, math.floor(estimate * 1000), math.max(math.ceil(wait), 1)}
end
redis.call('INCR', current_key)
redis.call('PEXPIRE', current_key, window * 2)
return {1, math.floor((estimate + 1) * 1000), 0}
"""


def _estimate(state: list[float], now: float, window: float) -> tuple[float, float]:
    """``state``: [window number, current count, previous count], moved to ``now``'s window;
    (the estimate, seconds elapsed in the current window)."""
    index = math.floor(now / window)
    if index != state[0]:
        state[2] = state[1] if index == state[0] + 1 else 0.0
        state[0], state[1] = index, 0.0
    elapsed = now - index * window
    return state[2] * (window - elapsed) / window + state[1], elapsed


def _wait(current: float, previous: float, limit: int, window: float, elapsed: float) -> float:
    """Seconds until one more registration fits: the previous window's weight decays enough
    (room left in the current one), or the current window ends and its own count, as the
    next one's previous, decays enough."""
    if current + 1 <= limit:  # refused by the previous window's share (previous > 0)
        return window - elapsed - (limit - current - 1) * window / previous
    return window - elapsed + window * (1 - max(limit - 1, 0) / current)


class LocalWindows:
    """The window in this process's memory (embedded mode, and Redis's fallback)."""

    def __init__(self) -> None:
        self._states: dict[str, list[float]] = {}
        self._lock = threading.Lock()

    def take(self, tenant: str, limit: int, window: float) -> float | None:
        """Count one registration: None when admitted, else seconds to wait."""
        with self._lock:
            state = self._states.get(tenant)
            if state is None:
                if len(self._states) >= _MAX_TENANTS:
                    self._states.clear()
                state = self._states[tenant] = [0.0, 0.0, 0.0]
            estimate, elapsed = _estimate(state, time.time(), window)
            if estimate + 1 <= limit:
                state[1] += 1
                return None
            return max(_wait(state[1], state[2], limit, window, elapsed), 0.001)

    def used(self, tenant: str, window: float) -> float:
        with self._lock:
            state = self._states.get(tenant)
            return 0.0 if state is None else _estimate(state, time.time(), window)[0]


class RedisWindows:
    """The window in Redis, shared by every node (one script call per registration)."""

    def __init__(self, url: str, cluster: str) -> None:
        import redis

        self.client = redis.Redis.from_url(url, socket_timeout=REDIS_WAIT_SECONDS,
                                           socket_connect_timeout=REDIS_WAIT_SECONDS)
        self.prefix = KEY_PREFIX.format(cluster=cluster)
        self._script = self.client.register_script(_TAKE)
        self.local = LocalWindows()
        self._warned = 0.0
        self._down_until = 0.0

    def _call(self, tenant: str, limit: int, window: float, count: bool) -> list[Any]:
        reply: list[Any] = self._script(keys=[f"{self.prefix}{tenant}:"],
                                        args=[max(int(window * 1000), 1), limit, int(count)])
        return reply

    def take(self, tenant: str, limit: int, window: float) -> float | None:
        if time.monotonic() < self._down_until:
            return self.local.take(tenant, limit, window)
        try:
            admitted, _, wait_ms = self._call(tenant, limit, window, True)
        except Exception as exc:
            self._warn(exc)
            return self.local.take(tenant, limit, window)
        return None if admitted else int(wait_ms) / 1000

    def used(self, tenant: str, window: float) -> float:
        if time.monotonic() < self._down_until:
            return self.local.used(tenant, window)
        try:
            return int(self._call(tenant, 0, window, False)[1]) / 1000
        except Exception as exc:
            self._warn(exc)
            return self.local.used(tenant, window)

    def _warn(self, exc: BaseException) -> None:
        now = time.monotonic()
        self._down_until = now + RETRY_REDIS_SECONDS
        if now - self._warned >= WARN_EVERY_SECONDS:
            self._warned = now
            logger.warning("tenant registration quota: Redis unreachable (%s: %s); this node "
                           "counts its own registrations meanwhile", type(exc).__name__, exc)


_windows: dict[str, LocalWindows | RedisWindows] = {}


def windows() -> LocalWindows | RedisWindows:
    """The process's windows: Redis's when ``REDIS_URL`` is set, else in memory."""
    url = settings.REDIS_URL or ""
    found = _windows.get(url)
    if found is None:
        found = _windows[url] = RedisWindows(url, cluster_of(settings.DATABASES["default"])) \
            if url else LocalWindows()
    return found


def window_seconds() -> float:
    """The window's length (``A2A_TENANT_REGISTRATION_WINDOW_SECONDS``; 60: a minute)."""
    return float(settings.A2A_TENANT_REGISTRATION_WINDOW_SECONDS)


def take_registration(tenant: str, limit: int) -> float | None:
    """Count one registration of ``tenant`` against ``limit`` per window: None when admitted,
    else the seconds until one would be."""
    return windows().take(tenant, limit, window_seconds())


def registrations_used(tenant: str) -> float:
    """The tenant's registrations in the sliding window now (the console's figure)."""
    return windows().used(tenant, window_seconds())
