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
(:mod:`gateway.rest`, :func:`handle_rest`): the same checks and the same way to the subscriber,
with the caller's HTTP method and path in the Query's tags -- or, for an agent without an
HTTP+JSON interface, translated to its JSON-RPC (:mod:`gateway.rest_translate`) -- and the
gateway's errors in that binding's form. The extended agent card (every binding) is answered
only to authenticated callers and rewritten like the public card (:class:`CardRewrite`).

Before any of that, a body announced above ``A2A_MAX_REQUEST_BYTES`` is answered 413 unread,
and a large (above 64 KiB) or chunked body is read only once the caller authenticates (else
401); both close the connection, so the server stops reading the unread rest.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

import orjson

from core import lifecycle as node_config
from gateway import agent_bindings, errors, metrics, push, recorder, rest, rest_translate, tracing
from gateway import envelope as env
from gateway.admission import AUTH_FIRST_ABOVE_BYTES, unauthenticated
from gateway.binding import BindingCaller
from gateway.bodies import BodyTooLarge, Disconnected, read_body
from gateway.cards import (
    EXTENDED_CARD_ANONYMOUS,
    EXTENDED_CARD_METHODS,
    CardRewrite,
    gateway_url,
    rewrite_card,
    serve_card,
)
from gateway.grpc_binding import outbound_translate
from gateway.headers import AUTHORIZATION_TAG, RequestHeaders, scan_request_headers
from gateway.inbox import STREAM_GAP, Reassembly
from gateway.jsonrpc import (
    LAZY_ABOVE_BYTES,
    events_have_error,
    is_error_reply,
    parse_request,
)
from gateway.limits import request_timeout
from gateway.liveness import BROKER_LOST, OWNER_LOST
from gateway.replicator import ORIGIN
from gateway.resume import STREAM_ID_HEADER, parse_last_event_id
from gateway.sse import OVERFLOW, StreamBuffer, error_event, flow_controlled
from gateway.translation import V03, TranslationError, Unsupported, agent_request
from registry.auth import UNAUTHENTICATED_MESSAGE
from registry.ids import AGENT_ID_RE, agent_channel
from registry.permissions import ANONYMOUS_ID
from registry.token_cache import AuthFailed, AuthUnavailable

if TYPE_CHECKING:
    from gateway.runtime import GatewayNode

logger = logging.getLogger(__name__)

JSON_HEADERS = [(b"content-type", b"application/json")]
EXECUTED_FALSE = (b"x-a2a-executed", b"false")
EXECUTED_TRUE = (b"x-a2a-executed", b"true")
#: Profile kubemq: the envelope checks KubeMQ's connector makes (its -32700 and -32600
#: triggers), answered before the request goes anywhere (executed false).
CONTENT_TYPE_NOT_JSON = "Content-Type must be application/json"
JSONRPC_NOT_2_0 = 'jsonrpc must be "2.0"'
#: How long a Query sent through the broker may go without any sign of life from the
#: subscriber (a reply or an ack) before the gateway answers `unreachable`.
ACK_TIMEOUT_SECONDS = 3.0
#: The ``stream_gap`` error's message (after its prefix).
GAP_DETAIL = "reply messages between the nodes were lost; events may be missing"
_CARD_PATHS = (".well-known/agent-card.json", ".well-known/agent.json")
_request_ids = itertools.count(1)
_ORIGIN = ORIGIN[:12]  # request ids are unique per process and across nodes
#: A route no subscriber can answer: owned here without a live subscriber, or owned by another
#: node while the channel layer reaches only this process.
_NOWHERE: Any = object()


class _Rest:
    __slots__ = ()

    def __repr__(self) -> str:
        return "REST"


#: The "request id" of an HTTP+JSON call, which has none: where a JSON-RPC call's id goes
#: (admission, :class:`Exchange`, :func:`_error`), it makes the gateway's errors take the
#: binding's form.
REST: Any = _Rest()


# --- entry point -----------------------------------------------------------------------------


def a2a_app(node: GatewayNode, scope: dict[str, Any], receive, send) -> Awaitable[None]:
    """The ASGI application of every path under ``/a2a/``, for ``node``.

    A plain function returning the handler's coroutine: one coroutine level fewer on every
    suspension of the hot path.
    """
    agent_id, _, tail = scope["path"][5:].partition("/")  # after "/a2a/"
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
    if tail.startswith("stream/"):
        if method == "GET":
            return handle_resume(node, scope, receive, send, agent_id, tail[7:].rstrip("/"))
        return _plain(send, 405, b'{"error": "method not allowed: use GET"}',
                      [(b"allow", b"GET")])
    if tail in _CARD_PATHS:
        if method in ("GET", "HEAD"):
            return serve_card(node, scope, receive, send, agent_id)
        return _plain(send, 405, b'{"error": "method not allowed: use GET"}',
                      [(b"allow", b"GET, HEAD")])
    # Everything else under the agent's base is the A2A HTTP+JSON binding (gateway.rest).
    route = rest.route_of(tail)
    if route is None:
        return _error(send, errors.ROUTE_NOT_FOUND, REST, agent_id,
                      f"no A2A HTTP+JSON route at {scope['path']}")
    a2a_method = route.method(method)
    if a2a_method is None:
        return _error(send, errors.METHOD_NOT_ALLOWED, REST, agent_id,
                      f"{method} {scope['path']}: use {route.allow}",
                      extra=[(b"allow", route.allow.encode())])
    return handle_rest(node, scope, receive, send, agent_id, tail, a2a_method)


# --- POST /a2a/{agent_id} ----------------------------------------------------------------------


async def handle_rpc(node: GatewayNode, scope: dict[str, Any], receive, send,
                     agent_id: str) -> None:
    started = time.perf_counter()
    settings = node.settings
    headers = scan_request_headers(scope["headers"])
    cap = settings.A2A_MAX_REQUEST_BYTES
    if headers.content_length is not None and headers.content_length > cap:
        await _error(send, errors.REQUEST_TOO_LARGE, None, None,
                     f"request body larger than {cap} bytes", extra=[(b"connection", b"close")])
        return
    # Authenticate before reading a large (or chunked) body: an unknown caller never gets to
    # upload one. A small body is read first so a refusal can carry the caller's id.
    if (headers.content_length is None or headers.content_length > AUTH_FIRST_ABOVE_BYTES) \
            and not await _authenticated(node, scope, _gateway_credential(node, agent_id, headers),
                                         send, agent_id):
        return
    # One receive() holds the whole of a small body: read it here, without a reader coroutine.
    message = await receive()
    body = message.get("body", b"")
    if message.get("more_body") or message["type"] != "http.request" or len(body) > cap:
        try:
            body = await _read_rest(message, receive, cap)
        except Disconnected:
            return
        except BodyTooLarge:
            await _error(send, errors.REQUEST_TOO_LARGE, None, None,
                         f"request body larger than {cap} bytes",
                         extra=[(b"connection", b"close")])
            return
    kubemq = settings.A2A_ERROR_PROFILE == "kubemq"
    if kubemq and not _is_json_media_type(_media_type(headers.content_type)):
        await _error(send, errors.PARSE_ERROR, None, None, CONTENT_TYPE_NOT_JSON)
        return
    try:
        # A small body (the common case) is parsed whole without a call more; tracing reads
        # the task and context ids of params, so it takes the whole parse too.
        payload = orjson.loads(body) if len(body) <= LAZY_ABOVE_BYTES \
            else parse_request(body, whole=tracing.ENABLED)
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
    if kubemq and payload.get("jsonrpc") != "2.0":
        await _error(send, errors.INVALID_REQUEST, rpc_id, None, JSONRPC_NOT_2_0)
        return
    method = payload.get("method")
    if not isinstance(method, str) or not method:
        await _error(send, errors.INVALID_REQUEST, rpc_id, None,
                     "method must be a non-empty string")
        return
    # The common case without a coroutine: a known agent, a client verified within the token
    # cache's lifetime, allowed to call it. Anything else takes the full path below (same
    # checks, same answers); the rate limit is charged once either way.
    caller = None
    route = node.table.get(agent_id)
    actor = _fresh_caller(node, route, headers, agent_id)
    if actor is not None:
        if not node.limiter.allow(actor.client_id):
            await _rate_limited(scope, send, rpc_id, agent_id, actor.client_id, method)
            return
        caller = actor.client_id
    if caller is None:
        admitted = await _admit_to_agent(node, scope, send, headers, rpc_id, agent_id,
                                         method)
        if admitted is None:
            return
        caller, route = admitted
    if method in push.METHODS and (len(body) <= LAZY_ABOVE_BYTES or push.MARKER in body):
        whole = payload if len(body) <= LAZY_ABOVE_BYTES else orjson.loads(body)
        refused = await refused_webhook(scope, agent_id, caller, method, whole.get("params"))
        if refused is not None:
            await _error(send, errors.WEBHOOK_REFUSED, rpc_id, agent_id, refused)
            return
    if method in EXTENDED_CARD_METHODS:
        send = await _extended_card(scope, send, headers, rpc_id, agent_id, caller, method)
        if send is None:
            return
    # HOOK (gRPC-only agent): its endpoint is its gRPC address; the admitted call is
    # translated to its gRPC server instead of taking the subscriber's HTTP way
    # (gateway.grpc_binding.outbound_translate).
    if route is not None and outbound_translate.is_grpc_target(route.endpoint):
        await outbound_translate.answer_jsonrpc(
            send, receive, route=route, caller=caller, tags=headers.tags, timeout=request_timeout(
                payload, settings), started=started, request_bytes=len(body),
            payload=payload if len(body) <= LAZY_ABOVE_BYTES else orjson.loads(body))
        return
    metrics.count_request(agent_id, method)
    timeout = request_timeout(payload, settings)
    tags = headers.tags
    tags[env.TAG_METHOD] = method
    tags[env.TAG_TIMEOUT] = repr(timeout)
    tags[env.TAG_CALLER] = caller
    tags[env.TAG_REQUEST_ID] = f"{_ORIGIN}.{next(_request_ids)}"
    trace = None
    if tracing.ENABLED:
        trace = tracing.start_call(send, agent_id=agent_id, method=method, payload=payload,
                                   request_bytes=len(body), tags=tags, caller=caller,
                                   node_id=settings.NODE_ID)
        send = trace.send
    exchange = Exchange(send, rpc_id, agent_id, settings.A2A_ERROR_PROFILE)
    await _forward(node, route, env.query(body, tags), exchange, receive,
                   method in env.STREAMING_METHODS, timeout)
    seconds = time.perf_counter() - started
    metrics.observe_latency(agent_id, exchange.outcome, seconds)
    recorder.record(agent_id, caller, method, exchange, len(body), seconds)
    if trace is not None:
        trace.end(exchange.outcome)


