"""The gateway side of a node: an explicit :class:`GatewayNode` that owns its collaborators.

A node is built with its settings (:class:`gateway.conf.NodeSettings`) and, on
:meth:`GatewayNode.start`, creates and wires everything it runs: the routing table, the
Subscriber Manager (and so the virtual subscribers), the replicator and the node inbox, the
rate limiter, its subscription to registry events and to the metrics collector, and the
background jobs (database resync, node heartbeat). The ASGI router hands the node to the
``/a2a`` handler on every request (``gateway.routing``). Imports go one way: this module imports
the collaborators, none of them imports it, and a test can build two nodes in one process.

:class:`NodeHost` is the slot an ASGI application serves from. ``GatewayConfig.ready()``
registers the process's :data:`host` with ``config.node``: uvicorn starts and stops it through
the ASGI lifespan, ``manage.py serve`` under Daphne calls the hooks itself, and a server that
runs no lifespan at all gets the node started by the first gateway request.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Callable

from channels.db import database_sync_to_async
from channels.layers import InMemoryChannelLayer, get_channel_layer

from gateway import conf, metrics, outbound
from gateway.conf import NodeSettings
from gateway.inbox import Inbox
from gateway.limits import RateLimiter
from gateway.replicator import Replicator
from gateway.routing_table import RoutingTable
from gateway.subscriber_manager import SubscriberManager
from registry import events, selectors, services
from registry.ids import DISCOVERY_GROUP
from registry.token_cache import TokenCache, shared_token_cache

logger = logging.getLogger(__name__)


class GatewayNode:
    """One node's gateway: built with its settings, wired in :meth:`start`."""

    def __init__(
        self,
        settings: NodeSettings | None = None,
        *,
        layer=None,
        broadcast: bool | None = None,
        tokens: TokenCache | None = None,
    ) -> None:
        """``settings``: None reads Django's at start. ``layer``: the Channels layer (default:
        the process's). ``broadcast``: whether other nodes share the layer (default: any layer
        but the in-memory one, which reaches only this process)."""
        self._explicit_settings = settings
        self.settings: NodeSettings = settings or NodeSettings.from_django()
        self._layer = layer
        self._broadcast = broadcast
        self._tokens = tokens
        self._jobs: list[asyncio.Task] = []
        self._unsubscribe: list[Callable[[], None]] = []
        self._running = False
        self._stopped = False

    # --- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Create the collaborators, load the routing table, start the subscribers, the inbox
        and the background jobs."""
        if self._explicit_settings is None:
            self.settings = NodeSettings.from_django()
        settings = self.settings
        conf.activate(settings)
        self.loop = asyncio.get_running_loop()
        self.layer = self._layer if self._layer is not None else get_channel_layer()
        # The in-memory layer reaches only this process: a Query for an agent owned elsewhere
        # can never be answered, so it is answered `unreachable` at once instead of waiting.
        self.cross_process = (
            self._broadcast if self._broadcast is not None
            else not isinstance(self.layer, InMemoryChannelLayer)
        )
        self.tokens = self._tokens or shared_token_cache()
        self.limiter = RateLimiter(settings)
        self.table = RoutingTable(settings)
        self.manager = SubscriberManager(self.table, self.layer, settings)
        self.replicator = Replicator(self.layer, self.manager, settings,
                                     broadcast=self.cross_process)
        self.inbox = Inbox(
            self.layer,
            groups=(DISCOVERY_GROUP,) if self.cross_process else (),
            on_other=self.replicator.remote_message,
        )
        # Subscribed before the table loads: events during the load are applied at once and
        # the load keeps them (RoutingTable.finish_resync).
        self._unsubscribe = [
            events.subscribe(self._on_registry_event),
            metrics.watch(self.manager),
            conf.on_change(self._reconfigure),
        ]
        self.replicator.attach()
        await self.resync()
        self._running = True
        self.manager.start()
        self.inbox.start()
        self._jobs = [
            self.loop.create_task(self._every(settings.A2A_ROUTING_RESYNC_SECONDS,
                                              self._resync_job), name="gateway-resync"),
            self.loop.create_task(self._every(settings.A2A_NODE_HEARTBEAT_SECONDS, self._beat,
                                              now=True), name="gateway-heartbeat"),
        ]
        if settings.A2A_GC_FREEZE:
            # Everything loaded so far lives as long as the process: keep it out of the
            # cyclic GC's scans (a full collection of a Django process costs ~60 ms).
            gc.collect()
            gc.freeze()
        logger.info("gateway node %s up: %d route(s), %d local subscriber(s)",
                    settings.NODE_ID, len(self.table), len(self.manager.subscribers))

    async def stop(self) -> None:
        self._running = False
        self._stopped = True
        for unsubscribe in self._unsubscribe:
            unsubscribe()
        self._unsubscribe = []
        if not hasattr(self, "inbox"):
            return  # never started
        self.replicator.detach()
        for job in self._jobs:
            job.cancel()
        if self._jobs:
            await asyncio.wait(self._jobs, timeout=2)
        await self.manager.stop()
        await self.inbox.stop()
        await self.replicator.drain()
        await outbound.close_client()

    def _on_registry_event(self, event: events.AgentEvent) -> None:
        """The node's ``registry.events`` subscriber (runs in any thread)."""
        if self._stopped or self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.replicator.local_event, event)

    def _reconfigure(self) -> None:
        """A setting changed (tests): hand every collaborator a new settings object."""
        if self._explicit_settings is not None:
            return
        settings = self.settings = NodeSettings.from_django()
        conf.activate(settings)
        self.limiter.settings = settings
        self.table.settings = settings
        self.replicator.settings = settings
        self.manager.reconfigure(settings)

    # --- jobs ------------------------------------------------------------------------------

    async def resync(self) -> None:
        """Reload the routing table from the database (keeping what events changed since the
        read began) and reconcile this node's subscribers with it."""
        self.table.begin_resync()
        try:
            routes = await database_sync_to_async(selectors.agent_routes,
                                                  thread_sensitive=False)()
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
            await database_sync_to_async(services.node_heartbeat, thread_sensitive=False)(
                node_id=self.settings.NODE_ID
            )
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


