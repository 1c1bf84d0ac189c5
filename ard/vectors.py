"""The node's in-process nearest-neighbour index over the search documents' embeddings.

One float32 matrix (a row per document with an embedding, ``ARD_EMBEDDING_DIM`` columns) and
the documents' ids beside it. A query is one matrix-vector product and a partial sort: exact
cosine neighbours, no approximation. Kept current three ways:

* loaded from the database on the first search of the process;
* changed in place by the indexer as this process writes or drops a document (registry
  events, the deferred writer, reindex);
* caught up with the other nodes' writes by a thread of its own every
  ``ARD_SEMANTIC_SYNC_SECONDS`` (never on a search's path): the documents written since the
  last catch-up (an indexed ``updated_at`` range, re-read with five seconds of slack), and the
  ids still present when the count of embedded documents says some were dropped elsewhere.

Memory: ``4 x dim`` bytes per document for the matrix plus 8 for its id (128 dimensions:
520 bytes, about 52 MB for 100,000 agents); growth doubles the capacity, like a list.
"""

from __future__ import annotations

import atexit
import logging
import threading
from datetime import datetime, timedelta

import numpy as np
from django.conf import settings
from django.db.models import Max
from django.utils import timezone

from ard import embeddings
from ard.models import AgentDoc

logger = logging.getLogger(__name__)
SLACK = timedelta(seconds=5)  # a write committed late with an earlier timestamp is still seen
CHUNK = 2000


class VectorIndex:
    """Exact cosine nearest neighbours over one matrix; thread-safe."""

    def __init__(self, dim: int, model: str) -> None:
        self.dim, self.model = dim, model
        self._lock = threading.RLock()
        self._matrix = np.zeros((0, dim), dtype=np.float32)
        self._ids = np.zeros(0, dtype=np.int64)
        self._size = 0
        self._row: dict[int, int] = {}  # document id -> row
        self.loaded = False
        self._watermark: datetime | None = None  # the latest updated_at seen
        self._syncer: threading.Thread | None = None
        self._stopped = threading.Event()

    def __len__(self) -> int:
        return self._size

    def nbytes(self) -> int:
        """Bytes held by the matrix and ids (their capacity, not only the rows in use)."""
        return self._matrix.nbytes + self._ids.nbytes

    def put(self, doc_ids: list[int], vectors: np.ndarray) -> None:
        """Insert or replace the vectors of ``doc_ids``."""
        with self._lock:
            for doc_id, vector in zip(doc_ids, vectors, strict=True):
                row = self._row.get(doc_id)
                if row is None:
                    if self._size == len(self._ids):
                        self._grow()
                    row = self._size
                    self._size += 1
                    self._row[doc_id] = row
                    self._ids[row] = doc_id
                self._matrix[row] = vector

    def drop(self, doc_ids: list[int]) -> None:
        """Remove ``doc_ids`` (the last row moves into each hole)."""
        with self._lock:
            for doc_id in doc_ids:
                row = self._row.pop(doc_id, None)
                if row is None:
                    continue
                last = self._size - 1
                if row != last:
                    moved = int(self._ids[last])
                    self._matrix[row] = self._matrix[last]
                    self._ids[row] = moved
                    self._row[moved] = row
                self._size = last

    def clear(self) -> None:
        with self._lock:
            self._matrix = np.zeros((0, self.dim), dtype=np.float32)
            self._ids = np.zeros(0, dtype=np.int64)
            self._size = 0
            self._row.clear()
            self.loaded = False
            self._watermark = None

    def _grow(self) -> None:
        capacity = max(1024, 2 * len(self._ids))
        matrix = np.zeros((capacity, self.dim), dtype=np.float32)
        matrix[: self._size] = self._matrix[: self._size]
        ids = np.zeros(capacity, dtype=np.int64)
        ids[: self._size] = self._ids[: self._size]
        self._matrix, self._ids = matrix, ids

    def nearest(
        self, query: np.ndarray, *, k: int, min_similarity: float
    ) -> list[tuple[int, float]]:
        """Up to ``k`` ``(document id, cosine)`` at or above ``min_similarity``, nearest first
        (ties: the lower id)."""
        with self._lock:
            n = self._size
            if n == 0 or k <= 0:
                return []
            sims = self._matrix[:n] @ query.astype(np.float32)
            ids = self._ids[:n]
            floor = min_similarity
            if k < n:  # the k-th best similarity; every row tied with it stays in the running
                floor = max(floor, float(sims[np.argpartition(-sims, k - 1)[k - 1]]))
            part = np.flatnonzero(sims >= floor)
            order = part[np.lexsort((ids[part], -sims[part]))][:k]
            return [(int(ids[i]), float(sims[i])) for i in order]

    # --- keeping in step with the database -------------------------------------------------------

    def _rows(self, qs) -> tuple[list[int], list[np.ndarray]]:
        ids, vectors = [], []
        for pk, raw in qs.values_list("pk", "embedding").iterator(chunk_size=CHUNK):
            vector = embeddings.from_bytes(raw, self.dim) if raw is not None else None
            if vector is not None:
                ids.append(pk)
                vectors.append(vector)
        return ids, vectors

    def _embedded(self):
        return AgentDoc.objects.filter(embedding_model=self.model).order_by()

    def load(self) -> None:
        """Everything from the database (the first search of the process, or a resync)."""
        with self._lock:
            watermark = self._embedded().aggregate(m=Max("updated_at"))["m"]
            ids, vectors = self._rows(self._embedded())
            self.clear()
            if ids:
                self.put(ids, np.vstack(vectors))
            self.loaded = True
            self._watermark = watermark

    def ensure_loaded(self) -> None:
        """Load the index on the first search of the process (and start catching up)."""
        if self.loaded:
            return
        with self._lock:
            if not self.loaded:
                self.load()
        self._start_catching_up()

    def sync(self) -> None:
        """Catch up with documents other processes wrote or dropped: the rows embedded since
        the last catch-up (less ``SLACK``), then, when the count of embedded documents says
        some went elsewhere, the ids still present. The database is read without holding the
        index: searches go on meanwhile."""
        if not self.loaded:
            self.ensure_loaded()
            return
        changed = self._embedded()
        if self._watermark is not None:
            # re-read a slack twice the interval: a round that missed a row (a late commit,
            # an id dropped in a race) sees it again in the next
            slack = max(SLACK, 2 * timedelta(seconds=settings.ARD_SEMANTIC_SYNC_SECONDS))
            changed = changed.filter(updated_at__gte=self._watermark - slack)
        latest = changed.aggregate(m=Max("updated_at"))["m"]
        ids, vectors = self._rows(changed)
        if ids:
            self.put(ids, np.vstack(vectors))
        if latest is not None:
            self._watermark = max(latest, self._watermark or latest)
        if self._embedded().count() != self._size:  # dropped (or re-embedded) elsewhere
            present = set(self._embedded().values_list("pk", flat=True))
            with self._lock:
                self.drop([i for i in list(self._row) if i not in present])

    def _start_catching_up(self) -> None:
        """A thread syncing every ARD_SEMANTIC_SYNC_SECONDS (0: never) while this index is the
        process's: off the search path."""
        seconds = settings.ARD_SEMANTIC_SYNC_SECONDS
        with self._lock:
            if seconds <= 0 or self._syncer is not None:
                return
            self._syncer = threading.Thread(target=self._catch_up, args=(seconds,),
                                            name="ard-vectors-sync", daemon=True)
        self._syncer.start()

    def _catch_up(self, seconds: float) -> None:
        from django.db import close_old_connections, connection

        while not self._stopped.wait(seconds):
            if _index is not self:
                return
            try:
                close_old_connections()
                self.sync()
            except Exception:  # an outage: the next round tries again
                logger.warning("vector index catch-up failed", exc_info=True)
            finally:
                connection.close()

    def stop(self) -> None:
        self._stopped.set()


