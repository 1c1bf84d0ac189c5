"""The agent's concurrency cap for the calls nodes make to its gRPC server themselves (gRPC
pass-through, calls translated to a gRPC-only agent), counted across the cluster.

Such a call runs on the node that took it, not through the owner's virtual subscriber, so the
subscriber's count cannot see it. Each node counts its own calls in memory
(:func:`take_slot`: past the cap on this node alone, ``busy`` at once, nothing asked), and in
distributed mode every slot is also a **lease** in Redis: a sorted set per agent
(``a2a:node:<cluster>:grpc-slots:<agent id>``) whose members are the calls holding a slot,
scored by their lease's expiry, taken and counted by one script (:data:`_TAKE`: expired leases
dropped, at most the cap granted; the time is Redis's own, so no two nodes' clocks are
compared). A lease lasts ``A2A_NODE_LIVENESS_TTL_SECONDS`` and the node renews those of its
calls in flight every ``A2A_NODE_LIVENESS_REFRESH_SECONDS`` (one script for all), so a slot
cannot leak: a call's end gives it back (a deletion sent without waiting), and the slots of a
node that crashed, lost its Redis connection or was stopped are free again within the TTL, as
the node itself is found dead within it. No database query: one Redis round trip per call (the
take), which waits at most :data:`REDIS_WAIT_SECONDS`.

While Redis cannot be reached, a node counts its own calls only (the cap per node, as in
embedded mode), and says so in its log. The owner's subscriber still counts the agent's HTTP
calls on its own: an agent reached both ways may have the cap of each at once.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any

from django.conf import settings as django_settings

from core.cluster import REDIS_NOW_MS, cluster_of
from gateway import runtime

logger = logging.getLogger(__name__)

KEY_PREFIX = "a2a:node:{cluster}:grpc-slots:"
#: How long taking a slot waits for Redis before the node counts on its own.
REDIS_WAIT_SECONDS = 0.5
#: The node's connections to Redis for its slots.
MAX_CONNECTIONS = 16
#: At most this many leases renewed by one script call.
RENEW_BATCH = 500
#: A failing Redis is logged at most this often.
WARN_EVERY_SECONDS = 30.0

#: KEYS[1]: the agent's set; ARGV: the cap, the lease in ms, the lease's id. 1 granted, 0 busy.
_TAKE = REDIS_NOW_MS + """
local ms = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[1], now + ms, ARGV[3])
redis.call('PEXPIRE', KEYS[1], ms * 2)
return 1
"""
#: KEYS: the agents' sets; ARGV[1]: the lease in ms, ARGV[i + 1]: the lease held in KEYS[i].
#: A lease already expired (dropped) is not taken again: its slot may have been granted.
_RENEW = REDIS_NOW_MS + """
local ms = tonumber(ARGV[1])
for i = 1, #KEYS do
  redis.call('ZADD', KEYS[i], 'XX', now + ms, ARGV[i + 1])
  redis.call('PEXPIRE', KEYS[i], ms * 2)
