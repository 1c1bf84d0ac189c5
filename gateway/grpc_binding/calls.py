"""One call of the gRPC binding, from the caller's serialized request to its answer.

Each method of both services (``lf.a2a.v1.A2AService``, ``a2a.v1.A2AService``) is served by
:func:`serve` with the request's bytes:

1. the request is decoded into the A2A 1.0 ("core") message (:mod:`.translate`); a message
   that does not decode is ``INVALID_ARGUMENT``;
2. its ``tenant`` names the agent (a 0.3 request has none: the ``tenant`` metadata entry then);
3. admission as for every gateway call (:func:`gateway.admission.admit_binding_call`): the
   bearer token of the ``authorization`` metadata through the same token cache,
   authorization, rate limits, the route;
4. an agent whose card lists its own gRPC interface of the caller's version gets the call
   passed through (:mod:`.passthrough`: the caller's bytes, its own tenant, the header rules
   on metadata, from this node); otherwise
   the core request becomes the JSON-RPC request the agent's endpoint speaks (1.0 or 0.3:
   :mod:`.agents`), and takes the gateway's one way to the agent
   (:func:`gateway.forwarding.forward_binding_call`: the agent's virtual subscriber, local fast
   path or broker, its concurrency cap, timeouts, size caps, metrics, audit, tracing);
5. the agent's answer -- one JSON-RPC response, or SSE events relayed as they come, each
   written to the caller as it arrives (a caller that stops reading holds the stream back,
   within the stall timeout) -- becomes the caller's reply messages.

Metadata mirrors the header rules: the caller's metadata (``-bin`` entries, gRPC's own
``grpc-*`` and ``content-type``, ``te`` aside) travels as request headers under the same rules
as an HTTP caller's; the agent's relayed response headers come back as initial metadata. The
gateway's own errors are gRPC statuses (docs/gateway.md has the table) with a
``google.rpc.Status`` in ``grpc-status-details-bin`` (``ErrorInfo`` of domain ``gateway.a2a``),
and every answer carries ``x-a2a-executed`` in its trailing metadata.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import orjson
from a2a.types import a2a_pb2
from django.conf import settings as django_settings
from google.protobuf.json_format import MessageToDict, ParseDict
from google.protobuf.message import DecodeError

from gateway import admission, errors, forwarding, push, runtime
from gateway import agent_bindings as agents
from gateway.binding import BindingCaller
from gateway.cards import EXTENDED_CARD_ANONYMOUS, grpc_gateway_url, rewrite_core_card
from gateway.exchange import discard
from gateway.grpc_binding import outbound_translate, passthrough, translate
from gateway.grpc_binding.frame_guard import caller_address
from gateway.grpc_binding.translate import ServiceMethod, TranslationError, Unsupported
from gateway.headers import scan_request_headers
from gateway.resume import STREAM_ID_HEADER
from gateway.sse import data_events, take_events
from gateway.tenant_quotas import NO_STREAM, StreamSlot
from gateway.translation import CoreMethod
from push import relay as push_relay

logger = logging.getLogger(__name__)

EXECUTED = "x-a2a-executed"
AGENT_STATUS = "x-a2a-agent-status"
STATUS_DETAILS = "grpc-status-details-bin"
#: Where a caller of the 0.3 service (whose requests have no ``tenant``) names the agent.
TENANT_METADATA = "tenant"
#: Caller metadata that never becomes a request header: gRPC's own, and what the gateway
#: sets itself for the agent (the JSON-RPC request's framing and protocol version).
_DROPPED_METADATA = frozenset({"content-type", "content-length", "te", "accept", "a2a-version",
                               TENANT_METADATA})
#: Relayed agent headers that never become initial metadata (gRPC's framing, the trailers).
_DROPPED_HEADERS = frozenset({b"content-type", b"content-length", b"x-a2a-executed",
                              b"x-a2a-agent-status", b"transfer-encoding", STREAM_ID_HEADER})
_METADATA_KEY = frozenset(b"abcdefghijklmnopqrstuvwxyz0123456789-_.")
_CODES = {code.value[0]: code for code in grpc.StatusCode}
#: An agent's HTTP error status (its body not a JSON-RPC answer) as gRPC's HTTP mapping has it.
_HTTP_CODES = {400: "INTERNAL", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED",
               404: "UNIMPLEMENTED", 429: "UNAVAILABLE", 502: "UNAVAILABLE",
               503: "UNAVAILABLE", 504: "UNAVAILABLE"}
_ids = itertools.count(1)
#: How often a relay waiting for its caller to leave looks whether the RPC ended.
DONE_POLL_SECONDS = 0.5


class GrpcCall(BindingCaller):
    """The caller's side of one gRPC call: the gateway's errors (as a
    :class:`~gateway.binding.BindingCaller`) and the agent's answer (:meth:`send`, the ASGI
    messages of the gateway's relay), turned into the caller's reply messages and status."""

    __slots__ = ("method", "context", "agent_version", "failure", "http_status", "sse",
                 "metadata", "answered", "chunks", "tail", "reply", "ended", "gone",
                 "_done", "initial_sent", "card_url", "slot")

    def __init__(self, method: ServiceMethod, context: Any) -> None:
        self.method = method
        self.context = context
        self.agent_version = translate.V10
        #: The call's error answer once decided: (status, trailing metadata).
        self.failure: tuple[Any, list[tuple[str, str | bytes]]] | None = None
        self.http_status = 0
        self.sse = False
        self.metadata: list[tuple[str, str]] = []
        self.answered = False  # the agent answered (executed)
        self.chunks: list[bytes] = []
        self.tail = b""
        self.reply: Any = None
        #: Its place among its tenant's open streams (gateway.tenant_quotas), given back when
        #: :func:`serve` returns.
        self.slot: StreamSlot = NO_STREAM
        self.ended = False  # a streamed error ended the caller's stream
        self.gone = False
        # Set when a write finds the caller gone. No ``context.add_done_callback``: grpcio keeps
        # ``partial(callback, context)`` in the call's state, which the context holds -- a
        # reference cycle that keeps the call's HTTP/2 stream counted open until the cycle
        # collector runs, so after about a hundred calls a connection's new streams were
        # refused (REFUSED_STREAM). :meth:`receive` looks at ``context.done()`` instead.
        self._done = asyncio.Event()
        self.initial_sent = False
        self.card_url = ""  # the extended card's gateway base (its answer rewritten)

    # --- the gateway's errors ------------------------------------------------------------------

    async def gateway_error(self, kind: str, agent_id: str | None, detail: str, *,
                            status: int | None, executed: bool,
                            extra: list[tuple[bytes, bytes]] | None) -> None:
        if self.failure is not None:
            return
        form = errors.rest_error_object(kind, agent_id=agent_id, detail=detail, status=status,
                                        executed=executed)["error"]
        info = form["details"][0]
        trailers: list[tuple[str, str | bytes]] = [(EXECUTED, "true" if executed else "false")]
        if status:
            trailers.append((AGENT_STATUS, str(status)))
        for name, value in extra or ():
            if name == b"retry-after":
                trailers.append(("retry-after", value.decode("latin-1")))
        self.failure = (translate.status(errors.grpc_code_name(kind), form["message"],
                                         reason=info["reason"], domain=info["domain"],
                                         metadata=info["metadata"]), trailers)

    def fail(self, kind: str, detail: str, *, executed: bool = False, message: str = "") -> None:
        """A gateway error decided here (before or after the relay), in the same form."""
        if self.failure is not None:
            return
        form = errors.rest_error_object(kind, agent_id=None, detail=detail,
                                        executed=executed)["error"]
        info = form["details"][0]
        self.failure = (translate.status(errors.grpc_code_name(kind), message or form["message"],
                                         reason=info["reason"], domain=info["domain"],
                                         metadata=info["metadata"]),
                        [(EXECUTED, "true" if executed else "false")])

    def _agent_failed(self, status: Any) -> None:
        if self.failure is None:
            trailers: list[tuple[str, str | bytes]] = [(EXECUTED, "true")]
            if self.http_status >= 400:
                trailers.append((AGENT_STATUS, str(self.http_status)))
            self.failure = (status, trailers)

    # --- the agent's answer (ASGI messages of the relay) ---------------------------------------

    async def receive(self) -> dict[str, Any]:
        """The relay's view of the caller: it leaves when the RPC ends (cancelled), seen within
        DONE_POLL_SECONDS (a caller's cancellation also cancels the handler itself)."""
        context = self.context
        while not context.done():
            try:
                async with asyncio.timeout(DONE_POLL_SECONDS):
                    await self._done.wait()
                break
            except TimeoutError:
                continue
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.answered = True
            self.http_status = message["status"]
            for name, value in message.get("headers") or ():
                if name == b"content-type":
                    self.sse = value[:17].lower() == b"text/event-stream"
                elif name not in _DROPPED_HEADERS and _valid_metadata(name, value):
                    self.metadata.append((name.decode("ascii"), value.decode("ascii")))
            if self.method.core.streaming and self.sse and self.http_status < 400:
                await self._send_initial()
            return
        body = message.get("body", b"")
        if self.sse and self.method.core.streaming and self.http_status < 400:
            events, self.tail = take_events(self.tail, body, bool(message.get("more_body")))
            for event in data_events(events):
                await self._answer(event)
            return
        if body:
            self.chunks.append(body)

    async def _send_initial(self) -> None:
        if not self.initial_sent:
            self.initial_sent = True
            try:
                await self.context.send_initial_metadata(tuple(self.metadata))
            except Exception:  # the caller is gone (or it was sent already)
                self.gone = True

    async def _answer(self, answer: Any) -> None:
        """One JSON-RPC response of the agent: its result becomes a reply message (written at
        once in a stream), its error the call's status."""
        if self.ended or self.gone:
            return
        if not isinstance(answer, dict) or ("result" not in answer and "error" not in answer):
            self._broken("the agent's answer is not a JSON-RPC response")
            return
        if answer.get("error") is not None or "result" not in answer:
            self.ended = True
            self._agent_failed(translate.agent_error_status(answer.get("error"),
                                                            self.method.version))
            return
        core = self.method.core
        try:
            if core.streaming:
                event = translate.agent_event(answer["result"], self.agent_version)
                if event is None:
                    return
                payload = self.method.encode(event).SerializeToString()
            else:
                reply = translate.agent_result(core, answer["result"], self.agent_version)
                if self.card_url:  # the extended card, pointed at the gateway
                    reply = rewrite_core_card(reply, self.card_url)
                self.reply = self.method.encode(reply)
                return
        except TranslationError as exc:
            self._broken(str(exc))
            return
        if core.streaming:
            await self._send_initial()
            try:
                await self.context.write(payload)
            except Exception:  # the caller is gone: the relay sees it leave
                self.gone = True
                self._done.set()

    def _broken(self, detail: str) -> None:
        self.ended = True
        self._agent_failed(translate.status(
            "INTERNAL", f"the agent's answer cannot be translated: {detail}"[:2000]))

    def _whole_body(self) -> Any:
        """The agent's answer, read whole (a sync method, or a stream answered with one JSON
        body): one JSON-RPC response, or an HTTP error status of its own."""
        body = b"".join(self.chunks)
        self.chunks = []
        try:
            answer = orjson.loads(body)
        except orjson.JSONDecodeError:
            answer = None
        if self.sse and not self.method.core.streaming:
            # A sync method answered with events: the first answer of the stream counts.
            for event in data_events(body + b"\n\n"):
                answer = event
                break
        is_rpc = isinstance(answer, dict) and ("result" in answer or "error" in answer)
        if self.http_status >= 400 and not is_rpc:
            self._agent_failed(translate.status(
                _HTTP_CODES.get(self.http_status, "UNKNOWN"),
                f"the agent answered HTTP {self.http_status}"))
            return None
        if not is_rpc:
            self._broken("the agent's answer is not JSON-RPC")
            return None
        return answer

    # --- the end of the call -------------------------------------------------------------------

    async def finish(self) -> bytes | None:
        """The caller's answer: the reply (a sync method), the stream's end, or the status."""
        if self.failure is None and self.answered and (
                self.chunks or not (self.sse and self.method.core.streaming)):
            answer = self._whole_body()
            if answer is not None:
                await self._answer(answer)
        if self.failure is None and self.answered and not self.method.core.streaming \
                and self.reply is None:
            self._broken("no answer")
        if self.failure is None and not self.answered:
            self.fail(errors.UNREACHABLE, "the subscriber gave no answer")
        if self.failure is not None:
            status, trailers = self.failure
            trailers = [*trailers, (STATUS_DETAILS, status.SerializeToString())]
            # The status set and the handler returns: ``context.abort`` would raise an error
            # the call's state keeps, whose traceback holds the frames that hold the context (a
            # cycle keeping the HTTP/2 stream counted open until the collector runs).
            context = self.context
            context.set_code(_CODES.get(status.code, grpc.StatusCode.UNKNOWN))
            context.set_details(status.message)
            context.set_trailing_metadata(tuple(trailers))
            return None
        self.context.set_trailing_metadata(((EXECUTED, "true"),))
        if self.method.core.streaming:
            return None
        await self._send_initial()
        reply: bytes = self.reply.SerializeToString()
        return reply


def _valid_metadata(name: bytes, value: bytes) -> bool:
    return bool(name) and not name.startswith(b"grpc-") and not name.endswith(b"-bin") \
        and all(c in _METADATA_KEY for c in name) and all(0x20 <= c < 0x7F for c in value)


def _peer(context: Any) -> tuple[str, int]:
    """The caller's address from gRPC's peer string (``ipv4:1.2.3.4:5``, ``ipv6:[::1]:5``):
    the frame guard's caller behind its loopback end."""
    peer = context.peer() or ""
    kind, _, rest = peer.partition(":")
    host, _, port = rest.rpartition(":")
    if kind not in ("ipv4", "ipv6") or not host:
        return (peer or "-", 0)
    return caller_address(host.strip("[]"), int(port) if port.isdigit() else 0)


def _timeout(context: Any) -> float:
    """The call's timeout: the caller's deadline (what remains of it), capped at
    ``A2A_MAX_TIMEOUT_SECONDS``; ``A2A_DEFAULT_TIMEOUT_SECONDS`` without one -- the rules of
    a JSON-RPC call's ``params.configuration.timeout``."""
    cap = float(django_settings.A2A_MAX_TIMEOUT_SECONDS)
    remaining = context.time_remaining()
    if remaining is None:
        return min(float(django_settings.A2A_DEFAULT_TIMEOUT_SECONDS), cap)
    return min(max(float(remaining), 0.001), cap)


async def serve(method: ServiceMethod, data: bytes, context: Any) -> bytes | None:
    """Answer one call of ``method`` (the request's serialized bytes)."""
    started = time.perf_counter()
    call = GrpcCall(method, context)
    try:
        passed = await _call(method, data, context, call, started)
        if passed is not None and call.failure is None:
            return passed.reply
    except asyncio.CancelledError:
        raise
    except Exception:
        if call.failure is None:
            logger.exception("gRPC %s failed", method.path)
            call.fail(errors.UNREACHABLE, "the gateway failed to handle the call",
                      executed=call.answered)
    finally:
        call.slot.release()
    return await call.finish()


async def _call(method: ServiceMethod, data: bytes, context: Any, call: GrpcCall,
                started: float) -> passthrough.Passed | None:
    host = runtime.host
    node = host.node if host.node is not None else await host.ensure()
    try:
        request = method.decode(data)
    except TranslationError as exc:
        call.fail(errors.INVALID_REQUEST, str(exc))
        return None
    metadata = context.invocation_metadata()
    agent_id = translate.tenant_of(request) \
        or passthrough.metadata_value(metadata, TENANT_METADATA) or ""
    if not agent_id:
        call.fail(errors.INVALID_REQUEST, "no agent: set the request's tenant (the "
                  f"{TENANT_METADATA!r} metadata entry for A2A 0.3) to the agent id")
        return None
    headers = scan_request_headers(passthrough.request_headers(metadata, _DROPPED_METADATA))
    scope = {"client": _peer(context)}
    core = method.core
    admitted = await admission.admit_binding_call(node, scope, headers, call, agent_id, core.name)
    if admitted is None:
        return None
    client_id, route = admitted
    slot = await admission.stream_slot(node, scope, discard, call, agent_id, client_id, route,
                                       core.name)
    if slot is None:
        return None
    call.slot = slot
    if admission.anonymous_card_call(scope, agent_id, client_id, core.name):
        call.fail(errors.UNAUTHENTICATED, EXTENDED_CARD_ANONYMOUS)
        return None
    if core.name == "GetExtendedAgentCard":
        call.card_url = grpc_gateway_url(agent_id)
    try:
        bindings = await agents.bindings(route)
    except Exception as exc:
        logger.warning("gRPC: the card of %s cannot be read: %s", agent_id, exc)
        call.fail(errors.UNREACHABLE, "the agent's card cannot be read now; retry")
        return None
    target = bindings.grpc(method.version)
    if target and not (core.name == "GetExtendedAgentCard" and method.version == translate.V03):
        return await _pass_through(method, request, data, context, call, scope, agent_id,
                                   client_id, route, target, bindings.grpc_tenant, started,
                                   admission.relay_base(node, route, None, None))
    if outbound_translate.is_grpc_target(route.endpoint):
        # A gRPC-only agent serving the other version: translated to its gRPC server.
        await _to_other_grpc(method, request, context, call, scope, agent_id, client_id, route,
                             headers.tags, len(data), started,
                             admission.relay_base(node, route, None, None))
        return None
    version = call.agent_version = bindings.jsonrpc
    try:
        rpc_method, params = translate.agent_request(core, request, version)
    except Unsupported:
        call.fail(errors.BINDING_UNAVAILABLE, "", message=(
            f"{core.name} is not an A2A {version} method, and agent {agent_id} speaks "
            f"A2A {version}"))
        return None
    except TranslationError as exc:
        call.fail(errors.INVALID_REQUEST, str(exc))
        return None
    refused = await admission.refused_webhook(scope, agent_id, client_id, rpc_method, params,
                                              relay_base=admission.relay_base(node, route,
                                                                              None, None))
    if refused is not None:
        call.fail(errors.WEBHOOK_REFUSED, refused)
        return None
    body = orjson.dumps({"jsonrpc": "2.0", "id": f"grpc-{next(_ids)}", "method": rpc_method,
                         "params": params})
    tags = headers.tags
    tags["a2a_hdr_content-type"] = "application/json"
    tags["a2a_hdr_accept"] = "text/event-stream" if core.streaming else "application/json"
    tags["a2a_hdr_a2a-version"] = version
    if version == translate.V03 and "a2a_hdr_a2a-extensions" in tags:
        tags.setdefault("a2a_hdr_x-a2a-extensions", tags["a2a_hdr_a2a-extensions"])
    send = push.ConfigAnswer(call.send, agent_id, client_id) \
        if rpc_method in push.CONFIG_ANSWERS else call.send  # the caller's own configs shown
    await forwarding.forward_binding_call(
        node, route, client_id, send, call.receive, call, headers, rpc_method, body,
        _timeout(context), streaming=core.streaming, binding="GRPC", started=started,
        payload={"params": params})
    return None


async def _pass_through(method: ServiceMethod, request: Any, data: bytes, context: Any,
                        call: GrpcCall, scope: dict[str, Any], agent_id: str, client_id: str,
                        route: Any, target: str, tenant: str, started: float,
                        relay_base: str | None) -> passthrough.Passed | None:
    """The call forwarded to the agent's own gRPC server (:mod:`.passthrough`), after the
    webhook check every binding makes."""
    core = method.core
    allowed = await _webhook_allowed(core, request, call, scope, agent_id, client_id,
                                     relay_base, data, method.version)
    if allowed is False:
        return None
    if isinstance(allowed, bytes):
        data = allowed  # the configs point at the relay

    async def fail(kind: str, detail: str, executed: bool) -> None:
        await call.gateway_error(kind, agent_id, detail, status=None, executed=executed,
                                 extra=None)

    passed = await passthrough.forward(
        path=method.path, core_method=core.name, version=method.version,
        streaming=core.streaming, data=data, context=context, agent_id=agent_id,
        client_id=client_id, target=target, tenant=tenant,
        max_concurrency=route.max_concurrency,
        credential_passthrough=route.credential_passthrough, timeout=_timeout(context),
        started=started, fail=fail)
    if core.name == "GetExtendedAgentCard" and passed.reply is not None:
        # The agent's own URLs never reach the caller: its card pointed at the gateway.
        try:
            card = a2a_pb2.AgentCard.FromString(passed.reply)
        except DecodeError:
            call.fail(errors.AGENT_ERROR, "", executed=True,
                      message="the agent's card is not an AgentCard")
            return None
        passed.reply = rewrite_core_card(card, grpc_gateway_url(agent_id)).SerializeToString()
    elif core.name in push.CONFIG_ANSWERS and passed.reply is not None:
        passed.reply = await push.grpc_answer_shown(passed.reply, method.version, core.name,
                                                    agent_id, client_id)
    return passed


async def _to_other_grpc(method: ServiceMethod, request: Any, context: Any, call: GrpcCall,
                         scope: dict[str, Any], agent_id: str, client_id: str, route: Any,
                         tags: dict[str, str], size: int, started: float,
                         relay_base: str | None) -> None:
    """The call translated to the gRPC-only agent's own service of the other protocol
    version (:mod:`.outbound_translate`), after the webhook check every binding makes."""
    core = method.core
    if await _webhook_allowed(core, request, call, scope, agent_id, client_id,
                              relay_base) is False:
        return
    await outbound_translate.answer_grpc(
        call, route=route, caller=client_id, tags=tags, method=core, request=request,
        version=method.version, timeout=_timeout(context), started=started,
        request_bytes=size)


async def _webhook_allowed(core: CoreMethod, request: Any, call: GrpcCall, scope: dict[str, Any],
                           agent_id: str, client_id: str, relay_base: str | None,
                           data: bytes | None = None, version: str = translate.V10,
                           ) -> bytes | bool:
    """The webhook check every binding makes of a call forwarded to the agent's own gRPC
    server: False (the call failed: ``invalid_request``, ``webhook_refused``) when the
    request's push-notification webhook is refused. In relay mode the configs are rewritten
    (:func:`gateway.admission.refused_webhook`): ``request`` in place and, given the caller's
    ``data`` (of ``version``), the bytes to forward instead (else True)."""
    if core.name not in _WEBHOOK_METHODS:
        return True
    try:
        rpc_method, params = translate.agent_request(core, request, translate.V10)
    except (Unsupported, TranslationError) as exc:
        call.fail(errors.INVALID_REQUEST, str(exc))
        return False
    before = [config["url"] for config in push_relay.configs(rpc_method, params)]
    refused = await admission.refused_webhook(
        scope, agent_id, client_id, rpc_method, params,
        relay_base=relay_base)
    if refused is not None:
        call.fail(errors.WEBHOOK_REFUSED, refused)
        return False
    after = push_relay.configs(rpc_method, params)
    relayed = {url: config for url, config in zip(before, after, strict=True)
               if config.get("url") != url}
    if not relayed:
        return True
    tenant = translate.tenant_of(request)
    request.Clear()
    ParseDict(params, request, ignore_unknown_fields=True)
    if tenant:
        request.tenant = tenant
    if data is None:
        return True
    if version == translate.V10:
        return bytes(request.SerializeToString())
    message = translate.FROM_03[core.name].request.FromString(data)
    shape = MessageToDict(message)
    _point_at_relay(shape, relayed)
    message.Clear()
    ParseDict(shape, message, ignore_unknown_fields=True)
    return bytes(message.SerializeToString())


def _point_at_relay(shape: Any, relayed: dict[str, dict[str, Any]]) -> None:
    """Rewrite, anywhere in a 0.3 request's JSON form, each config whose URL was relayed."""
    if isinstance(shape, list):
        for item in shape:
            _point_at_relay(item, relayed)
    elif isinstance(shape, dict):
        config = relayed.get(shape["url"]) if isinstance(shape.get("url"), str) else None
        if config is not None:
            shape["url"], shape["token"] = config["url"], config["token"]
            shape.pop("authentication", None)
            return
        for value in shape.values():
            _point_at_relay(value, relayed)


#: The methods whose request may carry a push-notification webhook (checked on every binding).
_WEBHOOK_METHODS = frozenset({"SendMessage", "SendStreamingMessage",
                              "CreateTaskPushNotificationConfig"})


def handlers() -> list[grpc.GenericRpcHandler]:
    """The generic handlers of both services, on serialized messages (no (de)serializer: the
    request's bytes are decoded here, and a reply is written as bytes)."""
    out: list[grpc.GenericRpcHandler] = []
    for service in translate.SERVICES:
        methods: dict[str, grpc.RpcMethodHandler] = {}
        for method in translate.methods_of(service):
            if method.core.streaming:
                methods[method.name] = grpc.unary_stream_rpc_method_handler(_stream(method))
            else:
                methods[method.name] = grpc.unary_unary_rpc_method_handler(_unary(method))
        out.append(grpc.method_handlers_generic_handler(service, methods))
    return out


def _unary(method: ServiceMethod) -> Callable[[bytes, Any], Awaitable[bytes | None]]:
    async def unary(request: bytes, context: Any) -> bytes | None:
        return await serve(method, request, context)
    return unary


def _stream(method: ServiceMethod) -> Callable[[bytes, Any], Awaitable[None]]:
    async def stream(request: bytes, context: Any) -> None:
        await serve(method, request, context)
    return stream
