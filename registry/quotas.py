"""Per-client quotas on registry writes (both API surfaces go through registry.services)."""

from __future__ import annotations

from django.conf import settings

from registry.models import Agent
from registry.permissions import Actor, PermissionDenied


def check_agent_quota(actor: Actor) -> None:
    """Refuse a *new* agent when ``actor`` already owns ``A2A_MAX_AGENTS_PER_CLIENT`` of them.

    Admin clients (and the platform's own jobs, e.g. discovery) are exempt; anonymous callers
    share one quota over the unowned agents they registered. Expired agents still count until
    they are purged: they occupy the registry just the same.
    """
    room = agent_quota_room(actor)
    if room is not None and room <= 0:
        raise _quota_reached()


def take_agent_quota(actor: Actor, rooms: dict) -> None:
    """:func:`check_agent_quota` for one of several new agents written together: ``rooms``
    (one dict per batch) keeps each client's room, so the batch's earlier agents count."""
    key = actor.api_client_pk
    if key not in rooms:
        rooms[key] = agent_quota_room(actor)
    room = rooms[key]
    if room is None:
        return
    if room <= 0:
        raise _quota_reached()
    rooms[key] = room - 1


def agent_quota_room(actor: Actor) -> int | None:
    """How many more agents ``actor`` may own (None: no limit)."""
    limit = settings.A2A_MAX_AGENTS_PER_CLIENT
    if not limit or actor.is_admin:
        return None
    if actor.api_client_pk is not None:
        owned = Agent.objects.filter(owner_id=actor.api_client_pk)
    else:
        owned = Agent.objects.filter(
            owner__isnull=True, source__in=(Agent.Source.API, Agent.Source.KUBEMQ)
        )
    return limit - owned.count()


def _quota_reached() -> PermissionDenied:
    limit = settings.A2A_MAX_AGENTS_PER_CLIENT
    return PermissionDenied(
        f"agent quota reached: this client may own at most {limit} agents "
        "(A2A_MAX_AGENTS_PER_CLIENT); deregister some first"
    )