async def _forward(node: GatewayNode, route, query: dict[str, Any], exchange: Exchange,
                   receive, streaming: bool, timeout: float) -> None:
    """Hand an admitted call to the agent's subscriber and answer the caller from its replies:
    a stream relay, the local fast path inline, or a Query through the broker. Every binding's
    calls take this one way."""
    settings = node.settings
    subscriber = _subscriber_of(node, route)
    try:
        if subscriber is _NOWHERE:
            await exchange.fail(errors.UNREACHABLE, "no live subscriber for this agent")
        elif streaming:
            await _relay_stream(node, subscriber, query, exchange, receive, route.node_id)
        elif subscriber is not None and settings.A2A_LOCAL_FAST_PATH:
            # The local fast path, inline: the subscriber's own outbound timeout (the
            # caller's, shorter than the gateway's wait) always ends the call first, so no
            # second timer.
            call = subscriber.local_call(query, exchange.deliver)
            if call is not None:
                await call
            else:
                await subscriber.handle(query, exchange.deliver, local=True)
            if not exchange.done:
                await exchange.fail(errors.UNREACHABLE, "the subscriber gave no answer")
        else:
            await _remote_sync(node, query, exchange,
                               timeout + settings.A2A_GATEWAY_TIMEOUT_BUFFER_SECONDS,
                               route.node_id)
    except asyncio.CancelledError:
        if not await _answer_stopping(exchange):
            raise


# --- the HTTP+JSON binding: /a2a/{agent_id}/<route> (gateway.rest) ---------------------------


async def handle_rest(node: GatewayNode, scope: dict[str, Any], receive, send, agent_id: str,
                      tail: str, method: str) -> None:
    """One call of the A2A HTTP+JSON binding (``method``: its A2A method name), forwarded to
    the agent's HTTP+JSON interface with the caller's HTTP method, path and query, through the
    same admission, subscriber and replies as a JSON-RPC call; the gateway's own errors in the
    binding's form (``google.rpc.Status`` JSON, the HTTP status of docs/gateway.md's table).

    A body, when there is one, must be a JSON object (the binding's requests are); it is
    forwarded unchanged, and its ``configuration.timeout`` is the call's timeout, read as
    JSON-RPC's ``params.configuration.timeout``."""
    started = time.perf_counter()
    settings = node.settings
    headers = scan_request_headers(scope["headers"])
    cap = settings.A2A_MAX_REQUEST_BYTES
    if headers.content_length is not None and headers.content_length > cap:
        await _error(send, errors.REQUEST_TOO_LARGE, REST, agent_id,
                     f"request body larger than {cap} bytes", extra=[(b"connection", b"close")])
        return
    if (headers.content_length is None or headers.content_length > AUTH_FIRST_ABOVE_BYTES) \
            and not await _authenticated(node, scope, _gateway_credential(node, agent_id, headers),
                                         send, agent_id, REST):
        return
    try:
        body = await _read_rest(await receive(), receive, cap)
    except Disconnected:
        return
    except BodyTooLarge:
        await _error(send, errors.REQUEST_TOO_LARGE, REST, agent_id,
                     f"request body larger than {cap} bytes", extra=[(b"connection", b"close")])
        return
    payload: Any = None
    if body:
        try:
            # Above 16 KiB validated whole but built only as far as the timeout (as JSON-RPC
            # bodies are); tracing reads the ids, so it takes the whole parse.
            payload = orjson.loads(body) if len(body) <= LAZY_ABOVE_BYTES \
                else parse_request(body, whole=tracing.ENABLED, rest=True)
        except orjson.JSONDecodeError:
            await _error(send, errors.PARSE_ERROR, REST, agent_id,
                         _invalid_json_detail(headers.content_type))
            return
        if not isinstance(payload, dict):
            await _error(send, errors.INVALID_REQUEST, REST, agent_id,
                         "the request body must be a JSON object")
            return
    route = node.table.get(agent_id)
    actor = _fresh_caller(node, route, headers, agent_id)
    if actor is not None:  # the common case, as for JSON-RPC
        if not node.limiter.allow(actor.client_id):
            await _rate_limited(scope, send, REST, agent_id, actor.client_id, method)
            return
        caller = actor.client_id
    else:
        admitted = await _admit_to_agent(node, scope, send, headers, REST, agent_id, method)
        if admitted is None:
            return
        caller, route = admitted
    assert route is not None  # a caller is admitted only to a routed agent (_fresh_caller too)
    if method in EXTENDED_CARD_METHODS:
        send = await _extended_card(scope, send, headers, REST, agent_id, caller, method,
                                    rest_body=bool(route.http_json_endpoint))
        if send is None:
            return
    # HOOK (gRPC-only agent): translated to its gRPC server, as in handle_rpc.
    if outbound_translate.is_grpc_target(route.endpoint):
        await outbound_translate.answer_rest(
            send, receive, route=route, caller=caller, tags=headers.tags, tail=tail, method=method,
            query=scope.get("query_string") or b"", body=body, started=started,
            timeout=request_timeout({"params": payload} if payload else {}, settings),
            check_webhook=lambda name, params: refused_webhook(scope, agent_id, caller, name,
                                                               params))
        return
    if not route.http_json_endpoint:  # translated to the agent's JSON-RPC
        await _translated_rest(node, scope, receive, send, route, caller, headers, tail,
                               method, body, payload, started)
        return
    path = rest.forwarded_path(scope, agent_id, tail)
    if path is None:
        await _error(send, errors.INVALID_REQUEST, REST, agent_id,
                     "the path or query holds characters an HTTP request line cannot carry")
        return
    if payload and method in push.METHODS and (len(body) <= LAZY_ABOVE_BYTES
                                               or push.MARKER in body):
        whole = payload if len(body) <= LAZY_ABOVE_BYTES else orjson.loads(body)
        refused = await refused_webhook(scope, agent_id, caller, method, whole, rest=True)
        if refused is not None:
            await _error(send, errors.WEBHOOK_REFUSED, REST, agent_id, refused)
            return
    metrics.count_request(agent_id, method)
    timeout = request_timeout({"params": payload} if payload else {}, settings)
    tags = headers.tags
    tags[env.TAG_METHOD] = method
    tags[env.TAG_TIMEOUT] = repr(timeout)
    tags[env.TAG_CALLER] = caller
    tags[env.TAG_REQUEST_ID] = f"{_ORIGIN}.{next(_request_ids)}"
    tags[env.TAG_HTTP_METHOD] = scope["method"]
    tags[env.TAG_HTTP_PATH] = path
    trace = None
    if tracing.ENABLED:
        trace = tracing.start_call(send, agent_id=agent_id, method=method,
                                   payload={"params": payload} if payload else None,
                                   request_bytes=len(body), tags=tags, caller=caller,
                                   node_id=settings.NODE_ID, binding="HTTP+JSON")
        send = trace.send
    exchange = Exchange(send, REST, agent_id, settings.A2A_ERROR_PROFILE)
    await _forward(node, route, env.query(body, tags), exchange, receive,
                   method in rest.STREAMING, timeout)
    seconds = time.perf_counter() - started
    metrics.observe_latency(agent_id, exchange.outcome, seconds)
    recorder.record(agent_id, caller, method, exchange, len(body), seconds)
    if trace is not None:
        trace.end(exchange.outcome)


