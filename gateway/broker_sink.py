"""The owner's side of the broker for one Query: :class:`BrokerSink` writes its reply messages
(gateway.envelope) to the entry node's reply channel -- acknowledged while the agent works,
numbered, a large body in pieces, a stream at most a window ahead of what its caller has read
(``stream_credit``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, cast

from gateway import endings, grants
from gateway import envelope as env

logger = logging.getLogger(__name__)

#: Where a subscriber writes a Query's reply messages: a :class:`BrokerSink`, or, on the local
#: fast path, the entry node's :class:`~gateway.exchange.Exchange` itself.
Sink = Callable[[dict[str, Any]], Awaitable[None]]

#: Through the broker, a request still running after this long is acknowledged, so the gateway
#: can tell a slow agent from a missing subscriber.
ACK_AFTER_SECONDS = 0.5


class StreamStalled(Exception):
    """The gateway relaying a stream took no more of it for too long (no stream_credit)."""


class BrokerSink:
    """Writes reply messages to the gateway's reply channel through the Channels layer.

    For a stream whose Query names a window (``a2a_window``), at most that many body bytes are
    sent ahead of what the caller has read (``stream_credit`` from the gateway): the relay then
    waits here, so it stops reading the agent, and one slow caller never floods the broker or
    the gateway node's inbox. Each stream waits on its own; the receive loop never does.
    """

    __slots__ = ("layer", "channel", "request_id", "_ack_timer", "_tasks", "window", "sent",
                 "credited", "credit_timeout", "_credit_waiter", "number", "piece",
                 "pieces_sent", "pieces_received", "allowance", "done", "__weakref__")

    def __init__(self, layer: Any, channel: str, request_id: str,
                 tasks: set[asyncio.Task[Any]]) -> None:
        self.layer = layer
        self.channel = channel
        self.request_id = request_id
        self._ack_timer: asyncio.TimerHandle | None = None
        self._tasks = tasks
        self.window = 0  # 0: no flow control (sync replies, bounded by the response cap)
        self.sent = 0
        self.credited = 0
        #: How long a flow-controlled stream waits for credit (set with ``window``).
        self.credit_timeout = 0.0
        self._credit_waiter: asyncio.Future[None] | None = None
        #: The number of the last reply message published (gateway.envelope: numbered, so the
        #: entry node detects a lost one).
        self.number = 0
        #: The largest body sent in one message (0: whole messages; the entry node's
        #: ``a2a_pieces``), and the bytes of pieced messages sent / taken by the entry node.
        self.piece = 0
        self.pieces_sent = 0
        self.pieces_received = 0
        #: What the entry node grants of the pieces (gateway.grants; None: not asked).
        self.allowance: grants.Allowance | None = None
        #: The number of the last reply message whose publish is over (gateway.endings).
        self.done = 0

    def credit(self, total: int, received: int = 0) -> None:
        """The gateway has delivered ``total`` body bytes of this stream to its caller, and
        taken ``received`` bytes of pieced messages from the broker."""
        if total > self.credited or received > self.pieces_received:
            self.credited = max(total, self.credited)
            self.pieces_received = max(received, self.pieces_received)
            waiter = self._credit_waiter
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

    async def _wait_credit(self, pieces: bool = False) -> None:
        # Bounded: a gateway that vanished, or credits lost in the broker, end the stream
        # after the gateway's own stall timeout would have (plus its buffer) - never a hang.
        limit = self.credit_timeout
        try:
            async with asyncio.timeout(limit):
                while (self.pieces_sent - self.pieces_received if pieces
                       else self.sent - self.credited) >= self.window:
                    self._credit_waiter = asyncio.get_running_loop().create_future()
                    try:
                        await self._credit_waiter
                    finally:
                        self._credit_waiter = None
        except TimeoutError:
            raise StreamStalled(f"no stream credit for {limit:g} s") from None

    def arm_ack(self) -> None:
        self._ack_timer = asyncio.get_running_loop().call_later(ACK_AFTER_SECONDS, self._ack)

    def _ack(self) -> None:
        self._ack_timer = None
        spawn(self._tasks, self._send(env.ack(self.request_id)))

    async def __call__(self, message: dict[str, Any]) -> None:
        if self._ack_timer is not None:
            self._ack_timer.cancel()
            self._ack_timer = None
        body = message.get("body")
        window = self.window
        if window and body:
            if self.sent - self.credited >= window:
                await self._wait_credit()
            self.sent += len(body)
        # Numbered (acks are not: they carry nothing for the caller), and a large body crosses
        # in pieces, which the entry node joins back (gateway.envelope).
        self.number += 1
        if self.number == 1 and not env.is_last(message):
            endings.watch(self)  # a call of several messages: its progress is told meanwhile
        size = self.piece
        if not size or not body or len(body) <= size:
            message["n"] = self.number
            await self._send(message)
            if env.is_last(message):  # told again shortly: a lost last message shows
                endings.ended(self.layer, self.channel, self.request_id, self.number)
            return
        # A flow-controlled stream's pieces cross at most a window ahead of what the entry
        # node has taken (its credits' a2a_received): Redis never queues more for it.
        rest = range(size, len(body), size)
        self.pieces_sent += size
        await self._send({**message, "body": body[:size], "n": self.number, "pc": len(rest)})
        for at in rest:
            if window and self.pieces_sent - self.pieces_received >= window:
                await self._wait_credit(pieces=True)
            self.number += 1
            part = env.piece(self.request_id, body[at:at + size])
            part["n"] = self.number
            self.pieces_sent += len(part["body"])
            await self._send(part)
        if env.is_last(message):
            endings.ended(self.layer, self.channel, self.request_id, self.number)

    async def _send(self, message: dict[str, Any]) -> None:
        try:
            # a piece without a grant in time is not sent: the entry node ends the call
            # (gateway.grants)
            if self.allowance is None or message["k"] != env.PIECE \
                    or await self.allowance.take(len(message["body"])):
                await self.layer.send(self.channel, message)
        except Exception as exc:  # broker down: the gateway times out and answers itself
            logger.warning("reply to %s lost: %s: %s", self.channel, type(exc).__name__, exc)
        self.done = message.get("n") or self.done


def spawn(tasks: set[asyncio.Task[Any]], coro: Awaitable[Any]) -> asyncio.Task[Any]:
    # A sink's answer is a coroutine typed as the Awaitable its protocol promises.
    task = asyncio.get_running_loop().create_task(cast(Coroutine[Any, Any, Any], coro))
    tasks.add(task)
    task.add_done_callback(tasks.discard)
    return task
