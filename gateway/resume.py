"""Resumable streams: the owning node's replay buffer of one relayed SSE stream (docs/streams.md).

With ``A2A_SSE_RESUME_SECONDS`` > 0 the virtual subscriber wraps each streaming reply's sink in
a :class:`ReplayStream`. It numbers the agent's whole events (the subscriber only ever sends
whole events), appends an ``id: <stream_id>:<n>`` line to each (the agent's own lines are kept
byte for byte; a later ``id`` field wins, so callers see ours), tells the caller its stream id in
the ``X-A2A-Stream-Id`` response header, and keeps the most recent events, at most
``A2A_SSE_RESUME_BUFFER_BYTES``.

When the caller leaves, the stream is *detached* instead of cancelled: the agent keeps being read
into the buffer, which then evicts nothing; once full, the relay waits (backpressure reaches the
agent) rather than drop an event. A reconnect (``stream_resume``) from the same client within
``A2A_SSE_RESUME_SECONDS`` reattaches a new sink: the events after the caller's Last-Event-ID
are replayed, then the stream continues live. When the window passes, the stream is cancelled as
a caller's disconnect always was.
"""

from __future__ import annotations

import asyncio
import re
import secrets
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from gateway import envelope as env
from gateway import errors
from gateway.sse import KEEPALIVE, StreamBuffer

Sink = Callable[[dict[str, Any]], Awaitable[None]]

STREAM_ID_HEADER = b"x-a2a-stream-id"
#: One event ends at two line endings in a row (CRLF, LF or CR, mixed too: the SSE grammar).
_EVENT_END = re.compile(rb"(?:\r\n|\r|\n){2}")
#: Replayed events travel in messages of at most this many bytes (the credit window's unit).
REPLAY_MESSAGE_BYTES = 64 * 1024
_RELEASED = 1 << 62  # credit that lets a flow-controlled sink waiting for its caller go on


#: A stream opened through the A2A HTTP+JSON binding says so in its id, so that a reconnect
#: (even to an unknown or expired stream) is answered in the binding the stream was opened with:
#: ``r.<token>`` forwarded to the agent's own HTTP+JSON interface (the agent's events are
#: already the binding's), ``t<c><a>.<token>`` translated to the agent's JSON-RPC, the caller's
#: (``c``) and the agent's (``a``) protocol version as ``1`` (A2A 1.0) or ``0`` (A2A 0.3). A
#: JSON-RPC stream's id is the bare token. The token alone is random, so the prefix guards
#: nothing: the owner keys its streams by the whole id.
REST_FORWARDED = "r"
_FORM = re.compile(r"(r|t[01][01])\.")
_VERSIONS = {"1": "1.0", "0": "0.3"}


def rest_form(caller_version: str, agent_version: str) -> str:
    """The stream id prefix of a translated HTTP+JSON stream (``a2a_stream_form``)."""
    codes = {v: k for k, v in _VERSIONS.items()}
    return f"t{codes[caller_version]}{codes[agent_version]}"


def stream_form(stream_id: str) -> tuple[str, str, str] | None:
    """How a stream id was opened: None for JSON-RPC, else ``(form, caller version, agent
    version)`` -- the versions empty for a forwarded HTTP+JSON stream."""
    match = _FORM.match(stream_id)
    if match is None:
        return None
    form = match.group(1)
    if form == REST_FORWARDED:
        return form, "", ""
    return form, _VERSIONS[form[1]], _VERSIONS[form[2]]


def valid_form(form: str) -> bool:
    """Whether a Query's ``a2a_stream_form`` tag names a form :func:`stream_form` reads."""
    return _FORM.fullmatch(form + ".") is not None


def parse_last_event_id(value: str, stream_id: str) -> int | None:
    """The event number of a Last-Event-ID (``<stream_id>:<n>``, or ``<n>``); None if it is
    not one of this stream's ids."""
    prefix, colon, number = value.strip().rpartition(":")
    if colon and prefix != stream_id:
        return None
    if not number.isdigit() or len(number) > 18:
        return None
    return int(number)


def _release(sink: Sink | None) -> None:
    """Free a writer blocked on a caller that is gone (its buffer, or its broker credit)."""
    if sink is None:
        return
    credit = getattr(sink, "credit", None)
    if credit is not None:
        credit(_RELEASED, _RELEASED)  # delivered, and (pieces) taken from the broker
    allowance = getattr(sink, "allowance", None)
    if allowance is not None:
        allowance.grant(_RELEASED)  # and its pieces granted (gateway.grants)
    owner = getattr(sink, "__self__", None)
    if isinstance(owner, StreamBuffer):
        owner.close()


