"""Registry reads: lists with filters, routing data, token lookup."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Case, IntegerField, Q, QuerySet, Value, When
from django.utils import timezone

from registry.events import AgentRoute
from registry.ids import DEFAULT_TENANT, agent_key, split_agent_key
from registry.models import Agent, AgentTombstone, ApiClient, Tenant
from registry.permissions import Actor


def agent_get(*, agent_id: str, tenant: str = DEFAULT_TENANT) -> Agent | None:
    return Agent.objects.select_related("owner").filter(
        tenant_id=tenant, agent_id=agent_id).first()


def agent_get_by_key(*, key: str) -> Agent | None:
    """The agent a routing key (``registry.ids.agent_key``) names."""
    tenant, agent_id = split_agent_key(key)
    return agent_get(agent_id=agent_id, tenant=tenant)


def agent_pk_by_key(*, key: str) -> int | None:
    """The row (the registration) of the agent a routing key names, or None (one query)."""
    tenant, agent_id = split_agent_key(key)
    return Agent.objects.filter(tenant_id=tenant, agent_id=agent_id).values_list(
        "pk", flat=True).first()


def tenant_exists(*, slug: str) -> bool:
    return slug == DEFAULT_TENANT or Tenant.objects.filter(slug=slug).exists()


def shared_tenants(*, agent_pks: list[int] | None = None, agents: QuerySet[Agent] | None = None
                   ) -> dict[int, tuple[str, ...]]:
    """``agent pk -> the tenants it is shared with`` (one query; agents sharing with none are
    absent), for the agents of ``agent_pks`` or of the query ``agents`` (a subquery)."""
    found: dict[int, list[str]] = {}
    through = Agent.shared_with.through
    if agents is not None:
        shares = through.objects.filter(agent__in=agents)
    elif agent_pks:
        shares = through.objects.filter(agent_id__in=agent_pks)
    else:
        return {}
    for pk, tenant in shares.values_list("agent_id", "tenant_id").order_by("tenant_id"):
        found.setdefault(pk, []).append(tenant)
    return {pk: tuple(tenants) for pk, tenants in found.items()}


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


# --- text search: the search index's ranking, when one is registered --------------------------

#: Agents a text search ranks at most (the API's and the admin's pages are smaller).
MAX_RANKED = 1000
#: ``(text=..., agents=...)`` -> pks of the agents of that queryset matching the text, best
#: first. Registered by the search index (ard), which sits above the registry: no import up.
TextSearch = Callable[..., list[int]]
_text_search: TextSearch | None = None


def set_text_search(fn: TextSearch | None) -> None:
    """Register the ranking that :func:`agents_search` uses (ARD's hybrid ranker)."""
    global _text_search
    _text_search = fn


def agents_search(agents: QuerySet[Agent], text: str) -> QuerySet[Agent]:
    """The agents of ``agents`` (filters and visibility already applied) matching ``text``,
    best first, annotated ``search_rank`` (0 the best): agents whose id contains the text (an
    operator typing an id), then the registered ranking's matches (by words and by meaning:
    ARD's), then the other agents whose name, description or tags contain the text; at most
    ``MAX_RANKED``."""
    text = text.strip()
    if not text:
        return agents.annotate(search_rank=Value(0, output_field=IntegerField()))

    # One query for both kinds of substring match: the id's first.
    id_match = Q(agent_id__icontains=text)
    contained = list(
        agents.filter(id_match | Q(name__icontains=text) | Q(description__icontains=text)
                      | Q(tags_index__icontains=text))
        .annotate(by_id=Case(When(id_match, then=Value(0)), default=Value(1),
                             output_field=IntegerField()))
        .order_by("by_id", "agent_id").values_list("pk", "by_id")[:MAX_RANKED]
    )
    by_id = [pk for pk, first in contained if first == 0]
    by_text = [pk for pk, first in contained if first == 1]
    ranked = _text_search(text=text, agents=agents) if _text_search is not None else []
    order = list(dict.fromkeys([*by_id, *ranked, *by_text]))[:MAX_RANKED]
    if not order:
        return agents.none().annotate(search_rank=Value(0, output_field=IntegerField()))
    rank = Case(*[When(pk=pk, then=Value(n)) for n, pk in enumerate(order)],
                output_field=IntegerField())
    return agents.filter(pk__in=order).annotate(search_rank=rank).order_by("search_rank")


#: ``(text=..., cards={key: card}) -> [(key, 0-100 score)]``, best first: the same ranking over
#: cards that need not be registered (discovery's text needs rank a cycle's candidates with
#: it). Registered by the search index (ard): discovery, beside it, imports neither.
CardRanking = Callable[..., list[tuple[str, int]]]
_card_ranking: CardRanking | None = None


def set_card_ranking(fn: CardRanking | None) -> None:
    """Register the ranking that :func:`cards_ranked` uses (ARD's)."""
    global _card_ranking
    _card_ranking = fn


def cards_ranked(*, text: str, cards: dict[str, dict[str, Any]]) -> list[tuple[str, int]] | None:
    """``(key, 0-100 score)`` of the ``cards`` matching ``text``, best first; None when no
    ranking is registered (the ard app not installed)."""
    if _card_ranking is None:
        return None
    return _card_ranking(text=text, cards=cards)


_READ_OWNER: Any = object()


def agent_route(agent: Agent, *, owner_client_id: Any = _READ_OWNER) -> AgentRoute:
    """``agent``'s routing data; ``owner_client_id`` when the caller knows it (else read)."""
    if owner_client_id is _READ_OWNER:
        owner = agent.owner.client_id if agent.owner_id and agent.owner else None
    else:
        owner = owner_client_id
    shared: tuple[str, ...] = ()
    if agent.visibility == Agent.Visibility.SHARED and agent.pk is not None:
        shared = shared_tenants(agent_pks=[agent.pk]).get(agent.pk, ())
    return AgentRoute(
        agent_id=agent.key,
        tenant=str(agent.tenant_id),
        visibility=agent.visibility,
        shared_with=shared,
        endpoint=agent.url,
        node_id=agent.node_id,
        max_concurrency=agent.max_concurrency,
        expires_at=agent.expires_at.timestamp(),
        owner_client_id=owner,
        card_sha256=agent.card_sha256,
        credential_passthrough=agent.credential_passthrough,
        http_json_endpoint=agent.http_json_url,
        push_relay=agent.push_relay,
    )


_ROUTE_COLUMNS = (
    "agent_id", "url", "node_id", "max_concurrency", "expires_at", "owner__client_id",
    "card_sha256", "credential_passthrough", "http_json_url", "tenant_id", "visibility", "pk",
    "push_relay",
)
# Where the columns other reads pick out sit in a row (named, so a column added keeps them).
_AGENT_ID, _EXPIRES_AT, _TENANT, _VISIBILITY, _PK = (
    _ROUTE_COLUMNS.index(name) for name in ("agent_id", "expires_at", "tenant_id", "visibility",
                                            "pk"))


def _routes(rows, shared: dict[int, tuple[str, ...]], *, pause_every: int = 0
            ) -> list[AgentRoute]:
    """``rows``: :data:`_ROUTE_COLUMNS` (an iterable: a full read streams them);
    ``shared``: :func:`shared_tenants` of the shared agents among them."""
    # Node ids and owners repeat across thousands of routes: one string each, not one per row.
    intern = sys.intern
    routes: list[AgentRoute] = []
    append = routes.append
    for count, (
        agent_id, url, node_id, max_concurrency, expires_at, owner, sha, passthrough, rest,
        tenant, visibility, pk, relay,
    ) in enumerate(rows, 1):
        append(
            AgentRoute(
                agent_id=agent_key(tenant, agent_id), endpoint=url, node_id=intern(node_id),
                max_concurrency=max_concurrency, expires_at=expires_at.timestamp(),
                owner_client_id=intern(owner) if owner else owner, card_sha256=sha,
                credential_passthrough=passthrough, http_json_endpoint=rest,
                tenant=intern(tenant), visibility=intern(visibility),
                shared_with=shared.get(pk, ()),
                push_relay=relay,
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
#: Rows a full routing read fetches at a time.
_ROUTE_CHUNK_ROWS = 2000


def agent_routes(*, pause_every: int = 0) -> list[AgentRoute]:
    """Routing data for every routable agent: what a node loads at start and on a full resync.

    Reads only the routing columns (no card JSON to decode): with 10,000 agents a resync that
    built full model instances held the GIL long enough to show in the node's p99 latency.
    ``pause_every``: a running node's full resync (in a worker thread) lets the event loop's
    thread run every that many rows.
    """
    routable = Agent.objects.routable()
    shared = shared_tenants(agents=routable.filter(visibility=Agent.Visibility.SHARED))
    # Streamed in chunks: 100,000 rows of routing columns read into one list first raised the
    # process's peak memory by tens of MiB on every full resync (bench/scale_bench.py).
    rows = routable.values_list(*_ROUTE_COLUMNS).iterator(chunk_size=_ROUTE_CHUNK_ROWS)
    return _routes(rows, shared, pause_every=pause_every)


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
    deleted = {
        agent_key(tenant, agent_id) for tenant, agent_id in
        AgentTombstone.objects.filter(deleted_at__gt=since).values_list("tenant_id", "agent_id")
    }
    now = timezone.now()
    rows = Agent.objects.filter(routing_changed_at__gt=since).values_list(
        *_ROUTE_COLUMNS, "status"
    )
    routable: list[tuple] = []
    gone: set[str] = set()
    for row in rows:
        if row[-1] == Agent.Status.ACTIVE and row[_EXPIRES_AT] > now:
            routable.append(row[:-1])
        else:
            gone.add(agent_key(row[_TENANT], row[_AGENT_ID]))
    gone.update(
        agent_key(tenant, agent_id) for tenant, agent_id in
        Agent.objects.filter(status=Agent.Status.ACTIVE, expires_at__lte=now)
        .values_list("tenant_id", "agent_id")
    )
    changed = {agent_key(row[_TENANT], row[_AGENT_ID]) for row in routable}
    gone.update(deleted - changed)
    shared = shared_tenants(agent_pks=[row[_PK] for row in routable
                                       if row[_VISIBILITY] == Agent.Visibility.SHARED])
    return RouteChanges(routes=_routes(routable, shared), gone=sorted(gone))


def actor_from_token(*, token: str) -> Actor | None:
    """The actor a bearer token authenticates, or None (unknown, revoked or expired)."""
    if not token or len(token) > 200 or "." not in token:
        return None
    try:
        client: ApiClient = ApiClient.objects.get_from_key(token)  # type: ignore[assignment]  # manager typed for the abstract model
    except ApiClient.DoesNotExist:
        return None
    if client.has_expired:
        return None
    return Actor(
        client_id=client.client_id,
        scopes=frozenset(client.scopes or []),
        allowed_agents=frozenset(client.allowed_agents or []),
        api_client_pk=client.pk,
        tenant=str(client.tenant_id),
    )


#: Reads an agent's recent gateway calls (``agent_id`` -> a dict of
#: ``registry.api.serializers.AgentCallsOutput``'s fields). The statistics are the console's:
#: it installs the reader when it starts (``console.apps``), so the registry imports no console.
_calls_reader: Callable[[str], dict[str, Any]] | None = None


def agent_calls_reader_install(reader: Callable[[str], dict[str, Any]] | None) -> None:
    global _calls_reader
    _calls_reader = reader


def agent_calls(*, agent_id: str) -> dict[str, Any] | None:
    """The agent's recent gateway calls, or None when no statistics are kept here."""
    reader = _calls_reader
    return reader(agent_id) if reader is not None else None


def agent_cards(*, agent_ids: list[str]) -> dict[str, tuple[str, str]]:
    """``key -> (card_sha256, card bytes as registered)`` for the given agents, named by their
    routing keys (one query; unknown keys are absent)."""
    wanted = set(agent_ids)
    rows = Agent.objects.filter(
        agent_id__in={split_agent_key(key)[1] for key in wanted}).values_list(
        "tenant_id", "agent_id", "card_sha256", "card_raw")
    found = {agent_key(tenant, agent_id): (sha, raw) for tenant, agent_id, sha, raw in rows}
    return {key: value for key, value in found.items() if key in wanted}
