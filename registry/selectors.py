"""Registry reads: lists with filters, routing data, token lookup."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Q, QuerySet
from django.utils import timezone

from registry.events import AgentRoute
from registry.models import Agent, AgentTombstone, ApiClient
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


_READ_OWNER: Any = object()


def agent_route(agent: Agent, *, owner_client_id: Any = _READ_OWNER) -> AgentRoute:
    """``agent``'s routing data; ``owner_client_id`` when the caller knows it (else read)."""
    if owner_client_id is _READ_OWNER:
        owner = agent.owner.client_id if agent.owner_id and agent.owner else None
    else:
        owner = owner_client_id
    return AgentRoute(
        agent_id=agent.agent_id,
        endpoint=agent.url,
        node_id=agent.node_id,
        max_concurrency=agent.max_concurrency,
        expires_at=agent.expires_at.timestamp(),
        owner_client_id=owner,
        card_sha256=agent.card_sha256,
        credential_passthrough=agent.credential_passthrough,
        http_json_endpoint=agent.http_json_url,
    )


_ROUTE_COLUMNS = (
    "agent_id", "url", "node_id", "max_concurrency", "expires_at", "owner__client_id",
    "card_sha256", "credential_passthrough", "http_json_url",
)


def _routes(rows, *, pause_every: int = 0) -> list[AgentRoute]:
    # Node ids and owners repeat across thousands of routes: one string each, not one per row.
    intern = sys.intern
    routes: list[AgentRoute] = []
    append = routes.append
    for count, (
        agent_id, url, node_id, max_concurrency, expires_at, owner, sha, passthrough, rest
    ) in enumerate(rows, 1):
        append(
            AgentRoute(
                agent_id=agent_id, endpoint=url, node_id=intern(node_id),
                max_concurrency=max_concurrency, expires_at=expires_at.timestamp(),
                owner_client_id=intern(owner) if owner else owner, card_sha256=sha,
                credential_passthrough=passthrough, http_json_endpoint=rest,
            )
        )
        if pause_every and count % pause_every == 0:
            # Hand the GIL to the event loop's thread: building 100,000 objects in one go
            # starves it (a waiting thread gets the GIL back only after the switch interval,
            # on every release), which is what a node's p99 showed during a full resync.
            time.sleep(_GIL_PAUSE_SECONDS)
    return routes


#: How long a full routing read sleeps every ``pause_every`` rows (see :func:`_routes`).
_GIL_PAUSE_SECONDS = 0.0005


def agent_routes(*, pause_every: int = 0) -> list[AgentRoute]:
    """Routing data for every routable agent: what a node loads at start and on a full resync.

    Reads only the routing columns (no card JSON to decode): with 10,000 agents a resync that
    built full model instances held the GIL long enough to show in the node's p99 latency.
    ``pause_every``: a running node's full resync (in a worker thread) lets the event loop's
    thread run every that many rows.
    """
    return _routes(
        Agent.objects.routable().values_list(*_ROUTE_COLUMNS), pause_every=pause_every
    )


@dataclass(frozen=True)
class RouteChanges:
    """What changed for routing since a point in time (:func:`agent_route_changes`)."""

    routes: list[AgentRoute]  # routable agents whose routing changed: add or replace
    gone: list[str]  # agents no longer routable (expired, lapsed, deregistered): remove


def agent_route_changes(*, since: datetime) -> RouteChanges:
    """The routing changes since ``since``: a node's incremental resync.

    Three indexed reads, each proportional to what changed, not to the registry's size:
    rows whose routing marker (``Agent.routing_changed_at``) moved (routable ones are routes,
    the others are gone), active agents whose lease has lapsed but that the expiry job has not
    marked yet (routing tables drop them without waiting for it; a heartbeat that revives a
    lapsed lease moves the marker, so the agent comes back), and deregistrations
    (``AgentTombstone``) of ids that have no row now.
    """
    # Tombstones first: an id deregistered and registered again after this read shows as a
    # changed routable row in the next one, which wins.
    deleted = set(
        AgentTombstone.objects.filter(deleted_at__gt=since).values_list("agent_id", flat=True)
    )
    now = timezone.now()
    rows = Agent.objects.filter(routing_changed_at__gt=since).values_list(
        *_ROUTE_COLUMNS, "status"
    )
    routable: list[tuple] = []
    gone: set[str] = set()
    for row in rows:
        if row[-1] == Agent.Status.ACTIVE and row[4] > now:
            routable.append(row[:-1])
        else:
            gone.add(row[0])
    gone.update(
        Agent.objects.filter(status=Agent.Status.ACTIVE, expires_at__lte=now)
        .values_list("agent_id", flat=True)
    )
    changed = {row[0] for row in routable}
    gone.update(deleted - changed)
    return RouteChanges(routes=_routes(routable), gone=sorted(gone))


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
