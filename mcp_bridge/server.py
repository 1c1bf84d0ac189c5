"""The node's MCP server: ``/mcp`` (Streamable HTTP), built on the official MCP Python SDK.

**Stateless.** The SDK's session managers run in stateless mode: every request is answered on
its own and nothing is kept between requests, so any node answers any request (a load balancer
needs no affinity, a node restart loses nothing). A tool call is answered as an SSE stream (its
progress notifications, then its result), any other request as one JSON body
(:class:`Managers`). ``notifications/tools/list_changed`` reaches open sessions on whichever
node holds their stream (:mod:`mcp_bridge.notify`): ``initialize`` is answered with a
self-contained, signed ``Mcp-Session-Id`` and ``GET /mcp`` with it opens the stream (2025
protocol versions); ``subscriptions/listen`` is the stream at 2026-07-28. Server-to-client
requests are not offered.

**Auth.** The same bearer tokens as the API and the gateway, checked here through the process's
token cache before the SDK sees the request: no token, or a bad one, answers 401 with a
``WWW-Authenticate`` naming the protected-resource metadata (RFC 9728), served at
``/.well-known/oauth-protected-resource/mcp`` (and without the ``/mcp`` suffix). ``tools/list``
shows the agents the caller may call; a call of any other name is an unknown tool. The
gateway's rate limits apply: refused requests are charged to their address (which is then
refused before any token lookup), tool calls to the caller by the gateway, other requests
to the caller here.

**Calls** go through the gateway's own handler in-process (:mod:`gateway.inprocess`) with the
caller's ``Authorization``, so the gateway's authentication, authorization, rate limits, size
caps, timeouts, audit, metrics, tracing and executed flag apply to every tool call. An agent
whose card streams is called with the streaming send: its updates become progress
notifications, and a cancelled call cancels the A2A task (:mod:`mcp_bridge.calls`).

**Bounds.** A request body above ``A2A_MAX_REQUEST_BYTES`` is refused (413) before it is
parsed (announced or chunked); a reply is read up to ``A2A_MAX_RESPONSE_BYTES``;
``tools/list`` pages hold at most :data:`mcp_bridge.tools.PAGE_SIZE` tools.

This module is the HTTP edge (authentication, bounds, the SDK's transports, the notification
stream of ``GET /mcp``); what the SDK's server answers once a request got through is
:mod:`mcp_bridge.handlers`.

An SDK session manager runs a task group for its whole life: :class:`Bridge` runs both in a
task of their own, started and stopped by the node's lifecycle hooks (``core.lifecycle``), or on
the first request when no hook ran.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import mcp_types as types
import orjson
from django.conf import settings
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

from gateway import errors
from gateway.bodies import BodyTooLarge, Disconnected, read_body
from gateway.cards import gateway_base_url
from gateway.headers import scan_request_headers
from mcp_bridge import notify, pins
from mcp_bridge.handlers import ACTOR_KEY, AUTHORIZATION_KEY, build_server, current_node
from registry.auth import UNAUTHENTICATED_MESSAGE
from registry.permissions import Actor
from registry.token_cache import AuthFailed, AuthUnavailable

logger = logging.getLogger(__name__)

PATH = "/mcp"
METADATA_PATHS = ("/.well-known/oauth-protected-resource",
                  "/.well-known/oauth-protected-resource/mcp")


@dataclass(frozen=True)
class Managers:
    """The SDK's two stateless session managers: SSE responses for tool calls (their progress
    notifications; and the SDK cancels a call whose response the client closes only on an
    event stream) and JSON responses for everything else (``tools/list``, discovery,
    ``initialize``: about 40 % less CPU per request)."""

    json: StreamableHTTPSessionManager
    sse: StreamableHTTPSessionManager


class Bridge:
    """The SDK's session managers of this process, run in a task of their own on the serving
    loop (their task groups live as long as the node)."""

    def __init__(self) -> None:
        self.manager: Managers | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._stop: asyncio.Event | None = None
        self._starting: asyncio.Future | None = None

    async def start(self) -> None:
        """Node startup hook."""
        if settings.A2A_MCP_ENABLED:
            await self.ensure()

    async def ensure(self) -> Managers:
        loop = asyncio.get_running_loop()
        if self.manager is not None and self._loop is loop:
            return self.manager
        starting = self._starting
        if starting is not None and not starting.done() and starting.get_loop() is loop:
            return await asyncio.shield(starting)
        starting = self._starting = loop.create_future()
        server = build_server()
        manager = Managers(*(
            StreamableHTTPSessionManager(app=server, stateless=True, json_response=json_response,
                                         max_request_body_size=settings.A2A_MAX_REQUEST_BYTES)
            for json_response in (True, False)))
        ready, stop = asyncio.Event(), asyncio.Event()

        async def run() -> None:
            async with manager.json.run(), manager.sse.run():
                ready.set()
                await stop.wait()

        task = loop.create_task(run(), name="mcp-session-manager")
        waiter = loop.create_task(ready.wait())
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        if not ready.is_set():
            waiter.cancel()
            exc = task.exception() or RuntimeError("the MCP session manager did not start")
            starting.set_exception(exc)
            starting.exception()
            raise exc
        self.manager, self._loop, self._task, self._stop = manager, loop, task, stop
        starting.set_result(manager)
        return manager

    async def stop(self) -> None:
        """Node shutdown hook: requests in flight are cancelled with the task group."""
        task, stop = self._task, self._stop
        if task is None or stop is None or self._loop is not asyncio.get_running_loop():
            return
        self.manager = self._task = self._stop = None
        notify.notifier.end_all("the node is stopping: reconnect")
        stop.set()
        try:
            await task
        except Exception:
            logger.exception("the MCP session manager failed while stopping")


bridge = Bridge()


async def _json(send, status: int, payload: dict[str, Any],
                extra: list[tuple[bytes, bytes]] | None = None) -> None:
    body = orjson.dumps(payload)
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        *(extra or [])]})
    await send({"type": "http.response.body", "body": body})


def _base_url(scope: dict[str, Any]) -> str:
    host = proto = forwarded_host = ""
    for name, value in scope["headers"]:
        if name == b"host":
            host = value.decode("latin-1")
        elif name == b"x-forwarded-proto":
            proto = value.decode("latin-1")
        elif name == b"x-forwarded-host":
            forwarded_host = value.decode("latin-1")
    return gateway_base_url(scope, host, proto, forwarded_host)


def metadata_url(scope: dict[str, Any]) -> str:
    return _base_url(scope) + METADATA_PATHS[1]


async def metadata_app(scope, receive, send) -> None:
    """``/.well-known/oauth-protected-resource[/mcp]``: how an MCP client authenticates to
    ``/mcp`` (RFC 9728). Tokens come from ``create_client`` or the admin; no authorization
    server issues them, so none is named."""
    if scope["method"] not in ("GET", "HEAD"):
        await _json(send, 405, {"error": "method not allowed: use GET"}, [(b"allow", b"GET")])
        return
    base = _base_url(scope)
    await _json(send, 200, {
        "resource": base + PATH,
        "bearer_methods_supported": ["header"],
        "resource_name": "A2A agent registry (MCP)",
        "resource_documentation": base + "/api/docs/",
    }, [(b"cache-control", b"public, max-age=3600")])


async def _refuse(send, kind: str, detail: str,
                  extra: list[tuple[bytes, bytes]] | None = None) -> None:
    """A refusal before the SDK sees the request: the gateway's JSON-RPC error body for
    ``kind`` (the SDK client surfaces its message), with the gateway's HTTP status."""
    body = errors.error_body(kind, rpc_id=None, agent_id=None, detail=detail)
    await send({"type": "http.response.start", "status": errors.http_status_for(kind),
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()), *(extra or [])]})
    await send({"type": "http.response.body", "body": body})


