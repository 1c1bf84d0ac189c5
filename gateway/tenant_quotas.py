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

Seen cluster-wide (the console's *Tenants* page): in distributed mode each node reports what
it counts (:meth:`TenantQuotas.report`) to a Redis hash of its own,
``a2a:node:{cluster}:tenant-use:{node_id}``, on the same background beat, expiring after three
beats; :func:`cluster_use` sums the reports of the cluster's nodes. Nothing of it is on the
proxy path.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import NamedTuple

from django.conf import settings

from core.cluster import cluster_of
from gateway.liveness import KNOWN_SET
from registry.quotas import LIMIT_FIELDS, TenantLimits, count_refused, refused_counts

logger = logging.getLogger(__name__)

_MAX_TENANTS = 100_000
USE_KEY = "a2a:node:{cluster}:tenant-use:"
#: How long the console waits for Redis before it shows this node's own figures.
REDIS_WAIT_SECONDS = 0.5


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

    def report(self) -> dict[str, str]:
        """What this node counts, as the fields of its use report: ``c:<tenant>`` the calls
        of the last full second (tenants with a call quota), ``s:<tenant>`` the streams open
        now, ``r:<tenant>:<quota>`` the refusals of each quota since the process started."""
        fields = {f"c:{tenant}": f"{self.calls_per_second(tenant):g}"
                  for tenant, limits in list(self.limits.items())
                  if limits.max_calls_per_second is not None}
        fields.update((f"s:{tenant}", str(count)) for tenant, count in list(self.streams.items()))
        fields.update((f"r:{tenant}:{quota}", str(count))
                      for (tenant, quota), count in refused_counts().items())
        return fields

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


class TenantUse(NamedTuple):
    """A tenant's use of its gateway quotas and its refusals, as :func:`cluster_use` or
    :func:`node_use` found them."""

    calls_per_second: float
    streams: int
    refused: dict[str, int]  # quota field -> refusals
    #: How many nodes' counts are in the figures: the reports naming the tenant (cluster), or 1.
    nodes: int
    #: Whether the figures are the whole cluster's (False: this node's alone).
    cluster: bool


def node_use(quotas: TenantQuotas | None, tenant: str) -> TenantUse:
    """``tenant``'s use as this process counts it (embedded mode, or Redis not answering)."""
    refused = {quota: count for (slug, quota), count in refused_counts().items()
               if slug == tenant}
    if quotas is None:
        return TenantUse(0.0, 0, refused, 1, False)
    return TenantUse(quotas.calls_per_second(tenant), quotas.streams.get(tenant, 0), refused,
                     1, False)


class UseBoard:
    """The nodes' use reports in Redis: one hash per node, replaced on each report."""

    def __init__(self, url: str, cluster: str) -> None:
        import redis

        self.client = redis.Redis.from_url(url, socket_timeout=REDIS_WAIT_SECONDS,
                                           socket_connect_timeout=REDIS_WAIT_SECONDS)
        self.prefix = USE_KEY.format(cluster=cluster)
        self.known = KNOWN_SET.format(cluster=cluster)

    def publish(self, node_id: str, fields: dict[str, str], ttl_seconds: float) -> None:
        """Replace ``node_id``'s report with ``fields``, expiring after ``ttl_seconds``."""
        key = self.prefix + node_id
        pipe = self.client.pipeline(transaction=True)
        pipe.delete(key)
        if fields:
            pipe.hset(key, mapping=fields)  # type: ignore[arg-type]  # str -> str
            pipe.pexpire(key, max(int(ttl_seconds * 1000), 1))
        pipe.execute()

    def withdraw(self, node_id: str) -> None:
        """A node stopping: its report goes with it."""
        self.client.delete(self.prefix + node_id)

    def read(self, tenant: str) -> TenantUse:
        """``tenant``'s use summed over the reports of the cluster's known nodes."""
        nodes = sorted(m.decode() for m in self.client.smembers(self.known))  # type: ignore[union-attr]  # bytes replies
        fields = [f"c:{tenant}", f"s:{tenant}", *(f"r:{tenant}:{q}" for q in LIMIT_FIELDS)]
        pipe = self.client.pipeline(transaction=False)
        for node_id in nodes:
            pipe.hmget(self.prefix + node_id, fields)
        calls, streams, reporting = 0.0, 0, 0
        refused = dict.fromkeys(LIMIT_FIELDS, 0)
        for values in pipe.execute() if nodes else []:
            if all(value is None for value in values):
                continue  # gone, or nothing of this tenant's
            reporting += 1
            calls += float(values[0] or 0)
            streams += int(values[1] or 0)
            for quota, value in zip(LIMIT_FIELDS, values[2:], strict=True):
                refused[quota] += int(value or 0)
        return TenantUse(calls, streams, {q: n for q, n in refused.items() if n}, reporting,
                         True)


_boards: dict[str, UseBoard] = {}


def use_board() -> UseBoard | None:
    """The process's board: Redis's when ``REDIS_URL`` is set (distributed mode), else None."""
    url = getattr(settings, "REDIS_URL", "") or ""
    if not url:
        return None
    board = _boards.get(url)
    if board is None:
        board = _boards[url] = UseBoard(url, cluster_of(settings.DATABASES["default"]))
    return board


def cluster_use(quotas: TenantQuotas | None, tenant: str) -> TenantUse:
    """``tenant``'s use across the cluster: the nodes' reports summed (distributed mode), else
    (embedded mode, or Redis not answering within :data:`REDIS_WAIT_SECONDS`) this node's."""
    board = use_board()
    if board is None:
        return node_use(quotas, tenant)
    try:
        return board.read(tenant)
    except Exception as exc:  # shown as this node's figures, and said so
        logger.warning("tenant use: Redis unreachable (%s: %s); showing this node's counts",
                       type(exc).__name__, exc)
        return node_use(quotas, tenant)

