"""The Replicator: keeps every node's routing table current across the cluster.

Registry services publish events in whatever process runs them (a node's API thread, a Celery
worker, a management command). In a node process the event is applied to the node's table and
subscribers and announced on the ``_AGENTS_.discovery`` group; every other node applies it on
receipt. A process that runs no node (a Celery worker expiring agents) only announces.
Announcements are best effort: the periodic database resync is the safety net.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings

from registry.events import AgentEvent
from registry.ids import DISCOVERY_GROUP

logger = logging.getLogger(__name__)

EVENT_TYPE = "registry.event"
#: Identifies this process's announcements (a node ignores its own).
ORIGIN = uuid.uuid4().hex


def announcement(event: AgentEvent) -> dict[str, Any]:
    return {"type": EVENT_TYPE, "origin": ORIGIN, "node": settings.NODE_ID,
            "event": event.as_dict()}


class Replicator:
    def __init__(self, layer, manager, *, broadcast: bool) -> None:
        self.layer = layer
        self.manager = manager
        self.broadcast = broadcast
        self._tasks: set[asyncio.Task] = set()

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
            await self.layer.group_send(DISCOVERY_GROUP, announcement(event))
        except Exception as exc:
            logger.warning("announcing %s %s failed (%s); peers resync later",
                           event.kind, event.agent_id, exc)

    async def drain(self) -> None:
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=2)


def on_registry_event(event: AgentEvent) -> None:
    """The gateway's ``registry.events`` subscriber (any thread)."""
    from gateway import runtime

    node = runtime.current_node()
    if node is not None and node.accepts_events():
        node.loop.call_soon_threadsafe(node.replicator.local_event, event)
        return
    if not settings.EMBEDDED:
        _announce_without_node(event)


def _announce_without_node(event: AgentEvent) -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        return  # called on an event loop without a node: nothing safe to block on
    try:
        async_to_sync(get_channel_layer().group_send)(DISCOVERY_GROUP, announcement(event))
    except Exception as exc:
        logger.warning("announcing %s %s failed (%s); nodes resync later",
                       event.kind, event.agent_id, exc)
