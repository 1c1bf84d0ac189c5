"""JSON-RPC and HTTP+JSON calls to an agent whose card lists only a gRPC interface, translated
to its gRPC server (the A2A 1.0 service, ``lf.a2a.v1.A2AService``).

Such an agent's registered endpoint is its gRPC address (``grpc://host:port``, ``grpcs://``
for TLS: :func:`registry.bindings.grpc_only_endpoint`), and :func:`is_grpc_target` tells the
handler to come here instead of taking the subscriber's HTTP way. Everything goes through the
1.0 protobuf messages (canonical in A2A 1.0), with the a2a-sdk's own types and converters:

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
  (counted per node, shared with passed-through calls).
- **The answer.** The reply (or each stream message) becomes the caller's: a JSON-RPC result
  (1.0: ProtoJSON; 0.3: the 0.3 JSON) or SSE events; HTTP+JSON through
  :class:`gateway.rest_translate.RestTranslation`. The agent's gRPC status becomes the A2A
  error it names (:func:`status_error`: the ``ErrorInfo`` of domain ``a2a-protocol.org``
  the SDK's servers attach, else the status code) in the caller's binding; the gateway's own
  outcomes (``unreachable``, ``timeout``, ``busy``, ...) are the gateway's errors, with
  ``X-A2A-Executed`` false when no byte reached the agent. docs/gateway.md has the table.

No I/O of this module's own but the agent's gRPC call; admission, the webhook check and the
extended card's authentication are the handler's, before it hands the call here.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

import grpc
import orjson
from a2a.compat.v0_3 import a2a_v0_3_pb2 as pb03
from a2a.compat.v0_3 import conversions
from a2a.compat.v0_3 import types as t03
from a2a.compat.v0_3.proto_utils import FromProto, ToProto
from a2a.types import a2a_pb2 as pb
from a2a.utils.errors import A2A_REASON_TO_ERROR, JSON_RPC_ERROR_CODE_MAP
from django.conf import settings
from google.protobuf import empty_pb2
from google.protobuf.json_format import MessageToDict, ParseDict, ParseError
from google.protobuf.message import DecodeError, Message
from google.rpc import error_details_pb2, status_pb2

from gateway import errors, metrics, recorder
from gateway.agent_bindings import AgentBindings, bindings
from gateway.cards import CardRewrite, rewrite_card
from gateway.grpc_binding import passthrough
from gateway.headers import outbound_headers
from gateway.rest_translate import RestTranslation, rest_call
from gateway.translation import (
    A2A_DOMAIN,
    CORE,
    ERROR_INFO_TYPE,
    V03,
    V10,
    CoreMethod,
    TranslationError,
    Unsupported,
    compat,
)
from outbound import policy
from outbound.errors import OutboundError
from registry.bindings import is_grpc_url

SERVICE = "lf.a2a.v1.A2AService"
SERVICE_03 = "a2a.v1.A2AService"
#: Headers of the caller that are not gRPC metadata (the call's own framing).
_DROPPED = frozenset({"content-type", "content-length", "accept", "te", "tenant", "host",
                      "connection", "transfer-encoding", "a2a-version"})
#: The JSON-RPC error codes A2A 0.3 has; an error outside them is -32603 to a 0.3 caller (as
#: the SDK's 0.3 adapter answers).
_CODES_03 = frozenset({-32700, -32600, -32601, -32602, -32603, *range(-32007, -32000)})
#: A gRPC status without an A2A ErrorInfo: the JSON-RPC code it maps to (else -32603).
_STATUS_CODES = {grpc.StatusCode.INVALID_ARGUMENT: -32602,
                 grpc.StatusCode.UNIMPLEMENTED: -32601}


def is_grpc_target(endpoint: str) -> bool:
    """Whether an agent's endpoint is its gRPC address: its calls are translated here."""
    return is_grpc_url(endpoint)


# --- the caller's request ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JsonRpcCall:
    """One JSON-RPC call translated: the core method and request, and whether the caller used
    the A2A 0.3 method name (its answer is then in the 0.3 shapes)."""

    method: CoreMethod
    request: Message
    v03: bool


