"""Keeps the search index current: one :class:`AgentDoc` per registered agent.

``on_registry_event`` is subscribed to ``registry.events`` (the registry's one hook): a
registration or update re-indexes the agent when its card, its row or its public flag changed
and marks it active; an expiry marks it inactive; a deregistration drops its document. Searches
read only this table (no join with the registry). Registrations written together leave their
documents to a writer thread of their own (:class:`DeferredWriter`), ``index_missing`` (the
``ard-index-repair`` job) writes what a process died with, and ``index_rebuild``
(``manage.py ard_reindex``) rebuilds everything and prunes orphans.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections import Counter, deque

from django.conf import settings
from django.db import DatabaseError, close_old_connections, connection
from django.db.models import F, Q
from django.db.models.constants import OnConflict
from django.utils import timezone

from ard import embeddings, vectors
from ard.documents import build_document
from ard.models import AgentDoc
from core import outage
from registry.events import AgentEvent
from registry.ids import split_agent_key
from registry.models import Agent
from registry.rows import insert_rows
from registry.selectors import shared_tenants

logger = logging.getLogger(__name__)

BATCH = 500
_AGENT_FIELDS = (
    "pk",
    "tenant",
    "visibility",
    "agent_id",
    "name",
    "description",
    "card",
    "card_sha256",
    "public",
    "status",
    "expires_at",
)


def _embed(rows: list[dict]) -> bool:
    """Add each document's embedding to its fields (written with the document, in the same
    statement), or leave them to the embedding thread (True: hand them over with
    :func:`_written` once written). The thread takes them on PostgreSQL with
    ``ARD_EMBED_DEFERRED`` while it has room; SQLite writes one thing at a time, so there the
    document is embedded here (the bundled static model: about 0.15 ms a card,
    bench/ard_vectors_bench.py)."""
    embedder = embeddings.get_embedder()
    deferred = embedder is not None and (
        settings.ARD_EMBED_DEFERRED
        and connection.vendor == "postgresql"
        and vectors.embed_writer().pending() + len(rows) <= vectors.MAX_PENDING
    )
    if embedder is None or deferred:
        for row in rows:
            row["embedding"], row["embedding_model"] = None, ""
        return deferred
    matrix = embedder.embed([embeddings.document_text(row) for row in rows])
    for row, vector in zip(rows, matrix, strict=True):
        row["embedding"], row["embedding_model"] = embeddings.to_bytes(vector), embedder.name
    return False


def _current_model() -> str:
    embedder = embeddings.get_embedder()
    return embedder.name if embedder is not None else ""


def _written(rows: list[dict], agent_ids: list[str], deferred: bool) -> None:
    """Documents written: the node's vector index follows, and deferred embeddings go to the
    embedding thread (should it be full meanwhile, to the repair job)."""
    vectors.documents_written([(a, row["embedding"], row["embedding_model"])
                               for a, row in zip(agent_ids, rows, strict=True)])
    if deferred and not vectors.embed_writer().submit(
            [(a, row["card_sha256"]) for a, row in zip(agent_ids, rows, strict=True)]):
        logger.warning("embedding thread full: %d document(s) left to the repair job",
                       len(rows))


def _doc_fields(agent: Agent, updated_at) -> dict:
    doc = build_document(
        agent_id=agent.key,
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
        "reach": reach_index(agent),
    }


def reach_index(agent: Agent) -> str:
    """Which tenants' callers may find the agent (docs/tenants.md): ``|*|`` published to
    every tenant, else ``|tenant|`` and the tenants it is shared with."""
    if agent.visibility == Agent.Visibility.PUBLIC:
        return "|*|"
    tenants = [str(agent.tenant_id)]
    if agent.visibility == Agent.Visibility.SHARED and agent.pk is not None:
        tenants += shared_tenants(agent_pks=[agent.pk]).get(agent.pk, ())
    return "|" + "|".join(tenants) + "|"


def index_agent(*, agent_id: str, force: bool = False, new: bool = False,
                agent: Agent | None = None) -> AgentDoc | None:
    """(Re)index one agent from the registry; drop its document when the agent is gone.
    ``new``: the agent was just registered (no up-to-date document to compare): write at once.
    ``agent``: the row as the registration that announced it committed it (no read back)."""
    if agent is None or agent.key != agent_id:
        tenant, bare = split_agent_key(agent_id)  # the routing key (registry.ids.agent_key)
        agent = Agent.objects.filter(tenant_id=tenant, agent_id=bare).only(
            *_AGENT_FIELDS).first()
    if agent is None:
        _delete(AgentDoc.objects.filter(agent_id=agent_id))
        return None
    if new:
        return _upsert(agent)
    doc = (
        AgentDoc.objects.filter(agent_id=agent_id)
        .only("pk", "card_sha256", "registry_agent_id", "public", "active", "embedding_model",
              "reach")
        .first()
    )
    if (
        doc is not None
        and not force
        and doc.card_sha256 == agent.card_sha256
        and doc.registry_agent_id == agent.pk
        and doc.embedding_model == _current_model()
    ):
        # Same card, same row: only the flags may have moved (a lease renewal, a PATCH).
        reach = reach_index(agent)
        if (doc.public, doc.active, doc.reach) != (agent.public, agent.is_routable, reach):
            doc.public, doc.active, doc.reach = agent.public, agent.is_routable, reach
            doc.save(update_fields=["public", "active", "reach"])
        return doc
    return _upsert(agent)


def _upsert(agent: Agent) -> AgentDoc:
    """Write ``agent``'s document in one statement (INSERT ... ON CONFLICT DO UPDATE)."""
    fields = _doc_fields(agent, timezone.now())
    deferred = _embed([fields])
    doc = AgentDoc(agent_id=agent.key, **fields)
    meta = AgentDoc._meta
    # QuerySet._insert is bulk_create's own statement, without its BEGIN/COMMIT around it.
    AgentDoc.objects._insert(  # type: ignore[attr-defined]  # private QuerySet API
        [doc],
        fields=[f for f in meta.concrete_fields if not f.primary_key],
        on_conflict=OnConflict.UPDATE,
        update_fields=[meta.get_field(name) for name in fields],
        unique_fields=[meta.get_field("agent_id")],
    )
    _written([fields], [agent.key], deferred)
    return doc