async def _translated_rest(node: GatewayNode, scope: dict[str, Any], receive, send, route,
                           caller: str, headers: RequestHeaders, tail: str, method: str,
                           body: bytes, payload: Any, started: float) -> None:
    """An HTTP+JSON call to an agent without an HTTP+JSON interface: translated to its
    JSON-RPC (:mod:`gateway.rest_translate`) and forwarded the one way every call takes."""
    agent_id = route.agent_id
    try:
        call = rest_translate.rest_call(tail, method, scope.get("query_string") or b"", body)
    except TranslationError as exc:
        await _error(send, errors.INVALID_REQUEST, REST, agent_id, str(exc))
        return
    try:
        bindings = await agent_bindings.bindings(route)
    except Exception as exc:
        logger.warning("HTTP+JSON: the card of %s cannot be read: %s", agent_id, exc)
        await _error(send, errors.UNREACHABLE, REST, agent_id,
                     "the agent's card cannot be read now; retry")
        return
    version = bindings.jsonrpc
    try:
        rpc_method, params = agent_request(call.method, call.request, version,
                                           tenant=call.tenant)
    except Unsupported:
        _refused(scope, agent_id, caller, method, errors.BINDING_UNAVAILABLE)
        await _error(send, errors.BINDING_UNAVAILABLE, REST, agent_id,
                     f"{method} is not an A2A {version} method, and agent {agent_id} speaks "
                     f"A2A {version}")
        return
    except TranslationError as exc:
        await _error(send, errors.INVALID_REQUEST, REST, agent_id, str(exc))
        return
    refused = await refused_webhook(scope, agent_id, caller, rpc_method, params)
    if refused is not None:
        await _error(send, errors.WEBHOOK_REFUSED, REST, agent_id, refused)
        return
    rpc = orjson.dumps({"jsonrpc": "2.0", "id": f"rest-{next(_request_ids)}",
                        "method": rpc_method, "params": params})
    tags = headers.tags
    tags["a2a_hdr_content-type"] = "application/json"
    tags["a2a_hdr_accept"] = "text/event-stream" if call.method.streaming \
        else "application/json"
    tags["a2a_hdr_a2a-version"] = version
    if version == V03 and "a2a_hdr_a2a-extensions" in tags:
        tags.setdefault("a2a_hdr_x-a2a-extensions", tags["a2a_hdr_a2a-extensions"])
    answer = rest_translate.RestTranslation(call, version, send)
    if isinstance(send, CardRewrite):  # the extended card: rewritten once translated
        url = send.url
        answer = rest_translate.RestTranslation(call, version, send.send,
                                                card=lambda card: rewrite_card(card, url))
    timeout = request_timeout({"params": payload} if payload else {}, node.settings)
    await forward_binding_call(node, route, caller, answer.send, receive, answer, headers,
                               rpc_method, rpc, timeout, streaming=call.method.streaming,
                               binding="HTTP+JSON", started=started, payload={"params": params})
    await answer.finish()


async def _extended_card(scope: dict[str, Any], send, headers: RequestHeaders, rpc_id: Any,
                         agent_id: str, caller: str, method: str, *, rest_body: bool = False):
    """An extended-card call (A2A's ``GetExtendedAgentCard``): answered only to an
    authenticated caller (an anonymous one, with ``A2A_ALLOW_ANONYMOUS``, gets 401, audited;
    None), and its card rewritten like the public card: the ``send`` that does it."""
    if anonymous_card_call(scope, agent_id, caller, method):
        await _error(send, errors.UNAUTHENTICATED, rpc_id, agent_id, EXTENDED_CARD_ANONYMOUS,
                     extra=[(b"www-authenticate", b'Bearer realm="a2a"')])
        return None
    return CardRewrite(send, gateway_url(scope, headers, agent_id), rest=rest_body)


def anonymous_card_call(scope: dict[str, Any], agent_id: str, caller: str, method: str) -> bool:
    """Whether ``method`` asks for the extended card and ``caller`` is anonymous: then it is
    refused (audited; the caller answers ``unauthenticated``), on every binding."""
    if method in EXTENDED_CARD_METHODS and caller == ANONYMOUS_ID:
        _refused(scope, agent_id, caller, method, errors.UNAUTHENTICATED)
        return True
    return False


# --- callers of other bindings (gateway.grpc_binding) -----------------------------------------


async def admit_binding_call(node: GatewayNode, scope: dict[str, Any], headers: RequestHeaders,
                             caller: BindingCaller, agent_id: str, method: str):
    """Admission of a call that did not come over HTTP, as a JSON-RPC call's: the agent id,
    authentication (the same token cache), authorization, rate limits and the route. ``(client
    id, route)``, or None once the refusal was handed to ``caller`` (and audited)."""
    route = node.table.get(agent_id)
    actor = _fresh_caller(node, route, headers, agent_id)
    if actor is not None:
        if not node.limiter.allow(actor.client_id):
            await _rate_limited(scope, _discard, caller, agent_id, actor.client_id, method)
            return None
        return actor.client_id, route
    return await _admit_to_agent(node, scope, _discard, headers, caller, agent_id, method)


async def refused_webhook(scope: dict[str, Any], agent_id: str, caller: str, method: str,
                          params: Any, *, rest: bool = False) -> str | None:
    """Why a push-notification webhook ``params`` of ``method`` carries is refused
    (:mod:`gateway.push`; the refusal audited), or None: the one check of every binding."""
    if method not in push.METHODS:
        return None
    refused = await push.check(method, params, rest=rest)
    if refused is not None:
        _refused(scope, agent_id, caller, method, errors.WEBHOOK_REFUSED)
    return refused


async def forward_binding_call(node: GatewayNode, route, client_id: str, send, receive,
                               caller: BindingCaller, headers: RequestHeaders, method: str,
                               body: bytes, timeout: float, *, streaming: bool,
                               binding: str, started: float,
                               payload: dict[str, Any] | None = None) -> Exchange:
    """Forward an admitted call (``body``: the JSON-RPC request the agent gets, ``method``:
    its method) the one way every call takes (:func:`_forward`): the agent's answer reaches
    ``send`` as ASGI messages, the gateway's errors ``caller``. Metrics, the console's audit
    and tracing as for a JSON-RPC call; a call cancelled by its caller is recorded too."""
    settings = node.settings
    agent_id = route.agent_id
    metrics.count_request(agent_id, method)
    tags = headers.tags
    tags[env.TAG_METHOD] = method
    tags[env.TAG_TIMEOUT] = repr(timeout)
    tags[env.TAG_CALLER] = client_id
    tags[env.TAG_REQUEST_ID] = f"{_ORIGIN}.{next(_request_ids)}"
    trace = None
    if tracing.ENABLED:
        trace = tracing.start_call(send, agent_id=agent_id, method=method, payload=payload,
                                   request_bytes=len(body), tags=tags, caller=client_id,
                                   node_id=settings.NODE_ID, binding=binding)
        send = trace.send
    exchange = Exchange(send, caller, agent_id)
    try:
        await _forward(node, route, env.query(body, tags), exchange, receive, streaming,
                       timeout)
    except asyncio.CancelledError:
        if not exchange.done:
            exchange.outcome = "client_disconnect"
        raise
    finally:
        seconds = time.perf_counter() - started
        metrics.observe_latency(agent_id, exchange.outcome, seconds)
        recorder.record(agent_id, client_id, method, exchange, len(body), seconds)
        if trace is not None:
            trace.end(exchange.outcome)
    return exchange


