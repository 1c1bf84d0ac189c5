"""Server-Sent Events framing for the relay: event boundaries, keepalives, terminal errors.

The relay forwards whole events as they arrive (never the whole stream at once): it keeps the
unterminated tail of the upstream bytes until its blank line arrives, so a keepalive comment or
a terminal error event is never spliced into the middle of an agent's event, and the per-event
size cap applies to one event at a time.

Backpressure: a relayed stream never buffers more than ``A2A_SSE_BUFFER_BYTES`` for a caller
(:class:`StreamBuffer`), and the caller's ``send`` waits while its connection takes no more data
(:func:`flow_controlled`), so a caller that stops reading stops the agent being read instead of
growing the node's memory.
"""

from __future__ import annotations

import asyncio
import functools
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import orjson

KEEPALIVE = b": keepalive\n\n"
_TERMINATORS = (b"\r\n\r\n", b"\n\n", b"\r\r")


def split_events(buffer: bytes) -> tuple[bytes, bytes]:
    """Split ``buffer`` into (complete events, unterminated tail)."""
    end = -1
    for terminator in _TERMINATORS:
        at = buffer.rfind(terminator)
        if at >= 0 and at + len(terminator) > end:
            end = at + len(terminator)
    if end < 0:
        return b"", buffer
    return buffer[:end], buffer[end:]


def largest_event(events: bytes) -> int:
    """The size of the largest event in a run of complete events (for the per-event cap)."""
    normalized = events.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    return max((len(part) for part in normalized.split(b"\n\n")), default=0)


def error_event(error_response: dict[str, Any]) -> bytes:
    """A terminal ``event: error`` whose data is a JSON-RPC error response (what A2A SDK
    clients raise as a JSON-RPC error)."""
    return b"event: error\ndata: " + orjson.dumps(error_response) + b"\n\n"


# --- backpressure -----------------------------------------------------------------------------

#: What :meth:`StreamBuffer.get` answers once a message was refused for want of room.
OVERFLOW: dict[str, Any] = {"k": "overflow"}


def _cost(message: dict[str, Any]) -> int:
    body = message.get("body")
    return len(body) if body else 0


class StreamBuffer:
    """One relayed stream's reply messages waiting for its caller, bounded in body bytes.

    The local subscriber writes with :meth:`put`, which waits while the buffer is full: the
    subscriber then stops reading the agent, and the outbound client stops reading its socket,
    so backpressure reaches the agent. The node's inbox (replies through the broker) must never
    wait, so it writes with :meth:`put_nowait`: a message arriving while the buffer is full is
    refused and the stream ends with :data:`OVERFLOW` (the owner sends at most a window ahead
    of the caller, so a well-behaved owner never fills it). Control messages (the caller's
    disconnect) go in with :meth:`push`, free of charge.
    """

    __slots__ = ("limit", "size", "overflowed", "_items", "_getter", "_putter")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.size = 0
        self.overflowed = False
        self._items: deque[dict[str, Any]] = deque()
        self._getter: asyncio.Future[None] | None = None
        self._putter: asyncio.Future[None] | None = None

    def push(self, message: dict[str, Any]) -> None:
        self._items.append(message)
        self.size += _cost(message)
        self._wake_getter()

    def put_nowait(self, message: dict[str, Any]) -> None:
        if self.size >= self.limit and _cost(message):
            self.overflowed = True
            self._items.clear()
            self.size = 0
            self._wake_getter()
            return
        self.push(message)

    async def put(self, message: dict[str, Any]) -> None:
        """Add ``message`` once it fits: the buffer never holds more than its limit (or one
        message larger than the limit, alone)."""
        cost = _cost(message)
        while self.size and self.size + cost > self.limit and not self.overflowed:
            self._putter = asyncio.get_running_loop().create_future()
            try:
                await self._putter
            finally:
                self._putter = None
        self.push(message)

    async def get(self) -> dict[str, Any]:
        while not self._items:
            if self.overflowed:
                return OVERFLOW
            self._getter = asyncio.get_running_loop().create_future()
            try:
                await self._getter
            finally:
                self._getter = None
        if self.overflowed:
            return OVERFLOW
        message = self._items.popleft()
        self.size -= _cost(message)
        putter = self._putter
        if putter is not None and not putter.done():
            putter.set_result(None)  # it waits again if its message does not fit yet
        return message

    def close(self) -> None:
        """Nobody reads any more (the caller left): a writer waiting for room returns, and
        later writes never wait (resumable streams detach their writer this way)."""
        self.overflowed = True
        putter = self._putter
        if putter is not None and not putter.done():
            putter.set_result(None)

    def _wake_getter(self) -> None:
        getter = self._getter
        if getter is not None and not getter.done():
            getter.set_result(None)


