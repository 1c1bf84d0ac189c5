"""The messages of the calls :mod:`gateway.grpc_binding.outbound_translate` makes to an agent
that serves only gRPC: pure conversions with the a2a-sdk's own types and converters, no I/O.

- A JSON-RPC caller's request (1.0 method names: ProtoJSON params; 0.3 names: the 0.3 shapes,
  as the SDK's 0.3 JSON-RPC adapter reads them) to the core (A2A 1.0) request, and the core
  reply back to the caller's JSON-RPC result (:func:`jsonrpc_call`, :func:`jsonrpc_result`).
- The core request to the agent's gRPC service, 1.0 (the core messages, with the agent's own
  ``tenant``) or 0.3 (as the SDK's 0.3 gRPC client converts them), and its reply back
  (:func:`agent_method`).
- The agent's gRPC status to the JSON-RPC error of the A2A error it names
  (:func:`status_error`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
from a2a.compat.v0_3 import a2a_v0_3_pb2 as pb03
from a2a.compat.v0_3 import conversions
from a2a.compat.v0_3 import types as t03
from a2a.compat.v0_3.proto_utils import FromProto, ToProto
from a2a.types import a2a_pb2 as pb
from a2a.utils.errors import A2A_REASON_TO_ERROR, JSON_RPC_ERROR_CODE_MAP
from google.protobuf import empty_pb2
from google.protobuf.json_format import MessageToDict, ParseDict, ParseError
from google.protobuf.message import DecodeError, Message
from google.rpc import error_details_pb2, status_pb2

from gateway.grpc_binding.passthrough import STATUS_DETAILS
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

SERVICE = "lf.a2a.v1.A2AService"
SERVICE_03 = "a2a.v1.A2AService"
#: The JSON-RPC error codes A2A 0.3 has; an error outside them is -32603 to a 0.3 caller (as
#: the SDK's 0.3 adapter answers).
CODES_03 = frozenset({-32700, -32600, -32601, -32602, -32603, *range(-32007, -32000)})
#: A gRPC status without an A2A ErrorInfo: the JSON-RPC code it maps to (else -32603).
_STATUS_CODES = {grpc.StatusCode.INVALID_ARGUMENT: -32602,
                 grpc.StatusCode.UNIMPLEMENTED: -32601}


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
        return _dump(conversions.to_compat_agent_card(card_03(reply)))
    return None  # DeleteTaskPushNotificationConfig


def card_03(card: Any) -> Any:
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
        if key != STATUS_DETAILS or not isinstance(value, bytes):
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