_REQUESTS_03: dict[str, tuple[str, type[Any], Callable[[Any], Message]]] = {
    "message/send": ("SendMessage", t03.SendMessageRequest,
                     conversions.to_core_send_message_request),
    "message/stream": ("SendStreamingMessage", t03.SendStreamingMessageRequest,
                       conversions.to_core_send_message_request),
    "tasks/get": ("GetTask", t03.GetTaskRequest, conversions.to_core_get_task_request),
    "tasks/cancel": ("CancelTask", t03.CancelTaskRequest,
                     conversions.to_core_cancel_task_request),
    "tasks/resubscribe": ("SubscribeToTask", t03.TaskResubscriptionRequest,
                          conversions.to_core_subscribe_to_task_request),
    "tasks/pushNotificationConfig/set": (
        "CreateTaskPushNotificationConfig", t03.SetTaskPushNotificationConfigRequest,
        conversions.to_core_create_task_push_notification_config_request),
    "tasks/pushNotificationConfig/get": (
        "GetTaskPushNotificationConfig", t03.GetTaskPushNotificationConfigRequest,
        conversions.to_core_get_task_push_notification_config_request),
    "tasks/pushNotificationConfig/list": (
        "ListTaskPushNotificationConfigs", t03.ListTaskPushNotificationConfigRequest,
        conversions.to_core_list_task_push_notification_config_request),
    "tasks/pushNotificationConfig/delete": (
        "DeleteTaskPushNotificationConfig", t03.DeleteTaskPushNotificationConfigRequest,
        conversions.to_core_delete_task_push_notification_config_request),
    "agent/getAuthenticatedExtendedCard": (
        "GetExtendedAgentCard", t03.GetAuthenticatedExtendedCardRequest,
        conversions.to_core_get_extended_agent_card_request),
}


class UnknownMethod(ValueError):
    """A JSON-RPC method A2A has in neither version (-32601)."""


def jsonrpc_call(payload: dict[str, Any]) -> JsonRpcCall:
    """The translated call of a JSON-RPC request. Raises :class:`UnknownMethod`, or
    :class:`~gateway.translation.TranslationError` for params the method cannot take."""
    name = payload.get("method")
    params = payload.get("params")
    core = CORE.get(name) if isinstance(name, str) else None
    if core is not None:
        request = core.request()
        try:
            ParseDict(params if isinstance(params, dict) else {}, request,
                      ignore_unknown_fields=True)
        except (ParseError, ValueError, TypeError) as exc:
            raise TranslationError(f"invalid params for {name}: {exc}") from None
        return JsonRpcCall(core, request, False)
    found = _REQUESTS_03.get(name) if isinstance(name, str) else None
    if found is None:
        raise UnknownMethod(f"Method not found: {name}")
    core_name, model, to_core = found
    rpc_id = payload.get("id")
    envelope = {"jsonrpc": "2.0", "method": name, "params": params,
                "id": rpc_id if isinstance(rpc_id, (str, int)) else 0}
    request = compat(lambda body: to_core(model.model_validate(body)))(envelope)
    return JsonRpcCall(CORE[core_name], request, True)


def _dump(model: Any) -> Any:
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


def jsonrpc_result(call: JsonRpcCall, reply: Any) -> Any:
    """The JSON-RPC ``result`` of a core reply (one stream message of a streaming method):
    ProtoJSON for a 1.0 caller, the 0.3 shapes (the SDK's compat conversions) for a 0.3 one."""
    name = call.method.name
    if not call.v03:
        return MessageToDict(reply, always_print_fields_with_no_presence=name == "ListTasks")
    if call.method.streaming:
        return _dump(conversions.to_compat_stream_response(reply).result)
    if name == "SendMessage":
        return _dump(conversions.to_compat_task(reply.task) if reply.HasField("task")
                     else conversions.to_compat_message(reply.message))
    if name in ("GetTask", "CancelTask"):
        return _dump(conversions.to_compat_task(reply))
    if name in ("CreateTaskPushNotificationConfig", "GetTaskPushNotificationConfig"):
        return _dump(conversions.to_compat_task_push_notification_config(reply))
    if name == "ListTaskPushNotificationConfigs":
        return [_dump(conversions.to_compat_task_push_notification_config(config))
                for config in reply.configs]
    if name == "GetExtendedAgentCard":
        return _dump(conversions.to_compat_agent_card(_card_03(reply)))
    return None  # DeleteTaskPushNotificationConfig


