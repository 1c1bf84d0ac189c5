"""The Replicator: keeps every node's routing table current across the cluster.

Registry services publish events in whatever process runs them (a node's API thread, a Celery
worker, a management command). A running node subscribes to them (``GatewayNode.start``): the
event is applied to the node's table and subscribers and announced on the ``_AGENTS_.discovery``
group; every other node applies it on receipt. A process that runs no node (a Celery worker
expiring agents) only announces (:func:`announce_without_node`, subscribed by the gateway's
AppConfig): on Redis, or in embedded mode, which has no broker, over the local sockets of
``gateway.local_events``. Announcements are best effort: the periodic database resync is the
safety net.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import TYPE_CHECKING, Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings as django_settings

from core import lifecycle as node_config
from gateway import local_events
from gateway.conf import NodeSettings
from registry.events import AgentEvent
from registry.ids import DISCOVERY_GROUP

if TYPE_CHECKING:
    from gateway.subscriber_manager import SubscriberManager

logger = logging.getLogger(__name__)

EVENT_TYPE = "registry.event"
#: Identifies this process's announcements (a node ignores its own).
ORIGIN = uuid.uuid4().hex
#: Replicators of this process's running nodes (none: events are only announced).
_attached: set[Replicator] = set()


def announcement(event: AgentEvent, node_id: str) -> dict[str, Any]:
    return {"type": EVENT_TYPE, "origin": ORIGIN, "node": node_id, "event": event.as_dict()}


class Replicator:
    def __init__(self, layer: Any, manager: SubscriberManager, settings: NodeSettings, *,
                 broadcast: bool) -> None:
        self.layer = layer
        self.manager = manager
        self.settings = settings
        self.broadcast = broadcast
        self._tasks: set[asyncio.Task[None]] = set()

    def attach(self) -> None:
        """This process now has a node applying (and announcing) its events."""
        _attached.add(self)

    def detach(self) -> None:
        _attached.discard(self)

    def local_event(self, event: AgentEvent) -> None:
        """An event published in this process (runs on the node's loop)."""
        self.manager.apply(event)
        if self.broadcast:
            task = asyncio.get_running_loop().create_task(self._announce(event))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def remote_message(self, message: dict[str, Any]) -> None:
        """A message from the node inbox that is not a reply."""
        if message.get("type") != EVENT_TYPE or message.get("origin") == ORIGIN:
            return
        try:
            event = AgentEvent.from_dict(message["event"])
        except (KeyError, TypeError, ValueError):
            logger.warning("ignoring a malformed registry announcement")
            return
        self.manager.apply(event)

    async def _announce(self, event: AgentEvent) -> None:
        try:
            await self.layer.group_send(DISCOVERY_GROUP,
                                        announcement(event, self.settings.NODE_ID))
        except Exception as exc:
            logger.warning("announcing %s %s failed (%s); peers resync later",
                           event.kind, event.agent_id, exc)

    async def drain(self) -> None:
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=2)


def announce_without_node(event: AgentEvent) -> None:
    """The ``registry.events`` subscriber of a process without a running node (any thread):
    announce the event so the cluster's nodes apply it -- on Redis, or in embedded mode (no
    broker) to the nodes serving the same database on this machine (``gateway.local_events``)."""
    if _attached:
        return
    if django_settings.EMBEDDED:
        try:
            local_events.send(announcement(event, node_config.node_id()))
        except Exception as exc:
            logger.warning("announcing %s %s failed (%s); the node resyncs later",
                           event.kind, event.agent_id, exc)
        return
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        return  # called on an event loop without a node: nothing safe to block on
    try:
        async_to_sync(get_channel_layer().group_send)(
            DISCOVERY_GROUP, announcement(event, node_config.node_id())
        )
    except Exception as exc:
        logger.warning("announcing %s %s failed (%s); nodes resync later",
                       event.kind, event.agent_id, exc)
