"""Reading an ASGI request body under a size cap: the one reader of the lean ASGI handlers
(``/a2a`` in gateway.admission, heartbeats in node.heartbeats)."""

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
