"""The A2A HTTP+JSON binding translated to an agent's JSON-RPC, for an agent whose card lists
no HTTP+JSON interface (:mod:`gateway.rest` forwards to one when it does).

A call of the binding -- route, path parameters, query, body -- becomes the core (A2A 1.0)
request message the a2a-sdk's own REST server builds from it (``RestDispatcher``; the 0.3
routes under ``v1/`` as its ``REST03Handler`` does: the 0.3 protobuf messages' ProtoJSON, then
the SDK's compat conversions), and from there the JSON-RPC request of the version the agent
speaks (:mod:`gateway.translation`). The agent's JSON-RPC answer comes back the same way: its
result becomes the reply message's ProtoJSON (1.0 routes) or the 0.3 reply's (``v1/``), each
SSE event of a stream one ``data:`` event of the binding, and its JSON-RPC error the
binding's error form, ``{"error": google.rpc.Status}`` with the HTTP status and ``ErrorInfo``
(domain ``a2a-protocol.org``) the SDK's REST server answers for that A2A error -- what the
SDK's REST client raises as the same error.

The path's tenant (``{tenant}/message:send``) is the caller's: a 1.0 agent gets it as the
request's ``tenant``; A2A 0.3 has none. ``v1/`` names the 0.3 routes where A2A 0.3 has the
route (``v1/tasks`` and ``v1/extendedAgentCard`` are 1.0 routes of tenant ``v1``, as on the
SDK's server).

:class:`RestTranslation` is the caller's side of one such call: the gateway's errors (it is a
:class:`~gateway.binding.BindingCaller`) and the agent's answer (the relay's ASGI messages) are
written to the caller in the binding's form. Everything else -- admission, the subscriber,
caps, timeouts, header rules, metrics, audit, tracing -- is the gateway's one way
(``gateway.forwarding.forward_binding_call``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

import orjson
from a2a.compat.v0_3 import conversions
from a2a.types import a2a_pb2 as pb
from a2a.utils.constants import A2A_JSON_MEDIA_TYPE
from a2a.utils.proto_utils import parse_params
from google.protobuf.json_format import MessageToDict, Parse, ParseError
from google.protobuf.message import Message

from gateway import errors
from gateway.binding import BindingCaller
from gateway.bodies import Send
from gateway.rest import match_route
from gateway.resume import STREAM_ID_HEADER
from gateway.sse import data_events, identified_events, take_events
from gateway.translation import (
    A2A_DOMAIN,
    CORE,
    ERROR_INFO_TYPE,
    FROM_03,
    V03,
    V10,
    CoreMethod,
    TranslationError,
    agent_error,
    agent_event,
    agent_result,
)

_A2A_JSON = A2A_JSON_MEDIA_TYPE.encode()
#: The routes A2A 0.3 has under ``v1/`` (its A2A 1.0 method names; no ListTasks).
_ROUTES_03 = frozenset(FROM_03)
#: Relayed agent headers the translated answer does not keep (its framing is the gateway's). A
#: resumable stream's ``X-A2A-Stream-Id`` is kept: its id names the translation
#: (gateway.resume.stream_form), so a reconnect is translated as the live stream is.
_DROPPED = frozenset({b"content-type", b"content-length", b"transfer-encoding",
                      b"x-a2a-executed", b"x-a2a-agent-status"})
#: An agent's HTTP error status whose body is not JSON-RPC: the google.rpc status name of the
#: binding's answer (the agent's own HTTP status is kept).
_HTTP_STATUS_NAMES = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED",
                      403: "PERMISSION_DENIED", 404: "NOT_FOUND", 409: "ABORTED",
                      429: "RESOURCE_EXHAUSTED", 501: "UNIMPLEMENTED", 503: "UNAVAILABLE",
                      504: "DEADLINE_EXCEEDED"}


class _Query:
    """A query string as ``a2a.utils.proto_utils.parse_params`` reads one (Starlette's
    ``QueryParams`` interface: ``keys`` and ``getlist``)."""

    def __init__(self, raw: bytes) -> None:
        self.pairs = parse_qsl(raw.decode("latin-1"), keep_blank_values=True)

    def keys(self) -> list[str]:
        return list(dict.fromkeys(k for k, _ in self.pairs))

    def getlist(self, key: str) -> list[str]:
        return [v for k, v in self.pairs if k == key]


@dataclass(frozen=True, slots=True)
class RestCall:
    """One translated call: the core method and request, the caller's protocol version (0.3
    for a ``v1/`` route), and the tenant the caller named in the path."""

    method: CoreMethod
    request: Message
    version: str
    tenant: str


def _parse_body(body: bytes, message: Message) -> Message:
    if body.strip():
        try:
            Parse(body, message, ignore_unknown_fields=True)
        except (ParseError, ValueError, TypeError) as exc:
            raise TranslationError(f"not a {message.DESCRIPTOR.full_name}: {exc}") from None
    return message


def _query(query: bytes, message: Message) -> Message:
    try:
        # _Query stands for Starlette's QueryParams: parse_params reads only keys and getlist
        parse_params(_Query(query), message)  # type: ignore[arg-type]
    except (ParseError, ValueError, TypeError) as exc:
        raise TranslationError(f"query: {exc}") from None
    return message


def _route(tail: str) -> tuple[list[str], list[str]]:
    """(the route's segments, the segments before it: a tenant, ``v1``, or both)."""
    segments = tail.split("/")
    for skip in (0, 1, 2):
        if match_route(segments[skip:]) is not None:
            return segments[skip:], segments[:skip]
    raise TranslationError(f"no A2A HTTP+JSON route at {tail}")


def _ids(segments: list[str]) -> tuple[str, str]:
    """(task id, push config id) of a ``tasks/...`` route."""
    task = segments[1].removesuffix(":cancel").removesuffix(":subscribe") \
        if len(segments) == 2 else segments[1]
    return task, segments[3] if len(segments) == 4 else ""


def _core_request(name: str, segments: list[str], query: bytes, body: bytes) -> Message:
    """The core request of a 1.0 route, as the SDK's ``RestDispatcher`` builds it."""
    task, config = _ids(segments) if segments[0] == "tasks" and len(segments) > 1 else ("", "")
    if name in ("SendMessage", "SendStreamingMessage"):
        return _parse_body(body, pb.SendMessageRequest())
    if name == "GetTask":
        request: Any = _query(query, pb.GetTaskRequest())
        request.id = task
        return request
    if name == "CancelTask":
        request = _parse_body(body, pb.CancelTaskRequest())
        request.id = task
        return request
    if name == "SubscribeToTask":
        return pb.SubscribeToTaskRequest(id=task)
    if name == "ListTasks":
        return _query(query, pb.ListTasksRequest())
    if name == "CreateTaskPushNotificationConfig":
        request = _parse_body(body, pb.TaskPushNotificationConfig())
        request.task_id = task
        return request
    if name == "GetTaskPushNotificationConfig":
        return pb.GetTaskPushNotificationConfigRequest(task_id=task, id=config)
    if name == "ListTaskPushNotificationConfigs":
        request = _query(query, pb.ListTaskPushNotificationConfigsRequest())
        request.task_id = task
        return request
    if name == "DeleteTaskPushNotificationConfig":
        return pb.DeleteTaskPushNotificationConfigRequest(task_id=task, id=config)
    return pb.GetExtendedAgentCardRequest()


def _request_03(name: str, segments: list[str], query: bytes, body: bytes) -> Message:
    """The 0.3 request message of a ``v1/`` route, as the SDK's ``REST03Handler`` builds it."""
    method = FROM_03[name]
    task, config = _ids(segments) if segments[0] == "tasks" and len(segments) > 1 else ("", "")
    request: Any = method.request()
    if name in ("SendMessage", "SendStreamingMessage"):
        return _parse_body(body, request)
    if name == "GetTask":
        request.name = f"tasks/{task}"
        length = _Query(query).getlist("historyLength")
        if length and length[-1]:
            try:
                request.history_length = int(length[-1])
            except ValueError:
                raise TranslationError("historyLength is not an integer") from None
        return request
    if name in ("CancelTask", "SubscribeToTask"):
        request.name = f"tasks/{task}"
        return request
    if name == "CreateTaskPushNotificationConfig":
        request = _parse_body(body, request)
        request.parent = f"tasks/{task}"
        return request
    if name == "ListTaskPushNotificationConfigs":
        request.parent = f"tasks/{task}"
        return request
    if name in ("GetTaskPushNotificationConfig", "DeleteTaskPushNotificationConfig"):
        request.name = f"tasks/{task}/pushNotificationConfigs/{config}"
        return request
    return request


def rest_call(tail: str, method: str, query: bytes, body: bytes) -> RestCall:
    """The translated call of the binding's route ``tail`` (the path after the agent's base),
    whose A2A method is ``method``. Raises :class:`TranslationError` for a request the SDK's
    REST server would refuse as an invalid argument."""
    segments, prefix = _route(tail)
    if prefix and prefix[-1] == "v1" and method in _ROUTES_03 \
            and segments != ["extendedAgentCard"]:  # 0.3's is v1/card
        m03 = FROM_03[method]
        return RestCall(m03.core, m03.to_core(_request_03(method, segments, query, body)), V03,
                        "")
    return RestCall(CORE[method], _core_request(method, segments, query, body), V10,
                    prefix[0] if prefix else "")


# --- the answer ---------------------------------------------------------------------------------


def reply_json(call: RestCall, reply: Message,
               card: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> Any:
    """The binding's JSON of a core reply, for the caller's version. ``card`` rewrites an agent
    card (the extended card) before it is answered."""
    name = call.method.name
    if name == "DeleteTaskPushNotificationConfig":
        return {}
    if name == "GetExtendedAgentCard":
        if call.version == V03:  # the SDK's 0.3 REST server answers the 0.3 model's JSON
            out = conversions.to_compat_agent_card(reply).model_dump(
                mode="json", by_alias=True, exclude_none=True)
        else:
            out = MessageToDict(reply)
        return card(out) if card is not None else out
    if call.version == V03:
        return MessageToDict(FROM_03[name].from_core(reply))
    if name == "ListTasks":
        return MessageToDict(reply, always_print_fields_with_no_presence=True)
    return MessageToDict(reply)


def agent_error_json(error: Any) -> tuple[int, dict[str, Any]]:
    """(HTTP status, body) of an agent's JSON-RPC ``error`` in the binding's form: what the
    SDK's REST server answers for the same A2A error (``build_rest_error_payload``); a code
    outside A2A's is 500 ``INTERNAL`` naming it."""
    found = agent_error(error)
    if found.mapping is None:
        message = found.message if found.code is None else \
            f"JSON-RPC error {found.code}: {found.message}"
        return 500, {"error": {"code": 500, "status": "INTERNAL", "message": message}}
    return found.mapping.http_code, {"error": {
        "code": found.mapping.http_code, "status": found.mapping.grpc_status,
        "message": found.message,
        "details": [{"@type": ERROR_INFO_TYPE, "reason": found.reason, "domain": A2A_DOMAIN,
                     "metadata": found.metadata}],
    }}


class RestTranslation(BindingCaller):
    """The caller's side of one translated HTTP+JSON call: the relay's ASGI messages of the
    agent's JSON-RPC answer (:meth:`send`) and the gateway's errors (:meth:`gateway_error`)
    become the binding's answer on the caller's ``send``. A stream's events are written as
    they come, a resumable stream's each with the id the owner gave the agent's event; a
    unary answer once whole (:meth:`finish`). The reconnect to a translated stream
    (gateway.handler.handle_resume) translates the replayed events with this class too."""

    __slots__ = ("call", "agent_version", "out", "card", "started", "done", "answered",
                 "http_status", "sse", "headers", "chunks", "tail", "resumable")

    def __init__(self, call: RestCall, agent_version: str, send: Send,
                 card: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> None:
        self.call = call
        self.agent_version = agent_version
        self.out = send
        self.card = card
        self.started = False  # the caller's response started
        self.done = False  # ... and ended
        self.answered = False  # the agent answered (executed)
        self.http_status = 0
        self.sse = False
        self.headers: list[tuple[bytes, bytes]] = []
        self.chunks: list[bytes] = []
        self.tail = b""
        self.resumable = False  # the owner numbers the events (X-A2A-Stream-Id)

    def flow_controlled(self, wrap: Callable[[Any], Any]) -> None:
        """Apply the stream relay's flow control to the caller's own ``send`` beneath."""
        self.out = wrap(self.out)

    # --- writing the caller's answer -----------------------------------------------------------

    async def _respond(self, status: int, body: Any, *, executed: bool,
                       extra: list[tuple[bytes, bytes]] | None = None,
                       media_type: bytes = b"application/json") -> None:
        if self.started:
            return
        data = orjson.dumps(body)
        self.started = self.done = True
        await self.out({"type": "http.response.start", "status": status, "headers": [
            (b"content-type", media_type), (b"content-length", b"%d" % len(data)),
            (b"x-a2a-executed", b"true" if executed else b"false"), *(extra or ())]})
        await self.out({"type": "http.response.body", "body": data})

    def _agent_headers(self) -> list[tuple[bytes, bytes]]:
        return [*self.headers, (b"x-a2a-agent-status", b"%d" % self.http_status)]

    async def _start_stream(self) -> None:
        if not self.started:
            self.started = True
            await self.out({"type": "http.response.start", "status": 200, "headers": [
                (b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"),
                (b"x-a2a-executed", b"true"), *self._agent_headers()]})

    async def _event(self, data: Any, *, error: bool = False, event_id: bytes | None = None
                     ) -> None:
        await self._start_stream()
        event = (b"event: error\n" if error else b"") + b"data: " + orjson.dumps(data) + (
            b"\nid: " + event_id + b"\n\n" if event_id else b"\n\n")
        if error:
            self.done = True
        await self.out({"type": "http.response.body", "body": event, "more_body": not error})

    async def _broken(self, detail: str) -> None:
        """The agent's answer cannot be translated (executed: the agent had the call)."""
        form = errors.rest_error_object(errors.AGENT_ERROR, agent_id=None, executed=True,
                                        detail=f"the agent's answer cannot be translated: "
                                               f"{detail}"[:2000])
        if self.started:
            if not self.done:
                await self._event(form, error=True)
            return
        await self._respond(errors.rest_status_for(errors.AGENT_ERROR), form, executed=True,
                            extra=self._agent_headers())

    async def gateway_error(self, kind: str, agent_id: str | None, detail: str, *,
                            status: int | None, executed: bool,
                            extra: list[tuple[bytes, bytes]] | None) -> None:
        if self.done:
            return
        form = errors.rest_error_object(kind, agent_id=agent_id, detail=detail, status=status,
                                        executed=executed or self.started)
        if self.started:  # a stream already answering: its terminal error event
            await self._event(form, error=True)
            return
        headers = list(extra or ())
        if status:
            headers.append((b"x-a2a-agent-status", str(status).encode()))
        await self._respond(errors.rest_status_for(kind), form, executed=executed,
                            extra=headers)

    # --- the agent's answer (ASGI messages of the relay) ---------------------------------------

    async def send(self, message: dict[str, Any]) -> None:
        if self.done:
            return
        if message["type"] == "http.response.start":
            self.answered = True
            self.http_status = message["status"]
            for name, value in message.get("headers") or ():
                if name == b"content-type":
                    self.sse = value[:17].lower() == b"text/event-stream"
                elif name not in _DROPPED:
                    self.headers.append((name, value))
                    if name == STREAM_ID_HEADER:
                        self.resumable = True
            return
        body = message.get("body", b"")
        if self.sse and self.call.method.streaming and self.http_status < 400:
            events, self.tail = take_events(self.tail, body, bool(message.get("more_body")))
            # One translation, live or replayed after a reconnect (the replay's events are the
            # agent's JSON-RPC events the owner kept): each keeps the id the owner gave it.
            for event_id, answer in identified_events(events):
                await self._answer(answer, event_id if self.resumable else None)
                if self.done:
                    return
            if not message.get("more_body"):
                await self._end_stream()
            return
        if body:
            self.chunks.append(body)

    async def _end_stream(self) -> None:
        if not self.done:
            await self._start_stream()
            self.done = True
            await self.out({"type": "http.response.body", "body": b"", "more_body": False})

    async def _answer(self, answer: Any, event_id: bytes | None = None) -> None:
        """One JSON-RPC response of the agent: its result a reply (an event of a stream, with
        the id the agent's event had), its error the binding's error."""
        if not isinstance(answer, dict) or ("result" not in answer and "error" not in answer):
            await self._broken("not a JSON-RPC response")
            return
        method = self.call.method
        if answer.get("error") is not None or "result" not in answer:
            status, body = agent_error_json(answer.get("error"))
            if self.started:
                await self._event(body, error=True)
            else:
                await self._respond(status, body, executed=True, extra=self._agent_headers())
            return
        try:
            if method.streaming:
                event = agent_event(answer["result"], self.agent_version)
                if event is None:
                    return
                if self.call.version == V03:
                    data = MessageToDict(FROM_03[method.name].from_core(event))
                else:
                    data = MessageToDict(event)
            else:
                data = reply_json(self.call, agent_result(method, answer["result"],
                                                          self.agent_version), self.card)
        except TranslationError as exc:
            await self._broken(str(exc))
            return
        if method.streaming:
            await self._event(data, event_id=event_id)
        else:  # the media types of the SDK's REST server: A2A's for 1.0 routes
            await self._respond(200, data, executed=True, extra=self._agent_headers(),
                                media_type=_A2A_JSON if self.call.version == V10
                                else b"application/json")

    async def finish(self) -> None:
        """The caller's answer once the relay ended: the unary reply, an answer that was not
        a stream, or the end of the stream."""
        if self.done:
            return
        if not self.answered:
            await self.gateway_error(errors.UNREACHABLE, None, "the subscriber gave no answer",
                                     status=None, executed=False, extra=None)
            return
        body = b"".join(self.chunks)
        self.chunks = []
        answer: Any = None
        if self.sse:  # events answering a unary method: the first answer counts
            answer = next(iter(data_events(body + b"\n\n")), None)
        else:
            try:
                answer = orjson.loads(body)
            except orjson.JSONDecodeError:
                answer = None
        is_rpc = isinstance(answer, dict) and ("result" in answer or "error" in answer)
        if self.http_status >= 400 and not is_rpc:
            name = _HTTP_STATUS_NAMES.get(self.http_status, "INTERNAL")
            await self._respond(self.http_status, {"error": {
                "code": self.http_status, "status": name,
                "message": f"the agent answered HTTP {self.http_status}"}},
                executed=True, extra=self._agent_headers())
            return
        if not is_rpc and not (self.call.method.streaming and self.started):
            await self._broken("not JSON-RPC")
            return
        if is_rpc:
            await self._answer(answer)
        if self.call.method.streaming:
            await self._end_stream()
