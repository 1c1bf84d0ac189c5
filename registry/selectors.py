"""Registry reads: lists with filters, routing data, token lookup."""

from __future__ import annotations

from django.db.models import Q, QuerySet
from django.utils import timezone

from registry.events import AgentRoute
from registry.models import Agent, ApiClient
from registry.permissions import Actor


def agent_get(*, agent_id: str) -> Agent | None:
    return Agent.objects.select_related("owner").filter(agent_id=agent_id).first()


def agent_list(
    *,
    tag: str | None = None,
    tags_any: list[str] | None = None,
    skill: str | None = None,
    input_mode: str | None = None,
    output_mode: str | None = None,
    status: str | None = None,
    q: str | None = None,
) -> QuerySet[Agent]:
    """Agents matching every given filter; ``tags_any`` matches agents with any of the tags."""
    qs = Agent.objects.select_related("owner").order_by("agent_id")
    if tag:
        qs = qs.filter(tags_index__contains=f"|{tag}|")
    if tags_any:
        cond = Q()
        for t in tags_any:
            cond |= Q(tags_index__contains=f"|{t}|")
        qs = qs.filter(cond)
    if skill:
        qs = qs.filter(skills_index__contains=f"|{skill}|")
    if input_mode:
        qs = qs.filter(input_modes_index__contains=f"|{input_mode}|")
    if output_mode:
        qs = qs.filter(output_modes_index__contains=f"|{output_mode}|")
    if status == Agent.Status.ACTIVE:
        qs = qs.routable()
    elif status == Agent.Status.EXPIRED:
        qs = qs.filter(Q(status=Agent.Status.EXPIRED) | Q(expires_at__lte=timezone.now()))
    if q:
        qs = qs.filter(
            Q(agent_id__icontains=q) | Q(name__icontains=q) | Q(description__icontains=q)
            | Q(tags_index__icontains=q)
        )
    return qs


def agent_route(agent: Agent) -> AgentRoute:
    owner = agent.owner.client_id if agent.owner_id and agent.owner else None
    return AgentRoute(
        agent_id=agent.agent_id,
        endpoint=agent.url,
        node_id=agent.node_id,
        max_concurrency=agent.max_concurrency,
        expires_at=agent.expires_at.timestamp(),
        owner_client_id=owner,
        card_sha256=agent.card_sha256,
        credential_passthrough=agent.credential_passthrough,
    )


def agent_routes() -> list[AgentRoute]:
    """Routing data for every routable agent: what a node loads at start and on resync.

    Reads only the routing columns (no card JSON to decode): with 10,000 agents a resync that
    built full model instances held the GIL long enough to show in the node's p99 latency.
    """
    rows = Agent.objects.routable().values_list(
        "agent_id", "url", "node_id", "max_concurrency", "expires_at", "owner__client_id",
        "card_sha256", "credential_passthrough",
    )
    return [
        AgentRoute(
            agent_id=agent_id, endpoint=url, node_id=node_id, max_concurrency=max_concurrency,
            expires_at=expires_at.timestamp(), owner_client_id=owner, card_sha256=sha,
            credential_passthrough=passthrough,
        )
        for agent_id, url, node_id, max_concurrency, expires_at, owner, sha, passthrough in rows
    ]


def actor_from_token(*, token: str) -> Actor | None:
    """The actor a bearer token authenticates, or None (unknown, revoked or expired)."""
    if not token or len(token) > 200 or "." not in token:
        return None
    try:
        client = ApiClient.objects.get_from_key(token)
    except ApiClient.DoesNotExist:
        return None
    if client.has_expired:
        return None
    return Actor(
        client_id=client.client_id,
        scopes=frozenset(client.scopes or []),
        allowed_agents=frozenset(client.allowed_agents or []),
        api_client_pk=client.pk,
    )
