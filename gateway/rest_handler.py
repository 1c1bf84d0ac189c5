"""The A2A HTTP+JSON binding's entry: every path under ``/a2a/{agent_id}/`` that
:mod:`gateway.rest` routes (:func:`handle_rest`).

The same admission, subscriber and replies as a JSON-RPC call, with the caller's HTTP method
and path in the Query's tags, forwarded to the agent's HTTP+JSON interface -- or, for an agent
without one, translated to its JSON-RPC (:mod:`gateway.rest_translate`,
:func:`_translated_rest`) -- and the gateway's errors in that binding's form
(``google.rpc.Status`` JSON, the HTTP status of docs/gateway.md's table).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import orjson
from a2a.types import a2a_pb2 as pb

from gateway import agent_bindings, errors, push, rest, rest_translate, resume, tracing
from gateway import envelope as env
from gateway.admission import (
    admit_call,
    extended_card,
    read_call_body,
    refused,
    refused_webhook,
    relay_base,
    stream_slot,
)
from gateway.bodies import Receive, Send
from gateway.cards import EXTENDED_CARD_METHODS, CardRewrite, rewrite_card
from gateway.exchange import REST, send_error
from gateway.forwarding import forward_binding_call, forward_call
from gateway.grpc_binding import outbound_translate
from gateway.headers import RequestHeaders, scan_request_headers
from gateway.jsonrpc import LAZY_ABOVE_BYTES, invalid_json_detail, parse_request
from gateway.limits import request_timeout
from gateway.relays import request_numbers
from gateway.translation import CORE, V03, TranslationError, Unsupported, agent_request
from registry.events import AgentRoute

if TYPE_CHECKING:
    from gateway.runtime import GatewayNode

logger = logging.getLogger(__name__)


async def handle_rest(node: GatewayNode, scope: dict[str, Any], receive: Receive, send: Send,
                      agent_id: str, tail: str, method: str) -> None:
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
    body = await read_call_body(node, scope, receive, send, headers, agent_id, REST)
    if body is None:
        return
    payload: Any = None
    if body:
        try:
            # Above 16 KiB validated whole but built only as far as the timeout (as JSON-RPC
            # bodies are); tracing reads the ids, so it takes the whole parse.
            payload = orjson.loads(body) if len(body) <= LAZY_ABOVE_BYTES \
                else parse_request(body, whole=tracing.ENABLED, rest=True)
        except orjson.JSONDecodeError:
            await send_error(send, errors.PARSE_ERROR, REST, agent_id,
                             invalid_json_detail(headers.content_type))
            return
        if not isinstance(payload, dict):
            await send_error(send, errors.INVALID_REQUEST, REST, agent_id,
                             "the request body must be a JSON object")
            return
    admitted = await admit_call(node, scope, send, headers, REST, agent_id, method)
    if admitted is None:
        return
    caller, route = admitted
    slot = await stream_slot(node, scope, send, REST, agent_id, caller, route,
                             method)
    if slot is None:
        return
    try:
        if method in push.CONFIG_ANSWERS:
            send = push.ConfigAnswer(send, agent_id, caller)
        if method in EXTENDED_CARD_METHODS:
            rewrite = await extended_card(scope, send, headers, REST, agent_id, caller, method,
                                          rest_body=bool(route.http_json_endpoint))
            if rewrite is None:
                return
            send = rewrite
        # HOOK (gRPC-only agent): translated to its gRPC server, as in handler.handle_rpc.
        if outbound_translate.is_grpc_target(route.endpoint):
            await outbound_translate.answer_rest(
                send, receive, route=route, caller=caller, tags=headers.tags, tail=tail,
                method=method, query=scope.get("query_string") or b"", body=body, started=started,
                timeout=request_timeout({"params": payload} if payload else {}, node.settings),
                check_webhook=lambda name, params: refused_webhook(
                    scope, agent_id, caller, name, params,
                    relay_base=relay_base(node, route, scope, headers)))
            return
        if not route.http_json_endpoint:  # translated to the agent's JSON-RPC
            await _translated_rest(node, scope, receive, send, route, caller, headers, tail,
                                   method, body, payload, started)
            return
        path = rest.forwarded_path(scope, agent_id, tail)
        if path is None:
            await send_error(send, errors.INVALID_REQUEST, REST, agent_id,
                             "the path or query holds characters an HTTP request line cannot carry")
            return
        if payload and method in push.METHODS and push.may_carry(method, body):
            whole = payload if len(body) <= LAZY_ABOVE_BYTES else orjson.loads(body)
            base = relay_base(node, route, scope, headers)
            why = await refused_webhook(scope, agent_id, caller, method, whole, rest=True,
                                        relay_base=base)
            if why is not None:
                await send_error(send, errors.WEBHOOK_REFUSED, REST, agent_id, why)
                return
            if base is not None and push.carries(method, whole, rest=True):
                payload, body = whole, orjson.dumps(whole)  # the configs point at the relay
        # The body read as JSON-RPC's params: its timeout, and what tracing reads the ids from.
        params = {"params": payload} if payload else None
        timeout = request_timeout(params or {}, settings)
        await forward_call(node, route, send, receive, REST, caller, headers.tags, method, body,
                           timeout, streaming=method in rest.STREAMING, started=started,
                           payload=params, binding="HTTP+JSON",
                           profile=settings.A2A_ERROR_PROFILE,
                           extra_tags={env.TAG_HTTP_METHOD: scope["method"],
                                       env.TAG_HTTP_PATH: path})
    finally:
        slot.release()


async def _translated_rest(node: GatewayNode, scope: dict[str, Any], receive: Receive,
                           send: Send, route: AgentRoute, caller: str, headers: RequestHeaders,
                           tail: str, method: str, body: bytes, payload: Any,
                           started: float) -> None:
    """An HTTP+JSON call to an agent without an HTTP+JSON interface: translated to its
    JSON-RPC (:mod:`gateway.rest_translate`) and forwarded the one way every call takes."""
    agent_id = route.agent_id
    try:
        call = rest_translate.rest_call(tail, method, scope.get("query_string") or b"", body)
    except TranslationError as exc:
        await send_error(send, errors.INVALID_REQUEST, REST, agent_id, str(exc))
        return
    try:
        bindings = await agent_bindings.bindings(route)
    except Exception as exc:
        logger.warning("HTTP+JSON: the card of %s cannot be read: %s", agent_id, exc)
        await send_error(send, errors.UNREACHABLE, REST, agent_id,
                         "the agent's card cannot be read now; retry")
        return
    version = bindings.jsonrpc
    try:
        rpc_method, params = agent_request(call.method, call.request, version,
                                           tenant=call.tenant)
    except Unsupported:
        refused(scope, agent_id, caller, method, errors.BINDING_UNAVAILABLE)
        await send_error(send, errors.BINDING_UNAVAILABLE, REST, agent_id,
                         f"{method} is not an A2A {version} method, and agent {agent_id} speaks "
                         f"A2A {version}")
        return
    except TranslationError as exc:
        await send_error(send, errors.INVALID_REQUEST, REST, agent_id, str(exc))
        return
    base = relay_base(node, route, scope, headers) if rpc_method in push.METHODS else None
    why = await refused_webhook(scope, agent_id, caller, rpc_method, params, relay_base=base)
    if why is not None:
        await send_error(send, errors.WEBHOOK_REFUSED, REST, agent_id, why)
        return
    rpc = orjson.dumps({"jsonrpc": "2.0", "id": f"rest-{next(request_numbers)}",
                        "method": rpc_method, "params": params})
    tags = headers.tags
    tags["a2a_hdr_content-type"] = "application/json"
    tags["a2a_hdr_accept"] = "text/event-stream" if call.method.streaming \
        else "application/json"
    tags["a2a_hdr_a2a-version"] = version
    if call.method.streaming:  # a resumable stream's id says how to translate a reconnect
        tags[env.TAG_STREAM_FORM] = resume.rest_form(call.version, version)
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



def resumed_rest_stream(
    send: Send, stream_id: str,
) -> tuple[Any, Send, rest_translate.RestTranslation | None]:
    """The caller's side of a reconnect to an HTTP+JSON stream (``GET
    /a2a/{agent_id}/stream/{stream_id}``, docs/streams.md): ``(the Exchange's rpc id, the send
    the replies go to, the translation to finish once the relay ended)``. A forwarded stream's
    events are the agent's own, relayed as they are; a translated one's are the agent's
    JSON-RPC events, translated by the live stream's own :class:`RestTranslation` (the stream
    id names the caller's and the agent's versions). Errors in the binding's form."""
    form = resume.stream_form(stream_id)
    if form is None or form[0] == resume.REST_FORWARDED:
        return REST, send, None
    _, caller_version, agent_version = form
    call = rest_translate.RestCall(CORE["SendStreamingMessage"], pb.SendMessageRequest(),
                                   caller_version, "")
    answer = rest_translate.RestTranslation(call, agent_version, send)
    return answer, answer.send, answer