async def mcp_app(scope, receive, send) -> None:
    """``/mcp``: authenticate the caller (before any body is read), read the body up to
    ``A2A_MAX_REQUEST_BYTES`` (413 beyond, announced or not), then hand the request to the
    SDK's transport: the SSE one for a tool call, else the JSON one."""
    headers = scan_request_headers(scope["headers"])
    challenge = f'Bearer realm="a2a", resource_metadata="{metadata_url(scope)}"'.encode()
    node = await current_node()
    limiter, tokens_cache = node.limiter, node.tokens
    client = scope.get("client")
    address = client[0] if client else "-"
    # The gateway's rate limits (A2A_RATE_LIMIT_PER_SECOND): an address whose refused calls
    # used up its allowance is refused before any token lookup (/a2a and /mcp share it).
    if limiter.address_blocked(address) and not tokens_cache.verified(headers.authorization):
        await _refuse(send, errors.RATE_LIMITED, "rate limit exceeded", [(b"retry-after", b"1")])
        return
    try:
        actor = await tokens_cache.actor(headers.authorization)
    except AuthUnavailable as exc:
        await _refuse(send, errors.AUTH_UNAVAILABLE, str(exc), [(b"retry-after", b"1")])
        return
    except AuthFailed as exc:
        limiter.charge_refused(address)
        await _refuse(send, errors.UNAUTHENTICATED, str(exc), [(b"www-authenticate", challenge)])
        return
    if actor is None:
        limiter.charge_refused(address)
        await _refuse(send, errors.UNAUTHENTICATED, UNAUTHENTICATED_MESSAGE,
                      [(b"www-authenticate", challenge)])
        return
    key = actor.client_id if not actor.is_anonymous else f"anonymous:{address}"
    if scope["method"] == "GET":
        if not limiter.allow(key):
            await _refuse(send, errors.RATE_LIMITED, "rate limit exceeded",
                          [(b"retry-after", b"1")])
            return
        await _stream(scope, receive, send, node, actor, headers.authorization)
        return
    if scope["method"] != "POST":
        # Stateless: no session to delete (a session id names no state on any node).
        await _json(send, 405, {"error": "method not allowed: use POST, or GET with an "
                                         "Mcp-Session-Id for notifications"},
                    [(b"allow", b"GET, POST")])
        return
    cap = settings.A2A_MAX_REQUEST_BYTES
    too_large = f"request body larger than {cap} bytes (A2A_MAX_REQUEST_BYTES)"
    if headers.content_length is not None and headers.content_length > cap:
        await _refuse(send, errors.REQUEST_TOO_LARGE, too_large, [(b"connection", b"close")])
        return
    try:
        body = await read_body(receive, cap)
    except BodyTooLarge:
        await _refuse(send, errors.REQUEST_TOO_LARGE, too_large, [(b"connection", b"close")])
        return
    except Disconnected:
        return
    replayed = False

    async def replay() -> dict[str, Any]:
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    method = _method(body)
    tool_call = method == "tools/call"
    # A tool call is charged to the caller's rate limit by the gateway; anything else here.
    if not tool_call and not limiter.allow(key):
        await _refuse(send, errors.RATE_LIMITED, "rate limit exceeded", [(b"retry-after", b"1")])
        return
    scope = {**scope, ACTOR_KEY: actor, AUTHORIZATION_KEY: headers.authorization}
    managers = await bridge.ensure()
    # A tool call is answered on an event stream: its progress notifications, and the SDK
    # cancels a call whose response is closed only there (the client's cancellation).
    # Everything else is answered as one JSON body (subscriptions/listen: always a stream).
    manager = managers.sse if tool_call else managers.json
    if method == "initialize":
        # Handshake era: the session id the client's GET stream names (mcp_bridge.notify).
        session_id = notify.issue(actor.client_id,
                                  pins.requested(scope.get("query_string") or b""))
        send = _with_header(send, b"mcp-session-id", session_id.encode())
    elif method == "subscriptions/listen":
        # A client that stops reading its stream ends it (and frees its slot).
        send = _bounded(send, settings.A2A_MCP_KEEPALIVE_SECONDS)
        try:
            await manager.handle_request(scope, replay, send)
        except* StalledClient:
            logger.info("an MCP notification stream of %s ended: its client stopped reading",
                        actor.client_id)
        return
    await manager.handle_request(scope, replay, send)


