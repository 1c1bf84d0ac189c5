"""Leases: heartbeats, bulk renewals, and the expiry job."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from config import tracing
from registry import events
from registry.models import Agent, Node
from registry.permissions import SCOPE_REGISTER, Actor, PermissionDenied
from registry.services.agents import _publish
from registry.services.errors import AgentNotFound
from registry.services.nodes import _node_dead_after

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class HeartbeatResult:
    agent_id: str
    last_seen: datetime
    expires_at: datetime

    @property
    def ttl_seconds(self) -> int:
        return round((self.expires_at - self.last_seen).total_seconds())


_ANY_OWNER = object()


def _renew_lease(*, agent_id: str, now: datetime, owner_pk: object):
    """One UPDATE ... RETURNING that renews an active agent's lease by its own TTL.

    Heartbeats are the registry's hottest write (10,000 agents every 10 s is 1,000/s), so this
    is one round trip, computed in SQL, instead of a read and a write through the ORM.
    Returns ``(last_seen, expires_at)`` or None when no active agent owned by ``owner_pk``
    (None: unowned; ``_ANY_OWNER``: any) matched.
    """
    table = connection.ops.quote_name(Agent._meta.db_table)
    if connection.vendor == "postgresql":
        expires = "%s + make_interval(secs => ttl_seconds)"
    elif connection.vendor == "sqlite":
        expires = "strftime('%%Y-%%m-%%d %%H:%%M:%%f', %s, '+' || ttl_seconds || ' seconds')"
    else:  # pragma: no cover - other backends take the portable path
        return None
    stamp = connection.ops.adapt_datetimefield_value(now)
    sql = (
        f"UPDATE {table} SET last_seen = %s, expires_at = {expires} "
        f"WHERE agent_id = %s AND status = %s"
    )
    params: list[Any] = [stamp, stamp, agent_id, Agent.Status.ACTIVE]
    if owner_pk is None:
        sql += " AND owner_id IS NULL"
    elif owner_pk is not _ANY_OWNER:
        sql += " AND owner_id = %s"
        params.append(owner_pk)
    sql += " RETURNING expires_at"
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is None:
        return None
    expires_at = row[0]
    if isinstance(expires_at, str):
        expires_at = parse_datetime(expires_at)
    if timezone.is_naive(expires_at):
        expires_at = timezone.make_aware(expires_at, UTC)
    return now, expires_at


@tracing.traced("registry.heartbeat")
def agent_heartbeat(*, actor: Actor, agent_id: str) -> HeartbeatResult:
    """Renew an active agent's lease by its TTL. An expired or unknown agent is not found.

    Only the lease moves: routing tables keep an agent routable until its ``expired`` or
    ``deregistered`` event, so a heartbeat costs one query and no broadcast.
    """
    if not actor.has_scope(SCOPE_REGISTER):
        raise PermissionDenied(f"this client may not heartbeat {agent_id}")
    owner_pk = _ANY_OWNER if actor.is_admin else actor.api_client_pk
    renewed = _renew_lease(agent_id=agent_id, now=timezone.now(), owner_pk=owner_pk)
    if renewed is None:
        agent = (
            Agent.objects.filter(agent_id=agent_id, status=Agent.Status.ACTIVE)
            .only("pk", "owner_id")
            .first()
        )
        if agent is None:
            raise AgentNotFound(agent_id)
        raise PermissionDenied(f"this client may not heartbeat {agent_id}")
    last_seen, expires_at = renewed
    return HeartbeatResult(agent_id=agent_id, last_seen=last_seen, expires_at=expires_at)


def agents_extend_ttl(*, agent_ids: list[str], seconds: int | None = None) -> int:
    """Admin action: renew the lease of the given agents (by ``seconds`` or their own TTL)."""
    now = timezone.now()
    count = 0
    for agent in Agent.objects.filter(agent_id__in=agent_ids):
        agent.status = Agent.Status.ACTIVE
        agent.last_seen = now
        agent.expires_at = now + timedelta(seconds=seconds or agent.ttl_seconds)
        agent.save(update_fields=["status", "last_seen", "expires_at"])
        _publish("updated", agent)
        count += 1
    return count


def agents_expire(*, now: datetime | None = None) -> dict[str, int]:
    """Mark agents past their lease expired and purge those expired beyond the retention.

    One conditional ``UPDATE ... RETURNING``: the lease is re-checked in the statement that
    expires it, so a heartbeat that lands while the job runs is never lost (a select of ids
    followed by an update by id would expire an agent whose lease was just renewed).
    """
    now = now or timezone.now()
    expired_ids = _mark_expired(now=now, dead_before=now - _node_dead_after())
    for agent_id in expired_ids:
        events.publish(events.AgentEvent(kind="expired", agent_id=agent_id))
    cutoff = now - timedelta(seconds=settings.A2A_EXPIRED_RETENTION_SECONDS)
    purged, _ = Agent.objects.filter(status=Agent.Status.EXPIRED, expires_at__lte=cutoff).delete()
    if expired_ids or purged:
        logger.info("expired %d agent(s), purged %d row(s)", len(expired_ids), purged)
    return {"expired": len(expired_ids), "purged": purged}


def _mark_expired(*, now: datetime, dead_before: datetime) -> list[str]:
    """Expire, in one statement, the active agents whose lease ended or whose node is dead
    (KubeMQ: "if Node A goes down, the agent's heartbeat expires on all nodes": their
    subscriber is gone and their next heartbeat is answered "not found", so they re-register
    on a live node). Returns their ids."""
    agents = connection.ops.quote_name(Agent._meta.db_table)
    nodes = connection.ops.quote_name(Node._meta.db_table)
    sql = (
        f"UPDATE {agents} SET status = %s "
        f"WHERE status = %s AND (expires_at <= %s OR node_id IN "
        f"(SELECT node_id FROM {nodes} WHERE last_heartbeat < %s)) "
        f"RETURNING agent_id"
    )
    params = [
        Agent.Status.EXPIRED,
        Agent.Status.ACTIVE,
        connection.ops.adapt_datetimefield_value(now),
        connection.ops.adapt_datetimefield_value(dead_before),
    ]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return sorted(row[0] for row in cursor.fetchall())


def agents_renew_leases(
    *, agent_ids: list[str], ttl_seconds: int, source: str | None = None
) -> int:
    """Renew the lease of active agents in bulk (discovery keeps its selected agents routable).

    Like a heartbeat, only the lease moves: no broadcast, routing tables learn the new expiry
    from their periodic resync. Expired or unknown ids are skipped (re-register those).
    """
    if not agent_ids:
        return 0
    now = timezone.now()
    qs = Agent.objects.filter(status=Agent.Status.ACTIVE)
    if source is not None:
        qs = qs.filter(source=source)
    renewed = 0
    ids = list(agent_ids)
    for i in range(0, len(ids), 500):
        renewed += qs.filter(agent_id__in=ids[i : i + 500]).update(
            last_seen=now, expires_at=now + timedelta(seconds=ttl_seconds)
        )
    return renewed
