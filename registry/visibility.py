"""What an API client may see of the registry (both API surfaces).

An admin sees every agent as registered, and an agent's owner sees it too. Anyone else sees
only the agents it may call (the ``call`` scope, within its ``--agents`` list), as a caller
does: the agent's URL and every endpoint in its card point at the gateway's
``/a2a/{agent_id}/``, never at the agent's internal address. Other agents do not exist for it
(404, absent from lists).
"""

from __future__ import annotations

from typing import Any

import orjson
from django.conf import settings
from django.db.models import Q, QuerySet

from registry.bindings import rewrite_card_endpoints
from registry.models import Agent
from registry.permissions import SCOPE_CALL, Actor


def agents_visible(queryset: QuerySet[Agent], actor: Actor | None) -> QuerySet[Agent]:
    """``queryset`` narrowed to the agents ``actor`` may see."""
    if actor is None:
        return queryset.none()
    if actor.is_admin:
        return queryset
    condition = Q(pk__in=[])
    if actor.has_scope(SCOPE_CALL):
        if not actor.allowed_agents:
            return queryset  # may call any agent
        condition = Q(agent_id__in=actor.allowed_agents)
    if actor.api_client_pk is not None:
        condition |= Q(owner_id=actor.api_client_pk)
    return queryset.filter(condition)


def may_see(actor: Actor | None, agent: Agent) -> bool:
    if actor is None:
        return False
    return sees_internals(actor, agent) or actor.may_call(agent.agent_id)


def sees_internals(actor: Actor | None, agent: Agent) -> bool:
    """Whether ``actor`` may read the agent's own URL and card (admin or owner)."""
    if actor is None:
        return False
    return actor.is_admin or (
        actor.api_client_pk is not None and agent.owner_id == actor.api_client_pk
    )


def base_url(request) -> str:
    """The gateway's public base URL for a Django request."""
    return settings.A2A_PUBLIC_BASE_URL or request.build_absolute_uri("/").rstrip("/")


def gateway_url(base: str, agent_id: str) -> str:
    return f"{base}/a2a/{agent_id}/"


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
    return rewrite_card_endpoints(stored_card(agent), gateway_url(base, agent.agent_id))