_index: VectorIndex | None = None
_index_lock = threading.Lock()


def get_index() -> VectorIndex | None:
    """This process's index for the configured embedder, or None when semantic search is off."""
    global _index
    embedder = embeddings.get_embedder()
    if embedder is None:
        return None
    with _index_lock:
        if _index is None or (_index.model, _index.dim) != (embedder.name, embedder.dim):
            if _index is not None:
                _index.stop()
            _index = VectorIndex(embedder.dim, embedder.name)
        return _index


def reset() -> None:
    """Forget the index (tests: the database they start from is another one)."""
    global _index
    with _index_lock:
        if _index is not None:
            _index.stop()
        _index = None


def documents_written(rows: list[tuple[str, bytes | None, str]]) -> None:
    """The indexer wrote these ``(agent id, embedding, model)``: keep the index in step (one
    query for the documents' ids, only once the index is loaded)."""
    index = _index
    if index is None or not index.loaded or not rows:
        return
    pks: dict[str, int] = {}
    agent_ids = [a for a, _, _ in rows]
    for i in range(0, len(agent_ids), CHUNK):
        pks.update(AgentDoc.objects.filter(agent_id__in=agent_ids[i : i + CHUNK])
                   .values_list("agent_id", "pk"))
    keep: list[tuple[int, np.ndarray]] = []
    gone: list[int] = []
    for agent_id, raw, model in rows:
        pk = pks.get(agent_id)
        if pk is None:
            continue
        vector = (embeddings.from_bytes(raw, index.dim)
                  if raw is not None and model == index.model else None)
        if vector is None:
            gone.append(pk)
        else:
            keep.append((pk, vector))
    if keep:
        index.put([i for i, _ in keep], np.vstack([v for _, v in keep]))
    if gone:
        index.drop(gone)


def documents_dropped(doc_ids: list[int]) -> None:
    index = _index
    if index is not None and doc_ids:
        index.drop(doc_ids)


