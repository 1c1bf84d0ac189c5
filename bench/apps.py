"""The ASGI applications the proxy benchmark runs, each in its own pinned process.

* ``upstream``       -- the fast local agent: raw ASGI, a fixed JSON-RPC result for any POST
                        (the stand-in for a fixed-answer nginx upstream); ``message/stream``
                        answers SSE. Serve it with uvicorn + uvloop + httptools.
* ``httpx_proxy``    -- the *naive* proxy (arm ``httpx-naive-proxy``): the simplest one a user
                        would write, Starlette + one shared ``httpx.AsyncClient`` with its
                        defaults (20 keep-alive connections), deliberately not tuned like the
                        aiohttp arm (raw ASGI, unlimited pool). A floor, not a target.
* ``aiohttp_proxy``  -- raw ASGI + one aiohttp ``ClientSession``: the reference proxy whose
                        throughput the gateway floors in docs/performance.md are measured against.
* ``otlp_sink``      -- an OTLP/HTTP trace receiver that accepts and drops every export (the
                        collector of the traced gateway arm, ``proxy_bench.py --tracing``).
* ``daphne_ceiling`` -- a raw ASGI callable that answers a fixed JSON-RPC result, routed by a
                        Channels ``URLRouter``: what Daphne alone can serve (run under Daphne).

Proxies read the upstream from ``BENCH_UPSTREAM`` (e.g. ``http://127.0.0.1:9001/``).

SSE from the upstream: a ``message/stream`` request gets ``BENCH_SSE_EVENTS`` events (default
3) ``BENCH_SSE_INTERVAL`` seconds apart (default 0.01); when its body contains ``"hold"`` the
stream instead sends one event, then a ``: ping`` comment every 10 s and ends after
``BENCH_SSE_HOLD`` seconds (default 120) or when the caller goes away.
"""

from __future__ import annotations

import asyncio
import os

import orjson

RESULT = orjson.dumps({
    "jsonrpc": "2.0", "id": 1,
    "result": {"kind": "message", "role": "agent", "messageId": "m-0000",
               "parts": [{"kind": "text", "text": "ok"}]},
})
CARD = orjson.dumps({
    "name": "Bench Agent", "description": "Answers a fixed JSON-RPC result.", "version": "1.0.0",
    "url": "http://127.0.0.1/", "protocolVersion": "0.3.0", "preferredTransport": "JSONRPC",
    "capabilities": {"streaming": True}, "defaultInputModes": ["text/plain"],
    "defaultOutputModes": ["text/plain"],
    "skills": [{"id": "bench", "name": "Bench", "description": "bench", "tags": ["bench"]}],
})
JSON_HEADERS = [(b"content-type", b"application/json")]
SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
HOP_BY_HOP = {
    "connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "host",
    "content-length", "proxy-authorization", "proxy-authenticate",
}

UPSTREAM = os.environ.get("BENCH_UPSTREAM", "http://127.0.0.1:9001/")

_stats = {"posts": 0, "streams_open": 0}


async def _read_body(receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return b""
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks) if len(chunks) > 1 else chunks[0]


async def _lifespan(receive, send, startup=None, shutdown=None) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            if startup:
                await startup()
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            if shutdown:
                await shutdown()
            await send({"type": "lifespan.shutdown.complete"})
            return


def _sse_event(index: int) -> bytes:
    payload = orjson.dumps({"jsonrpc": "2.0", "id": 1, "result": {
        "kind": "status-update", "taskId": "t-1", "contextId": "c-1", "final": False,
        "status": {"state": "working"}, "metadata": {"seq": index}}})
    return b"data: " + payload + b"\n\n"


async def _stream(receive, send, body: bytes) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
    _stats["streams_open"] += 1
    try:
        if b'"hold"' in body:
            await send({"type": "http.response.body", "body": _sse_event(0), "more_body": True})
            hold = float(os.environ.get("BENCH_SSE_HOLD", "120"))
            disconnected = asyncio.ensure_future(receive())
            loop = asyncio.get_running_loop()
            deadline = loop.time() + hold
            while loop.time() < deadline:
                wait = min(10.0, deadline - loop.time())
                done, _ = await asyncio.wait({disconnected}, timeout=wait)
                if done:
                    return
                await send({"type": "http.response.body", "body": b": ping\n\n",
                            "more_body": True})
            disconnected.cancel()
        else:
            count = int(os.environ.get("BENCH_SSE_EVENTS", "3"))
            interval = float(os.environ.get("BENCH_SSE_INTERVAL", "0.01"))
            for index in range(count):
                if index:
                    await asyncio.sleep(interval)
                await send({"type": "http.response.body", "body": _sse_event(index),
                            "more_body": True})
        await send({"type": "http.response.body", "body": b""})
    except OSError:
        return
    finally:
        _stats["streams_open"] -= 1


