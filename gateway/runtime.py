"""The gateway side of a node: routing table, Subscriber Manager, inbox, replicator, caches and
the background jobs (database resync, node heartbeat), started and stopped with the node.

``GatewayConfig.ready()`` registers :func:`start_node` / :func:`stop_node` with
``config.node``: uvicorn runs them through the ASGI lifespan, ``manage.py serve`` under Daphne
calls them itself. A server that runs no lifespan at all gets a node started lazily by the first
gateway request.
"""

from __future__ import annotations

import asyncio
import gc
import logging

from asgiref.sync import sync_to_async
from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.conf import settings
from django.db import close_old_connections

from gateway import outbound
from gateway.conf import reload as reload_conf
from gateway.inbox import Inbox
from gateway.limits import RateLimiter
from gateway.replicator import Replicator
from gateway.routing_table import RoutingTable
from gateway.subscriber_manager import SubscriberManager
from registry import selectors, services
from registry.ids import DISCOVERY_GROUP
from registry.token_cache import TokenCache

logger = logging.getLogger(__name__)


def _load_routes():
    close_old_connections()
    try:
        return selectors.agent_routes()
    finally:
        close_old_connections()


def _heartbeat(node_id: str) -> None:
    close_old_connections()
    try:
        services.node_heartbeat(node_id=node_id)
    finally:
        close_old_connections()


class GatewayNode:
    def __init__(self) -> None:
        reload_conf()  # `manage.py serve` sets NODE_ID after the gateway was imported
        self.loop = asyncio.get_running_loop()
        self.layer = get_channel_layer()
        # The in-memory layer reaches only this process: a Query for an agent owned elsewhere
        # can never be answered, so it is answered `unreachable` at once instead of waiting.
        self.cross_process = not isinstance(self.layer, InMemoryChannelLayer)
        self.table = RoutingTable()
        self.manager = SubscriberManager(self.table, self.layer)
        self.replicator = Replicator(self.layer, self.manager, broadcast=self.cross_process)
        self.inbox = Inbox(
            self.layer,
            groups=(DISCOVERY_GROUP,) if self.cross_process else (),
            on_other=self.replicator.remote_message,
        )
        self.tokens = TokenCache()
        self.limiter = RateLimiter()
        self._jobs: list[asyncio.Task] = []
        self._running = False
        self._stopped = False

    def accepts_events(self) -> bool:
        return not self._stopped and not self.loop.is_closed()

    async def start(self) -> None:
        # Events may arrive while the table loads: they are applied at once and the load keeps
        # them (RoutingTable.finish_resync).
        await self.resync()
        self._running = True
        self.manager.start()
        self.inbox.start()
        resync, beat = settings.A2A_ROUTING_RESYNC_SECONDS, settings.A2A_NODE_HEARTBEAT_SECONDS
        self._jobs = [
            self.loop.create_task(self._every(resync, self._resync_job), name="gateway-resync"),
            self.loop.create_task(self._every(beat, self._beat, now=True),
                                  name="gateway-heartbeat"),
        ]
        if not settings.TESTING:
            # Everything loaded so far lives as long as the process: keep it out of the
            # cyclic GC's scans (a full collection of a Django process costs ~60 ms).
            gc.collect()
            gc.freeze()
        logger.info("gateway node %s up: %d route(s), %d local subscriber(s)",
                    settings.NODE_ID, len(self.table), len(self.manager.subscribers))

    async def stop(self) -> None:
        self._running = False
        self._stopped = True
        for job in self._jobs:
            job.cancel()
        if self._jobs:
            await asyncio.wait(self._jobs, timeout=2)
        await self.manager.stop()
        await self.inbox.stop()
        await self.replicator.drain()
        await outbound.close_client()

    async def resync(self) -> None:
        """Reload the routing table from the database (keeping what events changed since the
        read began) and reconcile this node's subscribers with it."""
        self.table.begin_resync()
        try:
            routes = await sync_to_async(_load_routes, thread_sensitive=False)()
        except Exception as exc:
            logger.warning("routing table resync failed: %s: %s", type(exc).__name__, exc)
            return
        self.table.finish_resync(routes)
        if self._running:
            self.manager.reconcile()

    async def _resync_job(self) -> None:
        await self.resync()
        if self.cross_process and self.inbox.ready:
            try:
                await self.inbox.rejoin_groups()
            except Exception as exc:
                logger.warning("rejoining the discovery group failed: %s", exc)

    async def _beat(self) -> None:
        try:
            await sync_to_async(_heartbeat, thread_sensitive=False)(settings.NODE_ID)
        except Exception as exc:
            logger.warning("node heartbeat failed: %s: %s", type(exc).__name__, exc)

    async def _every(self, seconds: float, job, *, now: bool = False) -> None:
        if now:
            await job()
        while True:
            await asyncio.sleep(seconds)
            try:
                await job()
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("gateway job %s failed", job)


_node: GatewayNode | None = None
_starting: asyncio.Future | None = None


def current_node() -> GatewayNode | None:
    return _node


async def start_node() -> None:
    """Node startup hook."""
    await ensure_node()


async def ensure_node() -> GatewayNode:
    """The running node of this loop, started now if no lifespan started it."""
    global _node, _starting
    loop = asyncio.get_running_loop()
    if _starting is not None and not _starting.done() and _node is not None \
            and _node.loop is loop:
        return await asyncio.shield(_starting)
    node = _node
    if node is not None and node.loop is loop:
        return node
    _starting = loop.create_future()
    try:
        node = GatewayNode()
        _node = node  # current before it starts: events during the start reach it
        await node.start()
        _starting.set_result(node)
        return node
    except BaseException as exc:
        _node = None
        _starting.set_exception(exc)
        _starting.exception()
        raise


async def stop_node() -> None:
    """Node shutdown hook."""
    global _node
    node = _node
    if node is None or node.loop is not asyncio.get_running_loop():
        return
    _node = None
    await node.stop()
