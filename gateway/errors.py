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
written) and carries it in the error reply; see ``gateway.subscriber.transport_error``.
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
}

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
