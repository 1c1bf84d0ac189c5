"""The gateway side of a node: an explicit :class:`GatewayNode` that owns its collaborators.

A node is built with its settings (:class:`gateway.conf.NodeSettings`) and, on
:meth:`GatewayNode.start`, creates and wires everything it runs: the routing table, the
Subscriber Manager (and so the virtual subscribers), the replicator and the node inbox, the
rate limiter, its subscription to registry events and to the metrics collector, and the
background jobs (database resync, node heartbeat). The ASGI router hands the node to the
``/a2a`` handler on every request (``node.router``). Imports go one way: this module imports
the collaborators, none of them imports it, and a test can build two nodes in one process.

:class:`NodeHost` is the slot an ASGI application serves from. ``GatewayConfig.ready()``
registers the process's :data:`host` with ``core.lifecycle``: uvicorn starts and stops it through
the ASGI lifespan, ``manage.py serve`` under Daphne calls the hooks itself, and a server that
runs no lifespan at all gets the node started by the first gateway request.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime, timedelta
from typing import Any

from channels.db import database_sync_to_async
from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.conf import settings as django_settings
from django.utils import timezone

from core.cluster import cluster_of
from gateway import conf, local_events, metrics
from gateway.conf import NodeSettings
from gateway.inbox import Inbox
from gateway.limits import RateLimiter
from gateway.liveness import BROKER_LOST, OWNER_LOST, Liveness
from gateway.redis_layer import RedisDirectChannelLayer
from gateway.replicator import Replicator
from gateway.routing_table import RoutingTable
from gateway.subscriber_manager import SubscriberManager
from gateway.tenant_quotas import TenantQuotas, UseBoard
from outbound import http1 as outbound
from registry import events, quotas, selectors, services
from registry.events import AgentRoute
from registry.ids import DISCOVERY_GROUP
from registry.token_cache import TokenCache, shared_token_cache

logger = logging.getLogger(__name__)

#: Subscribers reconciled per turn of the event loop by a resync.
_RECONCILE_SLICE = 100
_NO_NODES: frozenset[str] = frozenset()


def _broadcasts(layer: Any) -> bool:
    """Whether every receiver of a named channel gets every message: the Redis pub/sub layers
    (the gateway's own ``direct`` layer and channels-redis's ``pubsub``), not ``core``."""
    if isinstance(layer, RedisDirectChannelLayer):
        return True
    try:
        from channels_redis.pubsub import RedisPubSubChannelLayer
    except ImportError:
        return False
    return isinstance(layer, RedisPubSubChannelLayer)


class GatewayNode:
    """One node's gateway: built with its settings, wired in :meth:`start`."""

    def __init__(
        self,
        settings: NodeSettings | None = None,
        *,
        layer: Any = None,
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
        self._jobs: list[asyncio.Task[None]] = []
        #: The liveness beat (distributed mode): None in embedded mode and before start.
        self.liveness: Liveness | None = None
        #: In-flight calls sent through the broker, by owning node: request id -> a function
        #: that ends the call when that node is found dead (gateway.relays).
        self.inflight: dict[str, dict[str, Callable[[dict[str, Any]], None]]] = {}
        #: Why the broker was last lost (the terminal error's detail).
        self.broker_lost_detail = ""
        self._adoptions: set[asyncio.Task[None]] = set()
        self._unsubscribe: list[Callable[[], None]] = []
        self._running = False
        self._stopped = False
        # The incremental resync's cursor (rows changed after it are read) and when the last
        # full reload ran (time.monotonic()); None: the next resync is a full one.
        self._since: datetime | None = None
        self._last_full = 0.0
        #: Resyncs completed, by kind (the registry bench reports how many ran in its window).
        self.resyncs = {"full": 0, "incremental": 0}

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
        self.quotas = TenantQuotas()
        self.table = RoutingTable(settings)
        self.liveness = self._liveness()
        #: Where this node reports its tenants' use (distributed mode; gateway.tenant_quotas).
        self.use_board: UseBoard | None = None
        if self.liveness is not None:
            self.use_board = UseBoard(self.liveness.url,
                                      cluster_of(django_settings.DATABASES["default"]))
        # On a broadcasting layer a move between two live nodes is a handover (both receive on
        # the agent's channel for a while: gateway.handover).
        broadcasting = self.liveness is not None and _broadcasts(self.layer)
        self.manager = SubscriberManager(
            self.table, self.layer, settings,
            is_alive=self.liveness.is_alive if broadcasting else None,  # type: ignore[union-attr]  # broadcasting: set
        )
        self.replicator = Replicator(self.layer, self.manager, settings,
                                     broadcast=self.cross_process)
        self.inbox = Inbox(
            self.layer,
            groups=(DISCOVERY_GROUP,) if self.cross_process else (),
            on_other=self.replicator.remote_message,
            budget=settings.A2A_BROKER_INFLIGHT_BYTES if self.cross_process else 0,
        )
        # Subscribed before the table loads: events during the load are applied at once and
        # the load keeps them (RoutingTable.finish_resync).
        self._unsubscribe = [
            events.subscribe(self._on_registry_event),
            metrics.watch(self.manager),
            conf.on_change(self._reconfigure),
        ]
        on_lost = getattr(self.layer, "on_subscriber_lost", None)
        if on_lost is not None and self.cross_process:
            self._unsubscribe.append(on_lost(self._on_broker_lost))
        self.replicator.attach()
        # No broker (embedded): other processes' registry events come over a local socket.
        self.local_events: local_events.Listener | None = None
        if not self.cross_process:
            self.local_events = local_events.Listener(self.replicator.remote_message)
            if not self.local_events.start():
                self.local_events = None
        if self.liveness is not None:
            await asyncio.to_thread(self.liveness.start)
        await self.resync()
        await self._refresh_quotas()
        self._running = True
        self.manager.start()
        self.inbox.start()
        if self.cross_process:
            # Serve only once replies can come back (a call in the gap would be unreachable).
            await self.inbox.wait_ready(5.0)
        self._jobs = [
            self.loop.create_task(self._every(settings.A2A_ROUTING_RESYNC_SECONDS,
                                              self._resync_job), name="gateway-resync"),
            self.loop.create_task(self._every(settings.A2A_NODE_HEARTBEAT_SECONDS, self._beat,
                                              now=True), name="gateway-heartbeat"),
            self.loop.create_task(self._every(settings.A2A_TENANT_QUOTAS_REFRESH_SECONDS,
                                              self._refresh_quotas), name="gateway-quotas"),
        ]
        if settings.A2A_GC_FREEZE:
            # Everything loaded so far lives as long as the process: keep it out of the
            # cyclic GC's scans (a full collection of a Django process costs ~60 ms).
            gc.collect()
            gc.freeze()
            if settings.A2A_GC_GEN0_THRESHOLD > 0:
                # Fewer young collections: each scans the objects of every request in flight.
                gc.set_threshold(settings.A2A_GC_GEN0_THRESHOLD, *gc.get_threshold()[1:])
        logger.info("gateway node %s up: %d route(s), %d local subscriber(s)",
                    settings.NODE_ID, len(self.table), len(self.manager.subscribers))

    @property
    def dead_nodes(self) -> frozenset[str]:
        """Nodes found dead (liveness key gone) and not back since."""
        liveness = self.liveness
        return liveness.dead if liveness is not None else _NO_NODES

    def _liveness(self) -> Liveness | None:
        url = getattr(django_settings, "REDIS_URL", "")
        if not self.cross_process or not url:
            return None
        settings = self.settings
        return Liveness(url, settings.NODE_ID,
                        cluster=cluster_of(django_settings.DATABASES["default"]),
                        refresh=settings.A2A_NODE_LIVENESS_REFRESH_SECONDS,
                        ttl=settings.A2A_NODE_LIVENESS_TTL_SECONDS,
                        on_dead=self._peer_dead)

    def _peer_dead(self, node_id: str, restarted: bool) -> None:
        """The liveness beat found ``node_id`` gone (runs in the beat's thread)."""
        if self._stopped or self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self._on_peer_dead, node_id, restarted)

    def _on_broker_lost(self, detail: str) -> None:
        """This node's subscribing connection to the broker was lost: every call in flight
        through it ends at once with ``broker_lost`` (replies published while the connection
        was down are gone, so a stream would go on with a gap, or hang until its keepalive
        deadline and end as ``owner_lost`` although its owner lives)."""
        self.broker_lost_detail = detail
        calls = [end for owner in list(self.inflight.values()) for end in list(owner.values())]
        if calls:
            logger.warning("%s with %d call(s) in flight through it from here: ending them",
                           detail, len(calls))
        for end in calls:
            end(BROKER_LOST)

    def _on_peer_dead(self, node_id: str, restarted: bool) -> None:
        """End the calls in flight on the dead node at once (their Queries are lost with it)
        and, unless it already restarted, adopt its agents (``A2A_FAILOVER=adopt``)."""
        calls = self.inflight.pop(node_id, None)
        if calls:
            logger.warning("node %s died with %d call(s) in flight from here: ending them",
                           node_id, len(calls))
            for end in list(calls.values()):
                end(OWNER_LOST)
        if restarted or not self._running or self.settings.A2A_FAILOVER != "adopt":
            return
        task = self.loop.create_task(self._adopt(node_id))
        self._adoptions.add(task)
        task.add_done_callback(self._adoptions.discard)

    async def _adopt(self, node_id: str) -> None:
        """Move the dead node's agents to the live nodes (this one included) in one
        transaction; every survivor tries, the conditional update lets one win."""
        targets = self.liveness.live_nodes() if self.liveness is not None else []
        if not targets:
            return
        moved = await self._move_off(
            node_id, targets, f"adopting the agents of node {node_id} failed",
            "the expiry job expires them once its heartbeat lapses")
        if moved:
            logger.warning("adopted %d agent(s) of dead node %s over %s", len(moved), node_id,
                           ", ".join(targets))

    @staticmethod
    async def _move_off(node_id: str, targets: list[str], failure: str,
                        fallback: str) -> list[str] | None:
        """Move ``node_id``'s agents over ``targets`` (one transaction, in a worker thread):
        the agents moved, or None when the database refused (logged with what happens
        instead)."""
        try:
            moved: list[str] = await database_sync_to_async(services.agents_move_off_node,
                                                            thread_sensitive=False)(
                node_id=node_id, to_nodes=targets)
            return moved
        except Exception as exc:
            logger.warning("%s: %s: %s (%s)", failure, type(exc).__name__, exc, fallback)
            return None

    async def _hand_over(self) -> None:
        """A clean stop: hand this node's agents to the live nodes before stopping; each old
        subscriber drains after the new owner's takeover (gateway.handover)."""
        liveness = self.liveness
        assert liveness is not None  # stop() checked
        await asyncio.to_thread(liveness.stopping)
        if self.settings.A2A_FAILOVER != "adopt":
            return
        node_id = self.settings.NODE_ID
        targets = [n for n in liveness.live_nodes() if n != node_id]
        if not targets:
            logger.info("no live node to hand %d agent(s) to", len(self.manager.subscribers))
            return
        moved = await self._move_off(
            node_id, targets, "handover failed",
            "peers adopt the agents once this node's liveness key is gone")
        if moved is None:
            return
        await asyncio.sleep(0)  # the moves' events, applied on this loop
        logger.info("handing %d agent(s) over to %s", len(moved), ", ".join(targets))
        await self.manager.wait_handed_off(self.settings.A2A_HANDOVER_TIMEOUT_SECONDS + 1)

    async def stop(self) -> None:
        if self._running and self.liveness is not None:
            try:
                await self._hand_over()
            except Exception:
                logger.exception("handover failed")
        self._running = False
        self._stopped = True
        for unsubscribe in self._unsubscribe:
            unsubscribe()
        self._unsubscribe = []
        if not hasattr(self, "inbox"):
            return  # never started
        self.replicator.detach()
        listener = getattr(self, "local_events", None)
        if listener is not None:
            listener.stop()
        for job in self._jobs:
            job.cancel()
        if self._jobs:
            await asyncio.wait(self._jobs, timeout=2)
        await self.manager.stop()
        await self.inbox.stop()
        await self.replicator.drain()
        await outbound.close_client()
        for task in list(self._adoptions):
            task.cancel()
        if self.use_board is not None:
            try:
                await asyncio.to_thread(self.use_board.withdraw, self.settings.NODE_ID)
            except Exception:
                pass  # the report expires on its own
            self.use_board.client.close()
        if self.liveness is not None:
            await asyncio.to_thread(self.liveness.stop)  # last: peers see this node gone

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

    async def resync(self, *, full: bool | None = None) -> None:
        """Bring the routing table up to date with the database (keeping what events changed
        since the read began) and reconcile this node's subscribers with it.

        Incremental by default: only the rows whose routing marker moved since the previous
        read (plus lapsed leases and deregistrations), so the work on the event loop follows
        what changed, not the registry's size. A full reload runs first, then every
        ``A2A_ROUTING_FULL_RESYNC_SECONDS`` (``full=True`` forces one).
        """
        settings = self.settings
        if full is None:
            full = (
                self._since is None
                or time.monotonic() - self._last_full >= settings.A2A_ROUTING_FULL_RESYNC_SECONDS
            )
        # The next read starts from before this one began, less an overlap for clock skew
        # between nodes and transactions that commit after this read.
        cursor = timezone.now() - timedelta(seconds=settings.A2A_ROUTING_RESYNC_OVERLAP_SECONDS)
        started = time.perf_counter()
        self.table.begin_resync()
        try:
            if full:
                fresh, owned = await database_sync_to_async(
                    self._read_full, thread_sensitive=False
                )()
            else:
                changes = await database_sync_to_async(
                    selectors.agent_route_changes, thread_sensitive=False
                )(since=self._since)
        except Exception as exc:
            logger.warning("routing table resync failed: %s: %s", type(exc).__name__, exc)
            return
        read = time.perf_counter()
        if full:
            self.table.finish_resync(fresh)
            self._last_full = time.monotonic()
            if self._running:
                await self._reconcile(owned.union(self.manager.subscribers))
            changed_count = len(fresh)
        else:
            changed = self.table.finish_incremental(changes.routes, changes.gone)
            if self._running and changed:
                await self._reconcile(changed)
            changed_count = len(changed)
        self._since = cursor
        kind = "full" if full else "incremental"
        self.resyncs[kind] += 1
        # One line per resync (every A2A_ROUTING_RESYNC_SECONDS): what the safety net caught
        # (an incremental change here is an event this node missed) and the time it took on
        # the event loop; the registry bench counts these lines inside its measuring window.
        logger.info(
            "routing resync (%s): %d %s, read %.1f ms (worker thread), applied %.1f ms (loop)",
            kind, changed_count, "route(s)" if full else "change(s)",
            (read - started) * 1e3, (time.perf_counter() - read) * 1e3,
        )

    def _read_full(self) -> tuple[dict[str, AgentRoute], set[str]]:
        """A full resync's read (worker thread): the new table and the agents this node owns
        in it, both built off the event loop, the GIL handed back every 1,000 rows."""
        fresh = {r.agent_id: r for r in selectors.agent_routes(pause_every=1000)}
        node_id = self.settings.NODE_ID
        owned = {agent_id for agent_id, r in fresh.items() if r.node_id == node_id}
        return fresh, owned

    async def _reconcile(self, agent_ids: Iterable[str]) -> None:
        """Reconcile these agents' subscribers with the table, a slice at a time with the loop
        free in between (a node adopting or re-reading 10,000 agents must not stall calls)."""
        ids = list(agent_ids)
        for start in range(0, len(ids), _RECONCILE_SLICE):
            if start:
                await asyncio.sleep(0)
            self.manager.reconcile_agents(ids[start : start + _RECONCILE_SLICE])

    async def _resync_job(self) -> None:
        await self.resync()
        if self.liveness is not None and self.settings.A2A_FAILOVER == "adopt":
            # Agents given to a dead node after it was adopted (a registration made elsewhere
            # that picked it by its database heartbeat): adopted on this safety-net beat.
            for node_id in sorted(self.liveness.dead):
                await self._adopt(node_id)
        if self.cross_process and self.inbox.ready:
            try:
                await self.inbox.rejoin_groups()
            except Exception as exc:
                logger.warning("rejoining the discovery group failed: %s", exc)

    async def _refresh_quotas(self) -> None:
        """Read the tenants' quotas again (worker thread) and count the live nodes sharing
        them (gateway.tenant_quotas); a failed read keeps the quotas known. Then report this
        node's use (distributed mode), whether the read succeeded or not."""
        try:
            limits = await database_sync_to_async(quotas.tenant_limits,
                                                  thread_sensitive=False)()
        except Exception as exc:
            logger.warning("tenant quotas refresh failed: %s: %s", type(exc).__name__, exc)
        else:
            liveness = self.liveness
            self.quotas.update(limits,
                               len(liveness.live_nodes()) if liveness is not None else 1)
        await self._report_use()  # what it counts goes on being seen either way

    async def _report_use(self) -> None:
        """Report what this node counts of the tenants' quotas to the cluster (distributed
        mode: the console sums the reports, gateway.tenant_quotas); expiring after three
        refreshes, so a dead node's report goes with it."""
        board = self.use_board
        if board is None:
            return
        fields = self.quotas.report()  # taken on the loop, which changes the counts
        ttl = 3 * self.settings.A2A_TENANT_QUOTAS_REFRESH_SECONDS
        try:
            await asyncio.to_thread(board.publish, self.settings.NODE_ID, fields, ttl)
        except Exception as exc:
            logger.warning("tenant use report failed: %s: %s", type(exc).__name__, exc)

    async def _beat(self) -> None:
        try:
            await database_sync_to_async(services.node_heartbeat, thread_sensitive=False)(
                node_id=self.settings.NODE_ID
            )
        except Exception as exc:
            logger.warning("node heartbeat failed: %s: %s", type(exc).__name__, exc)

    async def _every(self, seconds: float, job: Callable[[], Awaitable[None]], *,
                     now: bool = False) -> None:
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
        self._starting: asyncio.Future[GatewayNode] | None = None

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
