"""The lean ASGI handler of ``/a2a/...``: the gateway's hot path, reached before Django.

The router (node.router) hands every request its :class:`~gateway.runtime.GatewayNode`:
the handler reads the node's settings, routing table, subscribers, token cache and limiter
from it, and never looks a node up itself.

``POST /a2a/{agent_id}[/]`` validates only what the gateway needs -- a JSON object (else
-32700; a batch or another JSON value -32600) with a non-empty string ``method`` (else -32600)
-- and forwards everything else unchanged, whatever the Content-Type says (it only words the
-32700 message: an agent parses the body, not the header). The ``kubemq`` error profile
refuses what KubeMQ's connector refuses, with its codes, so a drop-in gets the same answers: a
Content-Type that is not JSON (-32700, id null) and a ``jsonrpc`` other than ``"2.0"`` (-32600,
the caller's id). It then checks the agent id
(-32600), authenticates (cached tokens; 401), authorizes (403), rate-limits (429), looks the
agent up in the in-memory routing table (``agent_not_found``), turns the request into a Query
envelope and hands it to the agent's virtual subscriber: directly when it lives in this process
(local fast path), else through the broker to the owning node. The reply is relayed as it
comes: one JSON body, or SSE events as they arrive. Every reply carries ``X-A2A-Executed``; no
database query, no Django.

Every other path under ``/a2a/{agent_id}/`` is a route of the A2A HTTP+JSON binding
(:mod:`gateway.rest`, :func:`gateway.rest_handler.handle_rest`): the same checks and the same
way to the subscriber, with the caller's HTTP method and path in the Query's tags -- or, for an
agent without an HTTP+JSON interface, translated to its JSON-RPC (:mod:`gateway.rest_translate`)
-- and the gateway's errors in that binding's form. The extended agent card (every binding) is
answered only to authenticated callers and rewritten like the public card
(:class:`~gateway.cards.CardRewrite`).

Before any of that, a body announced above ``A2A_MAX_REQUEST_BYTES`` is answered 413 unread,
and a large (above 64 KiB) or chunked body is read only once the caller authenticates (else
401); both close the connection, so the server stops reading the unread rest.

The entry points share their steps: reading the body and admission (:mod:`gateway.admission`),
the one way to the subscriber (:func:`gateway.forwarding.forward_call`), the relays of its
replies (:mod:`gateway.relays`) and the caller's side of the exchange (:mod:`gateway.exchange`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

import orjson

from gateway import envelope as env
from gateway import errors, metrics, push, rest, tracing
from gateway.admission import (
    admit_call,
    admit_to_agent,
    extended_card,
    read_call_body,
    refused_webhook,
    relay_base,
    stream_slot,
)
from gateway.bodies import Receive, Send
from gateway.cards import EXTENDED_CARD_METHODS, serve_card
from gateway.exchange import REST, Exchange, send_error, send_plain
from gateway.forwarding import (
    NOWHERE,
    answer_stopping,
    forward_call,
    subscriber_of,
)
from gateway.grpc_binding import outbound_translate
from gateway.headers import scan_request_headers
from gateway.jsonrpc import (
    LAZY_ABOVE_BYTES,
    invalid_json_detail,
    is_json_media_type,
    media_type,
    parse_request,
)
from gateway.limits import request_timeout
from gateway.relays import new_request_id, relay_stream, request_numbers
from gateway.rest_handler import handle_rest, resumed_rest_stream
from gateway.resume import parse_last_event_id, stream_form
from registry.ids import TENANT_PATH_MARK, TENANT_SEPARATOR, agent_key, tenant_error

if TYPE_CHECKING:
    from gateway.runtime import GatewayNode

#: Profile kubemq: the envelope checks KubeMQ's connector makes (its -32700 and -32600
#: triggers), answered before the request goes anywhere (executed false).
CONTENT_TYPE_NOT_JSON = "Content-Type must be application/json"
JSONRPC_NOT_2_0 = 'jsonrpc must be "2.0"'
_CARD_PATHS = (".well-known/agent-card.json", ".well-known/agent.json")
#: Where a non-default tenant's agents are addressed (registry.ids.gateway_path).
TENANT_PREFIX = f"/a2a/{TENANT_PATH_MARK}/"


def tenant_scope(scope: dict[str, Any]) -> dict[str, Any] | None:
    """``/a2a/t/{tenant}/{agent_id}/...`` as the gateway's own form of it,
    ``/a2a/{tenant}.{agent_id}/...`` (the routing key in the agent id's place; the raw path
    rewritten alike, so the HTTP+JSON binding forwards the caller's encoding): a copy of
    ``scope``, or None when the tenant is not a valid tenant slug."""
    rest = scope["path"][len(TENANT_PREFIX):]
    tenant, _, rest = rest.partition("/")
    agent_id, sep, tail = rest.partition("/")
    if tenant_error(tenant) is not None or TENANT_SEPARATOR in agent_id:
        return None
    key = agent_key(tenant, agent_id)
    qualified = {**scope, "path": f"/a2a/{key}{sep}{tail}"}
    raw = scope.get("raw_path")
    if isinstance(raw, bytes):
        prefix = f"{TENANT_PREFIX}{tenant}/{agent_id}".encode()
        qualified["raw_path"] = (b"/a2a/" + key.encode() + raw[len(prefix):]
                                 if raw.startswith(prefix) else None)
    return qualified


# --- entry point -----------------------------------------------------------------------------


def a2a_app(node: GatewayNode, scope: dict[str, Any], receive: Receive,
            send: Send) -> Awaitable[None]:
    """The ASGI application of every path under ``/a2a/``, for ``node``.

    A plain function returning the handler's coroutine: one coroutine level fewer on every
    suspension of the hot path.
    """
    path = scope["path"]
    if path.startswith(TENANT_PREFIX):
        qualified = tenant_scope(scope)
        if qualified is not None:
            scope = qualified
            agent_id, _, tail = scope["path"][5:].partition("/")
        else:  # no valid tenant: its routes answer as for an invalid agent id
            agent_id, tail = "", path[len(TENANT_PREFIX):].partition("/")[2].partition("/")[2]
    else:
        agent_id, _, tail = path[5:].partition("/")  # after "/a2a/"
        if TENANT_SEPARATOR in agent_id:
            agent_id = ""  # a qualified id is addressed as /a2a/t/{tenant}/{agent_id} only
    method = scope["method"]
    if tail == "":
        if method == "POST":
            return handle_rpc(node, scope, receive, send, agent_id)
        return send_plain(send, 405, b'{"error": "method not allowed: use POST"}',
                          [(b"allow", b"POST")])
    if tail in ("stream", "stream/"):
        if method == "GET":
            return handle_get_stream(node, scope, receive, send, agent_id)
        return send_plain(send, 405, b'{"error": "method not allowed: use GET"}',
                          [(b"allow", b"GET")])
    if tail.startswith("stream/"):
        if method == "GET":
            return handle_resume(node, scope, receive, send, agent_id, tail[7:].rstrip("/"))
        return send_plain(send, 405, b'{"error": "method not allowed: use GET"}',
                          [(b"allow", b"GET")])
    if tail in _CARD_PATHS:
        if method in ("GET", "HEAD"):
            return serve_card(node, scope, receive, send, agent_id)
        return send_plain(send, 405, b'{"error": "method not allowed: use GET"}',
                          [(b"allow", b"GET, HEAD")])
    # Everything else under the agent's base is the A2A HTTP+JSON binding (gateway.rest).
    route = rest.route_of(tail)
    if route is None:
        return send_error(send, errors.ROUTE_NOT_FOUND, REST, agent_id,
                          f"no A2A HTTP+JSON route at {scope['path']}")
    a2a_method = route.method(method)
    if a2a_method is None:
        return send_error(send, errors.METHOD_NOT_ALLOWED, REST, agent_id,
                          f"{method} {scope['path']}: use {route.allow}",
                          extra=[(b"allow", route.allow.encode())])
    return handle_rest(node, scope, receive, send, agent_id, tail, a2a_method)


# --- POST /a2a/{agent_id} ----------------------------------------------------------------------


async def handle_rpc(node: GatewayNode, scope: dict[str, Any], receive: Receive, send: Send,
                     agent_id: str) -> None:
    started = time.perf_counter()
    settings = node.settings
    headers = scan_request_headers(scope["headers"])
    body = await read_call_body(node, scope, receive, send, headers, agent_id, None)
    if body is None:
        return
    kubemq = settings.A2A_ERROR_PROFILE == "kubemq"
    if kubemq and not is_json_media_type(media_type(headers.content_type)):
        await send_error(send, errors.PARSE_ERROR, None, None, CONTENT_TYPE_NOT_JSON)
        return
    try:
        # A small body (the common case) is parsed whole without a call more; tracing reads
        # the task and context ids of params, so it takes the whole parse too.
        payload = orjson.loads(body) if len(body) <= LAZY_ABOVE_BYTES \
            else parse_request(body, whole=tracing.ENABLED)
    except orjson.JSONDecodeError:
        await send_error(send, errors.PARSE_ERROR, None, None,
                         invalid_json_detail(headers.content_type))
        return
    if not isinstance(payload, dict):
        detail = "batch requests are not supported" if isinstance(payload, list) \
            else "expected one JSON-RPC 2.0 request object"
        await send_error(send, errors.INVALID_REQUEST, None, None, detail)
        return
    rpc_id = payload.get("id")
    if kubemq and payload.get("jsonrpc") != "2.0":
        await send_error(send, errors.INVALID_REQUEST, rpc_id, None, JSONRPC_NOT_2_0)
        return
    method = payload.get("method")
    if not isinstance(method, str) or not method:
        await send_error(send, errors.INVALID_REQUEST, rpc_id, None,
                         "method must be a non-empty string")
        return
    admitted = await admit_call(node, scope, send, headers, rpc_id, agent_id, method)
    if admitted is None:
        return
    caller, route = admitted
    slot = await stream_slot(node, scope, send, rpc_id, agent_id, caller, route, method)
    if slot is None:
        return
    try:
        if method in push.METHODS and push.may_carry(method, body):
            whole = payload if len(body) <= LAZY_ABOVE_BYTES else orjson.loads(body)
            base = relay_base(node, route, scope, headers)
            refused = await refused_webhook(scope, agent_id, caller, method, whole.get("params"),
                                            relay_base=base)
            if refused is not None:
                await send_error(send, errors.WEBHOOK_REFUSED, rpc_id, agent_id, refused)
                return
            if base is not None and push.carries(method, whole.get("params")):
                payload, body = whole, orjson.dumps(whole)  # the configs point at the relay
        if method in push.CONFIG_ANSWERS:
            send = push.ConfigAnswer(send, agent_id, caller)
        if method in EXTENDED_CARD_METHODS:
            rewrite = await extended_card(scope, send, headers, rpc_id, agent_id, caller, method)
            if rewrite is None:
                return
            send = rewrite
        # HOOK (gRPC-only agent): its endpoint is its gRPC address; the admitted call is
        # translated to its gRPC server instead of taking the subscriber's HTTP way
        # (gateway.grpc_binding.outbound_translate).
        if outbound_translate.is_grpc_target(route.endpoint):
            await outbound_translate.answer_jsonrpc(
                send, receive, route=route, caller=caller, tags=headers.tags,
                timeout=request_timeout(payload, settings), started=started,
                request_bytes=len(body),
                payload=payload if len(body) <= LAZY_ABOVE_BYTES else orjson.loads(body))
            return
        await forward_call(node, route, send, receive, rpc_id, caller, headers.tags, method, body,
                           request_timeout(payload, settings),
                           streaming=method in env.STREAMING_METHODS, started=started,
                           payload=payload, profile=settings.A2A_ERROR_PROFILE)
    finally:
        slot.release()


# --- GET /a2a/{agent_id}/stream ----------------------------------------------------------------


async def handle_get_stream(node: GatewayNode, scope: dict[str, Any], receive: Receive,
                            send: Send, agent_id: str) -> None:
    """KubeMQ's server-push stream: the agent gets a ``message/stream`` request with empty
    params, and its events are relayed."""
    started = time.perf_counter()
    headers = scan_request_headers(scope["headers"])
    admitted = await admit_to_agent(node, scope, send, headers, None, agent_id,
                                    "message/stream")
    if admitted is None:
        return
    caller, route = admitted
    slot = await stream_slot(node, scope, send, None, agent_id, caller, route, "message/stream")
    if slot is None:
        return
    rpc_id = f"stream-{next(request_numbers)}"
    body = orjson.dumps({"jsonrpc": "2.0", "id": rpc_id, "method": "message/stream",
                         "params": {}})
    tags = headers.tags
    tags["a2a_hdr_content-type"] = "application/json"
    tags.setdefault("a2a_hdr_accept", "text/event-stream")
    settings = node.settings
    try:
        await forward_call(node, route, send, receive, rpc_id, caller, tags, "message/stream",
                           body, float(settings.A2A_DEFAULT_TIMEOUT_SECONDS), streaming=True,
                           started=started, payload=None, profile=settings.A2A_ERROR_PROFILE,
                           request_bytes=0)
    finally:
        slot.release()


# --- GET /a2a/{agent_id}/stream/{stream_id}: resume (docs/streams.md) -------------------------


async def handle_resume(node: GatewayNode, scope: dict[str, Any], receive: Receive, send: Send,
                        agent_id: str, stream_id: str) -> None:
    """Reattach to a resumable stream after a dropped connection: the events after the
    ``Last-Event-ID`` header (or ``last_event_id`` query parameter) are replayed, then the
    stream continues live. Authenticated and authorized like the call that opened it; only the
    client that opened it may resume it (else, as for an unknown or expired stream,
    ``stream_not_found``). Reaches the owning node like any call. A stream opened through the
    HTTP+JSON binding (its id says so, gateway.resume.stream_form) is answered in that binding,
    its errors too; a translated one's replay is translated as the live stream was."""
    started = time.perf_counter()
    headers = scan_request_headers(scope["headers"])
    # A stream opened through the HTTP+JSON binding is answered in that binding (its id says so)
    rest_form = stream_form(stream_id) is not None
    form_id: Any = REST if rest_form else None
    admitted = await admit_to_agent(node, scope, send, headers, form_id, agent_id)
    if admitted is None:
        return
    caller, route = admitted
    last_event_id = _last_event_id(scope)
    last = 0 if last_event_id is None else parse_last_event_id(last_event_id, stream_id)
    if not stream_id or len(stream_id) > 64 or last is None:
        await send_error(send, errors.INVALID_REQUEST, form_id, agent_id,
                         "expected /a2a/{agent_id}/stream/{stream_id} and a Last-Event-ID of "
                         "that stream")
        return
    # A resumed stream is an open stream of its tenant again (the dropped one gave its back).
    slot = await stream_slot(node, scope, send, form_id, agent_id, caller, route,
                             "tasks/resubscribe")
    if slot is None:
        return
    translation = None
    if rest_form:
        form_id, send, translation = resumed_rest_stream(send, stream_id)
    tags = {
        env.TAG_METHOD: env.RESUME_METHOD,
        env.TAG_STREAM_ID: stream_id,
        env.TAG_LAST_EVENT: str(last),
        env.TAG_CALLER: caller,
        env.TAG_REQUEST_ID: new_request_id(),
    }
    exchange = Exchange(send, form_id, agent_id, node.settings.A2A_ERROR_PROFILE)
    subscriber = subscriber_of(node, route)
    try:
        if subscriber is NOWHERE:
            await exchange.fail(errors.UNREACHABLE, "no live subscriber for this agent")
        else:
            await relay_stream(node, subscriber, env.query(b"", tags), exchange, receive,
                               route.node_id)
    except asyncio.CancelledError:
        if not await answer_stopping(exchange):
            raise
    finally:
        slot.release()
    if translation is not None:
        await translation.finish()
    metrics.observe_latency(agent_id, exchange.outcome, time.perf_counter() - started)


def _last_event_id(scope: dict[str, Any]) -> str | None:
    name: bytes
    raw: bytes
    for name, raw in scope["headers"]:
        if name.lower() == b"last-event-id":
            return raw.decode("latin-1")
    query: bytes = scope.get("query_string") or b""
    if query:
        for key, value in parse_qsl(query.decode("latin-1")):
            if key == "last_event_id":
                return value
    return None