def _card_03(card: Any) -> Any:
    """A 1.x agent card as a 0.3 caller gets it: the 0.3 view needs a 0.x interface, and the
    gateway's JSON-RPC answers this caller's 0.3 method names -- a JSON-RPC 0.3 entry first
    (its URL the agent's gRPC address, which the card rewrite points at the gateway)."""
    if any(not i.protocol_version or i.protocol_version.startswith("0.")
           for i in card.supported_interfaces):
        return card
    out = type(card)()
    out.CopyFrom(card)
    first = card.supported_interfaces[0].url if card.supported_interfaces else ""
    del out.supported_interfaces[:]
    out.supported_interfaces.add(url=first, protocol_binding="JSONRPC", protocol_version="0.3")
    out.supported_interfaces.extend(card.supported_interfaces)
    return out


# --- an agent serving the 0.3 service: core <-> 0.3 protobuf, as the SDK's 0.3 gRPC client ----


def _send_03(request: Any) -> Message:
    params = conversions.to_compat_send_message_request(request, request_id=0).params
    return pb03.SendMessageRequest(
        request=ToProto.message(params.message),
        configuration=ToProto.message_send_configuration(params.configuration),
        metadata=ToProto.metadata(params.metadata))


def _send_reply_03(data: bytes) -> Message:
    reply = pb03.SendMessageResponse.FromString(data)
    which = reply.WhichOneof("payload")
    if which == "task":
        return pb.SendMessageResponse(task=conversions.to_core_task(FromProto.task(reply.task)))
    if which == "msg":
        return pb.SendMessageResponse(message=conversions.to_core_message(
            FromProto.message(reply.msg)))
    raise TranslationError("the agent's answer holds neither a task nor a message")


def _event_03(data: bytes) -> Message:
    return conversions.to_core_stream_response(t03.SendStreamingMessageSuccessResponse(
        result=FromProto.stream_response(pb03.StreamResponse.FromString(data))))


def _task_03(data: bytes) -> Message:
    return conversions.to_core_task(FromProto.task(pb03.Task.FromString(data)))


def _create_push_03(request: Any) -> Message:
    params = conversions.to_compat_create_task_push_notification_config_request(
        request, request_id=0).params
    return pb03.CreateTaskPushNotificationConfigRequest(
        parent=f"tasks/{request.task_id}", config_id=params.push_notification_config.id,
        config=ToProto.task_push_notification_config(params))


def _push_03(data: bytes) -> Message:
    return conversions.to_core_task_push_notification_config(
        FromProto.task_push_notification_config(
            pb03.TaskPushNotificationConfig.FromString(data)))


def _push_list_03(data: bytes) -> Message:
    return conversions.to_core_list_task_push_notification_config_response(
        FromProto.list_task_push_notification_config_response(
            pb03.ListTaskPushNotificationConfigResponse.FromString(data)))


def _push_name(request: Any) -> str:
    return f"tasks/{request.task_id}/pushNotificationConfigs/{request.id}"


#: The 0.3 service's method, request and reply of each core method (no ListTasks in 0.3).
_AGENT_03: dict[str, tuple[str, Callable[[Any], Message], Callable[[bytes], Message]]] = {
    "SendMessage": ("SendMessage", _send_03, _send_reply_03),
    "SendStreamingMessage": ("SendStreamingMessage", _send_03, _event_03),
    "GetTask": ("GetTask", lambda r: pb03.GetTaskRequest(
        name=f"tasks/{r.id}", history_length=r.history_length), _task_03),
    "CancelTask": ("CancelTask", lambda r: pb03.CancelTaskRequest(name=f"tasks/{r.id}"),
                   _task_03),
    "SubscribeToTask": ("TaskSubscription",
                        lambda r: pb03.TaskSubscriptionRequest(name=f"tasks/{r.id}"), _event_03),
    "CreateTaskPushNotificationConfig": ("CreateTaskPushNotificationConfig", _create_push_03,
                                         _push_03),
    "GetTaskPushNotificationConfig": (
        "GetTaskPushNotificationConfig",
        lambda r: pb03.GetTaskPushNotificationConfigRequest(name=_push_name(r)), _push_03),
    "ListTaskPushNotificationConfigs": (
        "ListTaskPushNotificationConfig",
        lambda r: pb03.ListTaskPushNotificationConfigRequest(parent=f"tasks/{r.task_id}"),
        _push_list_03),
    "DeleteTaskPushNotificationConfig": (
        "DeleteTaskPushNotificationConfig",
        lambda r: pb03.DeleteTaskPushNotificationConfigRequest(name=_push_name(r)),
        lambda data: empty_pb2.Empty()),
    "GetExtendedAgentCard": (
        "GetAgentCard", lambda r: pb03.GetAgentCardRequest(),
        lambda data: conversions.to_core_agent_card(FromProto.agent_card(
            pb03.AgentCard.FromString(data)))),
}


