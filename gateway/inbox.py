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

What the owning node publishes for a request is numbered and, above ``PIECE_BYTES``, split
(gateway.envelope): each pending request's messages go through a :class:`Reassembly`, which
joins the pieces back in order and turns a missing number into :data:`STREAM_GAP` -- the call
then ends with the ``stream_gap`` error instead of relaying around the loss. A lost *last*
message has no later number: the owner's ``a2a.ended`` notices (gateway.endings) name the
number each call ended at, and a call still waiting for it gets :data:`STREAM_GAP` too
(:meth:`Reassembly.ended`). With a node-wide budget (gateway.grants) each call's Query asks the
owner to send the pieces of large messages only as granted, and the call's grants go back to
the budget when it is forgotten here (:class:`Pending`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from gateway import envelope as env
from gateway.grants import Budget, CallGrant
from registry.ids import agent_channel

logger = logging.getLogger(__name__)

RETRY_SECONDS = 1.0

#: What a request's buffer gets once a reply message between the nodes went missing.
STREAM_GAP: dict[str, str] = {"k": "stream_gap"}


class Reassembly:
    """One request's reply messages from the broker, checked and joined before they are
    relayed: numbers must follow one another from 1 (a repeated one is dropped; a skipped one
    is a gap: :data:`STREAM_GAP` goes to ``push`` and nothing more is taken), and a message
    announcing pieces (``pc``) is held until they all came, then handed on whole. Messages
    without a number pass as they are; an ack passes at once even between a message and its
    pieces (the owner's ack timer can fire as the answer starts: its publish then follows the
    message's first part).

    Bounded: a message announcing more than ``limit`` bytes of pieces is refused like a gap is
    (the owner never sends one: its messages are capped by the response cap)."""

    __slots__ = ("put", "push", "limit", "expected", "held", "parts", "missing", "broken",
                 "on_piece", "grant")

    def __init__(self, put: Callable[[dict[str, Any]], None],
                 push: Callable[[dict[str, Any]], None], limit: int) -> None:
        self.put = put  # the request's buffer, for messages it counts (bounded)
        self.push = push  # the same buffer, for the ending (never refused)
        self.limit = limit
        self.expected = 1
        self.held: dict[str, Any] | None = None
        self.parts: list[bytes] = []
        self.missing = 0
        self.broken = False
        #: Told the size of each piece taken (the stream's credit: the owner sends the pieces
        #: of one large message at most a window ahead of this).
        self.on_piece: Callable[[int], None] | None = None
        #: The call's share of the node's budget (gateway.grants), if it has one.
        self.grant: CallGrant | None = None

    def __call__(self, message: dict[str, Any]) -> None:
        if self.broken:
            return
        if message.get("k") == env.ACK:
            self.put(message)
            return
        number = message.get("n")
        if number is not None:
            if number != self.expected:
                if number > self.expected:
                    self._gap(f"reply {self.expected} of the call never arrived")
                return  # a repeated message: already relayed
            self.expected = number + 1
        kind = message.get("k")
        held = self.held
        if kind == env.PIECE:
            if held is None:
                self._gap("a piece without its message")
                return
            body = message.get("body") or b""
            self.parts.append(body)
            self.missing -= 1
            if self.on_piece is not None:
                self.on_piece(len(body))
            grant = self.grant
            if grant is not None:
                grant.took(len(body))
                if self.missing <= 0:
                    grant.complete()
            if self.missing <= 0:
                held["body"] = b"".join(self.parts)
                del held["pc"]
                self.held = None
                self.parts = []
                self.put(held)
            return
        if held is not None:
            self._gap(f"{self.missing} piece(s) of a reply never arrived")
            return
        pieces = message.get("pc")
        if pieces:
            if not isinstance(pieces, int) or pieces * env.PIECE_BYTES > self.limit:
                self._gap("a reply larger than this node accepts")
                return
            self.held = message
            self.parts = [message.get("body") or b""]
            self.missing = pieces
            if self.on_piece is not None:
                self.on_piece(len(self.parts[0]))
            if self.grant is not None:
                self.grant.announced(pieces)
            return
        self.put(message)

    def ended(self, number: int) -> None:
        """The owner says the call's last reply message was number ``number``: if it has not
        come (the call is still here, waiting for it), the call's tail was lost."""
        if not self.broken and number >= self.expected:
            self._gap(f"the call ended at reply {number}, and reply {self.expected} never "
                      "arrived")

    def _gap(self, detail: str) -> None:
        self.broken = True
        self.held = None
        self.parts = []
        logger.warning("reply messages lost between nodes: %s", detail)
        self.push(STREAM_GAP)


class Pending(dict[str, Callable[[dict[str, Any]], None]]):
    """The requests waiting for replies, by request id: a request forgotten (``pop``) gives its
    grants back to the node's budget."""

    def pop(self, key: str, *default: Any) -> Any:
        found = super().pop(key, *default)
        grant = getattr(found, "grant", None)
        if grant is not None:
            grant.close()
        return found


class Inbox:
    def __init__(self, layer: Any, *, groups: tuple[str, ...] = (),
                 on_other: Callable[[dict[str, Any]], None] | None = None,
                 budget: int = 0) -> None:
        """``budget``: bytes of pieces Redis may hold for this node across its calls
        (``A2A_BROKER_INFLIGHT_BYTES``; 0: no grants, pieces cross as the owner sends them)."""
        self.layer = layer
        self.groups = groups
        self.on_other = on_other
        self.channel: str | None = None
        self.pending: Pending = Pending()
        self.budget = Budget(budget, layer) if budget > 0 else None
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

    def expect(self, tags: dict[str, str], reassembly: Reassembly, agent_id: str) -> None:
        """Wait for the replies to the Query with ``tags`` (sent next, to ``agent_id``'s
        channel): its messages go to ``reassembly``; with a budget, its pieces are granted."""
        request_id = tags[env.TAG_REQUEST_ID]
        if self.budget is not None:
            tags[env.TAG_GRANT] = "0"
            reassembly.grant = self.budget.call(request_id, agent_channel(agent_id))
        self.pending[request_id] = reassembly

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
            kind = message.get("type")
            if kind == env.REPLY:
                deliver = pending.get(message.get("i"))  # type: ignore[arg-type]  # no id: no match
                if deliver is not None:
                    deliver(message)
            elif kind == env.ENDED:
                calls = message.get("calls")
                if isinstance(calls, dict):
                    for request_id, number in calls.items():
                        found = pending.get(request_id)
                        if found is not None and isinstance(number, int):
                            ended = getattr(found, "ended", None)
                            if ended is not None:
                                ended(number)
            elif self.on_other is not None:
                try:
                    self.on_other(message)
                except Exception:
                    logger.exception("node inbox: handling %r failed", message.get("type"))