async def _answer_stopping(exchange: Exchange) -> bool:
    """A call cancelled by its server: when the node is stopping (its drain ended before the
    call did), answer ``node_stopping`` -- a JSON-RPC error, or a terminal ``event: error`` in
    a stream -- instead of a cut connection or a bare 500, and say the cancellation is handled
    (the server ends the request either way). Executed true: the call had been forwarded."""
    if not node_config.draining():
        return False
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()
    try:
        async with asyncio.timeout(1.0):  # a caller that stopped reading cannot hold the stop
            await exchange.fail(errors.NODE_STOPPING,
                                "the node stopped before the call ended; retry on another node",
                                executed=True)
    except (TimeoutError, OSError):
        pass
    return True


async def _read_rest(first: dict[str, Any], receive, cap: int) -> bytes:
    """The body from its first message on (gateway.bodies.read_body's rules)."""
    if first["type"] == "http.disconnect":
        raise Disconnected
    pending = [first]

    async def replay() -> dict[str, Any]:
        return pending.pop() if pending else await receive()

    return await read_body(replay, cap)


def _invalid_json_detail(content_type: bytes) -> str:
    """The -32700 message: says when the declared media type was not JSON either."""
    media_type = _media_type(content_type)
    if not media_type or _is_json_media_type(media_type):
        return "invalid JSON"
    return f"invalid JSON (Content-Type {media_type.decode('latin-1')} is not JSON)"


def _media_type(content_type: bytes) -> bytes:
    """The media type of a Content-Type value, lower-cased, parameters dropped."""
    return content_type.split(b";", 1)[0].strip().lower()


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
    admitted = await _admit_to_agent(node, scope, send, headers, None, agent_id,
                                     "message/stream")
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
    trace = None
    if tracing.ENABLED:
        trace = tracing.start_call(send, agent_id=agent_id, method="message/stream",
                                   payload=None, request_bytes=0, tags=tags, caller=caller,
                                   node_id=node.settings.NODE_ID)
        send = trace.send
    exchange = Exchange(send, rpc_id, agent_id, node.settings.A2A_ERROR_PROFILE)
    subscriber = _subscriber_of(node, route)
    try:
        if subscriber is _NOWHERE:
            await exchange.fail(errors.UNREACHABLE, "no live subscriber for this agent")
        else:
            await _relay_stream(node, subscriber, env.query(body, tags), exchange, receive,
                                route.node_id)
    except asyncio.CancelledError:
        if not await _answer_stopping(exchange):
            raise
    seconds = time.perf_counter() - started
    metrics.observe_latency(agent_id, exchange.outcome, seconds)
    recorder.record(agent_id, caller, "message/stream", exchange, 0, seconds)
    if trace is not None:
        trace.end(exchange.outcome)


# --- GET /a2a/{agent_id}/stream/{stream_id}: resume (docs/streams.md) -------------------------


async def handle_resume(node: GatewayNode, scope: dict[str, Any], receive, send,
                        agent_id: str, stream_id: str) -> None:
    """Reattach to a resumable stream after a dropped connection: the events after the
    ``Last-Event-ID`` header (or ``last_event_id`` query parameter) are replayed, then the
    stream continues live. Authenticated and authorized like the call that opened it; only the
    client that opened it may resume it (else, as for an unknown or expired stream,
    ``stream_not_found``). Reaches the owning node like any call."""
    started = time.perf_counter()
    headers = scan_request_headers(scope["headers"])
    admitted = await _admit_to_agent(node, scope, send, headers, None, agent_id)
    if admitted is None:
        return
    caller, route = admitted
    last_event_id = _last_event_id(scope)
    last = 0 if last_event_id is None else parse_last_event_id(last_event_id, stream_id)
    if not stream_id or len(stream_id) > 64 or last is None:
        await _error(send, errors.INVALID_REQUEST, None, agent_id,
                     "expected /a2a/{agent_id}/stream/{stream_id} and a Last-Event-ID of that "
                     "stream")
        return
    tags = {
        env.TAG_METHOD: env.RESUME_METHOD,
        env.TAG_STREAM_ID: stream_id,
        env.TAG_LAST_EVENT: str(last),
        env.TAG_CALLER: caller,
        env.TAG_REQUEST_ID: f"{_ORIGIN}.{next(_request_ids)}",
    }
    exchange = Exchange(send, None, agent_id, node.settings.A2A_ERROR_PROFILE)
    subscriber = _subscriber_of(node, route)
    try:
        if subscriber is _NOWHERE:
            await exchange.fail(errors.UNREACHABLE, "no live subscriber for this agent")
        else:
            await _relay_stream(node, subscriber, env.query(b"", tags), exchange, receive,
                                route.node_id)
    except asyncio.CancelledError:
        if not await _answer_stopping(exchange):
            raise
    metrics.observe_latency(agent_id, exchange.outcome, time.perf_counter() - started)


def _last_event_id(scope: dict[str, Any]) -> str | None:
    for name, value in scope["headers"]:
        if name.lower() == b"last-event-id":
            return value.decode("latin-1")
    query = scope.get("query_string") or b""
    if query:
        for key, value in parse_qsl(query.decode("latin-1")):
            if key == "last_event_id":
                return value
    return None


# --- shared steps -----------------------------------------------------------------------------


def _fresh_caller(node: GatewayNode, route, headers: RequestHeaders, agent_id: str):
    """The common case of admission without a coroutine: a known agent (without credential
    passthrough), a client verified within the token cache's lifetime, allowed to call it --
    its actor; else None, and the caller takes :func:`_admit_to_agent` (same checks, same
    answers). The rate limit is the caller's to charge, once either way."""
    if route is None or route.credential_passthrough or AGENT_ID_RE.match(agent_id) is None:
        return None
    actor = node.tokens.fresh_client(headers.authorization)
    if actor is not None and actor.may_call(agent_id):
        return actor
    return None


async def _admit_to_agent(node: GatewayNode, scope, send, headers: RequestHeaders, rpc_id,
                          agent_id, method: str = ""):
    """Check the agent id, the caller and the route: ``(caller id, route)``, or None once the
    refusal has been answered (and audited: :func:`gateway.recorder.refuse`)."""
    if not AGENT_ID_RE.match(agent_id):
        await _error(send, errors.INVALID_REQUEST, rpc_id, None, "invalid agent id")
        return None
    route = node.table.get(agent_id)
    authorization = headers.authorization
    if route is not None and route.credential_passthrough:
        # Credential passthrough: Authorization belongs to the agent and travels unchanged;
        # the caller authenticates to the gateway with X-Gateway-Authorization.
        authorization = headers.gateway_authorization
        if headers.authorization is not None:
            headers.tags[AUTHORIZATION_TAG] = headers.authorization
    caller = await _admit(node, scope, send, authorization, rpc_id, agent_id, method)
    if caller is None:
        return None
    if route is None:
        recorder.refuse(agent_id, caller, method, errors.AGENT_NOT_FOUND,
                        errors.http_status_for(errors.AGENT_NOT_FOUND))
        expired = node.table.expired_at(agent_id)
        await _error(send, errors.AGENT_NOT_FOUND, rpc_id, agent_id,
                     errors.expired_detail(expired) if expired is not None else "")
        return None
    return caller, route


def _gateway_credential(node: GatewayNode, agent_id: str, headers: RequestHeaders):
    """The credential the caller authenticates to the gateway with: ``Authorization``, or
    ``X-Gateway-Authorization`` for an agent with credential passthrough (whose
    ``Authorization`` is the agent's)."""
    route = node.table.get(agent_id)
    if route is not None and route.credential_passthrough:
        return headers.gateway_authorization
    return headers.authorization