async def upstream(scope, receive, send) -> None:
    """The fast local agent (see the module docstring)."""
    kind = scope["type"]
    if kind == "lifespan":
        await _lifespan(receive, send)
        return
    if kind != "http":
        return
    if scope["method"] == "POST":
        body = await _read_body(receive)
        _stats["posts"] += 1
        head = body[:160]
        if b'"message/stream"' in head or b'"SendStreamingMessage"' in head:
            await _stream(receive, send, body)
            return
        await send({"type": "http.response.start", "status": 200, "headers": JSON_HEADERS})
        await send({"type": "http.response.body", "body": RESULT})
        return
    path = scope["path"]
    if path == "/stats":
        reply = orjson.dumps(_stats)
    elif path.endswith("/.well-known/agent-card.json"):
        reply = CARD
    else:
        await send({"type": "http.response.start", "status": 404, "headers": JSON_HEADERS})
        await send({"type": "http.response.body", "body": b"{}"})
        return
    await send({"type": "http.response.start", "status": 200, "headers": JSON_HEADERS})
    await send({"type": "http.response.body", "body": reply})


# --- raw ASGI + aiohttp ------------------------------------------------------------------------

_aiohttp_session = None


async def _aiohttp_start() -> None:
    import aiohttp

    global _aiohttp_session
    _aiohttp_session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=75, force_close=False),
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=5, sock_read=310),
        auto_decompress=False, skip_auto_headers=("User-Agent", "Accept-Encoding"),
    )


async def _aiohttp_stop() -> None:
    if _aiohttp_session is not None:
        await _aiohttp_session.close()


async def aiohttp_proxy(scope, receive, send) -> None:
    """Raw ASGI + aiohttp: forward the POST, relay JSON or stream SSE chunks as they come."""
    if scope["type"] == "lifespan":
        await _lifespan(receive, send, _aiohttp_start, _aiohttp_stop)
        return
    if scope["type"] != "http":
        return
    body = await _read_body(receive)
    headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]
               if k.decode("latin-1").lower() not in HOP_BY_HOP}
    async with _aiohttp_session.post(UPSTREAM, data=body, headers=headers) as response:
        out = [(b"content-type", response.headers.get("Content-Type", "").encode("latin-1"))]
        if response.headers.get("Content-Type", "").startswith("text/event-stream"):
            await send({"type": "http.response.start", "status": response.status, "headers": out})

            async def relay() -> None:
                async for chunk in response.content.iter_any():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send({"type": "http.response.body", "body": b""})

            # A careful proxy: when the caller goes away, close the upstream stream too.
            relaying = asyncio.ensure_future(relay())
            disconnected = asyncio.ensure_future(receive())
            await asyncio.wait({relaying, disconnected}, return_when=asyncio.FIRST_COMPLETED)
            for task in (relaying, disconnected):
                task.cancel()
            await asyncio.gather(relaying, disconnected, return_exceptions=True)
            return
        data = await response.read()
    await send({"type": "http.response.start", "status": response.status, "headers": out})
    await send({"type": "http.response.body", "body": data})


# --- Starlette + httpx (the simplest proxy) ----------------------------------------------------


def _build_httpx_proxy():
    import httpx
    from starlette.applications import Starlette
    from starlette.background import BackgroundTask
    from starlette.requests import Request
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    client = httpx.AsyncClient(timeout=310)

    async def proxy(request: Request) -> StreamingResponse:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        upstream_request = client.build_request("POST", UPSTREAM, content=await request.body(),
                                                headers=headers)
        response = await client.send(upstream_request, stream=True)
        return StreamingResponse(
            response.aiter_raw(), status_code=response.status_code,
            headers={"content-type": response.headers.get("content-type", "")},
            background=BackgroundTask(response.aclose))

    return Starlette(routes=[Route("/{path:path}", proxy, methods=["POST"])])


class _Lazy:
    """Build an app on first use so importing this module stays cheap for the other apps."""

    def __init__(self, factory) -> None:
        self.factory = factory
        self.app = None

    async def __call__(self, scope, receive, send) -> None:
        if self.app is None:
            self.app = self.factory()
        await self.app(scope, receive, send)


httpx_proxy = _Lazy(_build_httpx_proxy)


# --- Daphne raw-ASGI ceiling -------------------------------------------------------------------


async def _fixed_reply(scope, receive, send) -> None:
    await _read_body(receive)
    await send({"type": "http.response.start", "status": 200, "headers": JSON_HEADERS})
    await send({"type": "http.response.body", "body": RESULT})


def _build_daphne_ceiling():
    import django
    from django.conf import settings

    if not settings.configured:
        settings.configure(DEBUG=False, ALLOWED_HOSTS=["*"], USE_TZ=True)
        django.setup()
    from channels.routing import ProtocolTypeRouter, URLRouter
    from django.urls import re_path

    return ProtocolTypeRouter({"http": URLRouter([re_path(r"^a2a/(?P<agent_id>[^/]+)/?$",
                                                          _fixed_reply)])})


daphne_ceiling = _Lazy(_build_daphne_ceiling)


async def otlp_sink(scope, receive, send) -> None:
    """Accept OTLP/HTTP exports (any POST) with an empty ExportTraceServiceResponse."""
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/x-protobuf")]})
    await send({"type": "http.response.body", "body": b""})
