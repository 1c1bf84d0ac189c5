"""How the fusion of lexical and semantic ranking was chosen: every variant on the 30 queries
of ``QUERIES`` (never on the held-out set), printed, nothing asserted. Not collected with the
suite (no ``test_`` file name); run it on purpose:

    .venv/bin/python -m pytest tests/ard/fusion_study.py -q -s

Variants: lexical alone, semantic alone, weighted sums (lexical 1, semantic 0.25 to 3, the
cosine divided by the query's best) and reciprocal-rank fusion (k 10 and 60, semantic weight
0.5 to 2), at 64, 128 and 256 dimensions; then the cosine of each query's intended agent
against its best, fifth and tenth, and of nonsense queries (the similarity floor)."""

from __future__ import annotations

from collections.abc import Callable

from ard import indexer, vectors
from ard.models import AgentDoc
from ard.ranking import HybridRanker, get_ranker
from tests.ard.corpus import QUERIES

Fuse = Callable[[list[int], dict[int, float], list[tuple[int, float]]], list[int]]


def weighted(w_lex: float, w_sem: float) -> Fuse:
    def fuse(lexical, lex_scores, semantic):
        top = max((s for _, s in semantic), default=0.0)
        score = {i: w_lex * v for i, v in lex_scores.items()}
        for i, s in semantic:
            score[i] = score.get(i, 0.0) + (w_sem * s / top if top > 0 else 0.0)
        return sorted(score, key=lambda i: (-score[i], i))

    return fuse


def reciprocal_rank(w_sem: float, k: int = 60) -> Fuse:
    def fuse(lexical, lex_scores, semantic):
        score: dict[int, float] = {}
        for n, i in enumerate(lexical):
            score[i] = score.get(i, 0.0) + 1 / (k + n + 1)
        for n, (i, _) in enumerate(semantic):
            score[i] = score.get(i, 0.0) + w_sem / (k + n + 1)
        return sorted(score, key=lambda i: (-score[i], i))

    return fuse


def _measure(fuse: Fuse) -> tuple[int, float, list[str]]:
    ranker = get_ranker()
    assert isinstance(ranker, HybridRanker)
    candidates = AgentDoc.objects.filter(active=True)
    names = dict(candidates.values_list("pk", "agent_id"))
    hits, rr, misses = 0, 0.0, []
    for text, wanted in QUERIES:
        scored = ranker.lexical._scored(text, candidates)
        lexical = [i for i, _, _ in scored]
        lex_scores = {i: s / 100 for i, _, s in scored}
        semantic = ranker._near(text)
        agents = [names[i] for i in fuse(lexical, lex_scores, semantic) if i in names]
        rank = agents.index(wanted) + 1 if wanted in agents else None
        rr += 1 / rank if rank else 0.0
        if rank and rank <= 3:
            hits += 1
        else:
            misses.append(text)
    return hits, rr / len(QUERIES), misses


def test_fusion_variants(corpus, settings, capsys):
    settings.ARD_SEMANTIC_MIN_SIMILARITY = -1.0  # every agent ranked: the floor comes after
    lines = []
    variants: list[tuple[str, Fuse]] = [("lexical", weighted(1, 0)), ("semantic", weighted(0, 1))]
    variants += [(f"weighted 1:{w}", weighted(1, w)) for w in (0.25, 0.5, 0.75, 1, 1.5, 2, 3)]
    variants += [(f"rrf k=60 1:{w}", reciprocal_rank(w)) for w in (0.5, 1, 2)]
    variants += [(f"rrf k=10 1:{w}", reciprocal_rank(w, 10)) for w in (1, 2)]
    for dim in (64, 128, 256):
        settings.ARD_EMBEDDING_DIM = dim
        vectors.reset()
        indexer.index_rebuild()
        for name, fuse in variants:
            hits, mrr, misses = _measure(fuse)
            lines.append(f"dim {dim:3} {name:16} top 3: {hits}/30  MRR {mrr:.3f}  misses {misses}")
    settings.ARD_EMBEDDING_DIM = 128
    vectors.reset()
    indexer.index_rebuild()
    ranker = get_ranker()
    assert isinstance(ranker, HybridRanker)
    names = dict(AgentDoc.objects.values_list("pk", "agent_id"))
    for text, wanted in QUERIES:
        near = ranker._near(text)
        mine = next(s for i, s in near if names[i] == wanted)
        lines.append(f"{text[:44]:44} best {near[0][1]:.2f} intended {mine:.2f} "
                     f"5th {near[4][1]:.2f} 10th {near[9][1]:.2f}")
    for text in ("xyzzy plugh", "the", "purple elephant ballet"):
        lines.append(f"{text!r}: best {[round(s, 2) for _, s in ranker._near(text)[:3]]}")
    with capsys.disabled():
        print("\n" + "\n".join(lines))
