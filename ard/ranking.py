"""Relevance ranking behind one selector: PostgreSQL full text, SQLite FTS5, or a portable one.

A :class:`Ranker` takes the query text and the candidate documents (entitlement and filters
already applied, as a queryset) and returns one page of hits with 0-100 scores and the size of
the matched set. Scores: ``round(100 * rank / best rank of the query)`` -- the best match of a
query scores 100 and the others in proportion; matches under ``ARD_MIN_SCORE`` are cut off (the
same cutoff for search and explore, as ARD §7.3 asks). By default the vendor's lexical ranker
is fused with semantic search over the documents' embeddings (:class:`HybridRanker`); another
ranker plugs in through ``ARD_RANKER`` without touching the API.

Text becomes terms (letters and digits, lowercased, English stop words dropped) combined with
OR, so a natural-language question matches agents that share any of its words and the ranking
decides: weighted fields (name and skill names first; then tags and description; then skill
descriptions and examples) with ``ts_rank`` on PostgreSQL and ``bm25`` on SQLite.
"""

from __future__ import annotations

import hashlib
import math
import re
import time
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Protocol, TypeVar

from django.conf import settings
from django.db import connection
from django.db.models import QuerySet
from django.utils import timezone
from django.utils.module_loading import import_string

from ard.models import AgentDoc

K = TypeVar("K", bound=Hashable)

MAX_TERMS = 32
_TOKEN = re.compile(r"[^\W_]+", re.UNICODE)
STOP_WORDS = frozenset(
    """
a about above after again against all am an and any are as at be because been before being
below between both but by can could did do does doing down during each few for from further
had has have having he her here hers herself him himself his how i if in into is it its itself
just me more most my myself no nor not now of off on once only or other our ours ourselves out
over own same she should so some such than that the their theirs them themselves then there
these they this those through to too under until up very was we were what when where which
while who whom why will with would you your yours yourself yourselves please want need find
me get give tell show help can could would like let lets i'd im i'm
""".split()
)


def query_terms(text: str) -> list[str]:
    """The searchable terms of a text: lowercased words, stop words and 1-letter words out."""
    terms = [t for t in _TOKEN.findall(text.lower()) if len(t) > 1 and t not in STOP_WORDS]
    return list(dict.fromkeys(terms))[:MAX_TERMS]


@dataclass(frozen=True)
class Hit:
    doc_id: int
    score: float


@dataclass(frozen=True)
class Ranked:
    hits: list[Hit]
    total: int  # matched entries at or above the cutoff (all pages)


class Ranker(Protocol):
    """What the API needs from a ranker."""

    def rank(self, *, text: str, candidates: QuerySet[AgentDoc], offset: int, limit: int) -> Ranked:
        """The page ``[offset, offset+limit)`` of ``candidates`` matching ``text``, best first."""
        ...

    def matched_ids(self, *, text: str, candidates: QuerySet[AgentDoc]) -> list[int]:
        """Every candidate matching ``text`` at or above the cutoff (for explore's facets)."""
        ...


def _score(rank: float, top: float) -> int:
    return max(0, min(100, round(100 * rank / top))) if top > 0 else 0


def _cutoff_ratio() -> float:
    # score = round(100 r / top) >= min  <=>  r / top >= (min - 0.5) / 100
    return max(0.0, (settings.ARD_MIN_SCORE - 0.5) / 100)


def _allowed(candidates: QuerySet[AgentDoc], ids: list[int], chunk: int = 2000) -> set[int]:
    """Which of ``ids`` are candidates (entitlement and filters), a chunk of ids a query."""
    allowed: set[int] = set()
    for i in range(0, len(ids), chunk):
        allowed.update(
            candidates.order_by().filter(pk__in=ids[i : i + chunk]).values_list("pk", flat=True)
        )
    return allowed


def scored_among(rows: list[tuple[int, float]], allowed: set[int]) -> list[tuple[int, int, int]]:
    """``(id, id, 0-100 score)`` of the ``rows`` in ``allowed`` at or above the cutoff, best
    first; ties go to the older document (lower id): deterministic, and no join to sort by."""
    return scored_list([(i, i, r) for i, r in rows if i in allowed])