# --- the embedding writer ------------------------------------------------------------------------
# On PostgreSQL (ARD_EMBED_DEFERRED) a document is written without its embedding and handed to
# this process's embedding thread, which embeds it and writes the vector, so neither the model
# nor its first load is on the path of the registration that changed the card. SQLite writes
# one thing at a time: there the indexer embeds the document as it writes it. Searches on this
# node wait (at most SETTLE_TIMEOUT_SECONDS) for what is handed over: read your writes. Bounded:
# past MAX_PENDING agents waiting, the indexer embeds the documents itself; what a process dies
# with is embedded again by the repair job (a document without its model's embedding is stale).

MAX_PENDING = 10_000
EMBED_BATCH = 256
SETTLE_TIMEOUT_SECONDS = 5.0
_TEXT_FIELDS = ("name", "description", "skill_names", "tags", "skill_descriptions", "examples")


class EmbedWriter:
    """One thread embedding the documents handed to it and writing their vectors."""

    def __init__(self, *, max_pending: int = MAX_PENDING) -> None:
        self.max_pending = max_pending
        self._cond = threading.Condition()
        self._pending: dict[str, str] = {}  # agent id -> card sha256 of the document to embed
        self._queued = 0  # handed over so far
        self._done = 0  # embedded (or given up) so far
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.written = 0

    def submit(self, items: list[tuple[str, str]]) -> bool:
        """Hand over ``(agent id, card sha256)`` of documents just written; False (nothing
        taken) when they do not fit."""
        with self._cond:
            fresh = [a for a, _ in items if a not in self._pending]
            if len(self._pending) + len(fresh) > self.max_pending:
                return False
            for agent_id, sha in items:
                if agent_id not in self._pending:
                    self._queued += 1
                self._pending[agent_id] = sha
            if self._thread is None or not self._thread.is_alive():
                self._stopping = False
                self._thread = threading.Thread(target=self._run, name="ard-embedder",
                                                daemon=True)
                self._thread.start()
            self._cond.notify_all()
        return True

    def pending(self) -> int:
        with self._cond:
            return len(self._pending)

    def settle(self, timeout: float | None = None) -> bool:
        """Wait until what was handed over before this call is embedded; False on timeout."""
        with self._cond:
            target = self._queued
            return self._cond.wait_for(lambda: self._done >= target,
                                       SETTLE_TIMEOUT_SECONDS if timeout is None else timeout)

    def stop(self, timeout: float = SETTLE_TIMEOUT_SECONDS) -> bool:
        """Embed what was handed over (waiting at most ``timeout``), then end the thread; False
        when it was still embedding at the deadline (the repair job embeds the rest). Run at
        process exit: a daemon thread still inside the model's native code when the interpreter
        finalizes aborts the whole process (glibc's "FATAL: exception not rethrown")."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            thread = self._thread
        if thread is None:
            return True
        thread.join(timeout)
        return not thread.is_alive()

    def _run(self) -> None:
        from django.db import close_old_connections, connection

        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending or self._stopping)
                if not self._pending:
                    return  # stopping, nothing left
                batch = dict(list(self._pending.items())[:EMBED_BATCH])
            try:
                close_old_connections()
                self._embed(batch)
            except Exception:  # a bug or an outage must not stop the thread: repair catches up
                logger.exception("embedding %d search document(s) failed; the repair job "
                                 "(ard-index-repair) embeds them", len(batch))
            finally:
                connection.close()
                with self._cond:
                    for agent_id, sha in batch.items():
                        if self._pending.get(agent_id) == sha:
                            del self._pending[agent_id]
                            self._done += 1
                    self._cond.notify_all()

    def _embed(self, batch: dict[str, str]) -> None:
        from django.db import transaction

        embedder = embeddings.get_embedder()
        if embedder is None:
            return
        rows = list(AgentDoc.objects.filter(agent_id__in=list(batch))
                    .values("pk", "agent_id", "card_sha256", *_TEXT_FIELDS))
        rows = [r for r in rows if r["card_sha256"] == batch[r["agent_id"]]]  # else: newer
        if not rows:
            return
        matrix = embedder.embed([embeddings.document_text(r) for r in rows])
        written: list[tuple[int, np.ndarray]] = []
        with transaction.atomic():
            for row, vector in zip(rows, matrix, strict=True):
                # updated_at moves too: other nodes catch up by it
                if AgentDoc.objects.filter(pk=row["pk"], card_sha256=row["card_sha256"]).update(
                    embedding=embeddings.to_bytes(vector), embedding_model=embedder.name,
                    updated_at=timezone.now(),
                ):
                    written.append((row["pk"], vector))
        self.written += len(written)
        index = _index
        if index is not None and index.loaded and index.model == embedder.name and written:
            # as stored (float16), so this node ranks as the others, which load it
            stored = np.vstack([v.astype(np.float16) for _, v in written]).astype(np.float32)
            index.put([i for i, _ in written], stored)


_writer = EmbedWriter()
atexit.register(_writer.stop)  # after the indexer's own exit hook, which may hand some over


def embed_writer() -> EmbedWriter:
    """This process's embedding thread."""
    return _writer
