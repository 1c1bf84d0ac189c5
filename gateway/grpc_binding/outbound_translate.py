"""JSON-RPC and HTTP+JSON calls to an agent whose card lists only a gRPC interface, translated
to its gRPC server (the A2A 1.0 service, ``lf.a2a.v1.A2AService``).

Such an agent's registered endpoint is its gRPC address (``grpc://host:port``, ``grpcs://``
for TLS: :func:`registry.bindings.grpc_only_endpoint`), and :func:`is_grpc_target` tells the
handler to come here instead of taking the subscriber's HTTP way. Everything goes through the
1.0 protobuf messages (canonical in A2A 1.0), with the a2a-sdk's own types and converters
(the conversions: :mod:`gateway.grpc_binding.outbound_messages`):

- **The caller's request.** A JSON-RPC call with a 1.0 method name (``SendMessage``, ...) has
  the ProtoJSON of the request message as params; one with a 0.3 name (``message/send``,
  ``tasks/get``, ...) the 0.3 shapes, converted with the SDK's compat conversions as its own
  0.3 JSON-RPC adapter does. An HTTP+JSON call becomes its core request as in
  :mod:`gateway.rest_translate` (the SDK's REST dispatcher's way).
- **The agent's call** is made on the pass-through module's channel pool
  (:func:`gateway.grpc_binding.passthrough.channel_for`: the outbound policy's checks of the
  resolved address, TLS, message caps), with the request's ``tenant`` set to the one the
  agent's card names, the caller's headers as metadata under the header rules, the deadline of
  the timeout rules (a stream: the idle and stall timeouts), and the agent's concurrency cap
  (:mod:`gateway.grpc_binding.slots`: across the cluster, shared with passed-through calls).
- **The answer.** The reply (or each stream message) becomes the caller's: a JSON-RPC result
  (1.0: ProtoJSON; 0.3: the 0.3 JSON) or SSE events; HTTP+JSON through
  :class:`gateway.rest_translate.RestTranslation`. The agent's gRPC status becomes the A2A
  error it names (:func:`~gateway.grpc_binding.outbound_messages.status_error`: the
  ``ErrorInfo`` the SDK's servers attach, else the status code) in the caller's binding; the
  gateway's own outcomes (``unreachable``, ``timeout``, ``busy``, ...) are the gateway's
  errors, with ``X-A2A-Executed`` false when no byte reached the agent.
  docs/gateway.md has the table.

No I/O of this module's own but the agent's gRPC call; admission, the webhook check and the
extended card's authentication are the handler's, before it hands the call here.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol

import grpc
import orjson
from django.conf import settings
from google.protobuf.json_format import MessageToDict, ParseDict
from google.protobuf.message import Message

from gateway import errors, metrics, push, tracing
from gateway.agent_bindings import AgentBindings, bindings
from gateway.cards import CardRewrite, rewrite_card
from gateway.grpc_binding import passthrough, slots
from gateway.grpc_binding.outbound_messages import (
    CODES_03,
    AgentMethod,
    JsonRpcCall,
    UnknownMethod,
    agent_method,
    card_03,
    jsonrpc_call,
    jsonrpc_result,
    status_error,
)
from gateway.headers import outbound_headers
from gateway.rest_translate import RestTranslation, rest_call
from gateway.translation import V03, V10, CoreMethod, TranslationError, Unsupported
from registry.bindings import is_grpc_url

#: Headers of the caller that are not gRPC metadata (the call's own framing).
_DROPPED = frozenset({"content-type", "content-length", "accept", "te", "tenant", "host",
                      "connection", "transfer-encoding", "a2a-version"})


def is_grpc_target(endpoint: str) -> bool:
    """Whether an agent's endpoint is its gRPC address: its calls are translated here."""
    return is_grpc_url(endpoint)


# --- the call ----------------------------------------------------------------------------------


Send = Callable[[dict[str, Any]], Awaitable[None]]
Receive = Callable[[], Awaitable[dict[str, Any]]]


class Answer(Protocol):
    """The caller's side of one translated call, in its binding's form."""

    async def reply(self, message: Message) -> None:
        """The unary reply, or one message of a stream."""

    async def agent_error(self, error: dict[str, Any]) -> None:
        """The agent's status, as a JSON-RPC error object (:func:`status_error`)."""

    async def gateway_error(self, kind: str, detail: str, executed: bool) -> None:
        """A gateway error (a stream already answering: its terminal error)."""

    async def end(self) -> None:
        """The call ended: a stream's end (after its last message), else nothing."""


