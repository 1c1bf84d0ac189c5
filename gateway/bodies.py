"""Reading an ASGI request body under a size cap: the one reader of the lean ASGI handlers
(``/a2a`` in gateway.admission, heartbeats in node.heartbeats); and :class:`WholeAnswer`, the
one ``send`` that holds an answer whole to rewrite it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class Disconnected(Exception):
    """The caller went away while its request was being read."""


class BodyTooLarge(Exception):
    """The body grew past the cap; nothing more is read (the caller is answered 413)."""


async def read_body(receive: Receive, cap: int) -> bytes:
    """The whole request body. Raises :class:`BodyTooLarge` as soon as it passes ``cap``
    bytes (never buffering more than the cap), :class:`Disconnected` if the caller left."""
    message = await receive()
    if message["type"] == "http.disconnect":
        raise Disconnected
    body: bytes = message.get("body", b"")
    if not message.get("more_body"):
        if len(body) > cap:
            raise BodyTooLarge
        return body
    parts = [body]
    size = len(body)
    while True:
        if size > cap:
            raise BodyTooLarge
        message = await receive()
        if message["type"] == "http.disconnect":
            raise Disconnected
        chunk = message.get("body", b"")
        size += len(chunk)
        parts.append(chunk)
        if not message.get("more_body"):
            if size > cap:
                raise BodyTooLarge
            return b"".join(parts)


class WholeAnswer:
    """A caller's ``send`` that holds the answer until its last piece, then sends a 200's body
    as :meth:`rewritten` makes it (its Content-Length set anew) in one piece; other statuses
    pass as they came. For small answers only (a card, push configs: within the response cap).
    """

    __slots__ = ("send", "start", "chunks")

    def __init__(self, send: Send) -> None:
        self.send = send
        self.start: dict[str, Any] | None = None
        self.chunks: list[bytes] = []

    async def __call__(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.start = message
            return
        if self.start is None:
            await self.send(message)
            return
        self.chunks.append(message.get("body", b""))
        if message.get("more_body"):
            return
        start, self.start = self.start, None
        body = b"".join(self.chunks)
        self.chunks = []
        if start["status"] == 200:
            body = await self.rewritten(body)
        headers = [(k, v) for k, v in start.get("headers") or () if k != b"content-length"]
        headers.append((b"content-length", b"%d" % len(body)))
        await self.send({**start, "headers": headers})
        await self.send({"type": "http.response.body", "body": body})

    async def rewritten(self, body: bytes) -> bytes:
        return body