class ReplayStream:
    """One resumable stream on its owning node: numbers its events, keeps the recent ones, and
    forwards them to whichever caller is attached (none while it is detached)."""

    __slots__ = (
        "stream_id",
        "origin",
        "caller",
        "limit",
        "sink",
        "rid",
        "events",
        "size",
        "seq",
        "start",
        "final",
        "done",
        "plain",
        "expiry",
        "_room",
        "_on_end",
        "_sid",
        "_replaying",
        "_catching_up",
    )

    def __init__(
        self,
        request_id: str,
        caller: str,
        limit: int,
        sink: Sink,
        on_end: Callable[[ReplayStream], None],
        form: str = "",
    ) -> None:
        token = secrets.token_urlsafe(12)
        self.stream_id = f"{form}.{token}" if form else token
        self._sid = self.stream_id.encode()
        self.origin = request_id  # the first request: its task reads the agent
        self.caller = caller
        self.limit = limit
        self.sink: Sink | None = sink
        self.rid = request_id  # the attached caller's request id (reply messages name it)
        self.events: deque[tuple[int, bytes]] = deque()
        self.size = 0
        self.seq = 0
        self.start: dict[str, Any] | None = None
        self.final: dict[str, Any] | None = None  # the terminal message, once the agent ended
        self.done = False  # the terminal message went to a caller (kept for the window still)
        self.plain = False  # the agent answered JSON, not events: nothing to resume
        self.expiry: asyncio.TimerHandle | None = None
        self._room: asyncio.Future[None] | None = None
        self._on_end = on_end
        self._replaying = False
        self._catching_up: Sink | None = None  # the sink a replay is writing to

    # --- the agent's side (the stream task) ----------------------------------------------

    async def __call__(self, message: dict[str, Any]) -> None:
        kind = message["k"]
        if kind == env.START:
            if message["sse"]:
                headers = list(message["headers"])
                headers.append((STREAM_ID_HEADER, self._sid))
                message = {**message, "headers": headers}
                self.start = message
            else:
                self.plain = True
            if not message["more"]:
                self.final = message
        elif kind == env.CHUNK:
            body = message["body"]
            if self.start is not None and body and body != KEEPALIVE:
                message = {**message, "body": self._number(body)}
            if not message["more"]:
                self.final = message
        elif kind == env.ERROR:
            self.final = message
        sink = self.sink
        if sink is None or self._replaying:
            # Detached (or a reconnect is catching up): the events wait here; once the buffer
            # is full the agent waits too, until a caller is back or the window passes.
            if self.final is None:
                await self._wait_room()
            return
        if message.get("i") != self.rid:
            message = {**message, "i": self.rid}
        await sink(message)
        if self.final is not None and self.sink is sink and not self._replaying:
            self._finish()

    def _number(self, body: bytes) -> bytes:
        out = []
        events = self.events
        sid = self._sid
        for part in _EVENT_END.split(body):
            if not part.strip(b"\r\n"):
                continue  # blank lines between events
            self.seq += 1
            event = b"%s\nid: %s:%d\n\n" % (part, sid, self.seq)
            events.append((self.seq, event))
            self.size += len(event)
            out.append(event)
        if self.sink is not None and not self._replaying:
            # Attached: keep the most recent events (what may still be on the way to the caller)
            while self.size > self.limit and len(events) > 1:
                self.size -= len(events.popleft()[1])
        return b"".join(out)

    async def _wait_room(self) -> None:
        while self.size >= self.limit and self.sink is None:
            self._room = asyncio.get_running_loop().create_future()
            try:
                await self._room
            finally:
                self._room = None

    def _wake(self) -> None:
        room = self._room
        if room is not None and not room.done():
            room.set_result(None)

    def _finish(self) -> None:
        # The terminal message went to the caller, who may still lose the last events on the
        # way (its connection drops before it read them): resumable for the window all the same.
        if not self.done:
            self.done = True
            self._on_end(self)

    # --- the callers' side -----------------------------------------------------------------

    def detach(self, request_id: str, seconds: float, expire: Callable[[], None]) -> bool:
        """The caller of ``request_id`` left: keep the stream for ``seconds``. False when there
        is nothing to resume (the stream already ended for its caller, or it is not SSE)."""
        if request_id != self.rid:
            return True  # an earlier connection's late notice: a newer caller is attached
        if self.plain or self.start is None:
            return False
        old, self.sink = self.sink, None
        _release(old)
        _release(self._catching_up)  # left while its replay was still being written
        if not self.done:  # once ended, the window already runs
            if self.expiry is not None:
                self.expiry.cancel()
            self.expiry = asyncio.get_running_loop().call_later(seconds, expire)
        return True

    def check(self, caller: str, last: int) -> str | None:
        """Why ``caller`` cannot resume after event ``last`` (None: it can)."""
        if caller != self.caller or self.plain or self.start is None:
            return "unknown or expired stream"
        if last > self.seq:
            return f"event {last} was never sent"
        first = self.events[0][0] if self.events else self.seq + 1
        if last + 1 < first:
            return f"events after {last} are no longer buffered"
        return None

    async def attach(self, sink: Sink, request_id: str, last: int) -> None:
        """Reattach a caller: answer its start, replay the events after ``last``, go live."""
        if self.expiry is not None and not self.done:
            self.expiry.cancel()
            self.expiry = None
        old, self.sink = self.sink, None
        if old is not None:  # the previous connection's disconnect has not arrived yet
            _release(old)
        _release(self._catching_up)
        self.rid = request_id
        self._replaying = True
        self._catching_up = sink
        try:
            start = self.start
            assert start is not None
            await sink({**start, "i": request_id, "body": b"", "more": True})
            sent = last
            while True:
                batch = []
                size = 0
                for number, event in self.events:
                    if number > sent:
                        batch.append(event)
                        size += len(event)
                        sent = number
                        if size >= REPLAY_MESSAGE_BYTES:
                            break
                if not batch:
                    break  # caught up: nothing was added while the last batch was sent
                await sink(env.chunk(request_id, b"".join(batch), more=True))
                if self.rid != request_id:
                    return  # yet another reconnect took over
        finally:
            if self.rid == request_id:
                self._replaying = False
                self._catching_up = None
        self.sink = sink
        self._wake()
        final = self.final
        if final is not None:
            if final.get("k") != env.ERROR:  # its events were replayed above
                final = env.chunk(request_id, b"", more=False)
            await sink({**final, "i": request_id})
            self._finish()


def not_found(request_id: str, detail: str) -> dict[str, Any]:
    """The reply to a resume that cannot be served."""
    return env.error(request_id, errors.STREAM_NOT_FOUND, detail)