def _metadata(tags: dict[str, str], caller: str, passthrough_auth: bool,
              version: str) -> list[tuple[str, str]]:
    out = [("a2a-version", version)]
    for name, value in outbound_headers(tags, caller, passthrough=passthrough_auth).items():
        name = name.lower()
        if name in _DROPPED or name.startswith(("grpc-", ":")) or name.endswith("-bin") \
                or not passthrough.valid_metadata(name, value):
            continue
        out.append((name, value))
    return out


async def call_agent(answer: Answer, *, route: Any, agent: AgentBindings, method: CoreMethod,
                     request: Message, caller: str, tags: dict[str, str], timeout: float,
                     started: float, request_bytes: int, receive: Receive | None,
                     binding: str, payload: dict[str, Any] | None = None) -> None:
    """Make the agent's gRPC call of ``request`` (on its 1.0 service when its card lists one,
    else its 0.3 one) and answer the caller through ``answer``; metrics, the console's
    recorder and tracing (the caller's ``binding``; ``payload``: a JSON-RPC request, what the
    entry span reads the task and context ids from) see it under the 1.0 method name. A
    stream's caller leaving (``receive`` answers ``http.disconnect``) cancels the agent's
    call."""
    record = passthrough.CallRecord()
    agent_id = route.agent_id
    metrics.count_request(agent_id, method.name)
    trace = None
    if tracing.ENABLED:
        trace = passthrough.start_trace(
            agent_id=agent_id, method=method.name, binding=binding,
            traceparent=tags.get("a2a_hdr_traceparent"),
            tracestate=tags.get("a2a_hdr_tracestate"), payload=payload,
            request_bytes=request_bytes, caller=caller, endpoint=route.endpoint)
    version = V03 if agent.grpc_v03 and not agent.grpc_v10 else V10
    try:
        target = agent_method(method, version, agent.grpc_tenant)
        data = target.encode(request)
    except Unsupported:
        await _gateway_error(answer, record, errors.BINDING_UNAVAILABLE,
                             f"{method.name} is not an A2A 0.3 method, and agent {agent_id} "
                             "serves the A2A 0.3 gRPC service", False)
        await answer.end()
        passthrough.finish_call(record, agent_id, caller, method.name, request_bytes, started,
                                trace)
        return
    except TranslationError as exc:
        await _gateway_error(answer, record, errors.INVALID_REQUEST, str(exc), False)
        await answer.end()
        passthrough.finish_call(record, agent_id, caller, method.name, request_bytes, started,
                                trace)
        return
    slot = await slots.take_slot(agent_id, route.max_concurrency)
    if slot is None:
        metrics.count_busy(agent_id)
        await _gateway_error(answer, record, errors.BUSY, "", False)
        await answer.end()
        passthrough.finish_call(record, agent_id, caller, method.name, request_bytes, started,
                                trace)
        return
    try:
        call = _call(answer, record, route, target, method.streaming, data, caller, tags,
                     timeout, trace)
        if method.streaming and receive is not None:
            if not await _unless_gone(call, receive):
                record.outcome = "client_disconnect"
                return
        else:
            await call
        # The agent is done with the call: its slot is free before the caller hears the
        # answer, so the caller's next call never finds it still taken.
        slots.release_slot(slot)
        await answer.end()
    except asyncio.CancelledError:
        if record.outcome in ("unknown", "ok"):
            record.outcome = "client_disconnect"
        raise
    finally:
        slots.release_slot(slot)
        passthrough.finish_call(record, agent_id, caller, method.name, request_bytes, started,
                                trace)


