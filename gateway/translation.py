"""Translation between A2A bindings and an agent's JSON-RPC, with the a2a-sdk's own types and
converters: the pieces every translating binding shares (the gRPC listener,
:mod:`gateway.grpc_binding.translate`; the HTTP+JSON routes, :mod:`gateway.rest_translate`).
Pure functions: no I/O.

Protobuf is canonical in A2A 1.0, so every translated call goes through the 1.0 ("core")
messages of ``a2a.types.a2a_pb2``::

    the caller's request -> core request -> the agent's JSON-RPC request
    the agent's JSON-RPC result (or each SSE event's) -> core reply -> the caller's reply

An agent reached through its JSON-RPC interface speaks 1.0 (method names ``SendMessage``, ...,
params the ProtoJSON of the request message, answers the ProtoJSON of the reply message) or 0.3
(``message/send``, ..., the 0.3 JSON shapes). A 1.0 agent's JSON is ProtoJSON
(``google.protobuf.json_format``; unknown fields are ignored, as the SDK's clients ignore them);
a 0.3 agent's goes through the SDK's compat conversions (``a2a.compat.v0_3.conversions``), as
the SDK's 0.3 JSON-RPC client transport does.

A 0.3 caller's messages are the 0.3 protobuf messages (``a2a.compat.v0_3.a2a_v0_3_pb2``: the
0.3 gRPC service's, and the 0.3 HTTP+JSON binding's as ProtoJSON); they become core messages and
back with :data:`FROM_03` and :data:`TO_03` (``a2a.compat.v0_3.proto_utils`` between 0.3
protobuf and the 0.3 models, ``conversions`` between those and core), as the SDK's own 0.3 gRPC
and REST handlers do.

What is exact and what cannot be: docs/gateway.md ("Translation between bindings").
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
from a2a.utils.errors import (
    A2A_ERROR_MAPPING,
    A2A_ERROR_REASONS,
    JSON_RPC_ERROR_CODE_MAP,
    A2AError,
    ErrorMapping,
)
from a2a.utils.proto_utils import parse_lenient
from google.protobuf import empty_pb2
from google.protobuf.json_format import MessageToDict, ParseError
from google.protobuf.message import Message
from pydantic import ValidationError

V10 = "1.0"
V03 = "0.3"
#: The domain of the ``ErrorInfo`` the SDK's servers attach to A2A errors.
A2A_DOMAIN = "a2a-protocol.org"
ERROR_INFO_TYPE = "type.googleapis.com/google.rpc.ErrorInfo"


class TranslationError(ValueError):
    """A message that cannot be translated: the caller's request (an invalid argument), or the
    agent's answer (a broken answer, an internal error)."""


class Unsupported(TranslationError):
    """The method does not exist in the protocol version the agent speaks (``ListTasks`` in
    A2A 0.3)."""


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


def compat(convert: Callable[[Any], Any]) -> Callable[[Any], Any]:
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


# --- a 0.3 caller's messages (0.3 protobuf) <-> core -------------------------------------------


def task_id_of(name: str) -> str:
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


def _send_03(request: Any) -> Message:
    return conversions.to_core_send_message_request(
        t03.SendMessageRequest(id=0, params=FromProto.message_send_params(request)))


def _get_task_03(request: Any) -> Message:
    return conversions.to_core_get_task_request(
        t03.GetTaskRequest(id=0, params=t03.TaskQueryParams(
            id=task_id_of(request.name), history_length=request.history_length or None)))


def _cancel_03(request: Any) -> Message:
    return conversions.to_core_cancel_task_request(
        t03.CancelTaskRequest(id=0, params=t03.TaskIdParams(id=task_id_of(request.name))))


def _subscribe_03(request: Any) -> Message:
    return conversions.to_core_subscribe_to_task_request(
        t03.TaskResubscriptionRequest(id=0, params=t03.TaskIdParams(
            id=task_id_of(request.name))))


def _create_push_03(request: Any) -> Message:
    task_id_of(request.parent)
    return conversions.to_core_create_task_push_notification_config_request(
        t03.SetTaskPushNotificationConfigRequest(
            id=0, params=FromProto.task_push_notification_config_request(request)))


def _get_push_03(request: Any) -> Message:
    task_id, config_id = _task_and_config(request.name)
    return conversions.to_core_get_task_push_notification_config_request(
        t03.GetTaskPushNotificationConfigRequest(
            id=0, params=t03.GetTaskPushNotificationConfigParams(
                id=task_id, push_notification_config_id=config_id)))


def _list_push_03(request: Any) -> Message:
    return conversions.to_core_list_task_push_notification_config_request(
        t03.ListTaskPushNotificationConfigRequest(
            id=0, params=t03.ListTaskPushNotificationConfigParams(id=task_id_of(request.parent))))


def _delete_push_03(request: Any) -> Message:
    task_id, config_id = _task_and_config(request.name)
    return conversions.to_core_delete_task_push_notification_config_request(
        t03.DeleteTaskPushNotificationConfigRequest(
            id=0, params=t03.DeleteTaskPushNotificationConfigParams(
                id=task_id, push_notification_config_id=config_id)))


def _card_03(request: Any) -> Message:
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


