"""ARD reads: what a caller may see (entitlement tiers), filters, search, list and explore.

Entitlement tiers (as in the A2A community registry proposal): without a token, only agents
marked public; with a token, the public ones plus every agent that client may call (all of
them for admin clients and call clients without an agent list). Only routable agents show.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Collection, Iterable, Iterator
from typing import Any

from django.db.models import Q, QuerySet

from ard import documents, indexer
from ard.models import AgentDoc
from ard.query import (
    MAX_OFFSET,
    Clause,
    ExploreRequest,
    ListRequest,
    Query,
    SearchRequest,
    encode_token,
    parse_time,
)
from ard.ranking import get_ranker
from registry.ids import DEFAULT_TENANT
from registry.models import Agent
from registry.permissions import SCOPE_CALL, Actor

CHUNK = 1000


def actor_key(actor: Actor | None) -> str:
    """Which tier a caller is in, as a short string: page tokens and caches are per tier (and
    per tenant, docs/tenants.md: ``...@tenant``; a platform admin's tier is every tenant's)."""
    if actor is None:
        return "public"
    if actor.is_platform_admin:
        return "all"
    at = "" if actor.tenant == DEFAULT_TENANT else f"@{actor.tenant}"
    if actor.is_admin or (actor.has_scope(SCOPE_CALL) and not actor.allowed_agents):
        return "tenant" + at
    if actor.has_scope(SCOPE_CALL):
        ids = ",".join(sorted(actor.allowed_keys))
        return "some:" + hashlib.sha256(ids.encode()).hexdigest()[:12] + at
    return "public" + at


def visible_docs(actor: Actor | None) -> QuerySet[AgentDoc]:
    """Documents of routable agents this caller may see (this table only: no join): within
    its tenant's reach (docs/tenants.md; anonymous callers are the default tenant's), then
    its tier."""
    qs = AgentDoc.objects.filter(active=True)
    key = actor_key(actor)
    if key == "all":
        return qs
    tenant = actor.tenant if actor is not None else DEFAULT_TENANT
    qs = qs.filter(Q(reach__contains=f"|{tenant}|") | Q(reach__contains="|*|"))
    if key.startswith("tenant"):
        return qs
    if key.startswith("some:"):
        allowed = sorted(actor.allowed_keys)  # type: ignore[union-attr]  # a "some:" key has an actor
        return qs.filter(Q(public=True) | Q(agent_id__in=allowed))
    return qs.filter(public=True)


# --- filters (§7.1): OR within a key, AND across keys ---------------------------------------------


def _leaf_values(value: Any, segments: list[str]) -> Iterator[Any]:
    """Every value at ``segments`` under ``value``; arrays on the way fan out."""
    if isinstance(value, list):
        for item in value:
            yield from _leaf_values(item, segments)
        return
    if not segments:
        yield value
        return
    if isinstance(value, dict) and segments[0] in value:
        yield from _leaf_values(value[segments[0]], segments[1:])


def _as_text(value: Any) -> str | None:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    return None


def path_values(entry: dict[str, Any], path: str) -> list[str]:
    """The string values of a field path in a rendered entry (``publisher`` and ``host.*``
    resolve as §7.1 says)."""
    if path == "publisher":
        return [documents.publisher_of(entry.get("identifier", ""))]
    segments = path.split(".")
    source: Any = {"host": documents.host_block()} if segments[0] == "host" else entry
    return [t for v in _leaf_values(source, segments) if (t := _as_text(v)) is not None]


def _constant(values: Iterable[str], actual: str, *, fold: bool = False) -> Q:
    wanted = {v.lower() for v in values} if fold else set(values)
    return Q() if (actual.lower() if fold else actual) in wanted else Q(pk__in=[])


def _sql_filter(path: str, values: tuple[str, ...], base_url: str) -> Q | None:
    """A filter key as SQL, or None when it must be checked on the entries themselves."""
    if path == "type":
        return _constant(values, documents.A2A_CARD_TYPE)
    if path == "publisher":
        return _constant(values, documents.publisher_host(), fold=True)
    if path.startswith("host."):
        got = path_values({}, path)
        return Q() if set(got) & set(values) else Q(pk__in=[])
    if path in ("tags", "capabilities"):
        column = "tags_index" if path == "tags" else "capabilities_index"
        cond = Q(pk__in=[])
        for v in values:
            cond |= Q(**{f"{column}__contains": f"|{v}|"})
        return cond
    if path == "identifier":
        ids = [a for v in values if (a := documents.agent_id_from_identifier(v))]
        return Q(agent_id__in=ids)
    if path == "metadata.agentId":
        return Q(agent_id__in=list(values))
    if path == "displayName":
        cond = Q(pk__in=[])
        for v in values:
            cond |= Q(name__iexact=v)
        return cond
    if path == "url":
        prefix, suffix = f"{base_url}/a2a/", "/.well-known/agent-card.json"
        ids = [
            v[len(prefix) : -len(suffix)]
            for v in values
            if v.startswith(prefix) and v.endswith(suffix)
        ]
        return Q(agent_id__in=ids)
    if path.split(".")[0] == "trustManifest":
        return Q(pk__in=[])  # this registry's entries carry none
    return None


def apply_filter(qs: QuerySet[AgentDoc], query: Query, base_url: str) -> QuerySet[AgentDoc]:
    """Narrow ``qs`` by the query's filter: SQL where it can, the stored entries elsewhere."""
    rest: dict[str, set[str]] = {}
    for path, values in query.filter.items():
        cond = _sql_filter(path, values, base_url)
        if cond is None:
            rest[path] = set(values)
        else:
            qs = qs.filter(cond)
    if rest:
        keep = [
            pk
            for pk, entry in qs.values_list("pk", "entry").iterator(chunk_size=CHUNK)
            if all(
                set(path_values(documents.render_entry(entry, base_url), p)) & wanted
                for p, wanted in rest.items()
            )
        ]
        qs = AgentDoc.objects.filter(pk__in=keep)
    return qs