async def _unless_gone(call: Coroutine[Any, Any, None], receive: Receive) -> bool:
    """Run ``call`` unless the caller leaves first (then it is cancelled: False)."""
    async def gone() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    task = asyncio.ensure_future(call)
    watch = asyncio.ensure_future(gone())
    try:
        await asyncio.wait((task, watch), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for pending in (task, watch):
            if not pending.done():
                pending.cancel()
        await asyncio.gather(task, watch, return_exceptions=True)
    if task.cancelled():
        return False
    task.result()  # its own exception, if any
    return True


async def _gateway_error(answer: Answer, record: passthrough.CallRecord, kind: str, detail: str,
                         executed: bool) -> None:
    record.outcome = kind
    record.status = errors.rest_status_for(kind)
    await answer.gateway_error(kind, detail, executed)


async def _call(answer: Answer, record: passthrough.CallRecord, route: Any, target: AgentMethod,
                streaming: bool, data: bytes, caller: str, tags: dict[str, str],
                timeout: float, trace: tracing.DirectCallTrace | None) -> None:
    address = route.endpoint
    channel, why = await passthrough.open_channel(address, timeout)
    if channel is None:
        await _gateway_error(answer, record, errors.UNREACHABLE, why, False)
        return
    metadata = _metadata(tags, caller, route.credential_passthrough, target.version)
    if trace is not None:  # the agent's traceparent: the gateway's span of its call
        metadata = trace.agent_metadata(metadata)
    record.started = True
    if streaming:
        await _stream(answer, record, channel, target, data, metadata)
        return
    deadline = time.monotonic() + timeout
    call = channel.unary_unary(target.path)(data, metadata=metadata, timeout=timeout)
    try:
        raw: bytes = await call
    except grpc.aio.AioRpcError as exc:
        await _failed(answer, record, exc, deadline)
        return
    try:
        reply = target.decode(raw)
    except TranslationError as exc:
        await _gateway_error(answer, record, errors.AGENT_ERROR,
                             f"the agent's answer cannot be translated: {exc}", True)
        return
    record.outcome, record.status, record.nbytes = "ok", 200, len(raw)
    await answer.reply(reply)


async def _failed(answer: Answer, record: passthrough.CallRecord, exc: grpc.aio.AioRpcError,
                  deadline: float | None) -> None:
    own = passthrough.gateway_failure(exc, deadline)
    if own is not None:
        await _gateway_error(answer, record, own[0], own[1], True)
        return
    record.outcome, record.status = "agent_error", 200
    await answer.agent_error(status_error(exc.code(), exc.details() or "",
                                          exc.trailing_metadata()))


async def _stream(answer: Answer, record: passthrough.CallRecord, channel: grpc.aio.Channel,
                  target: AgentMethod, data: bytes, metadata: list[tuple[str, str]]) -> None:
    call = channel.unary_stream(target.path)(data, metadata=metadata)
    idle = float(settings.A2A_SSE_IDLE_TIMEOUT_SECONDS)
    stall = float(settings.A2A_SSE_STALL_TIMEOUT_SECONDS)
    try:
        while True:
            message = await passthrough.read_or_idle(call, idle)
            if message is None:
                await _gateway_error(answer, record, errors.TIMEOUT,
                                     "the agent's stream went idle", True)
                return
            if message is grpc.aio.EOF:
                break
            assert isinstance(message, bytes)  # identity deserializer
            try:
                event = target.decode(message)
            except TranslationError as exc:
                call.cancel()
                await _gateway_error(answer, record, errors.AGENT_ERROR,
                                     f"the agent's event cannot be translated: {exc}", True)
                return
            try:
                async with asyncio.timeout(stall):
                    await answer.reply(event)
            except TimeoutError:
                call.cancel()
                await _gateway_error(answer, record, errors.STREAM_STALLED,
                                     "the caller stopped reading", True)
                return
            record.nbytes += len(message)
    except grpc.aio.AioRpcError as exc:
        await _failed(answer, record, exc, None)
        return
    except BaseException:
        call.cancel()
        raise
    record.outcome, record.status = "ok", 200


# --- the JSON-RPC caller -----------------------------------------------------------------------

_EXECUTED = (b"x-a2a-executed", b"true")


class JsonRpcAnswer:
    """A JSON-RPC caller's answer: one JSON-RPC response, or (a streaming method) SSE events
    each holding one; the gateway's errors as :func:`gateway.errors.error_body` (a stream's a
    terminal ``event: error``)."""

    def __init__(self, send: Send, rpc_id: Any, agent_id: str, call: JsonRpcCall) -> None:
        self.send = send
        self.rpc_id = rpc_id
        self.agent_id = agent_id
        self.call = call
        self.started = False
        self.done = False

    async def _respond(self, status: int, body: bytes, executed: bool) -> None:
        self.started = self.done = True
        await _send_json(self.send, status, body, executed)

    async def _event(self, data: bytes, *, last: bool = False) -> None:
        if not self.started:
            self.started = True
            await self.send({"type": "http.response.start", "status": 200, "headers": [
                (b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"),
                _EXECUTED]})
        self.done = last
        await self.send({"type": "http.response.body", "body": data, "more_body": not last})

    def _response(self, member: str, value: Any) -> bytes:
        return orjson.dumps({"jsonrpc": "2.0", "id": self.rpc_id, member: value})

    async def reply(self, message: Message) -> None:
        try:
            result = jsonrpc_result(self.call, message)
        except Exception as exc:  # the SDK's conversions refuse in their own ways
            await self.gateway_error(errors.AGENT_ERROR,
                                     f"the agent's answer cannot be translated: {exc}"[:2000],
                                     True)
            return
        if self.call.method.streaming:
            await self._event(b"data: " + self._response("result", result) + b"\n\n")
        else:
            await self._respond(200, self._response("result", result), True)

    async def agent_error(self, error: dict[str, Any]) -> None:
        if self.done:
            return
        if self.call.v03 and error["code"] not in CODES_03:
            error = {**error, "code": -32603}
        body = self._response("error", error)
        if self.call.method.streaming and self.started:
            await self._event(b"data: " + body + b"\n\n", last=True)
        else:
            await self._respond(200, body, True)

    async def gateway_error(self, kind: str, detail: str, executed: bool) -> None:
        if self.done:
            return
        body = errors.error_body(kind, rpc_id=self.rpc_id, agent_id=self.agent_id,
                                 detail=detail, executed=executed or self.started)
        if self.started:
            await self._event(b"event: error\ndata: " + body + b"\n\n", last=True)
        else:
            await self._respond(errors.http_status_for(kind), body, executed)

    async def end(self) -> None:
        if self.call.method.streaming and not self.done:
            await self._event(b"", last=True)


async def answer_jsonrpc(send: Send, receive: Receive, *, route: Any, caller: str,
                         tags: dict[str, str], payload: dict[str, Any], timeout: float,
                         started: float, request_bytes: int) -> None:
    """Answer an admitted JSON-RPC call (``payload``) to the gRPC-only agent of ``route``."""
    rpc_id = payload.get("id")
    try:
        call = jsonrpc_call(payload)
    except (UnknownMethod, TranslationError) as exc:
        # Nothing reached the agent: -32601 (a method A2A has not) or -32602 (bad params).
        code = -32601 if isinstance(exc, UnknownMethod) else -32602
        body = orjson.dumps({"jsonrpc": "2.0", "id": rpc_id, "error": {
            "code": code, "message": str(exc)[:2000]}})
        await _send_json(send, 200, body, False)
        return
    answer = JsonRpcAnswer(send, rpc_id, route.agent_id, call)
    await _call_bound(answer, route=route, method=call.method, request=call.request,
                      caller=caller, tags=tags, timeout=timeout, started=started,
                      request_bytes=request_bytes, receive=receive, binding="JSONRPC",
                      payload=payload)


# --- the HTTP+JSON caller ----------------------------------------------------------------------


class RelayAnswer:
    """A caller whose binding the gateway already translates from a 1.0 JSON-RPC agent's
    answer (:class:`~gateway.rest_translate.RestTranslation` for HTTP+JSON,
    :class:`~gateway.grpc_binding.calls.GrpcCall` for a gRPC caller of the other protocol
    version): the agent's reply is fed to it as that answer would be (its ProtoJSON, as ASGI
    messages), and it writes it in its binding's form. ``finish``: end the caller's answer
    with the call (HTTP+JSON; the gRPC call's handler finishes its own)."""

    def __init__(self, out: Any, agent_id: str, method: CoreMethod, *, version: str,
                 finish: bool, caller: str = "") -> None:
        self.out = out
        #: A gRPC caller: its relayed push configs shown back in config answers (its own).
        self.caller = caller
        self.agent_id = agent_id
        self.method = method
        self.version = version  # the caller's protocol version
        self.finish = finish
        self.sse = False
        self.ended = False

    async def _start(self, sse: bool) -> None:
        if not self.out.answered:
            self.sse = sse
            await self.out.send({"type": "http.response.start", "status": 200, "headers": [
                (b"content-type", b"text/event-stream" if sse else b"application/json")]})

    async def _answer(self, member: str, value: Any) -> None:
        body = orjson.dumps({"jsonrpc": "2.0", "id": "grpc", member: value})
        if self.method.streaming:
            await self._start(True)
            if self.sse:
                await self.out.send({"type": "http.response.body",
                                     "body": b"data: " + body + b"\n\n", "more_body": True})
                return
        await self._start(False)
        await self.out.send({"type": "http.response.body", "body": body})

    async def reply(self, message: Message) -> None:
        if self.method.name == "GetExtendedAgentCard" and self.version != V10:
            message = card_03(message)  # a 0.3 caller's card (``v1/card``, GetAgentCard)
        try:
            result = MessageToDict(message)
            if self.caller and self.method.name in push.CONFIG_ANSWERS:
                await push.shown(result, V10, self.agent_id, self.caller)
            await self._answer("result", result)
        except Exception as exc:  # the SDK's conversions refuse in their own ways
            await self.gateway_error(errors.AGENT_ERROR,
                                     f"the agent's answer cannot be translated: {exc}"[:2000],
                                     True)

    async def agent_error(self, error: dict[str, Any]) -> None:
        if self.method.streaming and not self.out.answered:
            await self._start(False)  # no stream yet: the binding's error response
        await self._answer("error", error)

    async def gateway_error(self, kind: str, detail: str, executed: bool) -> None:
        await self.out.gateway_error(kind, self.agent_id, detail, status=None,
                                     executed=executed, extra=None)

    async def end(self) -> None:
        if self.sse and not self.ended:
            self.ended = True
            await self.out.send({"type": "http.response.body", "body": b"",
                                 "more_body": False})
        if self.finish:
            await self.out.finish()


async def answer_rest(send: Any, receive: Receive, *, route: Any, caller: str,
                      tags: dict[str, str], tail: str, method: str, query: bytes, body: bytes,
                      timeout: float, started: float,
                      check_webhook: Callable[[str, Any], Awaitable[str | None]]) -> None:
    """Answer an admitted HTTP+JSON call (route ``tail``, A2A ``method``) to the gRPC-only
    agent of ``route``: translated as :func:`gateway.rest_translate.rest_call` does, its
    webhook checked (``check_webhook(method, params)``: the refusal, or None), an extended
    card (``send`` a :class:`~gateway.cards.CardRewrite`) rewritten once translated."""
    card: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    if isinstance(send, CardRewrite):
        url = send.url
        send, card = send.send, (lambda answered: rewrite_card(answered, url))
    try:
        call = rest_call(tail, method, query, body)
    except TranslationError as exc:
        await send_error(send, errors.INVALID_REQUEST, route.agent_id, str(exc))
        return
    params = MessageToDict(call.request)
    refused = await check_webhook(call.method.name, params)
    if refused is not None:
        await send_error(send, errors.WEBHOOK_REFUSED, route.agent_id, refused)
        return
    if params != MessageToDict(call.request):  # relayed: the configs point at the gateway
        call.request.Clear()
        ParseDict(params, call.request)
    answer = RelayAnswer(RestTranslation(call, V10, send, card=card), route.agent_id,
                         call.method, version=call.version, finish=True)
    # The caller's path tenant is the gateway's: the agent gets its card's.
    await _call_bound(answer, route=route, method=call.method, request=call.request,
                      caller=caller, tags=tags, timeout=timeout, started=started,
                      request_bytes=len(body), receive=receive, binding="HTTP+JSON")


async def send_error(send: Send, kind: str, agent_id: str, detail: str) -> None:
    """A gateway error of the HTTP+JSON binding before the agent was called."""
    body = errors.rest_error_body(kind, agent_id=agent_id, detail=detail)
    await _send_json(send, errors.rest_status_for(kind), body, False)


async def _send_json(send: Send, status: int, body: bytes, executed: bool) -> None:
    """A whole JSON response, its ``X-A2A-Executed`` header saying whether the agent ran."""
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", b"%d" % len(body)),
        (b"x-a2a-executed", b"true" if executed else b"false")]})
    await send({"type": "http.response.body", "body": body})


