"""Prometheus metrics of the gateway, and the ``GET /metrics`` ASGI endpoint.

The hot path only bumps plain integers in dicts (no locks, no label lookups: everything runs on
the node's event loop); a custom collector turns them into Prometheus families when scraped.
In-flight requests and active streams are read from the live subscribers at scrape time, so
they cost nothing per request. Series of a deregistered agent are dropped, so label cardinality
follows the registry, not history.

Exposed: ``kubemq_a2a_requests_total{agent_id,method}`` (A2A 0.3 and 1.0 method names and
``tasks/send`` as themselves, anything else ``unknown``), ``kubemq_a2a_sse_streams_active
{agent_id}``, ``kubemq_a2a_request_duration_seconds{agent_id,outcome}`` (histogram; outcome
``ok``, ``agent_error`` -- the agent's own error: a JSON-RPC error response or event, or an
HTTP error status, relayed unchanged -- or the gateway's error kind),
``kubemq_a2a_busy_rejections_total{agent_id}``, ``kubemq_a2a_in_flight{agent_id}``,
``kubemq_a2a_card_requests_total{result}``, the fast registration path's group commits,
``kubemq_a2a_registration_batches_total`` and ``kubemq_a2a_registration_batch_items_total``,
and ``kubemq_a2a_tenant_quota_refused_total{tenant,quota}`` (requests a tenant's quota refused,
``quota`` the Tenant field; counted by :func:`registry.quotas.count_refused`).
Other apps register collectors of their own in the same registry (the search index's writer:
:mod:`ard.metrics`); ``GET /metrics`` serves them all.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from gateway import access
from gateway.bodies import Receive, Send
from registry.quotas import refused_counts

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

BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
           10.0, 30.0, 60.0, 300.0)
MAX_SERIES = 100_000

_requests: dict[tuple[str, str], int] = {}
_latency: dict[tuple[str, str], list[float]] = {}  # bucket counts..., +Inf count, sum
_busy: dict[str, int] = {}
_cards: dict[str, int] = {}
_registration_batches = [0, 0]  # batches, registrations in them
#: Subscriber Managers of this process's running nodes, read at scrape time.
_managers: list[Any] = []


def watch(manager: Any) -> Callable[[], None]:
    """Report ``manager``'s subscribers (in flight, active streams) at scrape time; returns
    the function that stops it (a node stopping)."""
    _managers.append(manager)

    def unwatch() -> None:
        if manager in _managers:
            _managers.remove(manager)

    return unwatch


def method_label(method: str) -> str:
    return method if method in KNOWN_METHODS else "unknown"


def count_request(agent_id: str, method: str) -> None:
    key = (agent_id, method if method in KNOWN_METHODS else "unknown")
    count = _requests.get(key)
    if count is None:
        if len(_requests) >= MAX_SERIES:
            return
        count = 0
    _requests[key] = count + 1


def observe_latency(agent_id: str, outcome: str, seconds: float) -> None:
    key = (agent_id, outcome)
    cells = _latency.get(key)
    if cells is None:
        if len(_latency) >= MAX_SERIES:
            return
        cells = _latency[key] = [0.0] * (len(BUCKETS) + 2)
    cells[bisect_left(BUCKETS, seconds)] += 1
    cells[-1] += seconds


def count_busy(agent_id: str) -> None:
    _busy[agent_id] = _busy.get(agent_id, 0) + 1


def count_card(result: str) -> None:
    _cards[result] = _cards.get(result, 0) + 1


def count_registration_batch(size: int) -> None:
    _registration_batches[0] += 1
    _registration_batches[1] += size


def forget_agent(agent_id: str) -> None:
    """Drop every series of a deregistered agent."""
    for store in (_requests, _latency):
        for key in [k for k in store if k[0] == agent_id]:
            del store[key]
    _busy.pop(agent_id, None)


class GatewayCollector(Collector):
    def describe(self) -> Iterator[Metric]:
        # Names only: registration must not run collect() (the node may not exist yet).
        yield CounterMetricFamily("kubemq_a2a_requests", "", labels=["agent_id", "method"])
        yield HistogramMetricFamily("kubemq_a2a_request_duration_seconds", "",
                                    labels=["agent_id", "outcome"])
        yield CounterMetricFamily("kubemq_a2a_busy_rejections", "", labels=["agent_id"])
        yield GaugeMetricFamily("kubemq_a2a_in_flight", "", labels=["agent_id"])
        yield GaugeMetricFamily("kubemq_a2a_sse_streams_active", "", labels=["agent_id"])
        yield CounterMetricFamily("kubemq_a2a_card_requests", "", labels=["result"])
        yield CounterMetricFamily("kubemq_a2a_registration_batches", "")
        yield CounterMetricFamily("kubemq_a2a_registration_batch_items", "")
        yield CounterMetricFamily("kubemq_a2a_tenant_quota_refused", "",
                                  labels=["tenant", "quota"])

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "kubemq_a2a_requests", "A2A JSON-RPC requests routed to an agent.",
            labels=["agent_id", "method"])
        for (agent_id, method), count in list(_requests.items()):
            requests.add_metric([agent_id, method], count)
        yield requests

        latency = HistogramMetricFamily(
            "kubemq_a2a_request_duration_seconds",
            "Time from request to the end of the gateway's reply, by agent and outcome.",
            labels=["agent_id", "outcome"])
        for (agent_id, outcome), cells in list(_latency.items()):
            cumulative, buckets = 0.0, []
            for bound, count in zip(BUCKETS, cells, strict=False):  # type: ignore[assignment]  # float counts
                cumulative += count
                buckets.append((_bound(bound), cumulative))
            cumulative += cells[len(BUCKETS)]
            buckets.append(("+Inf", cumulative))
            latency.add_metric([agent_id, outcome], buckets, cells[-1])
        yield latency

        busy = CounterMetricFamily(
            "kubemq_a2a_busy_rejections", "Requests rejected at the concurrency cap.",
            labels=["agent_id"])
        for agent_id, count in list(_busy.items()):
            busy.add_metric([agent_id], count)
        yield busy

        in_flight = GaugeMetricFamily(
            "kubemq_a2a_in_flight",
            "Requests (streams included) this node's subscriber of an agent is handling.",
            labels=["agent_id"])
        streams = GaugeMetricFamily(
            "kubemq_a2a_sse_streams_active", "SSE streams currently relayed.",
            labels=["agent_id"])
        for subscriber in _subscribers():
            in_flight.add_metric([subscriber.agent_id], subscriber.in_flight)
            streams.add_metric([subscriber.agent_id], subscriber.sse_active)
        yield in_flight
        yield streams

        cards = CounterMetricFamily(
            "kubemq_a2a_card_requests", "Rewritten agent cards served, by result.",
            labels=["result"])
        for result, count in list(_cards.items()):
            cards.add_metric([result], count)
        yield cards

        batches, items = _registration_batches
        yield CounterMetricFamily(
            "kubemq_a2a_registration_batches",
            "Batches of registrations the fast path wrote together (group commit).",
            value=batches)
        yield CounterMetricFamily(
            "kubemq_a2a_registration_batch_items", "Registrations in those batches.",
            value=items)

        quota = CounterMetricFamily(
            "kubemq_a2a_tenant_quota_refused",
            "Requests refused by a tenant's quota (quota: the tenant's field).",
            labels=["tenant", "quota"])
        for (tenant, name), count in sorted(refused_counts().items()):
            quota.add_metric([tenant, name], count)
        yield quota


def _bound(value: float) -> str:
    return repr(float(value))


def _subscribers() -> list[Any]:
    return [s for manager in list(_managers) for s in list(manager.subscribers.values())]


REGISTRY.register(GatewayCollector())


async def metrics_app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
    """``GET /metrics``: the Prometheus text exposition of this process."""
    if scope["method"] not in ("GET", "HEAD"):
        await send({"type": "http.response.start", "status": 405,
                    "headers": [(b"allow", b"GET, HEAD"), (b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})
        return
    refusal = await access.metrics_refusal(scope)
    if refusal is not None:
        await access.refuse(send, refusal)
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
