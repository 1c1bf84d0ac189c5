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
    limit = settings.A2A_MAX_AGENTS_PER_CLIENT
    if not limit or actor.is_admin:
        return
    if actor.api_client_pk is not None:
        owned = Agent.objects.filter(owner_id=actor.api_client_pk)
    else:
        owned = Agent.objects.filter(
            owner__isnull=True, source__in=(Agent.Source.API, Agent.Source.KUBEMQ)
        )
    if owned.count() >= limit:
        raise PermissionDenied(
            f"agent quota reached: this client may own at most {limit} agents "
            "(A2A_MAX_AGENTS_PER_CLIENT); deregister some first"
        )
