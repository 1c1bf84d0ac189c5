"""Registry writes. Views, consumers and tasks call these and stay thin.

Every public function is keyword-only and typed, raises :class:`RegistryError` subclasses with
messages fit for an API client, and publishes registry events after commit.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Q
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from registry import events
from registry.card_fetch import CardFetchError, fetch_card_bytes
from registry.cards import CardError, ParsedCard, parse_card
from registry.ids import agent_id_error
from registry.models import Agent, ApiClient, CardVersion, Node
from registry.netcheck import UnsafeUrl, check_agent_url
from registry.permissions import ALL_SCOPES, SCOPE_REGISTER, Actor, PermissionDenied
from registry.selectors import agent_route

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class HeartbeatResult:
    agent_id: str
    last_seen: datetime
    expires_at: datetime

    @property
    def ttl_seconds(self) -> int:
        return round((self.expires_at - self.last_seen).total_seconds())


class RegistryError(Exception):
    """Base of the registry's client-facing errors."""


class InvalidInput(RegistryError):
    pass


class AgentNotFound(RegistryError):
    def __init__(self, agent_id: str) -> None:
        super().__init__(f"agent not found: {agent_id}")
        self.agent_id = agent_id


def _index(values: list[str]) -> str:
    return "|" + "|".join(v.replace("|", "") for v in values) + "|" if values else ""


def _check_ttl(ttl_seconds: Any) -> int:
    if ttl_seconds is None:
        return settings.A2A_DEFAULT_TTL_SECONDS
    if isinstance(ttl_seconds, bool) or not isinstance(ttl_seconds, int):
        raise InvalidInput("ttl_seconds must be an integer")
    if not 1 <= ttl_seconds <= settings.A2A_MAX_TTL_SECONDS:
        raise InvalidInput(f"ttl_seconds must be between 1 and {settings.A2A_MAX_TTL_SECONDS}")
    return ttl_seconds


def _check_concurrency(value: Any) -> int:
    if value is None:
        return settings.A2A_AGENT_MAX_CONCURRENCY
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 100_000:
        raise InvalidInput("max_concurrency must be an integer between 1 and 100000")
    return value


def _authorize_register(actor: Actor, agent_id: str, existing: Agent | None) -> None:
    if not actor.has_scope(SCOPE_REGISTER):
        raise PermissionDenied("this client lacks the register scope")
    if not actor.may_touch(agent_id):
        raise PermissionDenied(f"this client may not register {agent_id}")
    if existing is not None and not _owns(actor, existing):
        raise PermissionDenied(f"{agent_id} belongs to another client")


def _owns(actor: Actor, agent: Agent) -> bool:
    if actor.is_admin:
        return True
    return agent.owner_id == actor.api_client_pk  # anonymous owns the unowned


def _resolve_card(
    *, url: str | None, card: dict[str, Any] | bytes | None, strict: bool | None
) -> ParsedCard:
    if url is not None:
        try:
            url = check_agent_url(url)
        except UnsafeUrl as exc:
            raise InvalidInput(f"url: {exc}") from None
    if card is None:
        if not url:
            raise InvalidInput("either a url or a card is required")
        try:
            card = fetch_card_bytes(url)
        except CardFetchError as exc:
            raise InvalidInput(str(exc)) from None
    try:
        parsed = parse_card(card, url=url, strict=strict)
    except CardError as exc:
        raise InvalidInput(str(exc)) from None
    if url is None:
        try:
            check_agent_url(parsed.endpoint)
        except UnsafeUrl as exc:
            raise InvalidInput(f"card endpoint: {exc}") from None
    return parsed


def _apply_card(agent: Agent, parsed: ParsedCard) -> None:
    agent.name = parsed.name
    agent.description = parsed.description
    agent.url = parsed.endpoint or ""
    agent.card = parsed.card
    agent.card_raw = parsed.raw.decode("utf-8", errors="replace")
    agent.card_sha256 = parsed.sha256
    agent.card_shape = parsed.shape
    agent.tags_index = _index(parsed.tags)
    agent.skills_index = _index(parsed.skill_ids + parsed.skill_names)
    agent.input_modes_index = _index(parsed.input_modes)
    agent.output_modes_index = _index(parsed.output_modes)


def _record_card_version(agent: Agent, parsed: ParsedCard) -> None:
    CardVersion.objects.get_or_create(
        agent=agent,
        sha256=parsed.sha256,
        defaults={
            "card": parsed.card,
            "card_raw": agent.card_raw,
            "endpoint": agent.url,
            "skill_ids": parsed.skill_ids,
        },
    )


def _publish(kind: events.EventKind, agent: Agent) -> None:
    events.publish(events.AgentEvent(kind=kind, agent_id=agent.agent_id, route=agent_route(agent)))


def _node_dead_after() -> timedelta:
    """A node whose last heartbeat is older than this is taken for dead."""
    return timedelta(seconds=max(60.0, 6 * settings.A2A_NODE_HEARTBEAT_SECONDS))


