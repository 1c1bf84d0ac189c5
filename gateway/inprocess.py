"""One gateway call made from inside the process: the operator console's test messages and the
MCP bridge's tool calls go through it.

:func:`call` hands a JSON-RPC body to the same handler ``POST /a2a/{agent_id}`` runs
(:func:`gateway.handler.handle_rpc`) with a request of its own making, so authentication (the
caller's own ``Authorization``), authorization, rate limits, the request size cap, routing,
the virtual subscriber, timeouts, the response size cap, metrics, the audit record, tracing and
``X-A2A-Executed`` all apply exactly as for an HTTP caller. No second proxy: only the socket
is missing.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gateway.handler import a2a_app
from registry.ids import gateway_path

if TYPE_CHECKING:
    from gateway.runtime import GatewayNode


@dataclass(frozen=True)
class Reply:
    """What an HTTP caller would have received."""

    status: int
    headers: dict[str, str]  # lower-case names
    body: bytes
    truncated: bool  # the body was longer than the reader's limit (cut there)

    @property
    def executed(self) -> str:
        return self.headers.get("x-a2a-executed", "")


class Collector:
    """Where a call's response goes: by default collected whole (up to ``max_bytes``); a
    subclass may act on each body chunk as it arrives (a relayed event stream). Each chunk is
    awaited before the gateway relays the next one, so a slow consumer holds the stream back
    (within the gateway's stall timeout) instead of buffering it."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.status = 0
        self.headers: dict[str, str] = {}
        self.chunks: list[bytes] = []
        self.size = 0
        self.truncated = False

    async def start(self, status: int, headers: dict[str, str]) -> None:
        self.status, self.headers = status, headers

    async def body(self, chunk: bytes) -> None:
        room = self.max_bytes - self.size
        if len(chunk) > room:
            chunk, self.truncated = chunk[:room], True
        if chunk:
            self.chunks.append(chunk)
            self.size += len(chunk)

    def reply(self) -> Reply:
        return Reply(self.status, self.headers, b"".join(self.chunks), self.truncated)


async def call(node: GatewayNode, agent_id: str, body: bytes, *,
               headers: list[tuple[bytes, bytes]], max_bytes: int,
               client: tuple[str, int] = ("127.0.0.1", 0),
               sink: Collector | None = None) -> Reply:
    """``POST /a2a/{agent_id}`` with ``body`` and ``headers`` (the caller's
    ``Authorization`` among them) on ``node``; answers the reply, its body cut at
    ``max_bytes`` (or what ``sink`` makes of it). The call is bounded by the gateway's own
    timeouts; cancelling the calling task cancels the call as a caller leaving would (a
    relayed stream is closed at the agent)."""
    sink = sink or Collector(max_bytes)
    sent = False
    never = asyncio.Event()

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await never.wait()  # the caller stays connected until the reply is complete
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            await sink.start(message["status"], {
                k.decode("latin-1").lower(): v.decode("latin-1")
                for k, v in message.get("headers", [])})
        elif message["type"] == "http.response.body":
            chunk = message.get("body", b"")
            if chunk:
                await sink.body(chunk)

    path = gateway_path(agent_id).rstrip("/")  # agent_id: the routing key
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "client": client,
        "server": ("127.0.0.1", 0),
        "headers": [*headers, (b"content-length", str(len(body)).encode())],
    }
    await a2a_app(node, scope, receive, send)
    return sink.reply()
