"""Prometheus metrics of the gateway, and the ``GET /metrics`` ASGI endpoint.

Label children are cached per label tuple so a hot-path update is a dict lookup plus one
locked add (``Counter.labels()`` alone costs more than that). Series of a deregistered agent
are removed so label cardinality follows the registry, not history.
"""

from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

#: Method names counted as themselves: A2A 0.3, A2A 1.0, and KubeMQ's tasks/send.
KNOWN_METHODS = frozenset({
    # A2A 0.3 (JSON-RPC method names)
    "message/send", "message/stream", "tasks/get", "tasks/cancel", "tasks/resubscribe",
    "tasks/pushNotificationConfig/set", "tasks/pushNotificationConfig/get",
    "tasks/pushNotificationConfig/list", "tasks/pushNotificationConfig/delete",
    "agent/getAuthenticatedExtendedCard",
    # A2A 1.0
    "SendMessage", "SendStreamingMessage", "GetTask", "ListTasks", "CancelTask",
    "SubscribeToTask", "CreateTaskPushNotificationConfig", "GetTaskPushNotificationConfig",
    "ListTaskPushNotificationConfigs", "DeleteTaskPushNotificationConfig",
    "GetExtendedAgentCard",
    # KubeMQ
    "tasks/send", "stream_cancel",
})

REQUESTS = Counter(
    "kubemq_a2a_requests", "A2A JSON-RPC requests routed to an agent.", ["agent_id", "method"]
)
SSE_STREAMS_ACTIVE = Gauge(
    "kubemq_a2a_sse_streams_active", "SSE streams currently relayed.", ["agent_id"]
)
LATENCY = Histogram(
    "kubemq_a2a_request_duration_seconds",
    "Time from request to the end of the gateway's reply, by agent and outcome.",
    ["agent_id", "outcome"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
             30, 60, 300),
)
BUSY_REJECTIONS = Counter(
    "kubemq_a2a_busy_rejections", "Requests rejected at the concurrency cap.", ["agent_id"]
)
IN_FLIGHT = Gauge(
    "kubemq_a2a_in_flight", "Requests (streams included) an agent's subscriber is handling.",
    ["agent_id"],
)
CARD_REQUESTS = Counter(
    "kubemq_a2a_card_requests", "Rewritten agent cards served, by result.",
    ["result"],
)

_requests: dict[tuple[str, str], object] = {}
_latency: dict[tuple[str, str], object] = {}
_methods_seen: dict[str, set[str]] = {}
_outcomes_seen: dict[str, set[str]] = {}


def method_label(method: str) -> str:
    return method if method in KNOWN_METHODS else "unknown"


def count_request(agent_id: str, method: str) -> None:
    key = (agent_id, method)
    child = _requests.get(key)
    if child is None:
        label = method_label(method)
        child = REQUESTS.labels(agent_id, label)
        if len(_requests) < 100_000:
            _requests[key] = child
        _methods_seen.setdefault(agent_id, set()).add(label)
    child.inc()  # type: ignore[attr-defined]


def observe_latency(agent_id: str, outcome: str, seconds: float) -> None:
    key = (agent_id, outcome)
    child = _latency.get(key)
    if child is None:
        child = _latency[key] = LATENCY.labels(agent_id, outcome)
        _outcomes_seen.setdefault(agent_id, set()).add(outcome)
    child.observe(seconds)  # type: ignore[attr-defined]


def forget_agent(agent_id: str) -> None:
    """Drop every series of a deregistered agent."""
    for label in _methods_seen.pop(agent_id, set()):
        _remove(REQUESTS, agent_id, label)
    for outcome in _outcomes_seen.pop(agent_id, set()):
        _remove(LATENCY, agent_id, outcome)
    for key in [k for k in _requests if k[0] == agent_id]:
        del _requests[key]
    for key in [k for k in _latency if k[0] == agent_id]:
        del _latency[key]
    for metric in (SSE_STREAMS_ACTIVE, BUSY_REJECTIONS, IN_FLIGHT):
        _remove(metric, agent_id)


def _remove(metric, *labels: str) -> None:
    try:
        metric.remove(*labels)
    except KeyError:
        pass


async def metrics_app(scope, receive, send) -> None:
    """``GET /metrics``: the Prometheus text exposition of this process."""
    if scope["method"] not in ("GET", "HEAD"):
        await send({"type": "http.response.start", "status": 405,
                    "headers": [(b"allow", b"GET, HEAD"), (b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})
        return
    body = generate_latest(REGISTRY)
    await send({
        "type": "http.response.start",
        "status": 200,
        "headers": [
            (b"content-type", CONTENT_TYPE_LATEST.encode()),
            (b"content-length", str(len(body)).encode()),
            (b"cache-control", b"no-store"),
        ],
    })
    await send({"type": "http.response.body",
                "body": b"" if scope["method"] == "HEAD" else body})
