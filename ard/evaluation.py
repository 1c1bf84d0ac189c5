"""Relevance evaluation: run queries with known intended agents through the search ranking.

A query file holds ``(query, intended agent id)`` pairs -- JSON (a list of ``[query, agent]``
pairs or of ``{"query": ..., "agent": ...}`` objects) or text lines ``query<TAB>agent`` (``#``
starts a comment). :func:`evaluate` ranks each query over every active agent (no entitlement
tier: the evaluation is about the ranking) exactly as ``POST /search`` does, and reports the
top-3 hits, how many queries have their agent in the top 3, and the mean reciprocal rank (MRR:
1 for the agent first, 1/2 second, ... 0 when it is not matched at all).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ard.models import AgentDoc
from ard.ranking import get_ranker

MAX_QUERIES = 10_000


@dataclass(frozen=True)
class Outcome:
    query: str
    wanted: str
    top: list[tuple[str, float]]  # (agent id, score) of the first three
    rank: int | None  # 1-based rank of the intended agent, None when not matched


@dataclass(frozen=True)
class Report:
    outcomes: list[Outcome]

    @property
    def top3(self) -> int:
        return sum(1 for o in self.outcomes if o.rank is not None and o.rank <= 3)

    @property
    def mrr(self) -> float:
        return sum(1 / o.rank for o in self.outcomes if o.rank) / max(1, len(self.outcomes))

    @property
    def misses(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.rank is None or o.rank > 3]


def read_queries(path: str | Path) -> list[tuple[str, str]]:
    """The ``(query, agent id)`` pairs of a query file (JSON or tab-separated lines)."""
    text = Path(path).read_text(encoding="utf-8")
    pairs: list[tuple[str, str]] = []
    if text.lstrip().startswith("["):
        for item in json.loads(text):
            if isinstance(item, dict):
                pairs.append((str(item["query"]), str(item["agent"])))
            else:
                pairs.append((str(item[0]), str(item[1])))
    else:
        for n, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            query, sep, agent = line.rpartition("\t")
            if not sep or not query.strip() or not agent.strip():
                raise ValueError(f"{path}:{n}: expected `query<TAB>agent id`")
            pairs.append((query.strip(), agent.strip()))
    if len(pairs) > MAX_QUERIES:
        raise ValueError(f"{path}: more than {MAX_QUERIES} queries")
    return pairs


def evaluate(queries: list[tuple[str, str]]) -> Report:
    """Rank every query over the active agents and measure where the intended agent lands."""
    ranker = get_ranker()
    candidates = AgentDoc.objects.filter(active=True)
    names: dict[int, str] = dict(candidates.values_list("pk", "agent_id"))
    outcomes = []
    for text, wanted in queries:
        hits = ranker.rank(text=text, candidates=candidates, offset=0, limit=len(names)).hits
        agents = [names.get(h.doc_id, "") for h in hits]
        top = [(names.get(h.doc_id, ""), h.score) for h in hits[:3]]
        rank = agents.index(wanted) + 1 if wanted in agents else None
        outcomes.append(Outcome(text, wanted, top, rank))
    return Report(outcomes)
