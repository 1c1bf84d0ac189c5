"""Per-request limits: the caller's timeout and the per-caller rate limit.

The per-agent concurrency cap lives with the virtual subscriber (it enforces it); the size caps
are checked where the bytes are read (gateway.admission for requests, gateway.agent_calls for
responses).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from gateway.conf import NodeSettings


def request_timeout(payload: dict[str, Any], settings: NodeSettings) -> float:
    """``params.configuration.timeout`` in seconds: missing or invalid gives the default,
    anything above the maximum is capped."""
    params = payload.get("params")
    if isinstance(params, dict):
        configuration = params.get("configuration")
        if isinstance(configuration, dict):
            value = configuration.get("timeout")
            if (
                isinstance(value, (int, float))
                and not isinstance(value, bool)
                and value > 0
                and value == value  # not NaN
            ):
                return min(float(value), settings.A2A_MAX_TIMEOUT_SECONDS)
    return min(float(settings.A2A_DEFAULT_TIMEOUT_SECONDS), settings.A2A_MAX_TIMEOUT_SECONDS)


class RateLimiter:
    """Token buckets: ``rate`` tokens per second, ``burst`` deep. Rate 0: off.

    Authenticated callers are limited per client id (:meth:`allow`). Calls that fail
    authentication are charged to the client's address (:meth:`charge_refused`), and an address
    whose allowance is used up is refused with 429 *before* authentication
    (:meth:`address_blocked`, unless the caller's token was verified recently): token-less and
    bad-token floods are rate limited too and cost no token lookup, while good callers sharing
    that address (behind a NAT or a proxy) keep their own per-client buckets.

    In memory, per node: a cluster of N nodes admits up to N times the rate, which is what a
    per-node limiter can promise without a shared store on the hot path.
    """

    MAX_CALLERS = 100_000

    def __init__(self, settings: NodeSettings, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self.settings = settings
        self.clock = clock  # injectable: tests move time by hand
        self._buckets: dict[str, list[float]] = {}
        self._refused: dict[str, list[float]] = {}  # client address -> bucket of refused calls

    def allow(self, caller: str) -> bool:
        settings = self.settings
        rate = settings.A2A_RATE_LIMIT_PER_SECOND
        if rate <= 0:
            return True
        return self._take(self._buckets, caller, rate)

    def address_blocked(self, address: str) -> bool:
        """Whether ``address`` has used up its allowance of refused calls (checked before
        authentication; charges nothing)."""
        bucket = self._refused.get(address)
        if bucket is None:
            return False
        settings = self.settings
        rate = settings.A2A_RATE_LIMIT_PER_SECOND
        if rate <= 0:
            return False
        burst = float(settings.A2A_RATE_LIMIT_BURST or max(1.0, rate))
        return min(burst, bucket[0] + (self.clock() - bucket[1]) * rate) < 1.0

    def charge_refused(self, address: str) -> None:
        """Charge one refused (unauthenticated) call to ``address``."""
        rate = self.settings.A2A_RATE_LIMIT_PER_SECOND
        if rate > 0:
            self._take(self._refused, address, rate)

    def _take(self, buckets: dict[str, list[float]], key: str, rate: float) -> bool:
        burst = float(self.settings.A2A_RATE_LIMIT_BURST or max(1.0, rate))
        now = self.clock()
        bucket = buckets.get(key)
        if bucket is None:
            if len(buckets) >= self.MAX_CALLERS:
                buckets.clear()
            bucket = buckets[key] = [burst, now]
        tokens = min(burst, bucket[0] + (now - bucket[1]) * rate)
        bucket[1] = now
        if tokens < 1.0:
            bucket[0] = tokens
            return False
        bucket[0] = tokens - 1.0
        return True