def _method(body: bytes) -> str | None:
    try:
        message = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    method = message.get("method") if isinstance(message, dict) else None
    return method if isinstance(method, str) else None


def _header(scope: dict[str, Any], name: bytes) -> str:
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return ""


def _with_header(send, name: bytes, value: bytes):
    """``send`` adding a header to a successful response's start."""

    async def sending(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start" and message["status"] < 400:
            message = {**message, "headers": [*message.get("headers", ()), (name, value)]}
        await send(message)

    return sending


class StalledClient(Exception):
    """A client took nothing of its notification stream for the keepalive period."""


def _bounded(send, seconds: float):
    """``send`` that gives up (:class:`StalledClient`) when a write waits ``seconds``."""

    async def sending(message: dict[str, Any]) -> None:
        try:
            async with asyncio.timeout(seconds):
                await send(message)
        except TimeoutError:
            raise StalledClient from None

    return sending


async def _rpc_error(send, status: int, code: int, message: str,
                     extra: list[tuple[bytes, bytes]] | None = None) -> None:
    await _json(send, status, {"jsonrpc": "2.0", "id": None,
                               "error": {"code": code, "message": message}}, extra)


async def _stream(scope, receive, send, node, actor: Actor, authorization: str | None) -> None:
    """``GET /mcp`` with an ``Mcp-Session-Id`` this installation issued to this caller: the
    session's standalone SSE stream, carrying ``notifications/tools/list_changed`` (and
    keepalive comments) until the client leaves, its token is revoked, or the node stops.
    Any node serves any session's stream (:mod:`mcp_bridge.notify`)."""
    if "text/event-stream" not in _header(scope, b"accept"):
        await _rpc_error(send, 406, types.INVALID_REQUEST,
                         "Not Acceptable: the GET stream needs Accept: text/event-stream")
        return
    session_id = _header(scope, b"mcp-session-id")
    if not session_id:
        await _rpc_error(send, 400, types.INVALID_REQUEST,
                         "Bad Request: Missing session ID (GET /mcp opens a session's "
                         "notification stream)", [(b"allow", b"GET, POST")])
        return
    session = notify.read(session_id)
    if session is None or session.client_id != actor.client_id:
        # The same answer for a forged id and another client's: nothing is learnt.
        await _rpc_error(send, 404, types.INVALID_REQUEST, "Session not found")
        return
    pinned_ids: frozenset[str] | None = None
    if session.pin is not None:
        try:
            pinned = await pins.pinned(urlencode([session.pin]).encode(), actor.client_id,
                                       actor.tenant)
        except pins.PinError as exc:
            await _rpc_error(send, 400, types.INVALID_PARAMS, str(exc))
            return
        if pinned is not None:
            pinned_ids = frozenset(pinned.descriptions)
    try:
        listener = notify.notifier.open(node, actor, authorization, pinned_ids)
    except notify.Full as exc:
        await _rpc_error(send, 429 if exc.per_client else 503, types.INTERNAL_ERROR, str(exc),
                         [(b"retry-after", b"5")])
        return

    async def watch_disconnect() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        listener.end("gone")

    keepalive = settings.A2A_MCP_KEEPALIVE_SECONDS
    bounded = _bounded(send, keepalive)

    async def write(frame: bytes | None) -> None:
        await bounded({"type": "http.response.body", "body": frame or notify.KEEPALIVE,
                       "more_body": True})

    watcher = asyncio.ensure_future(watch_disconnect())
    try:
        await bounded({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/event-stream"),
            (b"cache-control", b"no-cache, no-transform"),
            (b"x-accel-buffering", b"no"),
            (b"mcp-session-id", session_id.encode("latin-1"))]})
        # The reconnection delay a client should use when the stream ends (node stopping).
        await bounded({"type": "http.response.body", "body": b"retry: 1000\n\n",
                       "more_body": True})
        await notify.notifier.run(listener, node.tokens, write)
        if listener.ended != "gone":
            await bounded({"type": "http.response.body", "body": b"", "more_body": False})
    except (StalledClient, TimeoutError):
        logger.info("an MCP notification stream of %s ended: its client stopped reading",
                    actor.client_id)
    except OSError:
        pass  # the client went away mid-write
    finally:
        watcher.cancel()
        notify.notifier.close(listener)


def routes() -> dict[str, Any]:
    """Exact paths -> ASGI apps, for the node's router (empty when ``A2A_MCP_ENABLED`` is
    off: the paths then reach Django, which answers 404)."""
    if not settings.A2A_MCP_ENABLED:
        return {}
    return {PATH: mcp_app, PATH + "/": mcp_app,
            **{path: metadata_app for path in METADATA_PATHS}}