def scored_list(ranks: list[tuple[K, Any, float]]) -> list[tuple[K, Any, int]]:
    """``(key, tie-break, 0-100 score)`` of ``(key, tie-break, rank)`` rows at or above the
    cutoff, best first, ties by the tie-break: the one scoring of every ranker here."""
    top = max((r for _, _, r in ranks), default=0.0)
    if top <= 0:
        return []
    cut = _cutoff_ratio() * top
    kept = sorted((k for k in ranks if k[2] >= cut), key=lambda k: (-k[2], k[1]))
    return [(key, tie, _score(r, top)) for key, tie, r in kept]


def fuse(
    lexical: Mapping[K, float], semantic: Mapping[K, float]
) -> list[tuple[K, float, float, float]]:
    """``(key, fused, lexical 0-1, cosine)`` of every key either ranking matched, best first
    (ties by key): ``ARD_FUSION_LEXICAL_WEIGHT x lexical + ARD_FUSION_SEMANTIC_WEIGHT x
    cosine / best cosine``."""
    top_sim = max(semantic.values(), default=0.0)
    w_lex = settings.ARD_FUSION_LEXICAL_WEIGHT
    w_sem = settings.ARD_FUSION_SEMANTIC_WEIGHT
    out = []
    for key in lexical.keys() | semantic.keys():
        lex, sim = lexical.get(key, 0.0), semantic.get(key, 0.0)
        f = w_lex * lex + (w_sem * sim / top_sim if top_sim > 0 else 0.0)
        if f > 0:
            out.append((key, f, lex, sim))
    out.sort(key=lambda o: (-o[1], o[0]))
    return out


class _SqlRanker:
    """Shared shape: the full-text engine ranks every match (one indexed query, no joins), then
    the candidates (entitlement and filters) are applied to those ids only. Applying them inside
    the full-text query made SQLite materialise the whole candidate join on every search."""

    CHUNK = 2000

    def _hits_sql(self, terms: list[str]) -> tuple[str, list] | None:
        """SQL answering ``(id, rank)`` for every document matching ``terms``."""
        raise NotImplementedError

    def raw(self, text: str) -> list[tuple[int, float]]:
        """``(id, rank)`` of every document matching ``text`` (no candidates applied)."""
        terms = query_terms(text)
        hits = self._hits_sql(terms) if terms else None
        if hits is None:
            return []
        with connection.cursor() as cursor:
            cursor.execute(*hits)
            return [(i, float(r)) for i, r in cursor.fetchall() if r is not None]

    def _scored(self, text: str, candidates: QuerySet[AgentDoc]) -> list[tuple[int, int, int]]:
        """Every candidate matching ``text`` at or above the cutoff, best first, scored."""
        rows = self.raw(text)
        if not rows:
            return []
        # Candidates (entitlement flags and filters, all on the document row) are applied to
        # the matched ids afterwards: inside the full-text query SQLite re-ran the match per
        # candidate row.
        return scored_among(rows, _allowed(candidates, [i for i, _ in rows], self.CHUNK))

    def rank(self, *, text: str, candidates: QuerySet[AgentDoc], offset: int, limit: int) -> Ranked:
        scored = self._scored(text, candidates)
        return Ranked([Hit(i, s) for i, _, s in scored[offset : offset + limit]], len(scored))

    def matched_ids(self, *, text: str, candidates: QuerySet[AgentDoc]) -> list[int]:
        return [i for i, _, _ in self._scored(text, candidates)]