def _owning_node(*, agent_id: str, current: Agent | None) -> str:
    """The node whose virtual subscriber will serve a new or renewed registration.

    A registration arriving at a serving node belongs to that node (KubeMQ's rule). One made
    elsewhere -- a Celery worker running discovery, a management command -- goes to a live
    node: the agent's current one if it is alive, else one picked by the agent id's hash so
    agents spread over the cluster. With no live node known, this process's id.
    """
    since = timezone.now() - _node_dead_after()
    live = sorted(Node.objects.filter(last_heartbeat__gte=since).values_list("node_id", flat=True))
    if not live or settings.NODE_ID in live:
        return settings.NODE_ID
    if current is not None and current.node_id in live:
        return current.node_id
    return live[int(hashlib.sha256(agent_id.encode()).hexdigest(), 16) % len(live)]


def agent_register(
    *,
    actor: Actor,
    agent_id: Any,
    url: str | None = None,
    card: dict[str, Any] | bytes | None = None,
    ttl_seconds: Any = None,
    max_concurrency: Any = None,
    source: str = Agent.Source.API,
    node_id: str | None = None,
    strict: bool | None = None,
    public: bool | None = None,
) -> tuple[Agent, bool]:
    """Register or re-register an agent. Returns ``(agent, created)``.

    Re-registration keeps ``registered_at`` and renews the lease. Two concurrent registrations
    of one id leave exactly one row: the loser of the insert race updates the winner's row.
    """
    error = agent_id_error(agent_id)
    if error:
        raise InvalidInput(error)
    ttl = _check_ttl(ttl_seconds)
    concurrency = _check_concurrency(max_concurrency)
    existing = Agent.objects.filter(agent_id=agent_id).first()
    _authorize_register(actor, agent_id, existing)
    parsed = _resolve_card(url=url, card=card, strict=strict)
    now = timezone.now()
    fields = {
        "ttl_seconds": ttl,
        "max_concurrency": concurrency,
        "last_seen": now,
        "expires_at": now + timedelta(seconds=ttl),
        "status": Agent.Status.ACTIVE,
        "source": source,
        "node_id": node_id or _owning_node(agent_id=agent_id, current=existing),
    }
    if public is not None:  # omitted on re-registration: the flag stays as it was
        fields["public"] = bool(public)
    created = False
    with transaction.atomic():
        agent = Agent.objects.select_for_update().filter(agent_id=agent_id).first()
        if agent is None:
            agent = Agent(agent_id=agent_id, registered_at=now, **fields)
            if actor.api_client_pk:
                agent.owner_id = actor.api_client_pk
            _apply_card(agent, parsed)
            try:
                with transaction.atomic():
                    agent.save()
                created = True
            except IntegrityError:
                agent = Agent.objects.select_for_update().get(agent_id=agent_id)
        if not created:
            _authorize_register(actor, agent_id, agent)
            for key, value in fields.items():
                setattr(agent, key, value)
            _apply_card(agent, parsed)
            agent.save()
        _record_card_version(agent, parsed)
        _publish("registered" if created else "updated", agent)
    return agent, created


def agent_update(
    *,
    actor: Actor,
    agent_id: str,
    url: str | None = None,
    card: dict[str, Any] | bytes | None = None,
    ttl_seconds: Any = None,
    max_concurrency: Any = None,
    public: bool | None = None,
) -> Agent:
    """Partially update an agent (PATCH): a new card, URL, TTL, concurrency cap or ARD listing."""
    with transaction.atomic():
        agent = Agent.objects.select_for_update().filter(agent_id=agent_id).first()
        if agent is None:
            raise AgentNotFound(agent_id)
        if not _owns(actor, agent) or not actor.has_scope(SCOPE_REGISTER):
            raise PermissionDenied(f"this client may not change {agent_id}")
        if ttl_seconds is not None:
            agent.ttl_seconds = _check_ttl(ttl_seconds)
            agent.expires_at = timezone.now() + timedelta(seconds=agent.ttl_seconds)
        if max_concurrency is not None:
            agent.max_concurrency = _check_concurrency(max_concurrency)
        if public is not None:
            agent.public = bool(public)
        if url is not None or card is not None:
            parsed = _resolve_card(
                url=url if url is not None else agent.url,
                card=card if card is not None else agent.card_raw.encode(),
                strict=None,
            )
            _apply_card(agent, parsed)
            _record_card_version(agent, parsed)
        agent.save()
        _publish("updated", agent)
    return agent


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


def agent_deregister(*, actor: Actor, agent_id: str) -> None:
    """Remove an agent and its card history; its subscriber is torn down by the event."""
    with transaction.atomic():
        agent = Agent.objects.select_for_update().filter(agent_id=agent_id).first()
        if agent is None:
            raise AgentNotFound(agent_id)
        if not _owns(actor, agent) or not actor.has_scope(SCOPE_REGISTER):
            raise PermissionDenied(f"this client may not deregister {agent_id}")
        agent.delete()
        events.publish(events.AgentEvent(kind="deregistered", agent_id=agent_id))


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


