"""Translation between the A2A gRPC binding and an agent's JSON-RPC: the gRPC side of
:mod:`gateway.translation` (which holds the core methods, the 0.3 conversions and the agent's
JSON-RPC side, shared with the HTTP+JSON binding). Pure functions: no I/O, no gRPC runtime.

The gateway's listener serves both service names: ``lf.a2a.v1.A2AService`` (A2A 1.0) and
``a2a.v1.A2AService`` (A2A 0.3). A 1.0 caller's bytes are the core messages themselves; a 0.3
caller's are the 0.3 protobuf messages, converted to core and back as the SDK's own 0.3 gRPC
handler does (:data:`gateway.translation.FROM_03`).

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

from a2a.compat.v0_3 import a2a_v0_3_pb2 as pb03  # noqa: F401  (tests build 0.3 requests)
from google.protobuf import any_pb2
from google.protobuf.message import DecodeError, Message
from google.rpc import code_pb2, error_details_pb2, status_pb2

from gateway.translation import (
    A2A_DOMAIN,
    CORE,
    FROM_03,
    V03,
    V10,
    CoreMethod,
    TranslationError,
    Unsupported,
    agent_error,
    agent_event,
    agent_request,
    agent_result,
)

__all__ = ["A2A_DOMAIN", "CORE", "METHODS", "SERVICES", "V03", "V10", "CoreMethod",
           "ServiceMethod", "TranslationError", "Unsupported", "agent_error_status",
           "agent_event", "agent_request", "agent_result", "methods_of", "status",
           "tenant_of"]

SERVICE_V10 = "lf.a2a.v1.A2AService"
SERVICE_V03 = "a2a.v1.A2AService"
SERVICES = {SERVICE_V10: V10, SERVICE_V03: V03}


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


def _v03(name: str, core: str) -> ServiceMethod:
    method = FROM_03[core]
    return ServiceMethod(SERVICE_V03, name, method.core,
                         lambda data: method.to_core(_parse(method.request, data)),
                         method.from_core)


#: Every served method by its gRPC path (``/service/Method``).
METHODS: dict[str, ServiceMethod] = {m.path: m for m in (
    *(_v10(core) for core in CORE.values()),
    _v03("SendMessage", "SendMessage"),
    _v03("SendStreamingMessage", "SendStreamingMessage"),
    _v03("GetTask", "GetTask"),
    _v03("CancelTask", "CancelTask"),
    _v03("TaskSubscription", "SubscribeToTask"),
    _v03("CreateTaskPushNotificationConfig", "CreateTaskPushNotificationConfig"),
    _v03("GetTaskPushNotificationConfig", "GetTaskPushNotificationConfig"),
    _v03("ListTaskPushNotificationConfig", "ListTaskPushNotificationConfigs"),
    _v03("GetAgentCard", "GetExtendedAgentCard"),
    _v03("DeleteTaskPushNotificationConfig", "DeleteTaskPushNotificationConfig"),
)}


def methods_of(service: str) -> list[ServiceMethod]:
    return [m for m in METHODS.values() if m.service == service]


def tenant_of(request: Message) -> str:
    """The core request's ``tenant`` (every 1.0 request has one; a 0.3 caller's has none)."""
    return getattr(request, "tenant", "")


# --- errors ------------------------------------------------------------------------------------


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
    found = agent_error(error)
    if found.code is None and not isinstance(error, dict):
        return status("UNKNOWN", found.message)
    if found.mapping is None:
        return status("UNKNOWN", f"JSON-RPC error {found.code}: {found.message}")
    if version == V03:
        return status(found.mapping.grpc_status, f"{found.name}: {found.message}")
    return status(found.mapping.grpc_status, found.message, reason=found.mapping.reason,
                  domain=A2A_DOMAIN, metadata=found.metadata)