class PostgresRanker(_SqlRanker):
    """``ts_rank`` over the generated, weighted ``tsvector`` (GIN-indexed), one term at a time,
    each weighted by its inverse document frequency: ``ts_rank`` alone has no idf, so common
    words ("two", "current") would weigh as much as telling ones ("share", "nights")."""

    # {D, C, B, A} weights; normalisation 1 divides by 1 + log(document length).
    WEIGHTS = "{0.1,0.3,0.6,1.0}"
    DF_SECONDS = 60.0
    DF_MAX = 10_000

    def __init__(self) -> None:
        self._df: dict[str, tuple[float, int]] = {}
        self._signature: tuple[int, int] = (-1, -1)

    def _stats(self, terms: list[str]) -> tuple[int, dict[str, int]]:
        """Documents in the index, and per term the documents containing it (cached up to
        60 s, and dropped as soon as documents are added or removed)."""
        now = time.monotonic()
        with connection.cursor() as cursor:
            cursor.execute("SELECT COUNT(*), COALESCE(MAX(id), 0) FROM ard_agentdoc")
            count, top = cursor.fetchone()
        if (count, top) != self._signature:
            self._df.clear()
            self._signature = (int(count), int(top))
        out = {}
        for term in terms:
            hit = self._df.get(term)
            if hit is None or now - hit[0] > self.DF_SECONDS:
                with connection.cursor() as cursor:
                    cursor.execute(
                        "SELECT COUNT(*) FROM ard_agentdoc "
                        "WHERE search @@ to_tsquery('english', %s)",
                        [term],
                    )
                    hit = (now, int(cursor.fetchone()[0]))
                if len(self._df) >= self.DF_MAX:
                    self._df.clear()
                self._df[term] = hit
            out[term] = hit[1]
        return self._signature[0], out

    def _hits_sql(self, terms: list[str]) -> tuple[str, list] | None:
        total, df = self._stats(terms)
        used = [t for t in terms if df.get(t)]
        if not used:
            return None  # no term occurs in any document
        parts, params = [], []
        for term in used:
            parts.append(
                f"ts_rank(%s::float4[], d.search, to_tsquery('english', %s), 1) * "
                f"{math.log(1 + total / df[term]):.6f}"
            )
            params += [self.WEIGHTS, term]
        tsquery = " | ".join(used)  # terms are letters and digits only: no tsquery syntax
        sql = (
            f"SELECT d.id, ({' + '.join(parts)}) AS r FROM ard_agentdoc d "
            "WHERE d.search @@ to_tsquery('english', %s)"
        )
        return sql, [*params, tsquery]


class SqliteRanker(_SqlRanker):
    """``bm25`` over the FTS5 table (porter stemming), weighted per column."""

    # name, skill_names, tags, description, skill_descriptions, examples
    WEIGHTS = (10.0, 8.0, 5.0, 4.0, 2.0, 2.0)

    def _hits_sql(self, terms: list[str]) -> tuple[str, list] | None:
        match = " OR ".join(f'"{t}"' for t in terms)  # quoted: no FTS5 query syntax
        weights = ", ".join(str(w) for w in self.WEIGHTS)
        sql = (
            f"SELECT rowid AS id, -bm25(ard_agentdoc_fts, {weights}) AS r "
            "FROM ard_agentdoc_fts WHERE ard_agentdoc_fts MATCH %s"
        )
        return sql, [match]


class PortableRanker:
    """Any database: term frequency with the same field weights and an idf, in Python.

    Fine for small registries and a reference for a plugged-in ranker; PostgreSQL and SQLite
    use their full-text engines instead."""

    FIELDS = (
        ("name", 10.0),
        ("skill_names", 8.0),
        ("tags", 5.0),
        ("description", 4.0),
        ("skill_descriptions", 2.0),
        ("examples", 2.0),
    )

    def _scored(self, text: str, candidates: QuerySet[AgentDoc]) -> list[tuple[int, str, int]]:
        terms = query_terms(text)
        if not terms:
            return []
        rows = list(
            candidates.order_by().values_list("id", "agent_id", *[f for f, _ in self.FIELDS])
        )
        ranks = self.ranks(terms, [(row[0], row[1], row[2:]) for row in rows])
        return scored_list(ranks)

    @classmethod
    def ranks(
        cls, terms: list[str], rows: list[tuple[K, Any, tuple[str | None, ...]]]
    ) -> list[tuple[K, Any, float]]:
        """``(key, tie-break, rank > 0)`` of the ``rows`` (key, tie-break, the :data:`FIELDS`'
        texts) sharing a term with ``terms``; the idf is over ``rows``."""
        tokenised = [[_stems(v or "") for v in fields] for _, _, fields in rows]
        n = len(rows) or 1
        stems = list(map(_stem, terms))
        df = {t: sum(1 for doc in tokenised if any(t in f for f in doc)) for t in stems}
        out = []
        for (key, tie, _), fields in zip(rows, tokenised, strict=True):
            r = 0.0
            for term in stems:
                if not df.get(term):
                    continue
                idf = math.log(1 + n / df[term])
                r += idf * sum(
                    w * f.count(term) / (1 + math.log(1 + len(f)))
                    for (_, w), f in zip(cls.FIELDS, fields, strict=True)
                )
            if r > 0:
                out.append((key, tie, r))
        return out

    def rank(self, *, text: str, candidates: QuerySet[AgentDoc], offset: int, limit: int) -> Ranked:
        scored = self._scored(text, candidates)
        return Ranked([Hit(i, s) for i, _, s in scored[offset : offset + limit]], len(scored))

    def matched_ids(self, *, text: str, candidates: QuerySet[AgentDoc]) -> list[int]:
        return [i for i, _, _ in self._scored(text, candidates)]


