"""Reads for the console: the dashboard's figures and per-agent statistics.

Every node writes its own rows; these functions sum them, so the figures are the cluster's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Count, Max, Q, Sum
from django.utils import timezone

from console.models import AgentMinute, CallRecord
from console.tenancy import key_q, scope
from gateway.histogram import BUCKETS, merge, percentile_ms
from push.models import PushDelivery
from registry.models import Agent, Node

EXPIRING_SECONDS = 30


def minute_floor(moment: datetime) -> datetime:
    return moment.replace(second=0, microsecond=0)


@dataclass
class Series:
    """Per-minute totals over a window, oldest first. ``errors`` counts every failed call:
    the agent's own errors (``agent_errors``: a JSON-RPC error or an HTTP error status it
    answered) and the gateway's."""

    minutes: list[datetime]
    requests: list[int]
    errors: list[int]
    agent_errors: list[int] = field(default_factory=list)

    @property
    def total_requests(self) -> int:
        return sum(self.requests)

    @property
    def total_errors(self) -> int:
        return sum(self.errors)

    @property
    def total_agent_errors(self) -> int:
        return sum(self.agent_errors)

    @property
    def total_gateway_errors(self) -> int:
        return self.total_errors - self.total_agent_errors


@dataclass
class AgentStats:
    requests: int = 0
    errors_executed: int = 0
    errors_not_executed: int = 0
    errors_agent: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    streams_max: int = 0
    p50_ms: float | None = None
    p95_ms: float | None = None
    mean_ms: float | None = None
    last_call_at: datetime | None = None
    last_outcome: str = ""
    series: Series | None = None
    by_outcome: dict[str, int] = field(default_factory=dict)

    @property
    def gateway_errors(self) -> int:
        return self.errors_executed + self.errors_not_executed

    @property
    def errors(self) -> int:
        """Every failed call: the gateway's errors and the agent's own."""
        return self.gateway_errors + self.errors_agent

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0


