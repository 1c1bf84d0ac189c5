"""Server-Sent Events framing for the relay: event boundaries, keepalives, terminal errors.

The relay forwards whole events as they arrive (never the whole stream at once): it keeps the
unterminated tail of the upstream bytes until its blank line arrives, so a keepalive comment or
a terminal error event is never spliced into the middle of an agent's event, and the per-event
size cap applies to one event at a time.
"""

from __future__ import annotations

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
