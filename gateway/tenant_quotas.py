"""A tenant's gateway quotas: calls per second and streams open at once to its agents
(``Tenant.max_calls_per_second``, ``Tenant.max_concurrent_streams``; docs/tenants.md "Quotas",
docs/adr/0015-tenant-rate-quotas.md).

The proxy path reads no database and asks Redis nothing: the node keeps the quotas of the
tenants that have one in memory (:attr:`TenantQuotas.limits`), read again in the background
every ``A2A_TENANT_QUOTAS_REFRESH_SECONDS`` (a change applies within that time), and counts in
its own memory. A call is charged to the tenant of the agent it calls (its route's tenant).

Cluster-wide by shares: each node admits its share of a limit, the limit divided by the live
nodes (the liveness beat's count, taken at each refresh; 1 in embedded mode). Calls: a token
bucket per tenant filled at ``limit / nodes`` per second, one second of it deep. Streams:
``ceil(limit / nodes)`` open at once on this node; a stream's slot is given back when it ends
in any way (the entry's ``finally``: its caller gone, the agent's end, an error, the node's
shutdown cancelling it).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from registry.quotas import TenantLimits, count_refused

_MAX_TENANTS = 100_000


class StreamSlot:
    """One open stream of a tenant on this node; :meth:`release` gives it back (once)."""

    __slots__ = ("_open", "_quotas", "tenant")

    def __init__(self, quotas: TenantQuotas | None, tenant: str) -> None:
        self._quotas = quotas
        self.tenant = tenant
        self._open = quotas is not None

    def release(self) -> None:
        quotas = self._quotas
        if self._open and quotas is not None:
            self._open = False
            left = quotas.streams.get(self.tenant, 1) - 1
            if left > 0:
                quotas.streams[self.tenant] = left
            else:
                quotas.streams.pop(self.tenant, None)


#: The slot of a call that is not a stream: nothing to give back.
NO_STREAM = StreamSlot(None, "")


class TenantQuotas:
    """This node's view of the tenants' call and stream quotas, and what it counts of them."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        #: Tenants with a call or stream quota -> their quotas (the background refresh's).
        self.limits: dict[str, TenantLimits] = {}
        #: The live nodes sharing each limit (the refresh's count; at least 1).
        self.nodes = 1
        #: Streams open now through this node, by tenant (every tenant's, limited or not).
        self.streams: dict[str, int] = {}
        self._buckets: dict[str, list[float]] = {}  # tenant -> [tokens, last refill]
        self._calls: dict[str, list[float]] = {}  # tenant -> [second, calls, previous]

    def update(self, limits: dict[str, TenantLimits], nodes: int) -> None:
        """The refresh's result: the tenants' quotas (those with a gateway quota kept) and
        the live node count."""
        self.limits = {tenant: quotas for tenant, quotas in limits.items()
                       if quotas.max_calls_per_second is not None
                       or quotas.max_concurrent_streams is not None}
        self.nodes = max(1, nodes)
        for tenant in list(self._buckets):
            if tenant not in self.limits:
                del self._buckets[tenant]

    # --- calls ----------------------------------------------------------------------------

    def refuse_call(self, tenant: str) -> str | None:
        """Charge one call to ``tenant``: None when admitted, else the refusal's message."""
        quotas = self.limits.get(tenant)
        if quotas is None or quotas.max_calls_per_second is None:
            return None
        limit = quotas.max_calls_per_second
        now = self.clock()
        self._count_call(tenant, now)
        rate = limit / self.nodes
        burst = max(1.0, rate)
        bucket = self._buckets.get(tenant)
        if bucket is None:
            if len(self._buckets) >= _MAX_TENANTS:
                self._buckets.clear()
            bucket = self._buckets[tenant] = [burst, now]
        tokens = min(burst, bucket[0] + (now - bucket[1]) * rate)
        bucket[1] = now
        if tokens >= 1.0 and limit > 0:
            bucket[0] = tokens - 1.0
            return None
        bucket[0] = tokens
        count_refused(tenant, "max_calls_per_second")
        return (f"tenant quota reached: tenant {tenant} may make at most {limit} calls per "
                "second (max_calls_per_second)")

    def _count_call(self, tenant: str, now: float) -> None:
        second = math.floor(now)
        counts = self._calls.get(tenant)
        if counts is None:
            counts = self._calls[tenant] = [second, 0.0, 0.0]
        if counts[0] != second:
            counts[2] = counts[1] if counts[0] == second - 1 else 0.0
            counts[0], counts[1] = second, 0.0
        counts[1] += 1

    def calls_per_second(self, tenant: str) -> float:
        """The calls to ``tenant``'s agents this node saw in the last full second (limited
        tenants only), refused ones included."""
        counts = self._calls.get(tenant)
        if counts is None:
            return 0.0
        second = math.floor(self.clock())
        if counts[0] == second:
            return counts[2]
        return counts[1] if counts[0] == second - 1 else 0.0

    # --- streams --------------------------------------------------------------------------

    def open_stream(self, tenant: str) -> StreamSlot | str:
        """A slot for one more stream of ``tenant``, or the refusal's message."""
        open_now = self.streams.get(tenant, 0)
        quotas = self.limits.get(tenant)
        if quotas is not None and quotas.max_concurrent_streams is not None:
            limit = quotas.max_concurrent_streams
            if open_now >= math.ceil(limit / self.nodes):
                count_refused(tenant, "max_concurrent_streams")
                return (f"tenant quota reached: tenant {tenant} may have at most {limit} "
                        "streams open at once (max_concurrent_streams); retry when one ends")
        self.streams[tenant] = open_now + 1
        return StreamSlot(self, tenant)
