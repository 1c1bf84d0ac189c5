"""What an API client may see of the registry (both API surfaces).

Tenants (docs/tenants.md): a caller sees only agents within its tenant's reach -- its tenant's,
those published to every tenant and those shared with its tenant; a platform admin (an admin of
the default tenant) sees every tenant's. An admin sees every agent of its tenant as registered,
and an agent's owner sees it too. Anyone else sees only the agents it may call (the ``call``
scope, within its ``--agents`` list), as a caller does: the agent's URL and every endpoint in
its card point at the gateway's ``/a2a/{agent_id}/`` (``/a2a/t/{tenant}/{agent_id}/``), never
at the agent's internal address. Other agents do not exist for it (404, absent from lists).
"""

from __future__ import annotations

from typing import Any

import orjson
from django.conf import settings
from django.db.models import Q, QuerySet

from registry.bindings import rewrite_card_endpoints
from registry.ids import gateway_path, split_agent_key
from registry.models import Agent
from registry.permissions import SCOPE_CALL, Actor


def in_reach(actor: Actor) -> Q:
    """The agents within ``actor``'s tenant reach (docs/tenants.md): its tenant's, the ones
    published to every tenant and the ones shared with its tenant."""
    shared = Agent.shared_with.through.objects.filter(tenant_id=actor.tenant).values("agent_id")
    return (Q(tenant_id=actor.tenant) | Q(visibility=Agent.Visibility.PUBLIC)
            | Q(visibility=Agent.Visibility.SHARED, pk__in=shared))


def agents_visible(queryset: QuerySet[Agent], actor: Actor | None) -> QuerySet[Agent]:
    """``queryset`` narrowed to the agents ``actor`` may see."""
    if actor is None:
        return queryset.none()
    if actor.is_platform_admin:
        return queryset
    reach = in_reach(actor)
    if actor.is_admin:
        return queryset.filter(reach)
    condition = Q(pk__in=[])
    if actor.has_scope(SCOPE_CALL):
        if not actor.allowed_agents:
            return queryset.filter(reach)  # may call any agent within reach
        named = Q(pk__in=[])
        for key in actor.allowed_keys:
            tenant, agent_id = split_agent_key(key)
            named |= Q(tenant_id=tenant, agent_id=agent_id)
        condition = named & reach
    if actor.api_client_pk is not None:
        condition |= Q(owner_id=actor.api_client_pk)
    return queryset.filter(condition)


def reaches(actor: Actor, agent: Agent) -> bool:
    """Whether ``agent`` is within ``actor``'s tenant reach (:func:`in_reach`, one agent)."""
    if agent.tenant_id == actor.tenant or actor.is_platform_admin:
        return True
    if agent.visibility == Agent.Visibility.PUBLIC:
        return True
    return agent.visibility == Agent.Visibility.SHARED and \
        agent.shared_with.filter(slug=actor.tenant).exists()


def may_see(actor: Actor | None, agent: Agent) -> bool:
    if actor is None:
        return False
    if sees_internals(actor, agent):
        return True
    return actor.allows_call(agent.key) and reaches(actor, agent)


def sees_internals(actor: Actor | None, agent: Agent) -> bool:
    """Whether ``actor`` may read the agent's own URL and card (an admin of its tenant, a
    platform admin, or its owner)."""
    if actor is None:
        return False
    if actor.is_admin:
        return actor.in_tenant(str(agent.tenant_id))
    return actor.api_client_pk is not None and agent.owner_id == actor.api_client_pk


def visible_agent(actor: Actor | None, agent_id: str) -> Agent | None:
    """The agent a caller names (``Actor.locate``: a bare id in its tenant, or
    ``{tenant}.{agent_id}``) if it may see it, else None -- an unknown agent and another
    tenant's out of reach alike (docs/tenants.md). Both API surfaces."""
    if actor is None:
        return None
    tenant, bare = actor.locate(agent_id)
    agent = Agent.objects.select_related("owner").filter(
        tenant_id=tenant, agent_id=bare).first()
    if agent is None or not may_see(actor, agent):
        return None
    return agent


def base_url(request) -> str:
    """The gateway's public base URL for a Django request."""
    return settings.A2A_PUBLIC_BASE_URL or request.build_absolute_uri("/").rstrip("/")


def gateway_url(base: str, key: str) -> str:
    """The agent's gateway base URL (``key``: its routing key, registry.ids.agent_key)."""
    return f"{base}{gateway_path(key)}"


def stored_card(agent: Agent) -> dict[str, Any]:
    """The card as registered, key order kept (the JSON column may reorder keys)."""
    card = agent.card
    if card is not None and getattr(agent, "_card_parsed_from_raw", None) is card:
        return card  # type: ignore[return-value]  # not None (checked); parsed from card_raw by this registration: nothing to parse again
    try:
        card = orjson.loads(agent.card_raw)
    except orjson.JSONDecodeError:
        card = agent.card
    return card if isinstance(card, dict) else {}


def caller_card(agent: Agent, base: str) -> dict[str, Any]:
    """The card a caller sees: every endpoint pointed at the gateway."""
    return rewrite_card_endpoints(stored_card(agent), gateway_url(base, agent.key))
