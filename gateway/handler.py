"""The lean ASGI handler of ``/a2a/...``: the gateway's hot path, reached before Django.

``POST /a2a/{agent_id}[/]`` validates (Content-Type and JSON -> -32700; one JSON-RPC 2.0 object
with a string method -> else -32600; agent id -> -32600), authenticates (cached tokens; 401),
authorizes (403), rate-limits (429), looks the agent up in the in-memory routing table
(``agent_not_found``), turns the request into a Query envelope and hands it to the agent's
virtual subscriber: directly when it lives in this process (local fast path), else through
the broker to the owning node. The reply is relayed as it comes: one JSON body, or SSE events
as they arrive. Every reply carries ``X-A2A-Executed``; no database query, no Django.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Awaitable
from typing import Any

import orjson
from django.conf import settings

from gateway import envelope as env
from gateway import errors, metrics, runtime
from gateway.cards import serve_card
from gateway.conf import conf
from gateway.headers import scan_request_headers
from gateway.limits import request_timeout
from gateway.replicator import ORIGIN
from gateway.sse import error_event
from registry.auth import UNAUTHENTICATED_MESSAGE
from registry.ids import AGENT_ID_RE, agent_channel
from registry.token_cache import AuthFailed

logger = logging.getLogger(__name__)

JSON_HEADERS = [(b"content-type", b"application/json")]
EXECUTED_FALSE = (b"x-a2a-executed", b"false")
EXECUTED_TRUE = (b"x-a2a-executed", b"true")
#: How long a Query sent through the broker may go without any sign of life from the
#: subscriber (a reply or an ack) before the gateway answers `unreachable`.
ACK_TIMEOUT_SECONDS = 3.0
_CARD_PATHS = (".well-known/agent-card.json", ".well-known/agent.json")
_request_ids = itertools.count(1)
_ORIGIN = ORIGIN[:12]  # request ids are unique per process and across nodes


class _Disconnected(Exception):
    """The caller went away while the gateway was still reading its request."""


# --- entry point -----------------------------------------------------------------------------


def a2a_app(scope: dict[str, Any], receive, send) -> Awaitable[None]:
    """ASGI application for every path under ``/a2a/``.

    A plain function returning the handler's coroutine (marked single-callable for Channels):
    one coroutine level fewer on every suspension of the hot path.
    """
    rest = scope["path"][5:]  # after "/a2a/"
    agent_id, _, tail = rest.partition("/")
    method = scope["method"]
    if tail == "":
        if method == "POST":
            return handle_rpc(scope, receive, send, agent_id)
        return _plain(send, 405, b'{"error": "method not allowed: use POST"}',
                      [(b"allow", b"POST")])
    if tail in ("stream", "stream/"):
        if method == "GET":
            return handle_get_stream(scope, receive, send, agent_id)
        return _plain(send, 405, b'{"error": "method not allowed: use GET"}',
                      [(b"allow", b"GET")])
    if tail in _CARD_PATHS:
        if method in ("GET", "HEAD"):
            return serve_card(scope, receive, send, agent_id)
        return _plain(send, 405, b'{"error": "method not allowed: use GET"}',
                      [(b"allow", b"GET, HEAD")])
    return _plain(send, 404, b'{"error": "not found"}')


a2a_app._asgi_single_callable = True  # type: ignore[attr-defined]


# --- POST /a2a/{agent_id} ----------------------------------------------------------------------


async def handle_rpc(scope: dict[str, Any], receive, send, agent_id: str) -> None:
    started = time.perf_counter()
    headers = scan_request_headers(scope["headers"])
    cap = conf.A2A_MAX_REQUEST_BYTES
    if headers.content_length is not None and headers.content_length > cap:
        await _error(send, errors.REQUEST_TOO_LARGE, None, None,
                     f"request body larger than {cap} bytes")
        return
    try:
        body = await _read_body(receive, cap)
    except _Disconnected:
        return
    if body is None:
        await _error(send, errors.REQUEST_TOO_LARGE, None, None,
                     f"request body larger than {cap} bytes")
        return
    if b"json" not in headers.content_type.lower():
        await _error(send, errors.PARSE_ERROR, None, None, "Content-Type must be application/json")
        return
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        await _error(send, errors.PARSE_ERROR, None, None, "invalid JSON")
        return
    if not isinstance(payload, dict):
        detail = "batch requests are not supported" if isinstance(payload, list) \
            else "expected one JSON-RPC 2.0 request object"
        await _error(send, errors.INVALID_REQUEST, None, None, detail)
        return
    rpc_id = payload.get("id")
    if rpc_id is not None and (
        isinstance(rpc_id, bool) or not isinstance(rpc_id, (str, int, float))
    ):
        await _error(send, errors.INVALID_REQUEST, None, None, "id must be a string or number")
        return
    method = payload.get("method")
    if payload.get("jsonrpc") != "2.0":
        await _error(send, errors.INVALID_REQUEST, rpc_id, None, 'jsonrpc must be "2.0"')
        return
    if not isinstance(method, str) or not method:
        await _error(send, errors.INVALID_REQUEST, rpc_id, None, "missing method field")
        return
    admitted = await _admit_to_agent(scope, send, headers.authorization, rpc_id, agent_id)
    if admitted is None:
        return
    node, caller, route = admitted
    metrics.count_request(agent_id, method)
    timeout = request_timeout(payload)
    tags = headers.tags
    tags[env.TAG_METHOD] = method
    tags[env.TAG_TIMEOUT] = repr(timeout)
    tags[env.TAG_CALLER] = caller
    tags[env.TAG_REQUEST_ID] = f"{_ORIGIN}.{next(_request_ids)}"
    exchange = Exchange(send, rpc_id, agent_id)
    query = env.query(body, tags)
    subscriber = node.manager.subscribers.get(agent_id) if route.node_id == conf.NODE_ID \
        else None
    if subscriber is not None and conf.A2A_LOCAL_FAST_PATH \
            and method not in env.STREAMING_METHODS:
        # The local fast path, inline: the subscriber's own outbound timeout (the caller's,
        # shorter than the gateway's wait) always ends the call first, so no second timer.
        await subscriber.handle(query, exchange.deliver, local=True)
        if not exchange.done:
            await exchange.fail(errors.UNREACHABLE, "the subscriber gave no answer")
    else:
        await _dispatch(node, route, query, exchange, receive,
                        timeout + conf.A2A_GATEWAY_TIMEOUT_BUFFER_SECONDS,
                        streaming=method in env.STREAMING_METHODS)
    metrics.observe_latency(agent_id, exchange.outcome, time.perf_counter() - started)


# --- GET /a2a/{agent_id}/stream ----------------------------------------------------------------


async def handle_get_stream(scope: dict[str, Any], receive, send, agent_id: str) -> None:
    """KubeMQ's server-push stream: the agent gets a ``message/stream`` request with empty
    params, and its events are relayed."""
    started = time.perf_counter()
    headers = scan_request_headers(scope["headers"])
    admitted = await _admit_to_agent(scope, send, headers.authorization, None, agent_id)
    if admitted is None:
        return
    node, caller, route = admitted
    rpc_id = f"stream-{next(_request_ids)}"
    body = orjson.dumps({"jsonrpc": "2.0", "id": rpc_id, "method": "message/stream",
                         "params": {}})
    metrics.count_request(agent_id, "message/stream")
    tags = headers.tags
    tags["a2a_hdr_content-type"] = "application/json"
    tags.setdefault("a2a_hdr_accept", "text/event-stream")
    tags[env.TAG_METHOD] = "message/stream"
    tags[env.TAG_TIMEOUT] = repr(float(settings.A2A_DEFAULT_TIMEOUT_SECONDS))
    tags[env.TAG_CALLER] = caller
    exchange = Exchange(send, rpc_id, agent_id)
    await _dispatch(node, route, env.query(body, tags), exchange, receive, 0.0, streaming=True)
    metrics.observe_latency(agent_id, exchange.outcome, time.perf_counter() - started)


# --- shared steps -----------------------------------------------------------------------------

async def _admit_to_agent(scope, send, authorization, rpc_id, agent_id):
    """Check the agent id, the caller and the route: ``(node, caller id, route)``, or None
    once the refusal has been answered."""
    if not AGENT_ID_RE.match(agent_id):
        await _error(send, errors.INVALID_REQUEST, rpc_id, None, "invalid agent id")
        return None
    node = runtime._node or await runtime.ensure_node()
    caller = await _admit(node, scope, send, authorization, rpc_id, agent_id)
    if caller is None:
        return None
    route = node.table.get(agent_id)
    if route is None:
        await _error(send, errors.AGENT_NOT_FOUND, rpc_id, agent_id)
        return None
    return node, caller, route


async def _admit(node, scope, send, authorization, rpc_id, agent_id) -> str | None:
    """Authenticate, authorize and rate-limit: the caller's client id, or None once the
    refusal has been answered."""
    try:
        actor = await node.tokens.actor(authorization)
    except AuthFailed as exc:
        await _error(send, errors.UNAUTHENTICATED, rpc_id, agent_id, str(exc),
                     extra=[(b"www-authenticate", b'Bearer realm="a2a"')])
        return None
    if actor is None:
        await _error(send, errors.UNAUTHENTICATED, rpc_id, agent_id,
                     UNAUTHENTICATED_MESSAGE,
                     extra=[(b"www-authenticate", b'Bearer realm="a2a"')])
        return None
    if not actor.may_call(agent_id):
        await _error(send, errors.FORBIDDEN, rpc_id, agent_id,
                     f"this client may not call {agent_id}")
        return None
    if not actor.is_anonymous:
        key = actor.client_id
    else:
        client = scope.get("client")
        key = f"anonymous:{client[0] if client else '-'}"
    if not node.limiter.allow(key):
        await _error(send, errors.RATE_LIMITED, rpc_id, agent_id, "rate limit exceeded",
                     extra=[(b"retry-after", b"1")])
        return None
    return actor.client_id


async def _read_body(receive, cap: int) -> bytes | None:
    """The request body, or None once it grows past ``cap`` bytes."""
    message = await receive()
    if message["type"] == "http.disconnect":
        raise _Disconnected
    body = message.get("body", b"")
    if not message.get("more_body"):
        return body if len(body) <= cap else None
    parts = [body]
    size = len(body)
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Disconnected
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > cap:
            return None
        parts.append(chunk)
        if not message.get("more_body"):
            return b"".join(parts)


async def _dispatch(node, route, query, exchange: Exchange, receive, wait: float, *,
                    streaming: bool) -> None:
    agent_id = route.agent_id
    tags = query["tags"]
    tags.setdefault(env.TAG_REQUEST_ID, f"{_ORIGIN}.{next(_request_ids)}")
    local = route.node_id == conf.NODE_ID
    subscriber = node.manager.subscribers.get(agent_id) if local else None
    if local and subscriber is None or not local and not node.cross_process:
        await exchange.fail(errors.UNREACHABLE, "no live subscriber for this agent")
        return
    if streaming:
        await _relay_stream(node, subscriber, query, exchange, receive)
        return
    if subscriber is not None and conf.A2A_LOCAL_FAST_PATH:
        # In-process, the subscriber's own outbound timeout (the caller's timeout, shorter than
        # `wait`) always ends the call first: no second timer on the hot path.
        await subscriber.handle(query, exchange.deliver, local=True)
        if not exchange.done:
            await exchange.fail(errors.UNREACHABLE, "the subscriber gave no answer")
        return
    await _remote_sync(node, query, exchange, wait)


async def _remote_sync(node, query, exchange: Exchange, wait: float) -> None:
    """Send the Query through the broker and relay the reply messages as they come."""
    tags = query["tags"]
    request_id = tags[env.TAG_REQUEST_ID]
    queue: asyncio.Queue = asyncio.Queue()
    if not await _send_query(node, query, queue, exchange):
        return
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    acked = False
    try:
        while not exchange.done:
            remaining = deadline - loop.time()
            limit = remaining if acked else min(remaining, ACK_TIMEOUT_SECONDS)
            try:
                async with asyncio.timeout(max(limit, 0.0)):
                    message = await queue.get()
            except TimeoutError:
                if not acked and remaining > ACK_TIMEOUT_SECONDS:
                    await exchange.fail(errors.UNREACHABLE, "no live subscriber for this agent")
                else:  # the subscriber had it: the agent may have it (a reply lost between nodes)
                    await exchange.fail(errors.TIMEOUT, executed=True)
                return
            acked = True
            await exchange.deliver(message)
    finally:
        node.inbox.pending.pop(request_id, None)


async def _send_query(node, query, queue: asyncio.Queue, exchange: Exchange) -> bool:
    tags = query["tags"]
    if not node.inbox.ready:
        await exchange.fail(errors.UNREACHABLE, "broker unavailable")
        return False
    tags[env.TAG_REPLY_CHANNEL] = node.inbox.channel
    node.inbox.pending[tags[env.TAG_REQUEST_ID]] = queue.put_nowait
    try:
        await node.layer.send(agent_channel(exchange.agent_id), query)
    except Exception as exc:  # broker down: answer at once, never queue
        node.inbox.pending.pop(tags[env.TAG_REQUEST_ID], None)
        await exchange.fail(errors.UNREACHABLE, f"broker unavailable: {type(exc).__name__}")
        return False
    return True


_DISCONNECT: dict[str, Any] = {"k": "disconnect"}


async def _relay_stream(node, subscriber, query, exchange: Exchange, receive) -> None:
    """Relay a stream: reply messages in, SSE (or an up-front JSON answer) out, while watching
    for the caller going away (then the subscriber is told to cancel the stream)."""
    tags = query["tags"]
    request_id = tags[env.TAG_REQUEST_ID]
    queue: asyncio.Queue = asyncio.Queue()
    remote = subscriber is None or not conf.A2A_LOCAL_FAST_PATH
    if remote:
        if not await _send_query(node, query, queue, exchange):
            return
    else:
        async def sink(message: dict[str, Any]) -> None:
            queue.put_nowait(message)

        await subscriber.handle(query, sink, local=True)

    async def watch() -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                queue.put_nowait(_DISCONNECT)
                return

    watcher = asyncio.get_running_loop().create_task(watch())
    guard = settings.A2A_SSE_IDLE_TIMEOUT_SECONDS + settings.A2A_GATEWAY_TIMEOUT_BUFFER_SECONDS
    acked = not remote
    try:
        while not exchange.done:
            try:
                async with asyncio.timeout(guard if acked else ACK_TIMEOUT_SECONDS):
                    message = await queue.get()
            except TimeoutError:
                if exchange.started:
                    await exchange.fail(errors.TIMEOUT, "stream lost")
                else:
                    await exchange.fail(errors.UNREACHABLE if not acked else errors.TIMEOUT,
                                        "no live subscriber for this agent", executed=acked)
                await _cancel_stream(node, subscriber, query, exchange.agent_id, remote)
                return
            if message is _DISCONNECT:
                exchange.outcome = "client_disconnect"
                await _cancel_stream(node, subscriber, query, exchange.agent_id, remote)
                return
            acked = True
            await exchange.deliver(message)
    finally:
        watcher.cancel()
        if remote:
            node.inbox.pending.pop(request_id, None)


async def _cancel_stream(node, subscriber, query, agent_id: str, remote: bool) -> None:
    tags = query["tags"]
    cancel = env.query(b"", {
        env.TAG_METHOD: env.CANCEL_METHOD,
        env.TAG_STREAM_ID: tags[env.TAG_REQUEST_ID],
        env.TAG_REQUEST_ID: tags[env.TAG_REQUEST_ID] + ".cancel",
        env.TAG_CALLER: tags.get(env.TAG_CALLER, ""),
        env.TAG_REPLY_CHANNEL: tags.get(env.TAG_REPLY_CHANNEL, ""),
    })
    if not remote:
        await subscriber.handle(cancel, _discard, local=True)
        return
    try:
        await node.layer.send(agent_channel(agent_id), cancel)
    except Exception as exc:
        logger.warning("stream_cancel not delivered: %s", exc)


async def _discard(message: dict[str, Any]) -> None:
    return None


# --- replies ----------------------------------------------------------------------------------


class Exchange:
    """The caller's side of one request: turns reply messages into the ASGI response."""

    __slots__ = ("send", "rpc_id", "agent_id", "started", "done", "sse", "outcome")

    def __init__(self, send, rpc_id: Any, agent_id: str) -> None:
        self.send = send
        self.rpc_id = rpc_id
        self.agent_id = agent_id
        self.started = False
        self.done = False
        self.sse = False
        self.outcome = "unknown"

    async def deliver(self, message: dict[str, Any]) -> None:
        kind = message["k"]
        send = self.send
        if self.done or (kind == env.START and self.started) or (
            kind == env.CHUNK and not self.started
        ):
            # A duplicate or out-of-order reply (e.g. two nodes misconfigured with one NODE_ID
            # both answering): the caller's response is already decided; never break it.
            if kind != env.ACK:
                logger.warning("ignored an unexpected %s reply for %s", kind, self.agent_id)
            return
        if kind == env.START:
            status = message["status"]
            headers = list(message["headers"])
            headers.append(EXECUTED_TRUE)
            headers.append((b"x-a2a-agent-status", str(status).encode()))
            body = message["body"]
            more = message["more"]
            if not more and status not in (204, 304):
                headers.append((b"content-length", str(len(body)).encode()))
            self.started = True
            self.sse = message["sse"]
            self.outcome = "ok" if status < 400 else "agent_error"
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": body, "more_body": more})
            self.done = not more
        elif kind == env.CHUNK:
            more = message["more"]
            await send({"type": "http.response.body", "body": message["body"],
                        "more_body": more})
            self.done = not more
        elif kind == env.ERROR:
            await self.fail(message["kind"], message.get("detail") or "",
                            status=message.get("status"), executed=message.get("executed", False))
        # acks carry nothing for the caller

    async def fail(self, kind: str, detail: str = "", *, status: int | None = None,
                   executed: bool = False) -> None:
        """Answer a transport error: a JSON-RPC error before the reply started, a terminal
        ``event: error`` inside an event stream, an aborted body otherwise."""
        if self.done:
            return
        self.done = True
        if self.outcome in ("unknown", "ok", "agent_error"):
            self.outcome = kind
        if not self.started:
            extra = [(b"x-a2a-agent-status", str(status).encode())] if status else []
            await _error(self.send, kind, self.rpc_id, self.agent_id, detail, extra=extra,
                         status=status, executed=executed)
            return
        if self.sse:
            error = errors.error_object(kind, agent_id=self.agent_id, detail=detail,
                                        status=status, executed=True)
            event = error_event({"jsonrpc": "2.0", "id": self.rpc_id, "error": error})
            await self.send({"type": "http.response.body", "body": event, "more_body": False})
            return
        # A plain body cut short cannot be answered any more: returning without completing the
        # response makes the server close the connection, so the caller sees the truncation.


async def _error(send, kind: str, rpc_id: Any, agent_id: str | None, detail: str = "", *,
                 extra: list | None = None, status: int | None = None,
                 executed: bool = False) -> None:
    body = errors.error_body(kind, rpc_id=rpc_id, agent_id=agent_id, detail=detail,
                             status=status, executed=executed)
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        EXECUTED_TRUE if executed else EXECUTED_FALSE,
    ]
    if extra:
        headers.extend(extra)
    await send({"type": "http.response.start", "status": errors.http_status_for(kind),
                "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _plain(send, status: int, body: bytes, extra: list | None = None) -> None:
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode()), EXECUTED_FALSE]
    if extra:
        headers.extend(extra)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