async def answer_grpc(out: Any, *, route: Any, caller: str, tags: dict[str, str],
                      method: CoreMethod, request: Message, version: str, timeout: float,
                      started: float, request_bytes: int) -> None:
    """Answer an admitted gRPC call (``out``: its :class:`~gateway.grpc_binding.calls.GrpcCall`,
    which the caller's handler finishes) of a protocol version the gRPC-only agent of ``route``
    does not serve itself: translated to the version it serves."""
    answer = RelayAnswer(out, route.agent_id, method, version=version, finish=False,
                         caller=caller)
    await _call_bound(answer, route=route, method=method, request=request, caller=caller,
                      tags=tags, timeout=timeout, started=started,
                      request_bytes=request_bytes, receive=out.receive, binding="GRPC")


async def _call_bound(answer: Answer, *, route: Any, method: CoreMethod, request: Message,
                      caller: str, tags: dict[str, str], timeout: float, started: float,
                      request_bytes: int, receive: Receive, binding: str,
                      payload: dict[str, Any] | None = None) -> None:
    """:func:`call_agent` with the agent's bindings as its card has them (``unreachable``
    when the card cannot be read now)."""
    try:
        agent = await bindings(route)
    except Exception:
        await answer.gateway_error(errors.UNREACHABLE, "the agent's card cannot be read now; "
                                   "retry", False)
        return
    await call_agent(answer, route=route, agent=agent, method=method, request=request,
                     caller=caller, tags=tags, timeout=timeout, started=started,
                     request_bytes=request_bytes, receive=receive, binding=binding,
                     payload=payload)
