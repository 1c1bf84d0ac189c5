"""The lean ASGI handler of ``/a2a/...``: the gateway's hot path, reached before Django.

The router (gateway.routing) hands every request its :class:`~gateway.runtime.GatewayNode`:
the handler reads the node's settings, routing table, subscribers, token cache and limiter
from it, and never looks a node up itself.

``POST /a2a/{agent_id}[/]`` validates only what the gateway needs -- a JSON object (else
-32700; a batch or another JSON value -32600) with a non-empty string ``method`` (else -32600)
-- and forwards everything else unchanged, whatever the Content-Type says (it only words the
-32700 message: an agent parses the body, not the header). It then checks the agent id
(-32600), authenticates (cached tokens; 401), authorizes (403), rate-limits (429), looks the
agent up in the in-memory routing table (``agent_not_found``), turns the request into a Query
envelope and hands it to the agent's virtual subscriber: directly when it lives in this process
(local fast path), else through the broker to the owning node. The reply is relayed as it
comes: one JSON body, or SSE events as they arrive. Every reply carries ``X-A2A-Executed``; no
database query, no Django.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

import orjson

from gateway import envelope as env
from gateway import errors, metrics
from gateway.bodies import BodyTooLarge, Disconnected, read_body
from gateway.cards import serve_card
from gateway.headers import scan_request_headers
from gateway.limits import request_timeout
from gateway.replicator import ORIGIN
from gateway.sse import error_event
from registry.auth import UNAUTHENTICATED_MESSAGE
from registry.ids import AGENT_ID_RE, agent_channel
from registry.token_cache import AuthFailed

if TYPE_CHECKING:
    from gateway.runtime import GatewayNode

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
#: A route no subscriber can answer: owned here without a live subscriber, or owned by another
#: node while the channel layer reaches only this process.
_NOWHERE: Any = object()


# --- entry point -----------------------------------------------------------------------------


def a2a_app(node: GatewayNode, scope: dict[str, Any], receive, send) -> Awaitable[None]:
    """The ASGI application of every path under ``/a2a/``, for ``node``.

    A plain function returning the handler's coroutine: one coroutine level fewer on every
    suspension of the hot path.
    """
    rest = scope["path"][5:]  # after "/a2a/"
    agent_id, _, tail = rest.partition("/")
    method = scope["method"]
    if tail == "":
        if method == "POST":
            return handle_rpc(node, scope, receive, send, agent_id)
        return _plain(send, 405, b'{"error": "method not allowed: use POST"}',
                      [(b"allow", b"POST")])
    if tail in ("stream", "stream/"):
        if method == "GET":
            return handle_get_stream(node, scope, receive, send, agent_id)
        return _plain(send, 405, b'{"error": "method not allowed: use GET"}',
                      [(b"allow", b"GET")])
    if tail in _CARD_PATHS:
        if method in ("GET", "HEAD"):
            return serve_card(node, scope, receive, send, agent_id)
        return _plain(send, 405, b'{"error": "method not allowed: use GET"}',
                      [(b"allow", b"GET, HEAD")])
    return _plain(send, 404, b'{"error": "not found"}')


# --- POST /a2a/{agent_id} ----------------------------------------------------------------------


async def handle_rpc(node: GatewayNode, scope: dict[str, Any], receive, send,
                     agent_id: str) -> None:
    started = time.perf_counter()
    settings = node.settings
    headers = scan_request_headers(scope["headers"])
    cap = settings.A2A_MAX_REQUEST_BYTES
    try:
        if headers.content_length is not None and headers.content_length > cap:
            raise BodyTooLarge
        body = await read_body(receive, cap)
    except Disconnected:
        return
    except BodyTooLarge:
        await _error(send, errors.REQUEST_TOO_LARGE, None, None,
                     f"request body larger than {cap} bytes")
        return
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        await _error(send, errors.PARSE_ERROR, None, None,
                     _invalid_json_detail(headers.content_type))
        return
    if not isinstance(payload, dict):
        detail = "batch requests are not supported" if isinstance(payload, list) \
            else "expected one JSON-RPC 2.0 request object"
        await _error(send, errors.INVALID_REQUEST, None, None, detail)
        return
    rpc_id = payload.get("id")
    method = payload.get("method")
    if not isinstance(method, str) or not method:
        await _error(send, errors.INVALID_REQUEST, rpc_id, None,
                     "method must be a non-empty string")
        return
    admitted = await _admit_to_agent(node, scope, send, headers.authorization, rpc_id,
                                     agent_id)
    if admitted is None:
        return
    caller, route = admitted
    metrics.count_request(agent_id, method)
    timeout = request_timeout(payload, settings)
    tags = headers.tags
    tags[env.TAG_METHOD] = method
    tags[env.TAG_TIMEOUT] = repr(timeout)
    tags[env.TAG_CALLER] = caller
    tags[env.TAG_REQUEST_ID] = f"{_ORIGIN}.{next(_request_ids)}"
    exchange = Exchange(send, rpc_id, agent_id)
    query = env.query(body, tags)
    subscriber = _subscriber_of(node, route)
    if subscriber is _NOWHERE:
        await exchange.fail(errors.UNREACHABLE, "no live subscriber for this agent")
    elif method in env.STREAMING_METHODS:
        await _relay_stream(node, subscriber, query, exchange, receive)
    elif subscriber is not None and settings.A2A_LOCAL_FAST_PATH:
        # The local fast path, inline: the subscriber's own outbound timeout (the caller's,
        # shorter than the gateway's wait) always ends the call first, so no second timer.
        await subscriber.handle(query, exchange.deliver, local=True)
        if not exchange.done:
            await exchange.fail(errors.UNREACHABLE, "the subscriber gave no answer")
    else:
        await _remote_sync(node, query, exchange,
                           timeout + settings.A2A_GATEWAY_TIMEOUT_BUFFER_SECONDS)
    metrics.observe_latency(agent_id, exchange.outcome, time.perf_counter() - started)


def _invalid_json_detail(content_type: bytes) -> str:
    """The -32700 message: says when the declared media type was not JSON either."""
    media_type = content_type.split(b";", 1)[0].strip().lower()
    if not media_type or _is_json_media_type(media_type):
        return "invalid JSON"
    return f"invalid JSON (Content-Type {media_type.decode('latin-1')} is not JSON)"


def _is_json_media_type(media_type: bytes) -> bool:
    """``application/json`` and every ``+json`` structured syntax (RFC 6839)."""
    return media_type == b"application/json" or media_type.endswith(b"+json")


# --- GET /a2a/{agent_id}/stream ----------------------------------------------------------------


async def handle_get_stream(node: GatewayNode, scope: dict[str, Any], receive, send,
                            agent_id: str) -> None:
    """KubeMQ's server-push stream: the agent gets a ``message/stream`` request with empty
    params, and its events are relayed."""
    started = time.perf_counter()
    headers = scan_request_headers(scope["headers"])
    admitted = await _admit_to_agent(node, scope, send, headers.authorization, None, agent_id)
    if admitted is None:
        return
    caller, route = admitted
    rpc_id = f"stream-{next(_request_ids)}"
    body = orjson.dumps({"jsonrpc": "2.0", "id": rpc_id, "method": "message/stream",
                         "params": {}})
    metrics.count_request(agent_id, "message/stream")
    tags = headers.tags
    tags["a2a_hdr_content-type"] = "application/json"
    tags.setdefault("a2a_hdr_accept", "text/event-stream")
    tags[env.TAG_METHOD] = "message/stream"
    tags[env.TAG_TIMEOUT] = repr(float(node.settings.A2A_DEFAULT_TIMEOUT_SECONDS))
    tags[env.TAG_CALLER] = caller
    tags[env.TAG_REQUEST_ID] = f"{_ORIGIN}.{next(_request_ids)}"
    exchange = Exchange(send, rpc_id, agent_id)
    subscriber = _subscriber_of(node, route)
    if subscriber is _NOWHERE:
        await exchange.fail(errors.UNREACHABLE, "no live subscriber for this agent")
    else:
        await _relay_stream(node, subscriber, env.query(body, tags), exchange, receive)
    metrics.observe_latency(agent_id, exchange.outcome, time.perf_counter() - started)


# --- shared steps -----------------------------------------------------------------------------

async def _admit_to_agent(node: GatewayNode, scope, send, authorization, rpc_id, agent_id):
    """Check the agent id, the caller and the route: ``(caller id, route)``, or None once the
    refusal has been answered."""
    if not AGENT_ID_RE.match(agent_id):
        await _error(send, errors.INVALID_REQUEST, rpc_id, None, "invalid agent id")
        return None
    caller = await _admit(node, scope, send, authorization, rpc_id, agent_id)
    if caller is None:
        return None
    route = node.table.get(agent_id)
    if route is None:
        await _error(send, errors.AGENT_NOT_FOUND, rpc_id, agent_id)
        return None
    return caller, route


async def _admit(node: GatewayNode, scope, send, authorization, rpc_id,
                 agent_id) -> str | None:
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


def _subscriber_of(node: GatewayNode, route) -> Any:
    """The route's subscriber in this process; None when another node owns it (reached
    through the broker); :data:`_NOWHERE` when no subscriber can answer."""
    if route.node_id == node.settings.NODE_ID:
        return node.manager.subscribers.get(route.agent_id) or _NOWHERE
    return None if node.cross_process else _NOWHERE


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
    settings = node.settings
    remote = subscriber is None or not settings.A2A_LOCAL_FAST_PATH
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
