"""Gateway errors: the kinds of the error table (docs/kubemq.md), their codes per error profile,
and the JSON-RPC error bodies the gateway answers with.

A *transport* error is answered by the gateway itself: a JSON-RPC error with the caller's
``id``, ``X-A2A-Executed`` and ``error.data = {executed, retryable, kind, agent_id}``. The agent's
own answers (application errors included) are relayed unchanged and never pass through here.

``executed`` follows ARCHITECTURE's contract: false only when the gateway knows the agent never
received the request (no route, no subscriber, busy, refused connection, DNS, an address refused
at connect time, TLS handshake, auth, size, an intermediary's 502/503/504); true once any request
byte was written to the agent, whatever happened next (timeout after delivery, connection cut
mid-response, a broken or oversize answer), the kind saying what happened. The subscriber
decides it from the outbound layer's errors (``outbound.errors.classify``: whether a byte was
written) and carries it in the error reply; see ``gateway.agent_calls.transport_error``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson

from gateway import conf

PARSE_ERROR = "parse_error"
INVALID_REQUEST = "invalid_request"
AGENT_NOT_FOUND = "agent_not_found"
BUSY = "busy"
UNREACHABLE = "unreachable"
TIMEOUT = "timeout"
UPSTREAM_UNAVAILABLE = "upstream_unavailable"
RESPONSE_TOO_LARGE = "response_too_large"
# A relayed stream whose caller stopped reading past the stall timeout (the agent had answered).
STREAM_STALLED = "stream_stalled"
# A resume (GET /a2a/{id}/stream/{stream_id}) of a stream this caller cannot resume: unknown,
# expired, owned by another client, or its events after Last-Event-ID no longer buffered.
STREAM_NOT_FOUND = "stream_not_found"
# Profile kubemq: an agent's HTTP error status (not a JSON-RPC answer), as KubeMQ maps it.
AGENT_ERROR = "agent_error"
# Answered with an HTTP status of their own (401, 403, 429, 413) and a JSON-RPC error body.
UNAUTHENTICATED = "unauthenticated"
FORBIDDEN = "forbidden"
RATE_LIMITED = "rate_limited"
REQUEST_TOO_LARGE = "request_too_large"
# The caller's token cannot be checked now (database unreachable, token never verified): 503.
AUTH_UNAVAILABLE = "auth_unavailable"
# The node owning the agent died (its liveness key expired, or a relayed stream missed two
# keepalives) while the call was in flight: executed true (the owner may have reached the agent).
OWNER_LOST = "owner_lost"
# The node answering the caller stopped (SIGTERM) and its drain (A2A_SHUTDOWN_DRAIN_SECONDS)
# ended before the call did: executed true (the agent may have received it); retry elsewhere.
NODE_STOPPING = "node_stopping"
# The agent answered an HTTP status outside 100-599 (e.g. 999), which no HTTP server relays
# (uvicorn has no status line for it): executed true (the agent had the request), not retried.
BAD_AGENT_STATUS = "bad_agent_status"
# The entry node's connection to the broker (Redis) was lost while a call's replies crossed it:
# replies published meanwhile are gone, so the call ends at once; executed true (the Query had
# been published). The owner may be alive: ``owner_lost`` is only for a dead owner.
BROKER_LOST = "broker_lost"
# A reply message between the owning node and the entry node went missing (the numbers the
# owner puts on them skipped one: a publish lost while the broker restarted, a connection
# dropped mid-publish): the call ends instead of relaying around the gap; executed true.
STREAM_GAP = "stream_gap"

# A push-notification webhook in the request is refused by the outbound URL rules (metadata
# hosts, refused addresses, schemes, credentials, the allowlist): answered before the agent.
WEBHOOK_REFUSED = "webhook_refused"

# The HTTP+JSON and gRPC bindings: the call cannot reach the agent on any binding it speaks (a
# method its A2A version has not, e.g. ListTasks for a 0.3 agent; or its HTTP+JSON interface
# left its card while the call was on its way), no A2A route has that path, or the path's
# route takes another HTTP method.
BINDING_UNAVAILABLE = "binding_unavailable"
ROUTE_NOT_FOUND = "route_not_found"
METHOD_NOT_ALLOWED = "method_not_allowed"

# kind: (code in profile "a2a", code in profile "kubemq", retryable, HTTP status)
# The a2a profile keeps gateway codes outside A2A's own -32001..-32009 (TaskNotFound, ...);
# the kubemq profile reproduces the KubeMQ connector's codes for drop-in compatibility.
_TABLE: dict[str, tuple[int, int, bool, int]] = {
    PARSE_ERROR: (-32700, -32700, False, 200),
    INVALID_REQUEST: (-32600, -32600, False, 200),
    AGENT_NOT_FOUND: (-32050, -32002, False, 200),
    BUSY: (-32051, -32603, True, 200),
    UNREACHABLE: (-32052, -32603, True, 200),
    TIMEOUT: (-32053, -32001, True, 200),
    UPSTREAM_UNAVAILABLE: (-32054, -32603, True, 200),
    RESPONSE_TOO_LARGE: (-32055, -32603, False, 200),
    STREAM_STALLED: (-32060, -32603, True, 200),
    STREAM_NOT_FOUND: (-32062, -32002, False, 404),
    AGENT_ERROR: (-32603, -32603, False, 200),
    UNAUTHENTICATED: (-32056, -32600, False, 401),
    FORBIDDEN: (-32057, -32600, False, 403),
    RATE_LIMITED: (-32058, -32603, True, 429),
    REQUEST_TOO_LARGE: (-32059, -32600, False, 413),
    AUTH_UNAVAILABLE: (-32061, -32603, True, 503),
    OWNER_LOST: (-32063, -32603, True, 200),
    NODE_STOPPING: (-32064, -32603, True, 200),
    BAD_AGENT_STATUS: (-32065, -32603, False, 200),
    BROKER_LOST: (-32066, -32603, True, 200),
    STREAM_GAP: (-32067, -32603, True, 200),
    BINDING_UNAVAILABLE: (-32070, -32601, False, 501),
    ROUTE_NOT_FOUND: (-32071, -32601, False, 404),
    METHOD_NOT_ALLOWED: (-32072, -32601, False, 405),
    WEBHOOK_REFUSED: (-32069, -32602, False, 200),
}

#: The HTTP+JSON binding's form of each kind: (HTTP status, google.rpc status name), the
#: ``google.rpc.Status`` shape the A2A HTTP+JSON binding (and the a2a-sdk's REST server) uses
#: for errors. Statuses follow the canonical gRPC-to-HTTP mapping, except that failures of the
#: agent behind the gateway answer as a gateway does: 502 (unreachable, unavailable, broken or
#: oversize answer, owner lost) and 504 (timeout).
_REST: dict[str, tuple[int, str]] = {
    PARSE_ERROR: (400, "INVALID_ARGUMENT"),
    INVALID_REQUEST: (400, "INVALID_ARGUMENT"),
    AGENT_NOT_FOUND: (404, "NOT_FOUND"),
    BUSY: (429, "RESOURCE_EXHAUSTED"),
    UNREACHABLE: (502, "UNAVAILABLE"),
    TIMEOUT: (504, "DEADLINE_EXCEEDED"),
    UPSTREAM_UNAVAILABLE: (502, "UNAVAILABLE"),
    RESPONSE_TOO_LARGE: (502, "RESOURCE_EXHAUSTED"),
    STREAM_STALLED: (408, "DEADLINE_EXCEEDED"),
    STREAM_NOT_FOUND: (404, "NOT_FOUND"),
    AGENT_ERROR: (502, "INTERNAL"),
    UNAUTHENTICATED: (401, "UNAUTHENTICATED"),
    FORBIDDEN: (403, "PERMISSION_DENIED"),
    RATE_LIMITED: (429, "RESOURCE_EXHAUSTED"),
    REQUEST_TOO_LARGE: (413, "RESOURCE_EXHAUSTED"),
    AUTH_UNAVAILABLE: (503, "UNAVAILABLE"),
    OWNER_LOST: (502, "UNAVAILABLE"),
    NODE_STOPPING: (503, "UNAVAILABLE"),
    BAD_AGENT_STATUS: (502, "INTERNAL"),
    BROKER_LOST: (502, "UNAVAILABLE"),
    STREAM_GAP: (502, "DATA_LOSS"),
    BINDING_UNAVAILABLE: (501, "UNIMPLEMENTED"),
    ROUTE_NOT_FOUND: (404, "NOT_FOUND"),
    METHOD_NOT_ALLOWED: (405, "UNIMPLEMENTED"),
    WEBHOOK_REFUSED: (400, "INVALID_ARGUMENT"),
}
#: ``google.rpc.ErrorInfo`` of a gateway error in the HTTP+JSON binding: ``reason`` is the kind
#: upper-cased, ``metadata`` carries what ``error.data`` carries in JSON-RPC (as strings, the
#: type ErrorInfo's metadata has).
ERROR_INFO_TYPE = "type.googleapis.com/google.rpc.ErrorInfo"
ERROR_DOMAIN = "gateway.a2a"

_PREFIX = {
    PARSE_ERROR: "parse error: ",
    INVALID_REQUEST: "invalid request: ",
    UNREACHABLE: "agent unreachable: ",
    STREAM_STALLED: "stream stalled: ",
    STREAM_NOT_FOUND: "stream not found: ",
    OWNER_LOST: "owning node lost: ",
    NODE_STOPPING: "node stopping: ",
    BROKER_LOST: "broker lost: ",
    STREAM_GAP: "stream gap: ",
}


def message_for(
    kind: str, agent_id: str | None, detail: str = "", status: int | None = None
) -> str:
    """The error message of the error table for ``kind``."""
    if kind in _PREFIX:
        return _PREFIX[kind] + (detail or kind.replace("_", " "))
    if kind == AGENT_NOT_FOUND:
        return f"{detail}: {agent_id}" if detail else f"agent not found: {agent_id}"
    if kind == BUSY:
        return "server busy: concurrency limit reached"
    if kind == TIMEOUT:
        return f"agent timeout: {agent_id}"
    if kind == UPSTREAM_UNAVAILABLE:
        return f"agent unavailable: HTTP {status}"
    if kind == RESPONSE_TOO_LARGE:
        return "response too large"
    if kind == BAD_AGENT_STATUS:
        return f"bad agent status: HTTP {status}"
    if kind == BINDING_UNAVAILABLE:
        return detail or f"agent {agent_id} offers no HTTP+JSON interface"
    return detail or kind.replace("_", " ")


def expired_detail(expired_at: float) -> str:
    """The ``agent_not_found`` message for an agent whose lease ended (not one never seen)."""
    stamp = datetime.fromtimestamp(expired_at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"agent expired at {stamp}, re-register"


def code_for(kind: str) -> int:
    a2a_code, kubemq_code, _, _ = _TABLE[kind]
    return kubemq_code if conf.active.A2A_ERROR_PROFILE == "kubemq" else a2a_code


def http_status_for(kind: str) -> int:
    return _TABLE[kind][3]


def error_object(
    kind: str,
    *,
    agent_id: str | None,
    detail: str = "",
    status: int | None = None,
    executed: bool = False,
) -> dict[str, Any]:
    """The ``error`` member of a gateway JSON-RPC error response."""
    return {
        "code": code_for(kind),
        "message": message_for(kind, agent_id, detail, status),
        "data": {
            "executed": executed,
            "retryable": _TABLE[kind][2],
            "kind": kind,
            "agent_id": agent_id,
        },
    }


def error_body(
    kind: str,
    *,
    rpc_id: Any = None,
    agent_id: str | None,
    detail: str = "",
    status: int | None = None,
    executed: bool = False,
) -> bytes:
    """A complete JSON-RPC 2.0 error response, serialized."""
    return orjson.dumps({
        "jsonrpc": "2.0",
        "id": rpc_id,
        "error": error_object(
            kind, agent_id=agent_id, detail=detail, status=status, executed=executed
        ),
    })


def rest_status_for(kind: str) -> int:
    """The HTTP status of a gateway error in the HTTP+JSON binding."""
    return _REST[kind][0]


def rest_error_object(
    kind: str,
    *,
    agent_id: str | None,
    detail: str = "",
    status: int | None = None,
    executed: bool = False,
) -> dict[str, Any]:
    """A gateway error in the HTTP+JSON binding's form (``{"error": google.rpc.Status}``)."""
    http, name = _REST[kind]
    return {"error": {
        "code": http,
        "status": name,
        "message": message_for(kind, agent_id, detail, status),
        "details": [{
            "@type": ERROR_INFO_TYPE,
            "reason": kind.upper(),
            "domain": ERROR_DOMAIN,
            "metadata": {
                "kind": kind,
                "executed": "true" if executed else "false",
                "retryable": "true" if _TABLE[kind][2] else "false",
                "agent_id": agent_id or "",
            },
        }],
    }}


def rest_error_body(
    kind: str,
    *,
    agent_id: str | None,
    detail: str = "",
    status: int | None = None,
    executed: bool = False,
) -> bytes:
    """:func:`rest_error_object`, serialized."""
    return orjson.dumps(rest_error_object(kind, agent_id=agent_id, detail=detail, status=status,
                                          executed=executed))


def grpc_code_name(kind: str) -> str:
    """The gRPC status code (its name, ``google.rpc.Code``) of a gateway error in the gRPC
    binding: the one the HTTP+JSON binding's ``google.rpc.Status`` names (docs/gateway.md)."""
    return _REST[kind][1]