async def _authenticated(node: GatewayNode, scope, authorization, send, agent_id: str,
                         rpc_id: Any = None) -> bool:
    """Whether the caller authenticates (answered 401 if not), checked before the body is
    read; ``_admit`` repeats it from the token cache with the request's id."""
    detail = await unauthenticated(node.tokens, authorization)
    if detail is None:
        return True
    _refused(scope, agent_id, None, "", errors.UNAUTHENTICATED)
    # Connection: close, so the server stops reading (and discarding) the unread body.
    await _error(send, errors.UNAUTHENTICATED, rpc_id, agent_id, detail,
                 extra=[(b"www-authenticate", b'Bearer realm="a2a"'), (b"connection", b"close")])
    return False


def _refused(scope, agent_id: str, caller: str | None, method: str, kind: str) -> None:
    """Audit a refused call; a caller not authenticated is named by its address."""
    if caller is None:
        client = scope.get("client")
        caller = f"address:{client[0] if client else '-'}"
    recorder.refuse(agent_id, caller, method, kind, errors.http_status_for(kind))


async def _rate_limited(scope, send, rpc_id, agent_id: str, caller: str | None,
                        method: str) -> None:
    """Answer (and audit) a call refused by a rate limit: 429 with ``Retry-After``."""
    _refused(scope, agent_id, caller, method, errors.RATE_LIMITED)
    await _error(send, errors.RATE_LIMITED, rpc_id, agent_id, "rate limit exceeded",
                 extra=[(b"retry-after", b"1")])


async def _admit(node: GatewayNode, scope, send, authorization, rpc_id,
                 agent_id, method: str = "") -> str | None:
    """Rate-limit by address (calls refused earlier), authenticate, authorize and rate-limit
    by caller: the caller's client id, or None once the refusal has been answered."""
    limiter = node.limiter
    client = scope.get("client")
    address = client[0] if client else "-"
    if limiter.address_blocked(address) and not node.tokens.verified(authorization):
        await _rate_limited(scope, send, rpc_id, agent_id, None, method)
        return None
    try:
        actor = await node.tokens.actor(authorization)
    except AuthUnavailable as exc:
        await _error(send, errors.AUTH_UNAVAILABLE, rpc_id, agent_id, str(exc),
                     extra=[(b"retry-after", b"1")])
        return None
    except AuthFailed as exc:
        limiter.charge_refused(address)
        _refused(scope, agent_id, None, method, errors.UNAUTHENTICATED)
        await _error(send, errors.UNAUTHENTICATED, rpc_id, agent_id, str(exc),
                     extra=[(b"www-authenticate", b'Bearer realm="a2a"')])
        return None
    if actor is None:
        limiter.charge_refused(address)
        _refused(scope, agent_id, None, method, errors.UNAUTHENTICATED)
        await _error(send, errors.UNAUTHENTICATED, rpc_id, agent_id,
                     UNAUTHENTICATED_MESSAGE,
                     extra=[(b"www-authenticate", b'Bearer realm="a2a"')])
        return None
    if not actor.may_call(agent_id):
        _refused(scope, agent_id, actor.client_id, method, errors.FORBIDDEN)
        await _error(send, errors.FORBIDDEN, rpc_id, agent_id,
                     f"this client may not call {agent_id}")
        return None
    key = actor.client_id if not actor.is_anonymous else f"anonymous:{address}"
    if not limiter.allow(key):
        await _rate_limited(scope, send, rpc_id, agent_id, actor.client_id, method)
        return None
    return actor.client_id


def _subscriber_of(node: GatewayNode, route) -> Any:
    """The route's subscriber in this process; None when another node owns it (reached
    through the broker); :data:`_NOWHERE` when no subscriber can answer."""
    if route.node_id == node.settings.NODE_ID:
        return node.manager.subscribers.get(route.agent_id) or _NOWHERE
    if not node.cross_process or route.node_id in node.dead_nodes:
        return _NOWHERE  # the owner is down: nothing is sent (its agents are being adopted)
    return None


async def _remote_sync(node, query, exchange: Exchange, wait: float, owner: str) -> None:
    """Send the Query through the broker and relay the reply messages as they come. The call
    ends at once (``owner_lost``) if the owning node is found dead meanwhile."""
    tags = query["tags"]
    request_id = tags[env.TAG_REQUEST_ID]
    # Bounded: an agent answering a sync method with an endless event stream, to a caller that
    # does not read, must not grow this node (replies beyond the response cap end the call).
    queue = StreamBuffer(node.settings.A2A_MAX_RESPONSE_BYTES)
    received = await _send_query(node, query, queue, exchange)
    if received is None:
        return
    calls = node.inflight.get(owner)
    if calls is None:
        calls = node.inflight[owner] = {}
    calls[request_id] = queue.push
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
                    # No subscriber acknowledged it. With a checked send one received it (a
                    # loaded owner, or one in a handover's standby): it may have run, so never
                    # executed false then.
                    await exchange.fail(errors.UNREACHABLE, "no live subscriber for this agent",
                                        executed=received)
                else:  # the subscriber had it: the agent may have it (a reply lost between nodes)
                    await exchange.fail(errors.TIMEOUT, executed=True)
                return
            if message is OVERFLOW:  # the agent's answer outgrew the cap: it had the request
                await exchange.fail(errors.RESPONSE_TOO_LARGE, executed=True)
                return
            if message is OWNER_LOST:
                # The Query was published while the owner was up: it may have reached the
                # agent (acked or not yet), so executed is true (docs/operations.md).
                await exchange.fail(errors.OWNER_LOST, f"node {owner} died during the call",
                                    executed=True)
                return
            if message is BROKER_LOST:  # the reply may be lost with the connection
                await exchange.fail(errors.BROKER_LOST, node.broker_lost_detail, executed=True)
                return
            if message is STREAM_GAP:  # part of the reply was lost between the nodes
                await exchange.fail(errors.STREAM_GAP, GAP_DETAIL, executed=True)
                return
            acked = True
            await exchange.deliver(message)
    finally:
        node.inbox.pending.pop(request_id, None)
        _forget_call(node, owner, request_id)


def _forget_call(node, owner: str, request_id: str) -> None:
    calls = node.inflight.get(owner)
    if calls is not None:
        calls.pop(request_id, None)
        if not calls and node.inflight.get(owner) is calls:
            del node.inflight[owner]


_PIECES = str(env.PIECE_BYTES)


async def _send_query(node, query, queue: StreamBuffer, exchange: Exchange,
                      credit: _Credit | None = None) -> bool | None:
    """Publish the Query on the agent's channel. None: refused and answered (no broker, or
    nobody listens); True: a subscriber received it (a checked send); False: sent, and
    whether anyone received it is unknown (channels-redis's layers) until an ack comes."""
    tags = query["tags"]
    if not node.inbox.ready:
        await exchange.fail(errors.UNREACHABLE, "broker unavailable")
        return None
    tags[env.TAG_REPLY_CHANNEL] = node.inbox.channel
    # Numbered, large bodies in pieces (gateway.envelope): joined in order here, and a lost
    # message ends the call.
    tags[env.TAG_PIECES] = _PIECES
    reassembly = Reassembly(queue.put_nowait, queue.push,
                            node.settings.A2A_MAX_RESPONSE_BYTES + env.PIECE_BYTES)
    if credit is not None:
        reassembly.on_piece = credit.received
    node.inbox.pending[tags[env.TAG_REQUEST_ID]] = reassembly
    try:
        listeners = await node.layer.send(agent_channel(exchange.agent_id), query)
    except Exception as exc:  # broker down: answer at once, never queue
        node.inbox.pending.pop(tags[env.TAG_REQUEST_ID], None)
        await exchange.fail(errors.UNREACHABLE, f"broker unavailable: {type(exc).__name__}")
        return None
    # A checked send (gateway.redis_layer returns how many processes got it; channels-redis's
    # layers return None, and the missing ack answers instead, after ACK_TIMEOUT_SECONDS).
    if listeners == 0:
        node.inbox.pending.pop(tags[env.TAG_REQUEST_ID], None)
        await exchange.fail(errors.UNREACHABLE, "no live subscriber for this agent")
        return None
    if listeners is None:
        return False
    if listeners > 1:
        logger.warning("%d subscribers got the query for %s: more than one owner",
                       listeners, exchange.agent_id)
    return True


_DISCONNECT: dict[str, Any] = {"k": "disconnect"}
_REVOKED: dict[str, Any] = {"k": "revoked"}