def _upsert_many(agents: list[Agent]) -> None:
    """Write the documents of ``agents`` (distinct ids) in one multi-row upsert."""
    now = timezone.now()
    rows = [_doc_fields(agent, now) for agent in agents]
    deferred = _embed(rows)
    docs = [AgentDoc(agent_id=agent.key, **row)
            for agent, row in zip(agents, rows, strict=True)]
    quote = connection.ops.quote_name
    meta = AgentDoc._meta
    updates = ", ".join(f"{quote(meta.get_field(name).column)} = "  # type: ignore[union-attr, arg-type]  # concrete fields
                        f"EXCLUDED.{quote(meta.get_field(name).column)}" for name in rows[0])  # type: ignore[union-attr, arg-type]  # concrete fields
    insert_rows(AgentDoc, docs,
                suffix=f"ON CONFLICT ({quote(meta.get_field('agent_id').column)}) "  # type: ignore[arg-type]  # a concrete field
                       f"DO UPDATE SET {updates}")
    _written(rows, [agent.key for agent in agents], deferred)


def _upsert_or_each(agents: list[Agent]) -> int:
    """Write the documents of ``agents`` (distinct ids) in one upsert; should it fail (a
    document's registry row changed meanwhile), each on its own (SQLite: each on its own). A
    database outage is raised."""
    if connection.vendor == "postgresql":
        try:  # in autocommit (after the registrations' commit): a failure breaks nothing
            _upsert_many(agents)
            return len(agents)
        except DatabaseError as exc:
            if outage.is_database_outage(exc):
                raise
            logger.warning("batched index upsert failed; indexing one by one", exc_info=True)
    written = 0
    for agent in agents:
        try:
            index_agent(agent_id=agent.key, new=True, agent=agent)
            written += 1
        except DatabaseError as exc:
            if outage.is_database_outage(exc):
                raise
            logger.exception("indexing %s failed", agent.key)
    return written


def on_registry_events(events: list[AgentEvent]) -> None:
    """Several events at once (registrations written together): the new agents' documents
    handed to the deferred writer (or, when it is full or ``ARD_INDEX_DEFERRED`` is off,
    written here in one upsert); the other events one by one."""
    new = [e for e in events if e.kind == "registered" and e.agent is not None
           and e.agent.key == e.agent_id]
    if len({e.agent_id for e in new}) != len(new):
        new = []  # one id twice: an upsert cannot write a row twice
    if new and any(_writer.deferred(e.agent_id) for e in new):
        _writer.settle()  # an earlier document of one of them is still deferred: in order
    agents = [e.agent for e in new]
    if new and not (settings.ARD_INDEX_DEFERRED and _writer.defer(agents)):
        try:
            _upsert_or_each(agents)
        except DatabaseError:  # an outage (_upsert_or_each handles the rest): once more, each
            logger.warning("search documents not written (database unavailable); trying each "
                           "on its own", exc_info=True)
            new = []
    done = {id(e) for e in new}
    for event in events:
        if id(event) not in done:
            on_registry_event(event)