@dataclass(frozen=True, slots=True)
class AgentMethod:
    """A core method as the agent's gRPC service has it: the path, the request's bytes and
    the reply's decoding (refusals raised as :class:`TranslationError`)."""

    path: str
    encode: Callable[[Message], bytes]
    decode: Callable[[bytes], Message]
    version: str  # the service's A2A version (the ``a2a-version`` metadata)


def agent_method(method: CoreMethod, version: str, tenant: str) -> AgentMethod:
    """The agent's ``method`` on its gRPC service of ``version`` (1.0: the core messages, the
    request's ``tenant`` the agent's own; 0.3: the SDK's conversions). Raises
    :class:`~gateway.translation.Unsupported` for a method 0.3 has not."""
    if version == V10:
        def encode(request: Message) -> bytes:
            outgoing: Any = type(request)()
            outgoing.CopyFrom(request)
            if "tenant" in outgoing.DESCRIPTOR.fields_by_name:
                outgoing.tenant = tenant
            data: bytes = outgoing.SerializeToString()
            return data

        def decode(data: bytes) -> Message:
            try:
                return method.reply.FromString(data)
            except DecodeError as exc:
                raise TranslationError(f"not a {method.reply.__name__}: {exc}") from None

        return AgentMethod(f"/{SERVICE}/{method.name}", encode, decode, V10)
    found = _AGENT_03.get(method.name)
    if found is None:
        raise Unsupported(f"{method.name} is not an A2A 0.3 method")
    name, to_03, from_03 = found

    def decode_03(data: bytes) -> Message:
        try:
            return compat(from_03)(data)
        except DecodeError as exc:
            raise TranslationError(str(exc)) from None

    return AgentMethod(f"/{SERVICE_03}/{name}",
                       lambda request: compat(to_03)(request).SerializeToString(), decode_03,
                       V03)


# --- the agent's status ------------------------------------------------------------------------


_ERRORS_BY_NAME = {cls.__name__: code for cls, code in JSON_RPC_ERROR_CODE_MAP.items()}


def status_error(code: grpc.StatusCode, details: str,
                 trailing: Any) -> dict[str, Any]:
    """The JSON-RPC error object of the agent's gRPC status: the A2A error its ``ErrorInfo``
    (domain ``a2a-protocol.org``, in ``grpc-status-details-bin``) names, with that error's
    JSON-RPC code and the ErrorInfo as ``data`` (as a 1.0 JSON-RPC agent answers it), or the one
    a 0.3 server's details name (``"TaskNotFoundError: ..."``); without either,
    ``INVALID_ARGUMENT`` -32602, ``UNIMPLEMENTED`` -32601, anything else -32603 naming the
    status."""
    for key, value in trailing or ():
        if key != passthrough.STATUS_DETAILS or not isinstance(value, bytes):
            continue
        try:
            status = status_pb2.Status.FromString(value)
        except DecodeError:
            break
        for detail in status.details:
            info = error_details_pb2.ErrorInfo()
            if not detail.Unpack(info) or info.domain != A2A_DOMAIN:
                continue
            cls = A2A_REASON_TO_ERROR.get(info.reason)
            if cls is None or cls not in JSON_RPC_ERROR_CODE_MAP:
                continue
            return {"code": JSON_RPC_ERROR_CODE_MAP[cls], "message": details or status.message,
                    "data": [{"@type": ERROR_INFO_TYPE, "reason": info.reason,
                              "domain": info.domain, "metadata": dict(info.metadata)}]}
    name, sep, message = details.partition(": ")
    if sep and name in _ERRORS_BY_NAME:  # the SDK's 0.3 gRPC servers: "<ErrorName>: <message>"
        return {"code": _ERRORS_BY_NAME[name], "message": message}
    json_code = _STATUS_CODES.get(code)
    if json_code is not None:
        return {"code": json_code, "message": details or code.name}
    return {"code": -32603, "message": f"gRPC {code.name}: {details}"[:2000]}


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