async def _relay_stream(node, subscriber, query, exchange: Exchange, receive,
                        owner: str) -> None:
    """Relay a stream: reply messages in, SSE (or an up-front JSON answer) out, while watching
    for the caller going away (then the subscriber is told to cancel the stream).

    Backpressure end to end: at most ``A2A_SSE_BUFFER_BYTES`` wait for the caller
    (:class:`~gateway.sse.StreamBuffer`); the local subscriber waits for room, and through the
    broker the owner sends at most that window ahead of what the caller has read (``stream_credit``
    messages move it on), so the agent is no longer read while the caller lags. A caller whose
    connection takes nothing for ``A2A_SSE_STALL_TIMEOUT_SECONDS`` gets a terminal
    ``stream_stalled`` error event and the stream is freed on both sides.

    Through the broker, the owning node dying ends the stream with ``owner_lost`` as soon as
    its liveness key expires, or once an event stream misses two keepalives, whichever first;
    this node losing its connection to the broker ends it at once with ``broker_lost``; a reply
    message lost between the nodes (gateway.inbox.Reassembly) ends it with ``stream_gap``, or,
    for a resumable stream, re-attaches it after the last event relayed (:class:`_Reattach`).
    """
    tags = query["tags"]
    request_id = tags[env.TAG_REQUEST_ID]
    settings = node.settings
    window = settings.A2A_SSE_BUFFER_BYTES
    stall = settings.A2A_SSE_STALL_TIMEOUT_SECONDS
    buffer = StreamBuffer(window)
    remote = subscriber is None or not settings.A2A_LOCAL_FAST_PATH
    credit: _Credit | None = None
    received: bool | None = None
    if remote:
        tags[env.TAG_WINDOW] = str(window)
        credit = _Credit(node, query, exchange.agent_id, window)
        received = await _send_query(node, query, buffer, exchange, credit)
        if received is None:
            return
        calls = node.inflight.get(owner)
        if calls is None:
            calls = node.inflight[owner] = {}
        calls[request_id] = buffer.push
    else:
        await subscriber.handle(query, buffer.put, local=True)
    exchange.send = flow_controlled(exchange.send)

    gone = False

    async def watch() -> None:
        nonlocal gone
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                gone = True  # handled before anything still buffered for the caller
                buffer.push(_DISCONNECT)
                return

    stopped = False

    async def stop() -> None:
        nonlocal stopped
        stopped = True
        if not remote:
            buffer.close()  # a resumable stream's writer must not wait on a caller who left
        await _cancel_stream(node, subscriber, query, exchange.agent_id, remote)

    loop = asyncio.get_running_loop()
    watcher = loop.create_task(watch())
    # A client revoked while its stream is open: the stream ends within the cache delay.
    unwatch = node.tokens.watch_client(tags.get(env.TAG_CALLER, ""),
                                       lambda: buffer.push(_REVOKED))
    buffer_seconds = settings.A2A_GATEWAY_TIMEOUT_BUFFER_SECONDS
    guard = settings.A2A_SSE_IDLE_TIMEOUT_SECONDS + buffer_seconds
    # An event stream relayed through the broker gets a keepalive at least every
    # A2A_SSE_KEEPALIVE_SECONDS from its owner: two missed ones mean the owner is gone.
    missed = 2 * settings.A2A_SSE_KEEPALIVE_SECONDS + buffer_seconds
    acked = not remote
    # Resumable streams through the broker: what a re-attach after a gap needs.
    reattach = _Reattach(tags) if remote and settings.A2A_SSE_RESUME_SECONDS > 0 \
        and tags.get(env.TAG_METHOD) != env.RESUME_METHOD else None
    resuming = False  # re-attached: the owner's start is not relayed again

    async def resume_stream(*, outage: bool) -> bool:
        """Re-attach a resumable stream after the last event relayed (docs/streams.md):
        a ``stream_resume`` of a new request replaces the current one. ``outage``: the broker
        was lost; wait (at most REATTACH_SECONDS) until this node is subscribed again and the
        owner listens. False: not resumable here, or it could not be sent."""
        nonlocal query, tags, request_id, buffer, credit, stopped, resuming, acked
        if reattach is None or not reattach.last or reattach.tries >= REATTACH_TRIES \
                or not exchange.started:
            return False
        reattach.tries += 1
        node.inbox.pending.pop(request_id, None)
        _forget_call(node, owner, request_id)
        if not outage or not reattach.until:  # one wait per outage, whatever the tries
            reattach.until = loop.time() + REATTACH_SECONDS
        deadline = reattach.until
        while True:
            if gone:
                return False
            if not outage or _subscribed(node):
                query = reattach.query(query)
                tags = query["tags"]
                request_id = tags[env.TAG_REQUEST_ID]
                buffer = StreamBuffer(window)
                credit = _Credit(node, query, exchange.agent_id, window)
                if await _reattach(node, query, buffer, credit, exchange):
                    break
                if not outage:
                    return False
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(0.25)
        stopped = False
        resuming = True
        acked = False
        calls = node.inflight.get(owner)
        if calls is None:
            calls = node.inflight[owner] = {}
        calls[request_id] = buffer.push
        return True

    try:
        while not exchange.done:
            if not acked:
                limit = ACK_TIMEOUT_SECONDS
            elif remote and exchange.sse:
                limit = min(guard, missed)
            else:
                limit = guard
            try:
                async with asyncio.timeout(limit):
                    message = await buffer.get()
            except TimeoutError:
                if resuming and not acked and await resume_stream(outage=True):
                    continue  # the re-attach's answer was lost too (the broker was not back)
                if remote and exchange.sse and limit < guard:
                    await exchange.fail(errors.OWNER_LOST, "two keepalives missed",
                                        executed=True)
                elif exchange.started:
                    await exchange.fail(errors.TIMEOUT, "stream lost")
                else:
                    await exchange.fail(errors.UNREACHABLE if not acked else errors.TIMEOUT,
                                        "no live subscriber for this agent",
                                        executed=acked or bool(received))
                await stop()
                return
            if message is _DISCONNECT or gone:
                exchange.outcome = "client_disconnect"
                await stop()
                return
            if message is OVERFLOW:
                await stop()
                await _end_stalled(exchange, stall,
                                   f"more than {window} bytes buffered for the caller")
                return
            if message is OWNER_LOST:
                # Published while the owner was up: it may have reached the agent.
                await exchange.fail(errors.OWNER_LOST, f"node {owner} died during the stream",
                                    executed=True)
                return
            if message is BROKER_LOST:
                # Events published while the connection was down are gone: never relay around
                # that gap. A resumable stream is re-attached once the broker is back (within
                # REATTACH_SECONDS); else it ends now, and the owner is told to cancel (if
                # Redis is back by then).
                if reattach is not None:
                    reattach.until = 0.0  # a new outage: a new wait
                if await resume_stream(outage=True):
                    continue
                await exchange.fail(errors.BROKER_LOST, node.broker_lost_detail, executed=True)
                await stop()
                return
            if message is STREAM_GAP or (resuming and message.get("k") == env.ERROR):
                # A message from the owner went missing (its number skipped): never relay
                # around it. A resumable stream is re-attached after the last event relayed
                # (the owner's replay buffer has the rest); else, or if that fails, the stream
                # ends saying events may be missing, and the owner's stream is cancelled.
                await stop()
                if message is STREAM_GAP and await resume_stream(outage=False):
                    continue
                await exchange.fail(errors.STREAM_GAP, GAP_DETAIL, executed=True)
                return
            if resuming:
                if message.get("k") == env.START:
                    continue  # the caller has the response's start already
                resuming = False
            if message is _REVOKED:
                await stop()
                try:  # a terminal error event, if the caller's connection takes one
                    async with asyncio.timeout(min(max(stall, 1.0), 5.0)):
                        await exchange.fail(errors.UNAUTHENTICATED, "token revoked")
                except TimeoutError:
                    pass
                return
            acked = True
            try:
                async with asyncio.timeout(stall):
                    await exchange.deliver(message)
            except TimeoutError:
                await stop()
                await _end_stalled(exchange, stall, f"the caller read nothing for {stall:g} s")
                return
            if credit is not None:
                body = message.get("body")
                if body:
                    credit.delivered(len(body))
                    if reattach is not None:
                        reattach.relayed(body)
                elif reattach is not None and message.get("k") == env.START and exchange.sse:
                    reattach.started(message)
        if exchange.mapped:  # answered already; the rest of the agent's body is not wanted
            await stop()
    finally:
        unwatch()
        watcher.cancel()
        if not stopped and not (exchange.done and not exchange.mapped):
            # Left early (the server cancelled this task: Daphne does after a disconnect): a
            # subscriber waiting for room in the buffer must not wait forever.
            if remote:
                _background(loop, _cancel_stream(node, subscriber, query, exchange.agent_id,
                                                 remote))
            else:
                subscriber.cancel_stream(request_id)
        close = getattr(exchange.send, "close", None)
        if close is not None:
            close()
        if remote:
            node.inbox.pending.pop(request_id, None)
            _forget_call(node, owner, request_id)