class NodeHost:
    """The slot an ASGI application serves its node from.

    ``node`` is the running node (read by the router on every request). :meth:`start` and
    :meth:`stop` are the node's startup and shutdown hooks; :meth:`ensure` starts a node on
    the running loop when no hook did (a server without lifespan), concurrent first requests
    sharing one start.
    """

    def __init__(self, factory: Callable[[], GatewayNode] = GatewayNode) -> None:
        self.factory = factory
        #: The running node, read by the router on every request.
        self.node: GatewayNode | None = None
        self._starting: asyncio.Future | None = None

    async def start(self) -> None:
        """Node startup hook."""
        await self.ensure()

    async def ensure(self) -> GatewayNode:
        """The running node of this loop, started now if no lifespan started it."""
        loop = asyncio.get_running_loop()
        node = self.node
        if node is not None and node.loop is loop:
            return node
        starting = self._starting
        if starting is not None and not starting.done() and starting.get_loop() is loop:
            return await asyncio.shield(starting)
        starting = self._starting = loop.create_future()
        node = self.factory()
        try:
            await node.start()
        except BaseException as exc:
            await node.stop()
            starting.set_exception(exc)
            starting.exception()  # retrieved: no "never retrieved" warning
            raise
        # Published only once started: the router never sees a node without collaborators.
        self.node = node
        starting.set_result(node)
        return node

    async def stop(self) -> None:
        """Node shutdown hook."""
        node = self.node
        if node is None or getattr(node, "loop", None) is not asyncio.get_running_loop():
            return
        self.node = None
        await node.stop()


#: The process's node host: what ``config.asgi``'s application serves.
host = NodeHost()


def current_node() -> GatewayNode | None:
    """The process's running node (None before start and after stop)."""
    return host.node