class _Record:
    """What the metrics and the console's recorder read of a finished call."""

    __slots__ = ("outcome", "started", "status", "nbytes")

    def __init__(self) -> None:
        self.outcome = "unknown"
        self.started = False
        self.status = 0
        self.nbytes = 0


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
                     started: float, request_bytes: int, receive: Receive | None) -> None:
    """Make the agent's gRPC call of ``request`` (on its 1.0 service when its card lists one,
    else its 0.3 one) and answer the caller through ``answer``; metrics and the console's
    recorder see it under the 1.0 method name. A stream's caller leaving (``receive`` answers
    ``http.disconnect``) cancels the agent's call."""
    record = _Record()
    agent_id = route.agent_id
    metrics.count_request(agent_id, method.name)
    version = V03 if agent.grpc_v03 and not agent.grpc_v10 else V10
    try:
        target = agent_method(method, version, agent.grpc_tenant)
        data = target.encode(request)
    except Unsupported:
        await _gateway_error(answer, record, errors.BINDING_UNAVAILABLE,
                             f"{method.name} is not an A2A 0.3 method, and agent {agent_id} "
                             "serves the A2A 0.3 gRPC service", False)
        await answer.end()
        _finish(record, agent_id, caller, method.name, request_bytes, started)
        return
    except TranslationError as exc:
        await _gateway_error(answer, record, errors.INVALID_REQUEST, str(exc), False)
        await answer.end()
        _finish(record, agent_id, caller, method.name, request_bytes, started)
        return
    if not passthrough.take_slot(agent_id, route.max_concurrency):
        metrics.count_busy(agent_id)
        await _gateway_error(answer, record, errors.BUSY, "", False)
        await answer.end()
        _finish(record, agent_id, caller, method.name, request_bytes, started)
        return
    try:
        call = _call(answer, record, route, target, method.streaming, data, caller, tags,
                     timeout)
        if method.streaming and receive is not None:
            if not await _unless_gone(call, receive):
                record.outcome = "client_disconnect"
                return
        else:
            await call
        await answer.end()
    except asyncio.CancelledError:
        if record.outcome in ("unknown", "ok"):
            record.outcome = "client_disconnect"
        raise
    finally:
        passthrough.release_slot(agent_id)
        _finish(record, agent_id, caller, method.name, request_bytes, started)


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


def _finish(record: _Record, agent_id: str, caller: str, method: str, size: int,
            started: float) -> None:
    seconds = time.perf_counter() - started
    metrics.observe_latency(agent_id, record.outcome, seconds)
    recorder.record(agent_id, caller, method, record, size, seconds)


async def _gateway_error(answer: Answer, record: _Record, kind: str, detail: str,
                         executed: bool) -> None:
    record.outcome = kind
    record.status = errors.rest_status_for(kind)
    await answer.gateway_error(kind, detail, executed)


async def _call(answer: Answer, record: _Record, route: Any, target: AgentMethod,
                streaming: bool, data: bytes, caller: str, tags: dict[str, str],
                timeout: float) -> None:
    address = route.endpoint
    try:
        channel = await passthrough.channel_for(address)
    except (ValueError, OSError, OutboundError) as exc:
        await _gateway_error(answer, record, errors.UNREACHABLE,
                             f"the agent's gRPC interface {address}: {exc}", False)
        return
    if not await passthrough.connected(channel, min(policy.current().connect_timeout, timeout)):
        passthrough.forget(address, channel)
        await _gateway_error(answer, record, errors.UNREACHABLE,
                             f"cannot connect to the agent's gRPC interface {address}", False)
        return
    metadata = _metadata(tags, caller, route.credential_passthrough, target.version)
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


async def _failed(answer: Answer, record: _Record, exc: grpc.aio.AioRpcError,
                  deadline: float | None) -> None:
    code = exc.code()
    details = exc.details() or ""
    trailing = exc.trailing_metadata()
    if code is grpc.StatusCode.DEADLINE_EXCEEDED and deadline is not None \
            and time.monotonic() >= deadline - 0.05:
        await _gateway_error(answer, record, errors.TIMEOUT, "the agent did not answer in time",
                             True)
        return
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in details:
        await _gateway_error(answer, record, errors.RESPONSE_TOO_LARGE, "", True)
        return
    if code is grpc.StatusCode.UNAVAILABLE and not trailing:
        await _gateway_error(answer, record, errors.UNREACHABLE,
                             f"the agent's connection failed: {details}"[:300], True)
        return
    record.outcome, record.status = "agent_error", 200
    await answer.agent_error(status_error(code, details, trailing))