#: How many times one stream is re-attached after gaps before it ends with ``stream_gap``.
REATTACH_TRIES = 3
#: After the broker was lost, how long a resumable stream waits for it to be back before it
#: ends with ``broker_lost`` (within the keepalive window the other endings keep).
REATTACH_SECONDS = 12.0


def _subscribed(node) -> bool:
    """Whether this node's subscription to the broker is up (layers that cannot tell: yes)."""
    check = getattr(node.layer, "subscribed", None)
    return True if check is None else bool(check())


class _Reattach:
    """A resumable stream relayed through the broker: its stream id (from the owner's start)
    and the id of the last event relayed, so that after a gap the entry node can resume it
    from the owner's replay buffer (a ``stream_resume`` Query, as a reconnecting caller's)."""

    __slots__ = ("caller", "stream_id", "last", "tries", "until")

    def __init__(self, tags: dict[str, str]) -> None:
        self.caller = tags.get(env.TAG_CALLER, "")
        self.stream_id = ""
        self.last = 0
        self.tries = 0
        self.until = 0.0  # after a broker loss: the re-attach's deadline

    def started(self, message: dict[str, Any]) -> None:
        for name, value in message["headers"]:
            if name == STREAM_ID_HEADER:
                self.stream_id = value.decode("latin-1")

    def relayed(self, body: bytes) -> None:
        """The owner appends ``id: <stream id>:<n>`` to each whole event (gateway.resume)."""
        if not self.stream_id:
            return
        at = body.rfind(b"\nid: ")
        if at < 0:
            return
        line = body[at + 5:body.find(b"\n", at + 5)]
        _, _, number = line.partition(b":")
        if line.startswith(self.stream_id.encode()) and number.isdigit():
            self.last = int(number)

    def query(self, previous: dict[str, Any]) -> dict[str, Any]:
        return env.query(b"", {
            env.TAG_METHOD: env.RESUME_METHOD,
            env.TAG_STREAM_ID: self.stream_id,
            env.TAG_LAST_EVENT: str(self.last),
            env.TAG_CALLER: self.caller,
            env.TAG_REQUEST_ID: f"{_ORIGIN}.{next(_request_ids)}",
            env.TAG_WINDOW: previous["tags"].get(env.TAG_WINDOW, ""),
        })


async def _reattach(node, query, buffer: StreamBuffer, credit: _Credit,
                    exchange: Exchange) -> bool:
    """Send a re-attach Query (after the previous request's stream_cancel, on the same
    connection, so the owner detaches first). False: it could not be sent."""
    tags = query["tags"]
    if not node.inbox.ready:
        return False
    tags[env.TAG_REPLY_CHANNEL] = node.inbox.channel
    tags[env.TAG_PIECES] = _PIECES
    reassembly = Reassembly(buffer.put_nowait, buffer.push,
                            node.settings.A2A_MAX_RESPONSE_BYTES + env.PIECE_BYTES)
    reassembly.on_piece = credit.received
    node.inbox.pending[tags[env.TAG_REQUEST_ID]] = reassembly
    try:
        listeners = await node.layer.send(agent_channel(exchange.agent_id), query)
    except Exception as exc:
        logger.warning("re-attaching a stream after a gap failed: %s", exc)
        listeners = 0
    if listeners == 0:
        node.inbox.pending.pop(tags[env.TAG_REQUEST_ID], None)
        return False
    logger.warning("stream to %s re-attached after event %s: messages were lost between "
                   "the nodes", exchange.agent_id, tags[env.TAG_LAST_EVENT])
    return True


_background_tasks: set[asyncio.Task] = set()


def _background(loop, coro) -> None:
    task = loop.create_task(coro)
    _background_tasks.add(task)
    task.add_done_callback(_background_tasks.discard)


async def _end_stalled(exchange: Exchange, stall: float, detail: str) -> None:
    """End a stream whose caller stopped reading with a terminal error event and the
    response's end. Under uvicorn and Daphne the last message never waits for the connection
    to drain (:func:`gateway.sse.flow_controlled`): both buffer it, so a caller that reads
    again gets the same ending on both. Another server gets the stall timeout (at least 1 s,
    at most 5 s) for it, else the response is abandoned."""
    exchange.outcome = errors.STREAM_STALLED
    logger.warning("stream to %s ended: %s", exchange.agent_id, detail)
    try:
        async with asyncio.timeout(min(max(stall, 1.0), 5.0)):
            # the agent's stream was flowing: it had the request
            await exchange.fail(errors.STREAM_STALLED, detail, executed=True)
    except TimeoutError:
        pass