# --- search, list, explore ------------------------------------------------------------------------


def api_url(base_url: str) -> str:
    return base_url + documents.API_PATH


def _entries_by_pk(pks: list[int]) -> dict[int, dict[str, Any]]:
    return dict(AgentDoc.objects.filter(pk__in=pks).values_list("pk", "entry"))


def search(*, actor: Actor | None, request: SearchRequest, base_url: str) -> dict[str, Any]:
    """``POST /search``: entries ranked by relevance to ``query.text``, 0-100 scores."""
    candidates = apply_filter(visible_docs(actor), request.query, base_url)
    ranked = get_ranker().rank(
        text=request.query.text or "",
        candidates=candidates,
        offset=request.offset,
        limit=request.page_size,
    )
    entries = _entries_by_pk([h.doc_id for h in ranked.hits])
    source = api_url(base_url)
    results = [
        {**documents.render_entry(entries[h.doc_id], base_url), "score": h.score, "source": source}
        for h in ranked.hits
        if h.doc_id in entries
    ]
    body: dict[str, Any] = {"results": results}
    if request.federation == "referrals":
        body["referrals"] = []  # this registry federates with no other (yet)
    following = request.offset + len(ranked.hits)
    if ranked.hits and following < ranked.total and following <= MAX_OFFSET:
        body["pageToken"] = encode_token(following, request.query.fingerprint() + actor_key(actor))
    return body


def _list_clause(qs: QuerySet[AgentDoc], clause: Clause, base_url: str) -> QuerySet[AgentDoc]:
    name, values = clause.field, clause.values
    if name == "displayName":
        cond = Q(pk__in=[])
        for v in values:
            cond |= Q(name__icontains=v)
        return qs.filter(cond)
    if name in ("createdAfter", "updatedAfter"):
        moment = parse_time(values[0], name)
        column = "registry_agent__registered_at" if name == "createdAfter" else "updated_at"
        op = "gte" if clause.op == ">=" else "gt"
        return qs.filter(**{f"{column}__{op}": moment})
    path = "publisher" if name == "publisherId" else name
    return qs.filter(_sql_filter(path, values, base_url) or Q())