end
return #KEYS
"""


@dataclass(slots=True)
class Slot:
    """One slot of an agent's cap, held by a call (``lease``: its Redis lease, "" when the
    node counted it alone)."""

    agent_id: str
    lease: str
    released: bool = False


_in_flight: dict[str, int] = {}


class ClusterLeases:
    """The Redis side: this node's leases, taken, renewed and given back."""

    def __init__(self, url: str, cluster: str, node_id: str, *, lease: float,
                 renew: float) -> None:
        import redis.asyncio as aioredis

        # At most MAX_CONNECTIONS to Redis, however many calls wait (each at most
        # REDIS_WAIT_SECONDS, then counted by this node alone).
        pool = aioredis.BlockingConnectionPool.from_url(
            url, max_connections=MAX_CONNECTIONS, timeout=REDIS_WAIT_SECONDS,
            socket_timeout=max(lease / 2, 0.5), socket_connect_timeout=max(lease / 2, 0.5))
        self.client = aioredis.Redis(connection_pool=pool)
        self.prefix = KEY_PREFIX.format(cluster=cluster)
        self.lease_ms = max(int(lease * 1000), 1)
        self.renew_seconds = renew
        self.owner = f"{node_id}:{uuid.uuid4().hex[:12]}"
        self._numbers = itertools.count(1)
        self._take = self.client.register_script(_TAKE)
        self._renew = self.client.register_script(_RENEW)
        #: lease id -> the agent's set, for every slot this node holds.
        self.held: dict[str, str] = {}
        self._renewer: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._warned = 0.0

    async def take(self, agent_id: str, cap: int) -> str | None:
        """A new lease on one of the agent's ``cap`` slots, or None (all taken). Raises when
        Redis does not answer within :data:`REDIS_WAIT_SECONDS`."""
        lease = f"{self.owner}:{next(self._numbers)}"
        key = self.prefix + agent_id
        asked = asyncio.ensure_future(self._take(keys=[key], args=[cap, self.lease_ms, lease]))
        try:
            # Shielded: redis-py sometimes holds a cancellation back until its socket timeout
            # (seconds), so the wait is bounded here and not by cancelling the command.
            granted = await asyncio.wait_for(asyncio.shield(asked), REDIS_WAIT_SECONDS)
        except BaseException:
            asked.add_done_callback(lambda done: self._abandoned(done, key, lease))
            asked.cancel()
            raise
        if not granted:
            return None
        self.held[lease] = key
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.get_running_loop().create_task(self._renew_held())
        return lease

    def _abandoned(self, asked: asyncio.Future[Any], key: str, lease: str) -> None:
        """A take given up at its wait: a lease Redis granted all the same goes back."""
        if not asked.cancelled() and asked.exception() is None and asked.result():
            self._spawn(self._delete(key, lease))

    def give_back(self, lease: str) -> None:
        """End a lease (sent without waiting; one that is not deleted expires)."""
        key = self.held.pop(lease, None)
        if key is not None:
            self._spawn(self._delete(key, lease))

    async def _delete(self, key: str, lease: str) -> None:
        try:
            async with asyncio.timeout(self.lease_ms / 1000):
                await self.client.zrem(key, lease)
        except Exception as exc:  # it expires on its own
            self.warn("giving a slot back", exc)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _renew_held(self) -> None:
        """Renew this node's leases while it holds any (every ``renew_seconds``)."""
        while self.held:
            await asyncio.sleep(self.renew_seconds)
            held = list(self.held.items())
            for start in range(0, len(held), RENEW_BATCH):
                batch = held[start:start + RENEW_BATCH]
                try:
                    async with asyncio.timeout(self.renew_seconds):
                        await self._renew(keys=[key for _, key in batch],
                                          args=[self.lease_ms, *(lease for lease, _ in batch)])
                except Exception as exc:  # the next round tries again; past the TTL they expire
                    self.warn("renewing slots", exc)

    def warn(self, what: str, exc: BaseException) -> None:
        now = time.monotonic()
        if now - self._warned >= WARN_EVERY_SECONDS:
            self._warned = now
            logger.warning("gRPC calls' cluster slots: %s failed (%s: %s); counting this "
                           "node's calls only meanwhile", what, type(exc).__name__, exc)

    async def close(self) -> None:
        """Stop renewing (the leases still held expire) and close the connection; a node's
        earlier loop may be gone by then: nothing of it is waited for."""
        for task in [self._renewer, *self._tasks]:
            if task is not None and not task.done():
                try:
                    task.cancel()
                except RuntimeError:  # its loop is closed
                    pass
        self.held.clear()
        try:
            await self.client.aclose(close_connection_pool=True)
        except Exception as exc:  # a connection of a loop that is gone
            logger.debug("gRPC calls' cluster slots: closing: %s", exc)


_leases: tuple[Any, ClusterLeases | None] | None = None


def leases() -> ClusterLeases | None:
    """The running node's leases (None in embedded or single-node mode: no Redis)."""
    global _leases
    node = runtime.host.node
    if _leases is not None and _leases[0] is node:
        return _leases[1]
    made = None
    url = getattr(django_settings, "REDIS_URL", "")
    if node is not None and node.liveness is not None and url:
        settings = node.settings
        made = ClusterLeases(url, cluster_of(django_settings.DATABASES["default"]),
                             settings.NODE_ID, lease=settings.A2A_NODE_LIVENESS_TTL_SECONDS,
                             renew=settings.A2A_NODE_LIVENESS_REFRESH_SECONDS)
    if _leases is not None and _leases[1] is not None:
        old = _leases[1]
        asyncio.get_running_loop().create_task(old.close())
    _leases = (node, made)
    return made


async def take_slot(agent_id: str, max_concurrency: int) -> Slot | None:
    """Take one of the agent's ``max_concurrency`` slots for a call this node makes to its gRPC
    server (passed through, or translated); None when all are taken (``busy``), on this node
    or across the cluster. Every slot taken is given back with :func:`release_slot`."""
    if _in_flight.get(agent_id, 0) >= max_concurrency:
        return None
    lease = ""
    cluster = leases()
    if cluster is not None:
        try:
            taken = await cluster.take(agent_id, max_concurrency)
        except Exception as exc:
            cluster.warn("taking a slot", exc)
        else:
            if taken is None:
                return None
            lease = taken
        if _in_flight.get(agent_id, 0) >= max_concurrency:  # taken here meanwhile
            if lease:
                cluster.give_back(lease)
            return None
    _in_flight[agent_id] = _in_flight.get(agent_id, 0) + 1
    return Slot(agent_id, lease)


def release_slot(slot: Slot) -> None:
    """Give a slot back (its lease ended without waiting for Redis); once: a slot already
    given back is left alone."""
    if slot.released:
        return
    slot.released = True
    left = _in_flight.get(slot.agent_id, 1) - 1
    if left > 0:
        _in_flight[slot.agent_id] = left
    else:
        _in_flight.pop(slot.agent_id, None)
    if slot.lease:
        cluster = _leases[1] if _leases is not None else None
        if cluster is not None:
            cluster.give_back(slot.lease)


async def close() -> None:
    """Close the node's Redis connection (the listener stopping); its leases expire."""
    global _leases
    if _leases is not None and _leases[1] is not None:
        await _leases[1].close()
    _leases = None
