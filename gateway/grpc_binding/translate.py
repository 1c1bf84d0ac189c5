"""Translation between the A2A gRPC binding and an agent's JSON-RPC, with the a2a-sdk's own
types and converters. Pure functions: no I/O, no gRPC runtime.

The gateway's listener serves both service names: ``lf.a2a.v1.A2AService`` (A2A 1.0) and
``a2a.v1.A2AService`` (A2A 0.3). An agent reached through its JSON-RPC interface speaks 1.0
(method names ``SendMessage``, ..., params the ProtoJSON of the request message, answers the
ProtoJSON of the reply message) or 0.3 (``message/send``, ..., the 0.3 JSON shapes).
Protobuf is canonical in A2A 1.0, so every call goes through the 1.0 ("core") messages of
``a2a.types.a2a_pb2``::

    caller's request bytes -> core request -> the agent's JSON-RPC request
    the agent's JSON-RPC result (or each SSE event's) -> core reply -> caller's reply bytes

A 0.3 caller's messages become core messages and back with the SDK's compat converters
(``a2a.compat.v0_3.proto_utils`` between 0.3 protobuf and the 0.3 models,
``a2a.compat.v0_3.conversions`` between those and core), as the SDK's own 0.3 gRPC handler
does; a 0.3 agent's JSON with the same conversions, as the SDK's 0.3 JSON-RPC client transport
does. A 1.0 agent's JSON is ProtoJSON (``google.protobuf.json_format``; unknown fields are
ignored, as the SDK's clients ignore them).

The caller's ``tenant`` is the gateway's: it names the agent (the served card sets it to the
agent id) and is cleared before the request reaches the agent, which has tenants of its own.

An agent's JSON-RPC error becomes the gRPC status the SDK's gRPC servers answer for it
(:func:`agent_error_status`): for 1.0 callers a ``google.rpc.Status`` with an ``ErrorInfo`` of
domain ``a2a-protocol.org`` (what the SDK's 1.0 gRPC client raises as the matching A2A error),
for 0.3 callers the ``"<ErrorName>: <message>"`` details its 0.3 client reads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from a2a.compat.v0_3 import a2a_v0_3_pb2 as pb03
from a2a.compat.v0_3 import conversions
from a2a.compat.v0_3 import types as t03
from a2a.compat.v0_3.proto_utils import (
    TASK_NAME_MATCH,
    TASK_PUSH_CONFIG_NAME_MATCH,
    FromProto,
    ToProto,
)
from a2a.types import a2a_pb2 as pb
from a2a.utils.errors import A2A_ERROR_MAPPING, JSON_RPC_ERROR_CODE_MAP, A2AError
from a2a.utils.proto_utils import parse_lenient
from google.protobuf import any_pb2, empty_pb2
from google.protobuf.json_format import MessageToDict, ParseError
from google.protobuf.message import DecodeError, Message
from google.rpc import code_pb2, error_details_pb2, status_pb2
from pydantic import ValidationError

V10 = "1.0"
V03 = "0.3"
SERVICE_V10 = "lf.a2a.v1.A2AService"
SERVICE_V03 = "a2a.v1.A2AService"
SERVICES = {SERVICE_V10: V10, SERVICE_V03: V03}
#: The domain of the ``ErrorInfo`` the SDK's gRPC servers attach to A2A errors.
A2A_DOMAIN = "a2a-protocol.org"


class TranslationError(ValueError):
    """A message that cannot be translated: the caller's request (answered
    ``INVALID_ARGUMENT``), or the agent's answer (a broken answer, ``INTERNAL``)."""


class Unsupported(TranslationError):
    """The method does not exist in the protocol version the agent speaks (``ListTasks`` in
    A2A 0.3): answered ``UNIMPLEMENTED``."""


# --- the core (A2A 1.0) methods ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CoreMethod:
    """An A2A 1.0 method: its request and reply messages, whether it streams, and the name of
    the same method in A2A 0.3 JSON-RPC ("" when 0.3 has none)."""

    name: str
    request: type[Message]
    reply: type[Message]
    streaming: bool
    v03: str