def agents_expire(*, now=None) -> dict[str, int]:
    """Mark agents past their lease expired and purge those expired beyond the retention."""
    now = now or timezone.now()
    # Agents of a node that stopped heartbeating expire too (KubeMQ: "if Node A goes down, the
    # agent's heartbeat expires on all nodes"): their subscriber is gone, and their next
    # heartbeat is answered "not found", so they re-register on a live node.
    dead_nodes = Node.objects.filter(last_heartbeat__lt=now - _node_dead_after()).values(
        "node_id"
    )
    expired_ids = list(
        Agent.objects.filter(status=Agent.Status.ACTIVE)
        .filter(Q(expires_at__lte=now) | Q(node_id__in=dead_nodes))
        .values_list("agent_id", flat=True)
    )
    marked = 0
    if expired_ids:
        marked = Agent.objects.filter(
            agent_id__in=expired_ids, status=Agent.Status.ACTIVE
        ).update(status=Agent.Status.EXPIRED)
        for agent_id in expired_ids:
            events.publish(events.AgentEvent(kind="expired", agent_id=agent_id))
    cutoff = now - timedelta(seconds=settings.A2A_EXPIRED_RETENTION_SECONDS)
    purged, _ = Agent.objects.filter(status=Agent.Status.EXPIRED, expires_at__lte=cutoff).delete()
    if marked or purged:
        logger.info("expired %d agent(s), purged %d row(s)", marked, purged)
    return {"expired": marked, "purged": purged}


def api_client_create(
    *,
    name: str,
    scopes: list[str],
    allowed_agents: list[str] | None = None,
    client_id: str | None = None,
) -> tuple[ApiClient, str]:
    """Create an API client; returns it and its token (the only time the token is seen)."""
    from django.utils.text import slugify

    bad = [s for s in scopes if s not in ALL_SCOPES]
    if bad or not scopes:
        raise InvalidInput(f"scopes must be among {', '.join(ALL_SCOPES)}; got {scopes!r}")
    allowed = list(dict.fromkeys(allowed_agents or []))
    for agent_id in allowed:
        error = agent_id_error(agent_id)
        if error:
            raise InvalidInput(error)
    cid = client_id or slugify(name)[:100]
    if not cid:
        raise InvalidInput("name must contain letters or digits")
    if ApiClient.objects.filter(client_id=cid).exists():
        raise InvalidInput(f"a client named {cid!r} exists already")
    return ApiClient.objects.create_key(
        name=name[:50],
        client_id=cid,
        scopes=list(dict.fromkeys(scopes)),
        allowed_agents=allowed,
    )


def node_heartbeat(*, node_id: str, address: str = "") -> Node:
    now = timezone.now()
    node, _ = Node.objects.update_or_create(
        node_id=node_id, defaults={"last_heartbeat": now, "address": address}
    )
    return node


_UNSET: Any = object()


def _checked_scopes(scopes: list[str]) -> list[str]:
    bad = [s for s in scopes if s not in ALL_SCOPES]
    if bad or not scopes:
        raise InvalidInput(f"scopes must be among {', '.join(ALL_SCOPES)}; got {scopes!r}")
    return list(dict.fromkeys(scopes))


def _checked_agent_ids(agent_ids: list[str]) -> list[str]:
    for agent_id in agent_ids:
        error = agent_id_error(agent_id)
        if error:
            raise InvalidInput(error)
    return list(dict.fromkeys(agent_ids))


def api_client_update(
    *,
    client_id: str,
    name: str | None = None,
    scopes: list[str] | None = None,
    allowed_agents: list[str] | None = None,
    revoked: bool | None = None,
    expiry_date: Any = _UNSET,
) -> ApiClient:
    """Change a client's name, scopes, allowed agents or expiry, or revoke it (for good).

    The token and the ``client_id`` never change. Callers caching tokens see the change within
    their cache lifetime (``A2A_AUTH_CACHE_SECONDS``).
    """
    with transaction.atomic():
        client = ApiClient.objects.select_for_update().filter(client_id=client_id).first()
        if client is None:
            raise InvalidInput(f"no client {client_id!r}")
        fields: list[str] = []
        if name is not None:
            if not name.strip():
                raise InvalidInput("name is required")
            client.name = name.strip()[:50]
            fields.append("name")
        if scopes is not None:
            client.scopes = _checked_scopes(scopes)
            fields.append("scopes")
        if allowed_agents is not None:
            client.allowed_agents = _checked_agent_ids(allowed_agents)
            fields.append("allowed_agents")
        if revoked is not None and revoked != client.revoked:
            if not revoked:
                raise InvalidInput("a revoked client cannot be restored")
            client.revoked = True
            fields.append("revoked")
        if expiry_date is not _UNSET:
            client.expiry_date = expiry_date
            fields.append("expiry_date")
        if fields:
            client.save(update_fields=fields)
    return client


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