def list_agents(*, actor: Actor | None, request: ListRequest, base_url: str) -> dict[str, Any]:
    """``GET /agents``: deterministic, filtered, ordered, paginated browsing (no scores)."""
    qs = visible_docs(actor)
    for clause in request.clauses:
        qs = _list_clause(qs, clause, base_url)
    order = [("-" if desc else "") + column for column, desc in request.order_by]
    qs = qs.order_by(*order, "agent_id")
    total = qs.count()
    page = list(
        qs.values_list("entry", flat=True)[request.offset : request.offset + request.page_size]
    )
    body: dict[str, Any] = {
        "items": [documents.render_entry(e, base_url) for e in page],
        "total": total,
    }
    following = request.offset + len(page)
    if page and following < total and following <= MAX_OFFSET:
        body["pageToken"] = encode_token(following, request.fingerprint)
    return body


def _matched_entries(actor: Actor | None, query: Query, base_url: str) -> Iterator[dict[str, Any]]:
    candidates = apply_filter(visible_docs(actor), query, base_url)
    if not query.text:
        for entry in candidates.values_list("entry", flat=True).iterator(chunk_size=CHUNK):
            yield documents.render_entry(entry, base_url)
        return
    ids = get_ranker().matched_ids(text=query.text, candidates=candidates)
    for i in range(0, len(ids), CHUNK):
        for entry in AgentDoc.objects.filter(pk__in=ids[i : i + CHUNK]).values_list(
            "entry", flat=True
        ):
            yield documents.render_entry(entry, base_url)


def explore(*, actor: Actor | None, request: ExploreRequest, base_url: str) -> dict[str, Any]:
    """``POST /explore``: facet counts over the whole matched set (same cutoff as search)."""
    counters: dict[str, Counter[str]] = {f.field: Counter() for f in request.facets}
    for entry in _matched_entries(actor, request.query, base_url):
        for path, counter in counters.items():
            counter.update(set(path_values(entry, path)))
    facets: dict[str, Any] = {}
    for facet in request.facets:
        ranked = sorted(
            ((v, c) for v, c in counters[facet.field].items() if c >= max(facet.min_count, 1)),
            key=lambda vc: (-vc[1], vc[0]),
        )
        result: dict[str, Any] = {
            "buckets": [{"value": v, "count": c} for v, c in ranked[: facet.limit]]
        }
        if len(ranked) > facet.limit:
            result["otherCount"] = sum(c for _, c in ranked[facet.limit :])
        facets[facet.field] = result
    return {"resultType": "facets", "facets": facets}


def registry_agents_ranked(*, text: str, agents: QuerySet[Agent], limit: int = 1000) -> list[int]:
    """The registry's own search (``/api/v1/agents?q=``, the admin's search box): pks of the
    agents of ``agents`` matching ``text``, best first, by the same ranking as ``POST
    /search`` over their documents (expired agents' too: the registry lists them)."""
    candidates = AgentDoc.objects.filter(registry_agent_id__in=agents.order_by().values("pk"))
    hits = get_ranker().rank(text=text, candidates=candidates, offset=0, limit=limit).hits
    owners = dict(AgentDoc.objects.filter(pk__in=[h.doc_id for h in hits])
                  .values_list("pk", "registry_agent_id"))
    return [owners[h.doc_id] for h in hits if h.doc_id in owners]


#: Agents named by id in the candidates' query at most (more: every routable agent is ranked
#: and the answer narrowed to them afterwards).
MAX_NAMED = 1000


def agents_ranked(*, text: str, agent_ids: Collection[str], limit: int = 1000
                  ) -> list[tuple[str, int]]:
    """``(agent id, 0-100 score)`` of the routable agents of ``agent_ids`` matching ``text``,
    best first, by the same ranking as ``POST /search`` (the MCP bridge's ``/mcp?q=``; it may
    wait for this node's deferred documents, as search does: not on a shared thread). Scores
    are relative to the best of ``agent_ids`` (of every routable agent, past
    :data:`MAX_NAMED` ids)."""
    indexer.settle_deferred()  # this node's deferred documents first (read your writes)
    wanted = set(agent_ids)
    candidates = AgentDoc.objects.filter(active=True)
    if len(wanted) <= MAX_NAMED:
        candidates = candidates.filter(agent_id__in=sorted(wanted))
    hits = get_ranker().rank(text=text, candidates=candidates, offset=0, limit=limit).hits
    owners = dict(AgentDoc.objects.filter(pk__in=[h.doc_id for h in hits])
                  .values_list("pk", "agent_id"))
    return [(owners[h.doc_id], int(h.score)) for h in hits if owners.get(h.doc_id) in wanted]