def series(
    *,
    since: datetime,
    until: datetime | None = None,
    agent_id: str | None = None,
    step_minutes: int = 1,
    tenant: str | None = None,
) -> Series:
    """Requests and errors per ``step_minutes`` from ``since`` to now, all nodes summed (of
    ``tenant``'s agents only, if given)."""
    until = minute_floor(until or timezone.now())
    start = minute_floor(since)
    qs = AgentMinute.objects.filter(minute__gte=start, minute__lte=until)
    if agent_id is not None:
        qs = qs.filter(agent_id=agent_id)
    if tenant is not None:
        qs = qs.filter(key_q(tenant))
    rows = qs.values("minute").annotate(
        r=Sum("requests"), e1=Sum("errors_executed"), e2=Sum("errors_not_executed"),
        ea=Sum("errors_agent"),
    )
    steps = int((until - start).total_seconds() // 60) // step_minutes + 1
    minutes = [start + timedelta(minutes=i * step_minutes) for i in range(steps)]
    requests, errors, agent_errors = [0] * steps, [0] * steps, [0] * steps
    for row in rows:
        i = int((row["minute"] - start).total_seconds() // 60) // step_minutes
        if 0 <= i < steps:
            requests[i] += row["r"] or 0
            errors[i] += (row["e1"] or 0) + (row["e2"] or 0) + (row["ea"] or 0)
            agent_errors[i] += row["ea"] or 0
    return Series(minutes, requests, errors, agent_errors)


def agent_stats(
    *, agent_id: str, since: datetime, with_series: bool = False, step_minutes: int = 1
) -> AgentStats:
    """One agent's figures since ``since`` (all nodes), p50/p95 from the summed histograms."""
    rows = list(AgentMinute.objects.filter(agent_id=agent_id, minute__gte=minute_floor(since)))
    out = AgentStats()
    latency = 0.0
    for row in rows:
        out.requests += row.requests
        out.errors_executed += row.errors_executed
        out.errors_not_executed += row.errors_not_executed
        out.errors_agent += row.errors_agent
        out.bytes_in += row.bytes_in
        out.bytes_out += row.bytes_out
        out.streams_max = max(out.streams_max, row.streams_max)
        latency += row.latency_sum
        if row.last_call_at and (out.last_call_at is None or row.last_call_at > out.last_call_at):
            out.last_call_at, out.last_outcome = row.last_call_at, row.last_outcome
    hist = merge(r.histogram for r in rows) if rows else [0] * BUCKETS
    out.p50_ms, out.p95_ms = percentile_ms(hist, 0.50), percentile_ms(hist, 0.95)
    out.mean_ms = latency * 1000.0 / out.requests if out.requests else None
    out.by_outcome = dict(
        CallRecord.objects.filter(agent_id=agent_id, at__gte=since)
        .values_list("outcome")
        .annotate(n=Count("id"))
        .values_list("outcome", "n")
    )
    if with_series:
        out.series = series(since=since, agent_id=agent_id, step_minutes=step_minutes)
    return out


def top_agents(*, since: datetime, by: str, limit: int = 5,
               tenant: str | None = None) -> list[dict]:
    """Agents with the most requests (``by="requests"``) or errors (``by="errors"``: the
    gateway's and the agent's own; ``agent_errors`` the latter)."""
    qs = (
        scope(AgentMinute.objects.filter(minute__gte=minute_floor(since)), tenant,
              key_field="agent_id")
        .values("agent_id")
        .annotate(
            requests=Sum("requests"),
            errors=Sum("errors_executed") + Sum("errors_not_executed") + Sum("errors_agent"),
            agent_errors=Sum("errors_agent"),
        )
    )
    qs = qs.filter(errors__gt=0) if by == "errors" else qs
    return list(qs.order_by(f"-{by}", "agent_id")[:limit])  # type: ignore[arg-type]  # values() rows are dicts


def agents_unreachable(*, agent_ids: list[str], since: datetime) -> set[str]:
    """Agents whose last call (in the window) failed as unreachable."""
    latest: dict[str, tuple] = {}
    rows = AgentMinute.objects.filter(
        agent_id__in=agent_ids, minute__gte=minute_floor(since), last_call_at__isnull=False
    ).values_list("agent_id", "last_call_at", "last_outcome")
    for agent_id, at, outcome in rows:
        if agent_id not in latest or at > latest[agent_id][0]:
            latest[agent_id] = (at, outcome)
    return {a for a, (_, outcome) in latest.items() if outcome == "unreachable"}


def node_dead_after() -> timedelta:
    return timedelta(seconds=max(60.0, 6 * settings.A2A_NODE_HEARTBEAT_SECONDS))


def dashboard(*, window_minutes: int = 15, tenant: str | None = None) -> dict:
    """Everything the admin index shows; for a tenant admin (``tenant``), its tenant's agents,
    traffic and pushes, without the platform's nodes and discovery (console.tenancy)."""
    from discovery.loop import cycle_health
    from discovery.models import Alert, CycleRun

    now = timezone.now()
    since = now - timedelta(minutes=window_minutes)
    agents = scope(Agent.objects.all(), tenant).aggregate(
        active=Count(
            "pk",
            filter=Q(
                status=Agent.Status.ACTIVE, expires_at__gt=now + timedelta(seconds=EXPIRING_SECONDS)
            ),
        ),
        expiring=Count(
            "pk",
            filter=Q(
                status=Agent.Status.ACTIVE,
                expires_at__gt=now,
                expires_at__lte=now + timedelta(seconds=EXPIRING_SECONDS),
            ),
        ),
        expired=Count("pk", filter=Q(status=Agent.Status.EXPIRED) | Q(expires_at__lte=now)),
    )
    dead_after = node_dead_after()
    nodes = [
        {
            "node_id": n.node_id,
            "address": n.address,
            "last_heartbeat": n.last_heartbeat,
            "alive": now - n.last_heartbeat <= dead_after,
        }
        for n in (Node.objects.order_by("node_id")[:50] if tenant is None else ())
    ]
    traffic = series(since=since, tenant=tenant)
    cycle = CycleRun.objects.order_by("-started_at").first() if tenant is None else None
    totals = scope(AgentMinute.objects.filter(minute__gte=minute_floor(since)), tenant,
                   key_field="agent_id").aggregate(last=Max("last_call_at"))
    alerts = scope(Alert.objects.filter(acknowledged=False), tenant)
    return {
        "now": now,
        "platform": tenant is None,  # the nodes and discovery are shown to platform admins
        "window_minutes": window_minutes,
        "agents": agents,
        "nodes": nodes,
        "nodes_live": sum(1 for n in nodes if n["alive"]),
        "nodes_dead": sum(1 for n in nodes if not n["alive"]),
        "series": traffic,
        "requests_per_minute": traffic.total_requests / window_minutes,
        "error_rate": traffic.total_errors / traffic.total_requests
        if traffic.total_requests
        else 0.0,
        "last_call_at": totals["last"],
        "top_traffic": top_agents(since=since, by="requests", tenant=tenant),
        "top_errors": top_agents(since=since, by="errors", tenant=tenant),
        "alerts_open": alerts.count(),
        "alerts": list(alerts[:5]),
        "cycle": cycle,
        "cycle_health": cycle_health(cycle) if cycle is not None else None,
        "push": push_counts(tenant),
    }


def push_counts(tenant: str | None = None) -> dict[str, int]:
    """Pushes dead-lettered (``dead``) and waiting for delivery (``pending`` and ``failed``),
    cluster-wide (or of ``tenant``'s agents): one query."""
    state = PushDelivery.State
    return scope(PushDelivery.objects.all(), tenant).aggregate(
        dead=Count("pk", filter=Q(state=state.DEAD)),
        pending=Count("pk", filter=Q(state__in=(state.PENDING, state.FAILED))),
        failed=Count("pk", filter=Q(state=state.FAILED)),
    )


#: The window of the agent list's figures and of the API's ``calls`` field.
RECENT_WINDOW_MINUTES = 15


def agent_recent_calls(agent_id: str, *, window_minutes: int = RECENT_WINDOW_MINUTES
                       ) -> dict[str, Any]:
    """One agent's calls over the last ``window_minutes`` (all nodes, one query): the API's
    ``calls`` field (``registry.api.serializers.AgentCallsOutput``)."""
    since = minute_floor(timezone.now() - timedelta(minutes=window_minutes))
    rows = AgentMinute.objects.filter(agent_id=agent_id, minute__gte=since).values_list(
        "requests", "errors_agent", "errors_executed", "errors_not_executed", "last_call_at",
        "last_outcome",
    )
    out: dict[str, Any] = {"window_minutes": window_minutes, "requests": 0, "agent_errors": 0,
           "gateway_errors_executed": 0, "gateway_errors_not_executed": 0,
           "last_call_at": None, "last_outcome": ""}
    for requests, agent, executed, not_executed, last_at, last_outcome in rows:
        out["requests"] += requests
        out["agent_errors"] += agent
        out["gateway_errors_executed"] += executed
        out["gateway_errors_not_executed"] += not_executed
        if last_at is not None and (out["last_call_at"] is None or last_at > out["last_call_at"]):
            out["last_call_at"], out["last_outcome"] = last_at, last_outcome
    return out