def flow_controlled(
    send: Callable[[dict[str, Any]], Awaitable[None]],
) -> Callable[[dict[str, Any]], Awaitable[None]]:
    """``send`` made to wait while the caller's connection takes no more data, and to write a
    response's **last** message at once, whatever the caller reads.

    The same on both servers: every message but the last waits while the connection's write
    buffer is above its high-water mark (64 KiB on both); the last one (a stream's end: its
    terminator, or a terminal ``event: error`` such as ``stream_stalled``, a few hundred bytes)
    goes into that buffer without waiting, so a caller that reads again later gets the whole
    ending, and a caller that never does costs that buffer until the server closes the
    connection.

    uvicorn's ``send`` (a bound method of its request cycle) already waits, before every write,
    also the last (it drains the transport first): :class:`_UvicornFlow` lets the last one
    through. Daphne's never waits: Twisted buffers every byte written, without limit. Under
    Daphne ``send`` is ``partial(server.handle_reply, request)``; the request (a
    ``twisted.web.http.Request``) accepts a streaming producer, which Twisted pauses while its
    write buffer is full and resumes once it drains, so :class:`_TwistedFlow` waits on that.
    Anything else: ``send``.
    """
    owner = getattr(send, "__self__", None)
    if owner is not None and hasattr(owner, "flow_controlled"):
        # a wrapper around the server's send (the tracing span): control the inner send
        owner.flow_controlled(flow_controlled)
        return send
    if owner is not None and hasattr(getattr(owner, "flow", None), "write_paused"):
        return _UvicornFlow(send, owner.flow)
    if isinstance(send, functools.partial) and send.args:
        request = send.args[0]
        if hasattr(request, "registerProducer") and hasattr(request, "unregisterProducer"):
            return _TwistedFlow(send, request)
    return send


class _UvicornFlow:
    """uvicorn's ``send``, whose last message of a response never waits for the connection to
    drain (uvicorn's own waits before every write: a caller that stopped reading would never
    get a stream's terminal event, and the response would be abandoned mid-stream).

    uvicorn's ``send`` waits while its ``FlowControl.write_paused`` is set (the transport above
    its high-water mark); the last message is written with that flag lifted for the one
    synchronous write, then the flag is put back, so the connection stays paused until the
    transport drains and resumes it (a next request on the connection waits as before).
    """

    __slots__ = ("_send", "_flow")

    def __init__(self, send: Callable[[dict[str, Any]], Awaitable[None]], flow: Any) -> None:
        self._send = send
        self._flow = flow

    async def __call__(self, message: dict[str, Any]) -> None:
        flow = self._flow
        if (not flow.write_paused or message["type"] != "http.response.body"
                or message.get("more_body")):
            await self._send(message)
            return
        flow.write_paused = False  # uvicorn's send writes without awaiting anything then
        try:
            await self._send(message)
        finally:
            if not flow.write_paused:
                flow.write_paused = True  # its drain event is still clear: resume sets both


class _TwistedFlow:
    """A Twisted push producer standing for one response: ``send`` waits while paused."""

    __slots__ = ("_send", "_request", "_writable", "_registered")

    def __init__(self, send: Callable[[dict[str, Any]], Awaitable[None]], request: Any) -> None:
        self._send = send
        self._request = request
        self._writable = asyncio.Event()
        self._writable.set()
        self._registered = False
        try:
            request.registerProducer(self, True)
            self._registered = True
        except Exception:  # an unexpected server: no flow control, never a failed response
            return
        channel = getattr(request, "channel", None)
        if getattr(channel, "_waitingForTransport", False):
            self._writable.clear()

    # IPushProducer, called by Twisted on the event loop's thread (asyncio reactor)
    def pauseProducing(self) -> None:
        self._writable.clear()

    def resumeProducing(self) -> None:
        self._writable.set()

    def stopProducing(self) -> None:
        self._writable.set()  # connection lost: never keep a writer waiting

    async def __call__(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body" and not message.get("more_body"):
            self.close()  # Twisted wants the producer gone before the response finishes
            await self._send(message)
            return
        await self._send(message)
        if not self._writable.is_set():
            await self._writable.wait()

    def close(self) -> None:
        if self._registered:
            self._registered = False
            try:
                self._request.unregisterProducer()
            except Exception:  # the connection is already gone
                pass


def data_events(stream: bytes) -> Iterator[Any]:
    """The JSON of each ``data`` of the complete SSE events in ``stream`` (comments and
    keepalives skipped; an event whose data is not JSON gives None)."""
    for _, data in identified_events(stream):
        yield data


def identified_events(stream: bytes) -> Iterator[tuple[bytes | None, Any]]:
    """``(id, JSON of data)`` of each complete SSE event in ``stream`` that has a ``data``:
    its last ``id`` field (None without one; a resumable stream's owner appends its own,
    gateway.resume), comments and keepalives skipped, None for data that is not JSON."""
    for event in stream.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n\n"):
        data = []
        event_id = None
        for line in event.split(b"\n"):
            if line.startswith(b"data:"):
                data.append(line[5:].removeprefix(b" "))
            elif line.startswith(b"id:"):
                event_id = line[3:].removeprefix(b" ")
        if not data:
            continue
        try:
            yield event_id, orjson.loads(b"\n".join(data))
        except orjson.JSONDecodeError:
            yield event_id, None


def take_events(tail: bytes, body: bytes, more: bool) -> tuple[bytes, bytes]:
    """The complete events of ``tail + body`` (a relayed stream's next chunk after what was
    left of the last) and what is left now; at the stream's end (``more`` false) the rest is
    taken as a last event."""
    events, tail = split_events(tail + body if tail else body)
    if not more:
        events, tail = events + tail + b"\n\n", b""
    return events, tail