async def _stream(answer: Answer, record: _Record, channel: grpc.aio.Channel,
                  target: AgentMethod, data: bytes, metadata: list[tuple[str, str]]) -> None:
    call = channel.unary_stream(target.path)(data, metadata=metadata)
    idle = float(settings.A2A_SSE_IDLE_TIMEOUT_SECONDS)
    stall = float(settings.A2A_SSE_STALL_TIMEOUT_SECONDS)
    try:
        while True:
            try:
                async with asyncio.timeout(idle):
                    message = await call.read()
            except TimeoutError:
                call.cancel()
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
        await self.send({"type": "http.response.start", "status": status, "headers": [
            (b"content-type", b"application/json"), (b"content-length", b"%d" % len(body)),
            (b"x-a2a-executed", b"true" if executed else b"false")]})
        await self.send({"type": "http.response.body", "body": body})

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
        if self.call.v03 and error["code"] not in _CODES_03:
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
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"application/json"), (b"content-length", b"%d" % len(body)),
            (b"x-a2a-executed", b"false")]})
        await send({"type": "http.response.body", "body": body})
        return
    answer = JsonRpcAnswer(send, rpc_id, route.agent_id, call)
    try:
        agent = await bindings(route)
    except Exception:
        await answer.gateway_error(errors.UNREACHABLE, "the agent's card cannot be read now; "
                                   "retry", False)
        return
    await call_agent(answer, route=route, agent=agent, method=call.method,
                     request=call.request, caller=caller, tags=tags, timeout=timeout,
                     started=started, request_bytes=request_bytes, receive=receive)


# --- the HTTP+JSON caller ----------------------------------------------------------------------


class RelayAnswer:
    """A caller whose binding the gateway already translates from a 1.0 JSON-RPC agent's
    answer (:class:`~gateway.rest_translate.RestTranslation` for HTTP+JSON,
    :class:`~gateway.grpc_binding.calls.GrpcCall` for a gRPC caller of the other protocol
    version): the agent's reply is fed to it as that answer would be (its ProtoJSON, as ASGI
    messages), and it writes it in its binding's form. ``finish``: end the caller's answer
    with the call (HTTP+JSON; the gRPC call's handler finishes its own)."""

    def __init__(self, out: Any, agent_id: str, method: CoreMethod, *, version: str,
                 finish: bool) -> None:
        self.out = out
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
            message = _card_03(message)  # a 0.3 caller's card (``v1/card``, GetAgentCard)
        try:
            await self._answer("result", MessageToDict(message))
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
    refused = await check_webhook(call.method.name, MessageToDict(call.request))
    if refused is not None:
        await send_error(send, errors.WEBHOOK_REFUSED, route.agent_id, refused)
        return
    answer = RelayAnswer(RestTranslation(call, V10, send, card=card), route.agent_id,
                         call.method, version=call.version, finish=True)
    try:
        agent = await bindings(route)
    except Exception:
        await answer.gateway_error(errors.UNREACHABLE, "the agent's card cannot be read now; "
                                   "retry", False)
        return
    # The caller's path tenant is the gateway's: the agent gets its card's.
    await call_agent(answer, route=route, agent=agent, method=call.method,
                     request=call.request, caller=caller, tags=tags, timeout=timeout,
                     started=started, request_bytes=len(body), receive=receive)


async def send_error(send: Send, kind: str, agent_id: str, detail: str) -> None:
    """A gateway error of the HTTP+JSON binding before the agent was called."""
    body = errors.rest_error_body(kind, agent_id=agent_id, detail=detail)
    await send({"type": "http.response.start", "status": errors.rest_status_for(kind),
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", b"%d" % len(body)),
                            (b"x-a2a-executed", b"false")]})
    await send({"type": "http.response.body", "body": body})


async def answer_grpc(out: Any, *, route: Any, caller: str, tags: dict[str, str],
                      method: CoreMethod, request: Message, version: str, timeout: float,
                      started: float, request_bytes: int) -> None:
    """Answer an admitted gRPC call (``out``: its :class:`~gateway.grpc_binding.calls.GrpcCall`,
    which the caller's handler finishes) of a protocol version the gRPC-only agent of ``route``
    does not serve itself: translated to the version it serves."""
    answer = RelayAnswer(out, route.agent_id, method, version=version, finish=False)
    try:
        agent = await bindings(route)
    except Exception:
        await answer.gateway_error(errors.UNREACHABLE, "the agent's card cannot be read now; "
                                   "retry", False)
        return
    await call_agent(answer, route=route, agent=agent, method=method, request=request,
                     caller=caller, tags=tags, timeout=timeout, started=started,
                     request_bytes=request_bytes, receive=out.receive)