@dataclass(frozen=True, slots=True)
class Method03:
    """A core method as an A2A 0.3 caller has it: its 0.3 request message, and the
    conversions of that request to core and of the core reply to the 0.3 reply message
    (refusals raised as :class:`TranslationError`)."""

    core: CoreMethod
    request: type[Message]
    to_core: Callable[[Any], Message]
    from_core: Callable[[Any], Message]


def _m03(core: str, request: type[Message], to_core: Callable[[Any], Message],
         from_core: Callable[[Any], Message]) -> Method03:
    return Method03(CORE[core], request, compat(to_core), compat(from_core))


#: The core methods a 0.3 caller has (every one but ``ListTasks``), by core name.
FROM_03: dict[str, Method03] = {m.core.name: m for m in (
    _m03("SendMessage", pb03.SendMessageRequest, _send_03, _send_reply_03),
    _m03("SendStreamingMessage", pb03.SendMessageRequest, _send_03, _event_03),
    _m03("GetTask", pb03.GetTaskRequest, _get_task_03, _task_03),
    _m03("CancelTask", pb03.CancelTaskRequest, _cancel_03, _task_03),
    _m03("SubscribeToTask", pb03.TaskSubscriptionRequest, _subscribe_03, _event_03),
    _m03("CreateTaskPushNotificationConfig", pb03.CreateTaskPushNotificationConfigRequest,
         _create_push_03, _push_03),
    _m03("GetTaskPushNotificationConfig", pb03.GetTaskPushNotificationConfigRequest,
         _get_push_03, _push_03),
    _m03("ListTaskPushNotificationConfigs", pb03.ListTaskPushNotificationConfigRequest,
         _list_push_03, _push_list_03),
    _m03("GetExtendedAgentCard", pb03.GetAgentCardRequest, _card_03, _agent_card_03),
    _m03("DeleteTaskPushNotificationConfig", pb03.DeleteTaskPushNotificationConfigRequest,
         _delete_push_03, lambda reply: reply),
)}


# --- the agent's side: its JSON-RPC, 1.0 or 0.3 ------------------------------------------------


def _dump_03(model: Any) -> dict[str, Any]:
    params: dict[str, Any] = model.params.model_dump(by_alias=True, exclude_none=True,
                                                     mode="json")
    return params


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


def agent_request(method: CoreMethod, request: Message, version: str, *,
                  tenant: str = "") -> tuple[str, Any]:
    """The JSON-RPC method and params of a core request, for an agent speaking ``version``.
    The request's own ``tenant`` never reaches the agent (a gRPC caller's names the agent at
    the gateway); ``tenant``, when given, is the one the agent gets (A2A 1.0 only: 0.3 has
    none). Raises :class:`Unsupported` for a method the version has not."""
    if version == V10:
        params = MessageToDict(request)
        params.pop("tenant", None)
        if tenant:
            params["tenant"] = tenant
        return method.name, params
    convert = _TO_03.get(method.name)
    if convert is None or not method.v03:
        raise Unsupported(f"{method.name} is not an A2A 0.3 method")
    return method.v03, compat(convert)(request)


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
    return compat(_FROM_03[method.name])(result)


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
    convert = compat(lambda r: conversions.to_core_stream_response(
        t03.SendStreamingMessageSuccessResponse(result=model.model_validate(r))))
    return convert(result)


# --- the agent's errors ------------------------------------------------------------------------

_A2A_ERRORS = {code: cls for cls, code in JSON_RPC_ERROR_CODE_MAP.items()}


@dataclass(frozen=True, slots=True)
class AgentError:
    """An agent's JSON-RPC error object, read as the A2A error it is: ``mapping`` (the SDK's
    HTTP status, gRPC status name and ``ErrorInfo`` reason of the A2A error its code names;
    None for a code outside A2A's), its message, and the ``ErrorInfo`` metadata the agent sent
    (a 1.0 agent's ``data`` list, or a ``data`` object)."""

    code: Any
    name: str  # the A2A error's class name ("" outside A2A's codes)
    message: str
    mapping: ErrorMapping | None
    reason: str
    metadata: dict[str, str]


def agent_error(error: Any) -> AgentError:
    if not isinstance(error, dict):
        return AgentError(None, "", f"agent error: {error!r}"[:1000], None, "", {})
    code = error.get("code")
    message = error.get("message")
    message = message if isinstance(message, str) else str(message or "")
    cls = _A2A_ERRORS.get(code) if isinstance(code, int) and not isinstance(code, bool) \
        else None
    mapping = A2A_ERROR_MAPPING.get(cls) if cls is not None else None
    metadata: dict[str, str] = {}
    data = error.get("data")
    for item in data if isinstance(data, list) else []:
        if isinstance(item, dict) and item.get("@type") == ERROR_INFO_TYPE \
                and isinstance(item.get("metadata"), dict):
            metadata = {str(k): str(v) for k, v in item["metadata"].items()}
            break
    if isinstance(data, dict):
        metadata = {str(k): v if isinstance(v, str) else str(v) for k, v in data.items()}
    if cls is None or mapping is None:
        return AgentError(code, "", message, None, "", metadata)
    return AgentError(code, cls.__name__, message, mapping,
                      A2A_ERROR_REASONS.get(cls, mapping.reason), metadata)