class _Credit:
    """The caller's side of a stream's flow control through the broker: tells the owning
    subscriber how many body bytes the caller has taken, and how many bytes of pieced messages
    this node has taken from the broker (both cumulative, so a lost credit is made good by the
    next one), every quarter window of either.

    Sent from a task of its own, one at a time (a later total replaces an unsent one): the
    relay never waits on a publish, so a caller leaving is acted on at once even while the
    layer's publishes queue up (the Redis pub/sub layer publishes one message at a time per
    connection)."""

    __slots__ = ("node", "tags", "agent_id", "step", "total", "reported", "got",
                 "got_reported", "_sending")

    def __init__(self, node, query, agent_id: str, window: int) -> None:
        self.node = node
        self.tags = query["tags"]
        self.agent_id = agent_id
        self.step = max(window // 4, 1)
        self.total = 0
        self.reported = 0
        # bytes of pieced messages taken from the broker (gateway.inbox.Reassembly)
        self.got = 0
        self.got_reported = 0
        self._sending = False

    def delivered(self, size: int) -> None:
        self.total += size
        self._maybe_send()

    def received(self, size: int) -> None:
        self.got += size
        self._maybe_send()

    def _due(self) -> bool:
        return (self.total - self.reported >= self.step
                or self.got - self.got_reported >= self.step)

    def _maybe_send(self) -> None:
        if self._sending or not self._due():
            return
        self._sending = True
        _background(asyncio.get_running_loop(), self._send())

    async def _send(self) -> None:
        try:
            while self._due():
                self.reported = self.total
                self.got_reported = self.got
                await self._publish(self.total, self.got)
        finally:
            self._sending = False

    async def _publish(self, total: int, got: int) -> None:
        tags = self.tags
        message = env.query(b"", {
            env.TAG_METHOD: env.CREDIT_METHOD,
            env.TAG_STREAM_ID: tags[env.TAG_REQUEST_ID],
            env.TAG_CREDIT: str(total),
            env.TAG_RECEIVED: str(got),
            env.TAG_REQUEST_ID: tags[env.TAG_REQUEST_ID] + ".credit",
            env.TAG_REPLY_CHANNEL: tags.get(env.TAG_REPLY_CHANNEL, ""),
        })
        try:
            await self.node.layer.send(agent_channel(self.agent_id), message)
        except Exception as exc:  # the next credit carries the total; the stall timeout bounds
            logger.warning("stream_credit not delivered: %s", exc)


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

    # status / nbytes: what the caller got (HTTP status, response bytes), for the console.
    # outcome: "ok", "agent_error" (the agent answered an HTTP error status, or a JSON-RPC
    # error: gateway.jsonrpc.is_error_reply on a whole body or the head of a large one,
    # events_have_error on each chunk of an event stream), or the gateway's error kind.
    # watch: what is still looked at for an agent error (_WATCH_* below).
    __slots__ = ("send", "rpc_id", "agent_id", "profile", "started", "done", "sse", "outcome",
                 "mapped", "status", "nbytes", "watch")

    def __init__(self, send, rpc_id: Any, agent_id: str, profile: str = "a2a") -> None:
        self.send = send
        self.rpc_id = rpc_id
        self.agent_id = agent_id
        self.profile = profile  # the node's A2A_ERROR_PROFILE
        self.started = False
        self.done = False
        self.sse = False
        self.outcome = "unknown"
        self.mapped = False  # the agent's error status was answered as a JSON-RPC error
        self.status = 0
        self.nbytes = 0
        self.watch = _WATCH_NONE

    async def deliver(self, message: dict[str, Any]) -> None:
        kind = message["k"]
        send = self.send
        if self.done or (kind == env.START and self.started) or (
            kind == env.CHUNK and not self.started
        ):
            # A duplicate or out-of-order reply (e.g. two nodes misconfigured with one NODE_ID
            # both answering): the caller's response is already decided; never break it.
            if kind != env.ACK and not self.mapped:
                logger.warning("ignored an unexpected %s reply for %s", kind, self.agent_id)
            return
        if kind == env.START:
            status = message["status"]
            if status >= 400 and self.profile == "kubemq" and not message["sse"] \
                    and self.rpc_id is not REST and not _is_jsonrpc_answer(message):
                await self._agent_status_error(status, message["more"])
                return
            body = message["body"]
            more = message["more"]
            if not more and status not in (204, 304):
                headers = [*message["headers"], EXECUTED_TRUE, _agent_status(status),
                           (b"content-length", b"%d" % len(body))]
            else:
                headers = [*message["headers"], EXECUTED_TRUE, _agent_status(status)]
            self.started = True
            self.status = status
            self.nbytes = len(body)
            if message["sse"]:
                # Events answer any method (the agent's Content-Type decides): the caller's
                # send must wait while its connection is full, on Daphne too.
                self.sse = True
                if more:
                    self.send = send = flow_controlled(send)
            if status >= 400:
                self.outcome = "agent_error"
            elif not more:
                error = events_have_error(body) if self.sse else is_error_reply(body)
                self.outcome = "agent_error" if error else "ok"
            else:
                self.outcome = "ok"
                self.watch = _WATCH_EVENTS if self.sse else _WATCH_HEAD
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": body, "more_body": more})
            self.done = not more
        elif kind == env.CHUNK:
            more = message["more"]
            body = message["body"]
            self.nbytes += len(body)
            watch = self.watch
            if watch and body:
                if watch == _WATCH_HEAD:  # a large body: its first piece holds the head
                    self.watch = _WATCH_NONE
                    if is_error_reply(body):
                        self.outcome = "agent_error"
                elif events_have_error(body):
                    self.watch = _WATCH_NONE
                    self.outcome = "agent_error"
            await send({"type": "http.response.body", "body": body, "more_body": more})
            self.done = not more
        elif kind == env.ERROR:
            await self.fail(message["kind"], message.get("detail") or "",
                            status=message.get("status"), executed=message.get("executed", False))
        # acks carry nothing for the caller

    async def _agent_status_error(self, status: int, more: bool) -> None:
        """Profile kubemq: the agent's HTTP error status (its body not a JSON-RPC answer)
        becomes HTTP 200 with a JSON-RPC error, as KubeMQ documents (error-codes.md): 502 and
        503 -> -32603 "unavailable", 504 -> -32001 "timeout", any other -> -32603 naming the
        status. The agent answered, so executed is true."""
        if status in (502, 503):
            kind, detail = errors.UPSTREAM_UNAVAILABLE, ""
        elif status == 504:
            kind, detail = errors.TIMEOUT, ""
        else:
            kind, detail = errors.AGENT_ERROR, f"agent error: HTTP {status}"
        self.started = True
        self.done = True
        self.mapped = more  # the rest of the agent's body is dropped quietly
        self.outcome = "agent_error"
        body = orjson.dumps({
            "jsonrpc": "2.0", "id": self.rpc_id,
            "error": errors.error_object(kind, agent_id=self.agent_id, detail=detail,
                                         status=status, executed=True),
        })
        await self.send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            EXECUTED_TRUE, (b"x-a2a-agent-status", str(status).encode()),
        ]})
        await self.send({"type": "http.response.body", "body": body})

    async def fail(self, kind: str, detail: str = "", *, status: int | None = None,
                   executed: bool = False) -> None:
        """Answer a transport error: a JSON-RPC error before the reply started, a terminal
        ``event: error`` inside an event stream, an aborted body otherwise."""
        if self.done:
            return
        self.done = True
        if self.outcome in ("unknown", "ok", "agent_error"):
            self.outcome = kind
        if isinstance(self.rpc_id, BindingCaller):  # the binding answers in its own form
            self.status = errors.rest_status_for(kind)
            await self.rpc_id.gateway_error(kind, self.agent_id, detail, status=status,
                                            executed=executed or self.started, extra=None)
            return
        if not self.started:
            self.status = errors.rest_status_for(kind) if self.rpc_id is REST \
                else errors.http_status_for(kind)
            extra = [(b"x-a2a-agent-status", str(status).encode())] if status else []
            await _error(self.send, kind, self.rpc_id, self.agent_id, detail, extra=extra,
                         status=status, executed=executed)
            return
        if self.sse:
            if self.rpc_id is REST:  # the binding's stream error: data is a google.rpc.Status
                event = error_event(errors.rest_error_object(
                    kind, agent_id=self.agent_id, detail=detail, status=status, executed=True))
            else:
                error = errors.error_object(kind, agent_id=self.agent_id, detail=detail,
                                            status=status, executed=True)
                event = error_event({"jsonrpc": "2.0", "id": self.rpc_id, "error": error})
            await self.send({"type": "http.response.body", "body": event, "more_body": False})
            return
        # A plain body cut short cannot be answered any more: returning without completing the
        # response makes the server close the connection, so the caller sees the truncation.


#: What an Exchange still looks at for the agent's JSON-RPC error: nothing, the first piece
#: of a large body (its head), every chunk of an event stream.
_WATCH_NONE, _WATCH_HEAD, _WATCH_EVENTS = 0, 1, 2

_AGENT_STATUS: dict[int, tuple[bytes, bytes]] = {}


def _agent_status(status: int) -> tuple[bytes, bytes]:
    """The ``X-A2A-Agent-Status`` header of ``status``, built once per status code."""
    header = _AGENT_STATUS.get(status)
    if header is None:
        header = (b"x-a2a-agent-status", b"%d" % status)
        if 100 <= status < 1000:  # a bounded set of keys, whatever the agent answers
            _AGENT_STATUS[status] = header
    return header


def _is_jsonrpc_answer(message: dict[str, Any]) -> bool:
    """Whether a whole reply body is a JSON-RPC 2.0 response (relayed as the agent sent it)."""
    if message["more"]:
        return False  # larger than the subscriber reads whole: not a JSON-RPC error body
    try:
        answer = orjson.loads(message["body"])
    except orjson.JSONDecodeError:
        return False
    return isinstance(answer, dict) and answer.get("jsonrpc") == "2.0" and (
        "error" in answer or "result" in answer)


async def _error(send, kind: str, rpc_id: Any, agent_id: str | None, detail: str = "", *,
                 extra: list | None = None, status: int | None = None,
                 executed: bool = False) -> None:
    """Answer a gateway error: a JSON-RPC error with the caller's id, or, for an HTTP+JSON call
    (``rpc_id`` is :data:`REST`), the binding's ``google.rpc.Status`` form and HTTP status."""
    if isinstance(rpc_id, BindingCaller):  # not HTTP: the binding answers in its own form
        await rpc_id.gateway_error(kind, agent_id, detail, status=status, executed=executed,
                                   extra=extra)
        return
    if rpc_id is REST:
        body = errors.rest_error_body(kind, agent_id=agent_id, detail=detail, status=status,
                                      executed=executed)
        http_status = errors.rest_status_for(kind)
    else:
        body = errors.error_body(kind, rpc_id=rpc_id, agent_id=agent_id, detail=detail,
                                 status=status, executed=executed)
        http_status = errors.http_status_for(kind)
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        EXECUTED_TRUE if executed else EXECUTED_FALSE,
    ]
    if extra:
        headers.extend(extra)
    await send({"type": "http.response.start", "status": http_status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _plain(send, status: int, body: bytes, extra: list | None = None) -> None:
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode()), EXECUTED_FALSE]
    if extra:
        headers.extend(extra)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