def _stem(word: str) -> str:
    for suffix in ("ations", "ation", "ings", "ing", "ers", "er", "es", "s"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[: -len(suffix)]
    return word


def _stems(text: str) -> list[str]:
    return [_stem(t) for t in _TOKEN.findall(text.lower())]


class HybridRanker:
    """A lexical ranker and the node's embedding index, fused.

    The lexical ranker scores every candidate sharing a term with the query (0-100); the
    vector index gives the ``NEIGHBOURS`` documents nearest to the query's embedding at or
    above ``ARD_SEMANTIC_MIN_SIMILARITY`` cosine, narrowed to the candidates. A document's
    fused rank is ``ARD_FUSION_LEXICAL_WEIGHT x lexical/100 + ARD_FUSION_SEMANTIC_WEIGHT x
    cosine/best cosine``. Measured on the 30-query set (tests/ard/fusion_study.py, 128
    dimensions): every variant has 30/30 in the top 3; the weighted sum 1:2 the best MRR,
    0.967, against 0.961 for reciprocal-rank fusion (k 60, 1:1) and 0.867 lexical alone. Scores are
    ``round(100 x fused / best fused)`` with the ``ARD_MIN_SCORE`` cutoff, as the lexical
    rankers'. Ties go to the older document, so pages are stable while the index is."""

    NEIGHBOURS = 1000

    def __init__(self, lexical: _SqlRanker | PortableRanker) -> None:
        self.lexical = lexical

    def _near(self, text: str) -> list[tuple[int, float]]:
        """The documents nearest to ``text``'s embedding (no candidates applied)."""
        from ard import embeddings, vectors

        embedder, index = embeddings.get_embedder(), vectors.get_index()
        if embedder is None or index is None:
            return []
        if vectors.embed_writer().pending():
            vectors.embed_writer().settle()  # this node's own writes first
        index.ensure_loaded()
        return index.nearest(
            embedder.embed([text])[0],
            k=self.NEIGHBOURS,
            min_similarity=settings.ARD_SEMANTIC_MIN_SIMILARITY,
        )

    def fused(
        self, text: str, candidates: QuerySet[AgentDoc]
    ) -> list[tuple[int, float, float, float]]:
        """Every match ``(id, fused, lexical 0-1, cosine)``, best first (for evaluation)."""
        near = self._near(text)
        if isinstance(self.lexical, _SqlRanker):
            # One candidates query for the lexical and the semantic matches together.
            rows = self.lexical.raw(text)
            allowed = _allowed(candidates, list({i for i, _ in rows} | {i for i, _ in near}))
            lexical = {i: s / 100 for i, _, s in scored_among(rows, allowed)}
        else:
            lexical = {i: s / 100 for i, _, s in self.lexical._scored(text, candidates)}
            allowed = _allowed(candidates, [i for i, _ in near]) if near else set()
        semantic = {i: s for i, s in near if i in allowed}
        return fuse(lexical, semantic)

    def _scored(self, text: str, candidates: QuerySet[AgentDoc]) -> list[tuple[int, int, int]]:
        return scored_list([(i, i, f) for i, f, _, _ in self.fused(text, candidates)])

    def rank(self, *, text: str, candidates: QuerySet[AgentDoc], offset: int, limit: int) -> Ranked:
        scored = self._scored(text, candidates)
        return Ranked([Hit(i, s) for i, _, s in scored[offset : offset + limit]], len(scored))

    def matched_ids(self, *, text: str, candidates: QuerySet[AgentDoc]) -> list[int]:
        return [i for i, _, _ in self._scored(text, candidates)]


@lru_cache(maxsize=8)
def _ranker_for(path: str, vendor: str, semantic: bool) -> Ranker:
    if path and path != "auto":
        return import_string(path)()
    lexical: _SqlRanker | PortableRanker
    if vendor == "postgresql":
        lexical = PostgresRanker()
    elif vendor == "sqlite":
        lexical = SqliteRanker()
    else:
        lexical = PortableRanker()
    return HybridRanker(lexical) if semantic else lexical


def get_ranker() -> Ranker:
    """The one selector: ``ARD_RANKER`` when set to a class path, else by database vendor --
    fused with semantic search (:class:`HybridRanker`) unless ``ARD_SEMANTIC`` is off."""
    return _ranker_for(settings.ARD_RANKER or "auto", connection.vendor, settings.ARD_SEMANTIC)


#: Embeddings of cards ranked by :func:`rank_cards`, by model and text (a discovery cycle ranks
#: mostly the same cards as the last one); cleared when full.
_card_vectors: dict[tuple[str, str], Any] = {}
MAX_CARD_VECTORS = 10_000


def _embedded(embedder: Any, texts: list[str]) -> Any:
    import numpy as np

    keys = [(embedder.name, hashlib.sha256(t.encode()).hexdigest()) for t in texts]
    found: list[Any] = [_card_vectors.get(k) for k in keys]  # read once: may be cleared
    missing = [i for i, v in enumerate(found) if v is None]
    if missing:
        if len(_card_vectors) + len(missing) > MAX_CARD_VECTORS:
            _card_vectors.clear()
        fresh = embedder.embed([texts[i] for i in missing])
        for i, vector in zip(missing, fresh, strict=True):
            found[i] = _card_vectors[keys[i]] = vector
    return np.stack(found).astype(np.float32)


def rank_cards(*, text: str, cards: Mapping[str, dict[str, Any]]) -> list[tuple[str, int]]:
    """``(key, 0-100 score)`` of the ``cards`` matching ``text``, best first (ties by key):
    cards that need not be in the index (a discovery cycle's candidates), ranked as search ranks
    documents. Each card becomes its search document (:func:`ard.documents.build_document`);
    the lexical ranking is :class:`PortableRanker`'s (the full-text engines index stored
    documents only), the semantic one the cosine of the document's and the query's embeddings by
    the configured embedder at or above ``ARD_SEMANTIC_MIN_SIMILARITY``; both are fused by
    :func:`fuse` and scored by :func:`scored_list` with the ``ARD_MIN_SCORE`` cutoff, as
    :class:`HybridRanker` does. Lexical alone when ``ARD_SEMANTIC`` is off."""
    from ard import documents, embeddings

    if not cards:
        return []
    now = timezone.now()
    docs = {
        key: documents.build_document(
            agent_id=key, card=card, updated_at=now,
            name=card["name"] if isinstance(card.get("name"), str) else key,
            description=card["description"] if isinstance(card.get("description"), str) else "",
        )
        for key, card in cards.items()
    }
    terms = query_terms(text)
    rows = [(k, k, tuple(d[f] for f, _ in PortableRanker.FIELDS)) for k, d in docs.items()]
    lexical = (
        {k: s / 100 for k, _, s in scored_list(PortableRanker.ranks(terms, rows))} if terms else {}
    )
    semantic: dict[str, float] = {}
    embedder = embeddings.get_embedder()
    if embedder is not None:
        matrix = _embedded(embedder, [embeddings.document_text(d) for d in docs.values()])
        cosines = matrix @ embedder.embed([text])[0]
        floor = settings.ARD_SEMANTIC_MIN_SIMILARITY
        semantic = {k: float(c) for k, c in zip(docs, cosines, strict=True) if c >= floor}
    fused = fuse(lexical, semantic)
    return [(k, s) for k, _, s in scored_list([(k, k, f) for k, f, _, _ in fused])]