def on_registry_event(event: AgentEvent) -> None:
    """The ``registry.events`` subscriber (runs after the registry's commit)."""
    if _writer.deferred(event.agent_id):
        _writer.settle()  # its deferred document first: events apply in order
    if event.kind in ("registered", "updated"):
        index_agent(agent_id=event.agent_id, new=event.kind == "registered", agent=event.agent)
    elif event.kind == "expired":
        AgentDoc.objects.filter(agent_id=event.agent_id).update(active=False)
    elif event.kind == "deregistered":
        _delete(AgentDoc.objects.filter(agent_id=event.agent_id))


def _delete(docs) -> None:
    """Delete ``docs`` and take them out of the node's vector index."""
    pks = list(docs.values_list("pk", flat=True))
    if pks:
        AgentDoc.objects.filter(pk__in=pks).delete()
        vectors.documents_dropped(pks)


def index_rebuild(*, force: bool = True) -> dict[str, int]:
    """Index every registered agent and drop documents whose agent is gone."""
    now = timezone.now()
    model = _current_model()
    existing = {a: (sha, m) for a, sha, m in
                AgentDoc.objects.values_list("agent_id", "card_sha256", "embedding_model")}
    ids = set()
    written = 0
    qs = Agent.objects.only(*_AGENT_FIELDS).order_by("pk")
    batch: list[AgentDoc] = []
    for agent in qs.iterator(chunk_size=BATCH):
        ids.add(agent.key)
        if not force and existing.get(agent.key) == (agent.card_sha256, model):
            continue
        batch.append(AgentDoc(agent_id=agent.key, **_doc_fields(agent, now)))
        if len(batch) >= BATCH:
            written += _write(batch)
            batch = []
    if batch:
        written += _write(batch)
    gone = [a for a in existing if a not in ids]
    for i in range(0, len(gone), BATCH):
        _delete(AgentDoc.objects.filter(agent_id__in=gone[i : i + BATCH]))
    return {"indexed": written, "pruned": len(gone), "agents": len(ids)}


def _write(batch: list[AgentDoc]) -> int:
    # Delete-then-insert rather than an upsert: the registry row behind an agent id may have
    # changed (deregistered and registered again), and the one-to-one column is unique.
    rows = [{f: getattr(d, f) for f in ("name", "description", "skill_names", "tags",
                                        "skill_descriptions", "examples", "card_sha256")}
            for d in batch]
    deferred = _embed(rows)
    for doc, row in zip(batch, rows, strict=True):
        doc.embedding, doc.embedding_model = row["embedding"], row["embedding_model"]
    _delete(AgentDoc.objects.filter(agent_id__in=[d.agent_id for d in batch]))
    _delete(AgentDoc.objects.filter(registry_agent_id__in=[d.registry_agent_id for d in batch]))
    AgentDoc.objects.bulk_create(batch, batch_size=BATCH)
    _written(rows, [d.agent_id for d in batch], deferred)
    return len(batch)


# --- the deferred writer -------------------------------------------------------------------------
# Registrations written together (PostgreSQL's group commit, node.registrations) hand their
# new agents' documents to this process's index writer instead of writing them in the batch: a
# document's full-text vector costs PostgreSQL about as much as the rest of the registration, and
# written by one thread of its own, many batches' documents in one statement, it no longer holds
# the registrations answered with it. Searches on this node wait for what is deferred (read your
# writes); another node sees a document once written (milliseconds). A later event for an agent
# with a document still deferred waits for it first (events apply in order). Bounded: past
# MAX_DEFERRED agents or MAX_DEFERRED_BYTES of cards the batch writes its documents itself. A
# process that dies with documents deferred leaves them to the repair job (index_missing).

MAX_DEFERRED = 2048
MAX_DEFERRED_BYTES = 16 * 1024 * 1024  # the registered card bytes of the agents deferred
WRITE_BATCH = 256
SETTLE_TIMEOUT_SECONDS = 5.0
RETRY_SECONDS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)  # a database outage: then the documents are
# left to the repair job


