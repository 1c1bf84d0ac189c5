"""Leases: heartbeats, bulk renewals, and the expiry job."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Case, F, Value, When
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from core import tracing
from registry import events
from registry.ids import DEFAULT_TENANT, agent_key, split_agent_key
from registry.models import Agent, AgentTombstone, Node
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


def _renew_lease(*, agent_id: str, now: datetime, owner_pk: object,
                 tenant: str = DEFAULT_TENANT):
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
    # The routing marker moves only when the lease had lapsed (a node's resync may have dropped
    # the agent): a live agent's heartbeat leaves routing, and so every node's resync, alone.
    sql = (
        f"UPDATE {table} SET last_seen = %s, expires_at = {expires}, "
        f"routing_changed_at = CASE WHEN expires_at <= %s THEN %s ELSE routing_changed_at END "
        f"WHERE tenant_id = %s AND agent_id = %s AND status = %s"
    )
    params: list[Any] = [stamp, stamp, stamp, stamp, tenant, agent_id, Agent.Status.ACTIVE]
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


def _renew_many(items: list[tuple[str, object]], now: datetime
                ) -> dict[str, tuple[datetime, datetime]]:
    """PostgreSQL: renew several leases in one ``UPDATE ... FROM (VALUES ...) RETURNING``.

    ``items`` are ``(key, owner_pk)`` with distinct routing keys (``registry.ids.agent_key``),
    as :func:`_renew_lease` takes them, each row keeping its own owner check. Sorted by key,
    so that two nodes' batches lock shared rows in one order. Returns the renewed ones by key.
    """
    table = connection.ops.quote_name(Agent._meta.db_table)
    stamp = connection.ops.adapt_datetimefield_value(now)
    values: list[Any] = []
    for key, owner_pk in sorted(items, key=lambda item: item[0]):
        tenant, agent_id = split_agent_key(key)
        values += [tenant, agent_id, None if owner_pk is _ANY_OWNER else owner_pk,
                   owner_pk is _ANY_OWNER]
    rows = ", ".join(["(%s, %s, %s::text, %s::boolean)"] * len(items))
    sql = (
        f"UPDATE {table} AS a SET last_seen = %s, "
        f"expires_at = %s + make_interval(secs => a.ttl_seconds), "
        f"routing_changed_at = CASE WHEN a.expires_at <= %s THEN %s "
        f"ELSE a.routing_changed_at END "
        f"FROM (VALUES {rows}) AS v(tenant_id, agent_id, owner_id, any_owner) "
        f"WHERE a.tenant_id = v.tenant_id AND a.agent_id = v.agent_id AND a.status = %s "
        f"AND (v.any_owner OR a.owner_id IS NOT DISTINCT FROM v.owner_id) "
        f"RETURNING a.tenant_id, a.agent_id, a.expires_at"
    )
    params = [stamp, stamp, stamp, stamp, *values, Agent.Status.ACTIVE]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return {agent_key(tenant, agent_id): (now, expires_at)
                for tenant, agent_id, expires_at in cursor.fetchall()}


def _owner_key(actor: Actor) -> object:
    """Whose agents ``actor`` may heartbeat: any (admin), the unowned (None) or its own."""
    return _ANY_OWNER if actor.is_admin else actor.api_client_pk


def agents_heartbeat(*, beats: list[tuple[Actor, str]]) -> list[HeartbeatResult | None]:
    """Group commit for concurrent heartbeats: renew each ``(actor, agent_id)``'s lease as
    :func:`agent_heartbeat` does, in one statement on PostgreSQL (one transaction with a
    statement each elsewhere), so that 1,000 heartbeats/s are not 1,000 commits/s.

    A heartbeat that renewed nothing is None, and so is one whose actor lacks the scope or
    whose id an earlier heartbeat of the batch holds for another owner: the caller asks
    :func:`agent_heartbeat`, which tells "not found" from "forbidden" (and renews that id)
    with its own reads. Heartbeats repeating an id for the same owner share its renewal: a
    client hammering one agent's heartbeat costs one row of the batch, not a thread each.
    """
    now = timezone.now()
    items: dict[str, object] = {}  # routing key -> the owner it is renewed for
    holders: list[tuple[int, str, str]] = []  # (index, key, id as addressed) renewed here
    for index, (actor, agent_id) in enumerate(beats):
        key = _heartbeat_key(actor, agent_id)
        if key is None:
            continue
        owner_pk = items.setdefault(key, _owner_key(actor))
        if owner_pk == _owner_key(actor):
            holders.append((index, key, agent_id))
    results: list[HeartbeatResult | None] = [None] * len(beats)
    if not items:
        return results
    if connection.vendor == "postgresql":
        renewed = _renew_many(list(items.items()), now)
    else:
        with transaction.atomic():
            renewed = {}
            for key, owner_pk in items.items():
                tenant, bare = split_agent_key(key)
                lease = _renew_lease(agent_id=bare, now=now, owner_pk=owner_pk, tenant=tenant)
                if lease is not None:
                    renewed[key] = lease
    for index, key, agent_id in holders:
        lease = renewed.get(key)
        results[index] = HeartbeatResult(agent_id, *lease) if lease is not None else None
    return results


def _heartbeat_key(actor: Actor, agent_id: str) -> str | None:
    """The routing key of the agent ``actor`` heartbeats as ``agent_id`` (its tenant's, or a
    qualified id), or None when it may not (the caller then asks :func:`agent_heartbeat`)."""
    tenant, bare = actor.locate(agent_id)
    key = agent_key(tenant, bare)
    if not actor.has_scope(SCOPE_REGISTER) or not actor.in_tenant(tenant) or \
            (actor.external and not actor.may_touch(key)):
        return None
    return key


@tracing.traced("registry.heartbeat")
def agent_heartbeat(*, actor: Actor, agent_id: str) -> HeartbeatResult:
    """Renew an active agent's lease by its TTL. An expired or unknown agent is not found.

    Only the lease moves: routing tables keep an agent routable until its ``expired`` or
    ``deregistered`` event, so a heartbeat costs one query and no broadcast.
    """
    tenant, bare = actor.locate(agent_id)
    if not actor.in_tenant(tenant):
        raise AgentNotFound(agent_id)  # another tenant's: as if it did not exist
    if not actor.has_scope(SCOPE_REGISTER) or \
            (actor.external and not actor.may_touch(agent_key(tenant, bare))):
        raise PermissionDenied(f"this client may not heartbeat {agent_id}")
    renewed = _renew_lease(agent_id=bare, now=timezone.now(), owner_pk=_owner_key(actor),
                           tenant=tenant)
    if renewed is None:
        agent = (
            Agent.objects.filter(tenant_id=tenant, agent_id=bare, status=Agent.Status.ACTIVE)
            .only("pk", "owner_id")
            .first()
        )
        if agent is None:
            raise AgentNotFound(agent_id)
        raise PermissionDenied(f"this client may not heartbeat {agent_id}")
    last_seen, expires_at = renewed
    return HeartbeatResult(agent_id=agent_id, last_seen=last_seen, expires_at=expires_at)


def agents_extend_ttl(*, agent_ids: list[str], seconds: int | None = None) -> int:
    """Admin action: renew the lease of the given agents (routing keys, registry.ids.agent_key;
    by ``seconds`` or their own TTL)."""
    now = timezone.now()
    count = 0
    keys = set(agent_ids)
    for agent in Agent.objects.filter(
            agent_id__in={split_agent_key(key)[1] for key in keys}):
        if agent.key not in keys:
            continue
        agent.status = Agent.Status.ACTIVE
        agent.last_seen = now
        agent.expires_at = now + timedelta(seconds=seconds or agent.ttl_seconds)
        agent.routing_changed_at = now
        agent.save(update_fields=["status", "last_seen", "expires_at", "routing_changed_at"])
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
    expired_ids = _mark_expired(now=now, dead_before=now - _node_dead_after())  # routing keys
    for agent_id in expired_ids:
        events.publish(events.AgentEvent(kind="expired", agent_id=agent_id))
    cutoff = now - timedelta(seconds=settings.A2A_EXPIRED_RETENTION_SECONDS)
    purged, _ = Agent.objects.filter(status=Agent.Status.EXPIRED, expires_at__lte=cutoff).delete()
    AgentTombstone.objects.filter(deleted_at__lte=cutoff).delete()
    if expired_ids or purged:
        logger.info("expired %d agent(s), purged %d row(s)", len(expired_ids), purged)
    return {"expired": len(expired_ids), "purged": purged}


def _mark_expired(*, now: datetime, dead_before: datetime) -> list[str]:
    """Expire, in one statement, the active agents whose lease ended or whose node is dead
    (KubeMQ: "if Node A goes down, the agent's heartbeat expires on all nodes": their
    subscriber is gone and their next heartbeat is answered "not found", so they re-register
    on a live node). Returns their routing keys."""
    agents = connection.ops.quote_name(Agent._meta.db_table)
    nodes = connection.ops.quote_name(Node._meta.db_table)
    sql = (
        f"UPDATE {agents} SET status = %s, routing_changed_at = %s "
        f"WHERE status = %s AND (expires_at <= %s OR node_id IN "
        f"(SELECT node_id FROM {nodes} WHERE last_heartbeat < %s)) "
        f"RETURNING tenant_id, agent_id"
    )
    params = [
        Agent.Status.EXPIRED,
        connection.ops.adapt_datetimefield_value(timezone.now()),
        Agent.Status.ACTIVE,
        connection.ops.adapt_datetimefield_value(now),
        connection.ops.adapt_datetimefield_value(dead_before),
    ]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return sorted(agent_key(row[0], row[1]) for row in cursor.fetchall())


def agents_renew_leases(
    *, agent_ids: list[str], ttl_seconds: int, source: str | None = None,
    tenant: str = DEFAULT_TENANT,
) -> int:
    """Renew the lease of active agents in bulk (discovery keeps its selected agents routable).

    Like a heartbeat, only the lease moves: no broadcast, and the routing marker moves only for
    a lease that had lapsed (a node's resync may have dropped it). Expired or unknown ids are
    skipped (re-register those).
    """
    if not agent_ids:
        return 0
    now = timezone.now()
    # ``agent_ids`` are ``tenant``'s (bare): discovery renews one tenant's agents at a time.
    qs = Agent.objects.filter(status=Agent.Status.ACTIVE, tenant_id=tenant)
    if source is not None:
        qs = qs.filter(source=source)
    renewed = 0
    ids = list(agent_ids)
    for i in range(0, len(ids), 500):
        renewed += qs.filter(agent_id__in=ids[i : i + 500]).update(
            last_seen=now, expires_at=now + timedelta(seconds=ttl_seconds),
            routing_changed_at=Case(
                When(expires_at__lte=now, then=Value(now)), default=F("routing_changed_at")
            ),
        )
    return renewed