CORE: dict[str, CoreMethod] = {m.name: m for m in (
    CoreMethod("SendMessage", pb.SendMessageRequest, pb.SendMessageResponse, False,
               "message/send"),
    CoreMethod("SendStreamingMessage", pb.SendMessageRequest, pb.StreamResponse, True,
               "message/stream"),
    CoreMethod("GetTask", pb.GetTaskRequest, pb.Task, False, "tasks/get"),
    CoreMethod("ListTasks", pb.ListTasksRequest, pb.ListTasksResponse, False, ""),
    CoreMethod("CancelTask", pb.CancelTaskRequest, pb.Task, False, "tasks/cancel"),
    CoreMethod("SubscribeToTask", pb.SubscribeToTaskRequest, pb.StreamResponse, True,
               "tasks/resubscribe"),
    CoreMethod("CreateTaskPushNotificationConfig", pb.TaskPushNotificationConfig,
               pb.TaskPushNotificationConfig, False, "tasks/pushNotificationConfig/set"),
    CoreMethod("GetTaskPushNotificationConfig", pb.GetTaskPushNotificationConfigRequest,
               pb.TaskPushNotificationConfig, False, "tasks/pushNotificationConfig/get"),
    CoreMethod("ListTaskPushNotificationConfigs", pb.ListTaskPushNotificationConfigsRequest,
               pb.ListTaskPushNotificationConfigsResponse, False,
               "tasks/pushNotificationConfig/list"),
    CoreMethod("DeleteTaskPushNotificationConfig", pb.DeleteTaskPushNotificationConfigRequest,
               empty_pb2.Empty, False, "tasks/pushNotificationConfig/delete"),
    CoreMethod("GetExtendedAgentCard", pb.GetExtendedAgentCardRequest, pb.AgentCard, False,
               "agent/getAuthenticatedExtendedCard"),
)}


# --- the caller's side: the two gRPC services --------------------------------------------------


@dataclass(frozen=True, slots=True)
class ServiceMethod:
    """One method of a served gRPC service: its core method, and the caller's bytes to and
    from core messages."""

    service: str
    name: str
    core: CoreMethod
    decode: Callable[[bytes], Message]  # the caller's request -> core request
    encode: Callable[[Message], Message]  # core reply -> the caller's reply message

    @property
    def version(self) -> str:
        return SERVICES[self.service]

    @property
    def path(self) -> str:
        return f"/{self.service}/{self.name}"


def _parse(cls: type[Message], data: bytes) -> Any:
    try:
        return cls.FromString(data)
    except DecodeError as exc:
        raise TranslationError(f"not a {cls.DESCRIPTOR.full_name}: {exc}") from None


def _v10(core: CoreMethod) -> ServiceMethod:
    return ServiceMethod(SERVICE_V10, core.name, core,
                         lambda data, cls=core.request: _parse(cls, data),  # type: ignore[misc]
                         lambda reply: reply)


def _task_id(name: str) -> str:
    match = TASK_NAME_MATCH.match(name)
    if match is None:
        raise TranslationError(f"not a task name (tasks/{{id}}): {name!r}")
    return match.group(1)


def _task_and_config(name: str) -> tuple[str, str]:
    match = TASK_PUSH_CONFIG_NAME_MATCH.match(name)
    if match is None:
        raise TranslationError(
            f"not a push config name (tasks/{{id}}/pushNotificationConfigs/{{id}}): {name!r}")
    return match.group(1), match.group(2)


