"""The node's inbox: one Channels channel per process, with one long-lived receive loop.

It carries two kinds of message: replies to the Queries this node's gateway sent through the
broker (demultiplexed by request id to the waiting request), and registry events other nodes
announce on the ``_AGENTS_.discovery`` group (handed to the replicator). One receive loop per
channel, never cancelled and re-issued, as both Redis layers require (docs/adr/0003).

The loop never waits on a request: each pending request registers a non-blocking ``put_nowait``
into a bounded buffer of its own (``gateway.sse.StreamBuffer``). A slow stream cannot stall it
nor grow a queue: the owning node sends a stream at most ``A2A_SSE_BUFFER_BYTES`` ahead of what
the caller has read (it waits for ``stream_credit`` messages the gateway sends as the caller
reads), and a reply arriving while the buffer is full anyway (an owner ignoring the window)
ends that one stream with a ``stream_stalled`` error event instead of being queued. A sync
request's buffer holds at most the response cap.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from gateway import envelope as env

logger = logging.getLogger(__name__)

RETRY_SECONDS = 1.0


class Inbox:
    def __init__(self, layer: Any, *, groups: tuple[str, ...] = (),
                 on_other: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.layer = layer
        self.groups = groups
        self.on_other = on_other
        self.channel: str | None = None
        self.pending: dict[str, Callable[[dict[str, Any]], None]] = {}
        self._ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="gateway-inbox")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait([self._task], timeout=2)
        if self.channel is not None:
            for group in self.groups:
                try:
                    await self.layer.group_discard(group, self.channel)
                except Exception:  # broker down at shutdown: membership lapses on its own
                    pass

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    async def wait_ready(self, timeout: float) -> bool:
        try:
            async with asyncio.timeout(timeout):
                await self._ready.wait()
        except TimeoutError:
            return False
        return True

    async def rejoin_groups(self) -> None:
        """Re-add the inbox to its groups (the core Redis layer expires memberships)."""
        if self.channel is None:
            return
        for group in self.groups:
            await self.layer.group_add(group, self.channel)

    async def _open(self) -> None:
        while True:
            try:
                self.channel = await self.layer.new_channel("a2a-node.")
                await self.rejoin_groups()
                self._ready.set()
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                logger.warning("node inbox unavailable (%s: %s); retrying",
                               type(exc).__name__, exc)
                await asyncio.sleep(RETRY_SECONDS)

    async def _run(self) -> None:
        await self._open()
        layer, channel, pending = self.layer, self.channel, self.pending
        while True:
            try:
                message = await layer.receive(channel)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                logger.warning("node inbox receive failed: %s: %s", type(exc).__name__, exc)
                await asyncio.sleep(RETRY_SECONDS / 2)
                continue
            if not isinstance(message, dict):
                continue
            if message.get("type") == env.REPLY:
                deliver = pending.get(message.get("i"))  # type: ignore[arg-type]  # no id: no match
                if deliver is not None:
                    deliver(message)
            elif self.on_other is not None:
                try:
                    self.on_other(message)
                except Exception:
                    logger.exception("node inbox: handling %r failed", message.get("type"))
