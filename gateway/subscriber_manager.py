"""The Subscriber Manager: owns the lifecycle of this node's virtual subscribers.

It spawns ``a2a-vsub-{agent_id}`` when an agent registers on this node (``route.node_id`` is
the node's ``NODE_ID``), updates it when the registration changes, and tears it down at once on
deregistration, expiry, or when the agent re-registers on another node. Subscribers are not
replicated: only the owning node runs one; other nodes route to it through the broker.

When an agent moves between two live nodes on a broadcasting layer (pub/sub), the move is a
handover (``gateway.handover``): the new owner's subscriber starts in standby and
takes the channel over; the old one drains instead of being torn down at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Any

from gateway import metrics
from gateway.conf import NodeSettings
from gateway.routing_table import RoutingTable
from gateway.subscriber import VirtualSubscriber
from registry.events import AgentEvent, AgentRoute

logger = logging.getLogger(__name__)


class SubscriberManager:
    def __init__(self, table: RoutingTable, layer: Any, settings: NodeSettings, *,
                 is_alive: Callable[[str], bool] | None = None) -> None:
        """``is_alive(node_id)``: whether another node is up (its liveness key is present);
        given on a broadcasting layer only, where moves between live nodes are handovers."""
        self.table = table
        self.layer = layer
        self.settings = settings
        self.is_alive = is_alive
        #: Subscribers handing their agent over to another node (draining), by agent id.
        self.handing_off: dict[str, VirtualSubscriber] = {}
        self.subscribers: dict[str, VirtualSubscriber] = {}
        # Subscribers being torn down: a new one for the same agent starts receiving only after
        # the old one stopped (both Redis layers and the in-memory layer drop a channel's
        # subscription when its pending receive() is cancelled).
        self._stopping: dict[str, asyncio.Task[None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def local(self, agent_id: str) -> VirtualSubscriber | None:
        return self.subscribers.get(agent_id)

    def start(self) -> None:
        self.reconcile()

    def reconfigure(self, settings: NodeSettings) -> None:
        """New settings for the manager and every live subscriber (tests change settings)."""
        self.settings = settings
        for subscriber in list(self.subscribers.values()):  # may run off the node's loop
            subscriber.settings = settings

    async def stop(self) -> None:
        subscribers = list(self.subscribers.values()) + list(self.handing_off.values())
        self.subscribers.clear()
        self.handing_off.clear()
        await asyncio.gather(*(s.stop() for s in subscribers), return_exceptions=True)
        pending = list(self._stopping.values()) + list(self._tasks)
        if pending:
            await asyncio.wait(pending, timeout=2)

    # --- events ----------------------------------------------------------------------------

    def apply(self, event: AgentEvent) -> None:
        """Apply a registry event (this process's or another node's) to the table and to
        this node's subscribers. Runs on the node's event loop."""
        previous = self.table.get(event.agent_id)
        self.table.apply(event)
        if event.kind in ("deregistered", "expired"):
            self._teardown(event.agent_id)
            metrics.forget_agent(event.agent_id)
        elif event.route is not None:
            self._place(event.route, previous.node_id if previous is not None else None)

    def reconcile(self) -> None:
        """Make this node's subscribers match the routing table (start and every resync)."""
        node_id = self.settings.NODE_ID
        owned = {r.agent_id: r for r in self.table.routes() if r.node_id == node_id}
        for agent_id in list(self.subscribers):
            if agent_id not in owned:
                self._teardown(agent_id)
        for route in owned.values():
            self._place(route)

    def reconcile_agents(self, agent_ids: Iterable[str]) -> None:
        """Make the subscribers of these agents match the routing table (an incremental
        resync: the work follows what changed, not the table's size)."""
        for agent_id in agent_ids:
            route = self.table.get(agent_id)
            if route is None:
                self._teardown(agent_id)
                metrics.forget_agent(agent_id)
            else:
                self._place(route)

    def _place(self, route: AgentRoute, previous_node: str | None = None) -> None:
        current = self.subscribers.get(route.agent_id)
        node_id = self.settings.NODE_ID
        if route.node_id != node_id:
            if current is not None:
                if self.is_alive is not None and self.is_alive(route.node_id):
                    logger.info("%s moved to live node %s: handing over", route.agent_id,
                                route.node_id)
                    self._hand_off(route.agent_id)
                else:
                    logger.info("%s moved to node %s: tearing down", route.agent_id,
                                route.node_id)
                    self._teardown(route.agent_id)
            return
        if current is not None:
            current.update(route)
            return
        # Another live node's subscriber holds the channel: take it over (gateway.subscriber).
        standby = (self.is_alive is not None and previous_node is not None
                   and previous_node != node_id and self.is_alive(previous_node))
        subscriber = VirtualSubscriber(route, self.layer, self.settings)
        self.subscribers[route.agent_id] = subscriber
        subscriber.start(after=self._stopping.get(route.agent_id), standby=standby)
        logger.debug("spawned %s%s", subscriber.client_id, " (standby)" if standby else "")

    def _hand_off(self, agent_id: str) -> None:
        subscriber = self.subscribers.pop(agent_id)
        self.handing_off[agent_id] = subscriber
        task = asyncio.get_running_loop().create_task(
            subscriber.hand_off(self.settings.A2A_HANDOVER_TIMEOUT_SECONDS))
        self._stopping[agent_id] = task

        def done(t: asyncio.Task[None], agent_id: str = agent_id) -> None:
            if self._stopping.get(agent_id) is t:
                del self._stopping[agent_id]
            if self.handing_off.get(agent_id) is subscriber:
                del self.handing_off[agent_id]

        task.add_done_callback(done)

    async def wait_handed_off(self, timeout: float) -> None:
        """Wait (at most ``timeout``) until every subscriber handing over has drained."""
        pending = list(self._stopping.values())
        if pending:
            await asyncio.wait(pending, timeout=timeout)

    def _teardown(self, agent_id: str) -> None:
        subscriber = self.subscribers.pop(agent_id, None)
        if subscriber is None:
            return
        task = asyncio.get_running_loop().create_task(subscriber.stop())
        self._stopping[agent_id] = task

        def done(t: asyncio.Task[None], agent_id: str = agent_id) -> None:
            if self._stopping.get(agent_id) is t:
                del self._stopping[agent_id]

        task.add_done_callback(done)
        logger.debug("tearing down %s", subscriber.client_id)