def _compat(convert: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A conversion of the SDK's compat layer, its refusals as :class:`TranslationError`."""
    def converted(value: Any) -> Any:
        try:
            return convert(value)
        except (A2AError, ValidationError, ValueError, TypeError, AttributeError,
                KeyError) as exc:
            if isinstance(exc, TranslationError):
                raise
            raise TranslationError(str(exc) or type(exc).__name__) from None
    return converted


def _send_03(data: bytes) -> Message:
    request = _parse(pb03.SendMessageRequest, data)
    return conversions.to_core_send_message_request(
        t03.SendMessageRequest(id=0, params=FromProto.message_send_params(request)))


def _get_task_03(data: bytes) -> Message:
    request = _parse(pb03.GetTaskRequest, data)
    return conversions.to_core_get_task_request(
        t03.GetTaskRequest(id=0, params=t03.TaskQueryParams(
            id=_task_id(request.name), history_length=request.history_length or None)))


def _cancel_03(data: bytes) -> Message:
    request = _parse(pb03.CancelTaskRequest, data)
    return conversions.to_core_cancel_task_request(
        t03.CancelTaskRequest(id=0, params=t03.TaskIdParams(id=_task_id(request.name))))


def _subscribe_03(data: bytes) -> Message:
    request = _parse(pb03.TaskSubscriptionRequest, data)
    return conversions.to_core_subscribe_to_task_request(
        t03.TaskResubscriptionRequest(id=0, params=t03.TaskIdParams(id=_task_id(request.name))))


def _create_push_03(data: bytes) -> Message:
    request = _parse(pb03.CreateTaskPushNotificationConfigRequest, data)
    _task_id(request.parent)
    return conversions.to_core_create_task_push_notification_config_request(
        t03.SetTaskPushNotificationConfigRequest(
            id=0, params=FromProto.task_push_notification_config_request(request)))


def _get_push_03(data: bytes) -> Message:
    request = _parse(pb03.GetTaskPushNotificationConfigRequest, data)
    task_id, config_id = _task_and_config(request.name)
    return conversions.to_core_get_task_push_notification_config_request(
        t03.GetTaskPushNotificationConfigRequest(
            id=0, params=t03.GetTaskPushNotificationConfigParams(
                id=task_id, push_notification_config_id=config_id)))


def _list_push_03(data: bytes) -> Message:
    request = _parse(pb03.ListTaskPushNotificationConfigRequest, data)
    return conversions.to_core_list_task_push_notification_config_request(
        t03.ListTaskPushNotificationConfigRequest(
            id=0, params=t03.ListTaskPushNotificationConfigParams(id=_task_id(request.parent))))


def _delete_push_03(data: bytes) -> Message:
    request = _parse(pb03.DeleteTaskPushNotificationConfigRequest, data)
    task_id, config_id = _task_and_config(request.name)
    return conversions.to_core_delete_task_push_notification_config_request(
        t03.DeleteTaskPushNotificationConfigRequest(
            id=0, params=t03.DeleteTaskPushNotificationConfigParams(
                id=task_id, push_notification_config_id=config_id)))


def _card_03(data: bytes) -> Message:
    _parse(pb03.GetAgentCardRequest, data)
    return pb.GetExtendedAgentCardRequest()


def _send_reply_03(reply: Any) -> Message:
    if not reply.HasField("task") and not reply.HasField("message"):
        raise TranslationError("the agent's answer holds neither a task nor a message")
    result = conversions.to_compat_send_message_response(reply).root
    assert isinstance(result, t03.SendMessageSuccessResponse)  # built from a reply, never an error
    return ToProto.task_or_message(result.result)


def _event_03(reply: Any) -> Message:
    return ToProto.stream_response(conversions.to_compat_stream_response(reply).result)


def _task_03(reply: Any) -> Message:
    return ToProto.task(conversions.to_compat_task(reply))


def _push_03(reply: Any) -> Message:
    return ToProto.task_push_notification_config(
        conversions.to_compat_task_push_notification_config(reply))


def _push_list_03(reply: Any) -> Message:
    return pb03.ListTaskPushNotificationConfigResponse(configs=[
        ToProto.task_push_notification_config(
            conversions.to_compat_task_push_notification_config(config))
        for config in reply.configs])


def _agent_card_03(reply: Any) -> Message:
    return ToProto.agent_card(conversions.to_compat_agent_card(reply))


def _v03(name: str, core: str, decode: Callable[[bytes], Message],
         encode: Callable[[Any], Message]) -> ServiceMethod:
    return ServiceMethod(SERVICE_V03, name, CORE[core], _compat(decode), _compat(encode))


#: Every served method by its gRPC path (``/service/Method``).
METHODS: dict[str, ServiceMethod] = {m.path: m for m in (
    *(_v10(core) for core in CORE.values()),
    _v03("SendMessage", "SendMessage", _send_03, _send_reply_03),
    _v03("SendStreamingMessage", "SendStreamingMessage", _send_03, _event_03),
    _v03("GetTask", "GetTask", _get_task_03, _task_03),
    _v03("CancelTask", "CancelTask", _cancel_03, _task_03),
    _v03("TaskSubscription", "SubscribeToTask", _subscribe_03, _event_03),
    _v03("CreateTaskPushNotificationConfig", "CreateTaskPushNotificationConfig",
         _create_push_03, _push_03),
    _v03("GetTaskPushNotificationConfig", "GetTaskPushNotificationConfig", _get_push_03,
         _push_03),
    _v03("ListTaskPushNotificationConfig", "ListTaskPushNotificationConfigs", _list_push_03,
         _push_list_03),
    _v03("GetAgentCard", "GetExtendedAgentCard", _card_03, _agent_card_03),
    _v03("DeleteTaskPushNotificationConfig", "DeleteTaskPushNotificationConfig",
         _delete_push_03, lambda reply: reply),
)}


def methods_of(service: str) -> list[ServiceMethod]:
    return [m for m in METHODS.values() if m.service == service]


def tenant_of(request: Message) -> str:
    """The core request's ``tenant`` (every 1.0 request has one; a 0.3 caller's has none)."""
    return getattr(request, "tenant", "")


# --- the agent's side: its JSON-RPC, 1.0 or 0.3 ------------------------------------------------


def _dump_03(model: Any) -> dict[str, Any]:
    return model.params.model_dump(by_alias=True, exclude_none=True, mode="json")


_TO_03: dict[str, Callable[[Any], dict[str, Any]]] = {
    "SendMessage": lambda r: _dump_03(conversions.to_compat_send_message_request(r, 0)),
    "SendStreamingMessage": lambda r: _dump_03(conversions.to_compat_send_message_request(r, 0)),
    "GetTask": lambda r: _dump_03(conversions.to_compat_get_task_request(r, 0)),
    "CancelTask": lambda r: _dump_03(conversions.to_compat_cancel_task_request(r, 0)),
    "SubscribeToTask": lambda r: _dump_03(conversions.to_compat_subscribe_to_task_request(r, 0)),
    "CreateTaskPushNotificationConfig": lambda r: _dump_03(
        conversions.to_compat_create_task_push_notification_config_request(r, 0)),
    "GetTaskPushNotificationConfig": lambda r: _dump_03(
        conversions.to_compat_get_task_push_notification_config_request(r, 0)),
    "ListTaskPushNotificationConfigs": lambda r: _dump_03(
        conversions.to_compat_list_task_push_notification_config_request(r, 0)),
    "DeleteTaskPushNotificationConfig": lambda r: _dump_03(
        conversions.to_compat_delete_task_push_notification_config_request(r, 0)),
    "GetExtendedAgentCard": lambda r: {},
}


def agent_request(method: CoreMethod, request: Message, version: str) -> tuple[str, Any]:
    """The JSON-RPC method and params of a core request, for an agent speaking ``version``.
    Raises :class:`Unsupported` for a method the version has not."""
    if version == V10:
        params = MessageToDict(request)
        params.pop("tenant", None)  # the gateway's tenant (the agent id), not the agent's
        return method.name, params
    convert = _TO_03.get(method.name)
    if convert is None or not method.v03:
        raise Unsupported(f"{method.name} is not an A2A 0.3 method")
    return method.v03, _compat(convert)(request)


def _kind_03(result: dict[str, Any]) -> str:
    """The 0.3 ``kind`` of a result, inferred as the SDK's 0.3 client does when absent."""
    kind = result.get("kind")
    if isinstance(kind, str) and kind:
        return kind
    if "taskId" in result and "final" in result:
        return "status-update"
    if "messageId" in result:
        return "message"
    if "id" in result:
        return "task"
    return ""


_EVENT_MODELS_03: dict[str, type[Any]] = {
    "task": t03.Task, "message": t03.Message, "status-update": t03.TaskStatusUpdateEvent,
    "artifact-update": t03.TaskArtifactUpdateEvent,
}


def _send_result_03(result: Any) -> Message:
    kind = _kind_03(result)
    if kind == "task":
        return pb.SendMessageResponse(task=conversions.to_core_task(t03.Task.model_validate(
            result)))
    if kind == "message":
        return pb.SendMessageResponse(message=conversions.to_core_message(
            t03.Message.model_validate(result)))
    raise TranslationError(f"the agent's answer is neither a task nor a message: {kind!r}")


def _push_list_result_03(result: Any) -> Message:
    if not isinstance(result, list):
        raise TranslationError("the agent's answer is not a list of push configs")
    return pb.ListTaskPushNotificationConfigsResponse(configs=[
        conversions.to_core_task_push_notification_config(
            t03.TaskPushNotificationConfig.model_validate(item)) for item in result])


_FROM_03: dict[str, Callable[[Any], Message]] = {
    "SendMessage": _send_result_03,
    "GetTask": lambda r: conversions.to_core_task(t03.Task.model_validate(r)),
    "CancelTask": lambda r: conversions.to_core_task(t03.Task.model_validate(r)),
    "CreateTaskPushNotificationConfig": lambda r: conversions.to_core_task_push_notification_config(
        t03.TaskPushNotificationConfig.model_validate(r)),
    "GetTaskPushNotificationConfig": lambda r: conversions.to_core_task_push_notification_config(
        t03.TaskPushNotificationConfig.model_validate(r)),
    "ListTaskPushNotificationConfigs": _push_list_result_03,
    "DeleteTaskPushNotificationConfig": lambda r: empty_pb2.Empty(),
    "GetExtendedAgentCard": lambda r: conversions.to_core_agent_card(
        t03.AgentCard.model_validate(r)),
}


def agent_result(method: CoreMethod, result: Any, version: str) -> Message:
    """The core reply of a JSON-RPC ``result`` of an agent speaking ``version``."""
    if method.streaming:
        event = agent_event(result, version)
        if event is None:
            raise TranslationError("the agent's answer is not an A2A event")
        return event
    if method.reply is empty_pb2.Empty:
        return empty_pb2.Empty()
    if version == V10:
        if not isinstance(result, dict):
            raise TranslationError(f"the agent's answer is not a {method.reply.__name__}")
        try:
            return parse_lenient(result, method.reply())
        except (ParseError, ValueError, TypeError) as exc:
            raise TranslationError(f"the agent's answer is not a {method.reply.__name__}: "
                                   f"{exc}") from None
    return _compat(_FROM_03[method.name])(result)


def agent_event(result: Any, version: str) -> Message | None:
    """The core ``StreamResponse`` of one streamed JSON-RPC ``result``; None for a 0.3 result
    of no known kind (the SDK's 0.3 client skips those too)."""
    if not isinstance(result, dict):
        raise TranslationError("the agent's event is not a JSON object")
    if version == V10:
        try:
            return parse_lenient(result, pb.StreamResponse())
        except (ParseError, ValueError, TypeError) as exc:
            raise TranslationError(f"the agent's event is not a StreamResponse: {exc}") \
                from None
    model = _EVENT_MODELS_03.get(_kind_03(result))
    if model is None:
        return None
    convert = _compat(lambda r: conversions.to_core_stream_response(
        t03.SendStreamingMessageSuccessResponse(result=model.model_validate(r))))
    return convert(result)


# --- errors ------------------------------------------------------------------------------------

_A2A_ERRORS = {code: cls for cls, code in JSON_RPC_ERROR_CODE_MAP.items()}
_ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo"


def status(code_name: str, message: str, *, reason: str = "", domain: str = "",
           metadata: dict[str, str] | None = None) -> status_pb2.Status:
    """A ``google.rpc.Status`` (``code_name``: a gRPC status code's name), with an
    ``ErrorInfo`` when ``reason`` is given."""
    out = status_pb2.Status(code=code_pb2.Code.Value(code_name), message=message)
    if reason:
        detail = any_pb2.Any()
        detail.Pack(error_details_pb2.ErrorInfo(reason=reason, domain=domain,
                                                metadata=metadata or {}))
        out.details.append(detail)
    return out


def agent_error_status(error: Any, version: str) -> status_pb2.Status:
    """The gRPC status of an agent's JSON-RPC ``error`` object for a caller of ``version``:
    what the SDK's gRPC server of that version answers for the same A2A error."""
    if not isinstance(error, dict):
        return status("UNKNOWN", f"agent error: {error!r}"[:1000])
    code = error.get("code")
    message = error.get("message")
    message = message if isinstance(message, str) else str(message or "")
    cls = _A2A_ERRORS.get(code) if isinstance(code, int) and not isinstance(code, bool) \
        else None
    mapping = A2A_ERROR_MAPPING.get(cls) if cls is not None else None
    if cls is None or mapping is None:
        return status("UNKNOWN", f"JSON-RPC error {code}: {message}")
    if version == V03:
        return status(mapping.grpc_status, f"{cls.__name__}: {message}")
    metadata: dict[str, str] = {}
    data = error.get("data")
    for item in data if isinstance(data, list) else []:
        if isinstance(item, dict) and item.get("@type") == _ERROR_INFO \
                and isinstance(item.get("metadata"), dict):
            metadata = {str(k): str(v) for k, v in item["metadata"].items()}
            break
    return status(mapping.grpc_status, message, reason=mapping.reason, domain=A2A_DOMAIN,
                  metadata=metadata)
