"""Registry writes. Views, consumers and tasks call these and stay thin.

Every public function is keyword-only and typed, raises :class:`RegistryError` subclasses with
messages fit for an API client, and publishes registry events after commit.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from registry import events
from registry.card_fetch import CardFetchError, fetch_card_bytes
from registry.cards import CardError, ParsedCard, parse_card
from registry.ids import agent_id_error
from registry.models import Agent, ApiClient, CardVersion, Node
from registry.netcheck import UnsafeUrl, check_agent_url
from registry.permissions import ALL_SCOPES, SCOPE_REGISTER, Actor, PermissionDenied
from registry.selectors import agent_route

logger = logging.getLogger(__name__)


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
        "node_id": node_id or settings.NODE_ID,
    }
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
) -> Agent:
    """Partially update an agent (PATCH): a new card, URL, TTL or concurrency cap."""
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


def agent_heartbeat(*, actor: Actor, agent_id: str) -> Agent:
    """Renew an active agent's lease by its TTL. An expired or unknown agent is not found."""
    now = timezone.now()
    agent = Agent.objects.filter(agent_id=agent_id, status=Agent.Status.ACTIVE).first()
    if agent is None:
        raise AgentNotFound(agent_id)
    if not _owns(actor, agent) or not actor.has_scope(SCOPE_REGISTER):
        raise PermissionDenied(f"this client may not heartbeat {agent_id}")
    expires_at = now + timedelta(seconds=agent.ttl_seconds)
    updated = Agent.objects.filter(pk=agent.pk, status=Agent.Status.ACTIVE).update(
        last_seen=now, expires_at=expires_at
    )
    if not updated:
        raise AgentNotFound(agent_id)
    agent.last_seen, agent.expires_at = now, expires_at
    # Only the lease moved: routing tables learn new expiries from the periodic resync, so a
    # heartbeat costs two queries and no broadcast.
    return agent


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
    expired_ids = list(
        Agent.objects.filter(status=Agent.Status.ACTIVE, expires_at__lte=now).values_list(
            "agent_id", flat=True
        )
    )
    marked = 0
    if expired_ids:
        marked = Agent.objects.filter(
            agent_id__in=expired_ids, status=Agent.Status.ACTIVE, expires_at__lte=now
        ).update(status=Agent.Status.EXPIRED)
        for agent_id in expired_ids:
            events.publish(events.AgentEvent(kind="expired", agent_id=agent_id))
    cutoff = now - timedelta(seconds=settings.A2A_EXPIRED_RETENTION_SECONDS)
    purged, _ = Agent.objects.filter(status=Agent.Status.EXPIRED, expires_at__lte=cutoff).delete()
    if marked or purged:
        logger.info("expired %d agent(s), purged %d row(s)", marked, purged)
    return {"expired": marked, "purged": purged}


def api_client_create(
    *, name: str, scopes: list[str], allowed_agents: list[str] | None = None,
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
        name=name[:50], client_id=cid, scopes=list(dict.fromkeys(scopes)),
        allowed_agents=allowed,
    )


def node_heartbeat(*, node_id: str, address: str = "") -> Node:
    now = timezone.now()
    node, _ = Node.objects.update_or_create(
        node_id=node_id, defaults={"last_heartbeat": now, "address": address}
    )
    return node
