"""Keeps the search index current: one :class:`AgentDoc` per registered agent.

``on_registry_event`` is subscribed to ``registry.events`` (the registry's one hook): a
registration or update re-indexes the agent when its card, its row or its public flag changed
and marks it active; an expiry marks it inactive; a deregistration drops its document. Searches
read only this table (no join with the registry). ``index_rebuild`` (``manage.py ard_reindex``)
rebuilds everything and prunes orphans.
"""

from __future__ import annotations

import logging

from django.db import DatabaseError, connection
from django.db.models.constants import OnConflict
from django.utils import timezone

from ard.documents import build_document
from ard.models import AgentDoc
from registry.events import AgentEvent
from registry.models import Agent
from registry.rows import insert_rows

logger = logging.getLogger(__name__)

BATCH = 500
_AGENT_FIELDS = (
    "pk",
    "agent_id",
    "name",
    "description",
    "card",
    "card_sha256",
    "public",
    "status",
    "expires_at",
)


def _doc_fields(agent: Agent, updated_at) -> dict:
    doc = build_document(
        agent_id=agent.agent_id,
        card=agent.card if isinstance(agent.card, dict) else {},
        name=agent.name,
        description=agent.description,
        updated_at=updated_at,
    )
    return {
        **doc,
        "card_sha256": agent.card_sha256,
        "updated_at": updated_at,
        "registry_agent_id": agent.pk,
        "public": agent.public,
        "active": agent.is_routable,
    }


def index_agent(*, agent_id: str, force: bool = False, new: bool = False,
                agent: Agent | None = None) -> AgentDoc | None:
    """(Re)index one agent from the registry; drop its document when the agent is gone.
    ``new``: the agent was just registered (no up-to-date document to compare): write at once.
    ``agent``: the row as the registration that announced it committed it (no read back)."""
    if agent is None or agent.agent_id != agent_id:
        agent = Agent.objects.filter(agent_id=agent_id).only(*_AGENT_FIELDS).first()
    if agent is None:
        AgentDoc.objects.filter(agent_id=agent_id).delete()
        return None
    if new:
        return _upsert(agent)
    doc = (
        AgentDoc.objects.filter(agent_id=agent_id)
        .only("pk", "card_sha256", "registry_agent_id", "public", "active")
        .first()
    )
    if (
        doc is not None
        and not force
        and doc.card_sha256 == agent.card_sha256
        and doc.registry_agent_id == agent.pk
    ):
        # Same card, same row: only the flags may have moved (a lease renewal, a PATCH).
        if (doc.public, doc.active) != (agent.public, agent.is_routable):
            doc.public, doc.active = agent.public, agent.is_routable
            doc.save(update_fields=["public", "active"])
        return doc
    return _upsert(agent)


def _upsert(agent: Agent) -> AgentDoc:
    """Write ``agent``'s document in one statement (INSERT ... ON CONFLICT DO UPDATE)."""
    fields = _doc_fields(agent, timezone.now())
    doc = AgentDoc(agent_id=agent.agent_id, **fields)
    meta = AgentDoc._meta
    # QuerySet._insert is bulk_create's own statement, without its BEGIN/COMMIT around it.
    AgentDoc.objects._insert(
        [doc],
        fields=[f for f in meta.concrete_fields if not f.primary_key],
        on_conflict=OnConflict.UPDATE,
        update_fields=[meta.get_field(name) for name in fields],
        unique_fields=[meta.get_field("agent_id")],
    )
    return doc


def _upsert_many(agents: list[Agent]) -> None:
    """Write the documents of ``agents`` (distinct ids) in one multi-row upsert."""
    now = timezone.now()
    rows = [_doc_fields(agent, now) for agent in agents]
    docs = [AgentDoc(agent_id=agent.agent_id, **row)
            for agent, row in zip(agents, rows, strict=True)]
    quote = connection.ops.quote_name
    meta = AgentDoc._meta
    updates = ", ".join(f"{quote(meta.get_field(name).column)} = "
                        f"EXCLUDED.{quote(meta.get_field(name).column)}" for name in rows[0])
    insert_rows(AgentDoc, docs,
                suffix=f"ON CONFLICT ({quote(meta.get_field('agent_id').column)}) "
                       f"DO UPDATE SET {updates}")


def on_registry_events(events: list[AgentEvent]) -> None:
    """Several events at once (registrations written together): the new agents' documents in
    one upsert; should it fail (a document's registry row changed meanwhile), each on its own."""
    new = [e for e in events if e.kind == "registered" and e.agent is not None
           and e.agent.agent_id == e.agent_id]
    if len({e.agent_id for e in new}) != len(new):
        new = []  # one id twice: an upsert cannot write a row twice
    if new:
        try:  # after the registrations' commit: in autocommit, a failure breaks nothing
            _upsert_many([e.agent for e in new])
        except DatabaseError:
            logger.warning("batched index upsert failed; indexing one by one", exc_info=True)
            new = []
    done = {id(e) for e in new}
    for event in events:
        if id(event) not in done:
            on_registry_event(event)


def on_registry_event(event: AgentEvent) -> None:
    """The ``registry.events`` subscriber (runs after the registry's commit)."""
    if event.kind in ("registered", "updated"):
        index_agent(agent_id=event.agent_id, new=event.kind == "registered", agent=event.agent)
    elif event.kind == "expired":
        AgentDoc.objects.filter(agent_id=event.agent_id).update(active=False)
    elif event.kind == "deregistered":
        AgentDoc.objects.filter(agent_id=event.agent_id).delete()


def index_rebuild(*, force: bool = True) -> dict[str, int]:
    """Index every registered agent and drop documents whose agent is gone."""
    now = timezone.now()
    existing = dict(AgentDoc.objects.values_list("agent_id", "card_sha256"))
    ids = set()
    written = 0
    qs = Agent.objects.only(*_AGENT_FIELDS).order_by("pk")
    batch: list[AgentDoc] = []
    for agent in qs.iterator(chunk_size=BATCH):
        ids.add(agent.agent_id)
        if not force and existing.get(agent.agent_id) == agent.card_sha256:
            continue
        batch.append(AgentDoc(agent_id=agent.agent_id, **_doc_fields(agent, now)))
        if len(batch) >= BATCH:
            written += _write(batch)
            batch = []
    if batch:
        written += _write(batch)
    gone = [a for a in existing if a not in ids]
    for i in range(0, len(gone), BATCH):
        AgentDoc.objects.filter(agent_id__in=gone[i : i + BATCH]).delete()
    return {"indexed": written, "pruned": len(gone), "agents": len(ids)}


def _write(batch: list[AgentDoc]) -> int:
    # Delete-then-insert rather than an upsert: the registry row behind an agent id may have
    # changed (deregistered and registered again), and the one-to-one column is unique.
    AgentDoc.objects.filter(agent_id__in=[d.agent_id for d in batch]).delete()
    AgentDoc.objects.filter(registry_agent_id__in=[d.registry_agent_id for d in batch]).delete()
    AgentDoc.objects.bulk_create(batch, batch_size=BATCH)
    return len(batch)