class DeferredWriter:
    """One thread writing the documents handed to it, in order, many in one statement."""

    def __init__(self, *, max_agents: int = MAX_DEFERRED, max_bytes: int = MAX_DEFERRED_BYTES,
                 retry_seconds: tuple[float, ...] = RETRY_SECONDS) -> None:
        self.max_agents, self.max_bytes, self.retry_seconds = max_agents, max_bytes, retry_seconds
        self._cond = threading.Condition()
        self._queue: deque[tuple[int, Agent, int]] = deque()  # (sequence, agent, card bytes)
        self._ids: Counter[str] = Counter()  # agent ids deferred and not yet written
        self._bytes = 0
        self._queued = 0  # the sequence number of the last document handed over
        self._done = 0  # every document up to this sequence number is written (or given up)
        self._thread: threading.Thread | None = None
        self.written = 0
        self.given_up = 0

    def defer(self, agents: list[Agent]) -> bool:
        """Hand over ``agents``' documents; False (nothing taken) when they do not fit."""
        sizes = [len(agent.card_raw or "") for agent in agents]
        with self._cond:
            if (self._queued - self._done + len(agents) > self.max_agents  # queued or writing
                    or self._bytes + sum(sizes) > self.max_bytes):
                return False
            for agent, size in zip(agents, sizes, strict=True):
                self._queued += 1
                self._queue.append((self._queued, agent, size))
                self._ids[agent.key] += 1
            self._bytes += sum(sizes)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="ard-index-writer",
                                                daemon=True)
                self._thread.start()
            self._cond.notify_all()
        return True

    def deferred(self, agent_id: str | None = None) -> bool:
        """Whether any document (``agent_id``'s) is handed over and not yet written."""
        with self._cond:
            return self._ids[agent_id] > 0 if agent_id is not None else self._done < self._queued

    def waiting(self) -> int:
        """How many documents are handed over and not yet written."""
        with self._cond:
            return self._queued - self._done

    def settle(self, timeout: float | None = None) -> bool:
        """Wait until every document handed over before this call is written (or given up);
        False if ``timeout`` (``SETTLE_TIMEOUT_SECONDS``) passed first."""
        with self._cond:
            target = self._queued
            return self._cond.wait_for(lambda: self._done >= target,
                                       SETTLE_TIMEOUT_SECONDS if timeout is None else timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queue)
                batch = [self._queue.popleft() for _ in range(min(WRITE_BATCH, len(self._queue)))]
            try:
                self._write([agent for _, agent, _ in batch])
            except Exception:  # a bug must not stop the writer: the repair job catches up
                logger.exception("deferred index write failed")
            finally:
                with self._cond:
                    for _, agent, size in batch:
                        self._ids[agent.key] -= 1
                        if not self._ids[agent.key]:
                            del self._ids[agent.key]
                        self._bytes -= size
                    self._done = batch[-1][0]
                    self._cond.notify_all()

    def _write(self, agents: list[Agent]) -> None:
        latest = list({agent.key: agent for agent in agents}.values())  # the last one wins
        for pause in (*self.retry_seconds, None):
            close_old_connections()
            try:
                _upsert_or_each(latest)
                self.written += len(latest)
                return
            except DatabaseError as exc:
                if not outage.is_database_outage(exc) or pause is None:
                    break
                logger.warning("deferred index write: database unavailable (%s); retrying in "
                               "%.2f s", exc, pause)
            finally:
                close_old_connections()
            time.sleep(pause)
        self.given_up += len(latest)
        logger.error("deferred index write gave up on %d document(s); the repair job "
                     "(ard-index-repair) or `manage.py ard_reindex --changed` writes them",
                     len(latest))


_writer = DeferredWriter()


def writer() -> DeferredWriter:
    """This process's deferred writer."""
    return _writer


def settle_deferred() -> None:
    """Wait (at most ``SETTLE_TIMEOUT_SECONDS``) for the documents this process deferred."""
    if _writer.deferred():
        _writer.settle()


atexit.register(settle_deferred)  # a node stopping writes what it deferred


def index_missing() -> int:
    """Index the agents whose document is missing or older than their card (documents a
    process died with before writing them); how many were written."""
    written = 0
    outdated = Q(doc_sha__isnull=True) | ~Q(doc_sha=F("card_sha256"))
    if model := _current_model():  # embedded by another model (or not at all): embed again
        outdated |= ~Q(ard_doc__embedding_model=model)
    stale = (Agent.objects.annotate(doc_sha=F("ard_doc__card_sha256"))
             .filter(outdated)
             .only(*_AGENT_FIELDS).order_by("pk"))
    batch: list[Agent] = []
    for agent in stale.iterator(chunk_size=BATCH):
        batch.append(agent)
        if len(batch) >= BATCH:
            written += _upsert_or_each(batch)
            batch = []
    if batch:
        written += _upsert_or_each(batch)
    if written:
        logger.info("index repair: wrote %d missing or stale document(s)", written)
    return written
