"""ARD semantic search at scale: the node's vector index over 100,000 agents, in process.

No server and no database: what this measures is the part semantic search adds to a search
(embedding the query, then the nearest neighbours over every agent) and to an indexed card
(embedding its text), with the real bundled model (``ard.embeddings.WordLlamaEmbedder``) and
the real index (``ard.vectors.VectorIndex``). Phases:

1. embed ``--agents`` cards (default 100,000; the 30 realistic cards of tests/ard/corpus.py,
   each copy with its own name and a few extra words, as bench/ard_bench.py registers them)
   in batches of 256, as the index writer does: microseconds per card;
2. load them into one index: bytes per agent (matrix and ids, and the whole of what the
   index holds, measured with tracemalloc);
3. ``--queries`` searches (default 3,000), one at a time on one core: the 75 queries of the
   relevance sets in turn, each embedded and then ``nearest(k=1000)``; p50/p99/max of the
   query embedding, of the neighbour search, and of both; against a reference in the same
   run, a plain ``numpy`` dot product of the query with the matrix.

    .venv/bin/python bench/ard_vectors_bench.py [--agents 100000] [--dim 128] [--quick]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

import django  # noqa: E402

django.setup()

import numpy as np  # noqa: E402

from ard import embeddings, vectors  # noqa: E402
from bench.ard_bench import agent_card  # noqa: E402
from bench.common import machine_info, percentile, write_results  # noqa: E402
from tests.ard.corpus import QUERIES  # noqa: E402
from tests.ard.heldout import HELDOUT  # noqa: E402

BATCH = 256


def _ms(samples: list[float]) -> dict:
    return {
        "p50_ms": round(percentile(samples, 50) * 1e3, 3),
        "p99_ms": round(percentile(samples, 99) * 1e3, 3),
        "max_ms": round(max(samples) * 1e3, 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=3000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--quick", action="store_true", help="10,000 agents, 500 queries")
    args = parser.parse_args()
    if args.quick:
        args.agents, args.queries = 10_000, 500
    try:
        os.sched_setaffinity(0, {1})  # one core, as a search thread of a node has
    except (AttributeError, OSError):
        pass

    embedder = embeddings.WordLlamaEmbedder(dim=args.dim)
    texts = []
    for i in range(args.agents):
        _, card = agent_card(i)
        skills = card.get("skills", [])
        texts.append(embeddings.document_text({
            "name": card["name"],
            "description": card["description"],
            "skill_names": "\n".join(s["name"] for s in skills),
            "tags": " ".join(t for s in skills for t in s.get("tags", [])),
            "skill_descriptions": "\n".join(s.get("description", "") for s in skills),
            "examples": "\n".join(e for s in skills for e in s.get("examples", [])),
        }))

    started = time.perf_counter()
    matrix = np.vstack([embedder.embed(texts[i : i + BATCH]) for i in range(0, len(texts), BATCH)])
    embed_s = time.perf_counter() - started
    print(f"embedded {len(texts)} cards in {embed_s:.1f} s: "
          f"{embed_s / len(texts) * 1e6:.0f} µs a card", flush=True)

    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    index = vectors.VectorIndex(embedder.dim, embedder.name)
    for i in range(0, len(texts), BATCH):
        index.put(list(range(i + 1, min(i + BATCH, len(texts)) + 1)), matrix[i : i + BATCH])
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    in_use = len(index) * (4 * embedder.dim + 8)
    print(f"index: {len(index)} agents, {held / len(index):.0f} bytes an agent held "
          f"(matrix and ids in use: {in_use / len(index):.0f}; capacity "
          f"{index.nbytes() / len(index):.0f})", flush=True)

    queries = [q for q, _ in QUERIES + HELDOUT]
    embed_t, near_t, both_t, ref_t = [], [], [], []
    for n in range(args.queries):
        text = queries[n % len(queries)]
        t0 = time.perf_counter()
        query = embedder.embed([text])[0]
        t1 = time.perf_counter()
        index.nearest(query, k=1000, min_similarity=0.2)
        t2 = time.perf_counter()
        matrix @ query  # the reference: one dot product over the same rows, nothing else
        t3 = time.perf_counter()
        embed_t.append(t1 - t0)
        near_t.append(t2 - t1)
        both_t.append(t2 - t0)
        ref_t.append(t3 - t2)
    result = {
        "agents": len(index),
        "dim": embedder.dim,
        "model": embedder.name,
        "embed_us_per_card": round(embed_s / len(texts) * 1e6, 1),
        "bytes_per_agent_held": round(held / len(index)),
        "bytes_per_agent_in_use": round(in_use / len(index)),
        "query_embed": _ms(embed_t),
        "nearest_k1000": _ms(near_t),
        "semantic_total": _ms(both_t),
        "reference_dot_product": _ms(ref_t),
        "queries": args.queries,
        "machine": machine_info(),
    }
    for key in ("query_embed", "nearest_k1000", "semantic_total", "reference_dot_product"):
        print(f"{key:22} p50 {result[key]['p50_ms']:7.3f} ms  p99 {result[key]['p99_ms']:7.3f} ms"
              f"  max {result[key]['max_ms']:7.3f} ms")
    path = write_results("ard-vectors", result)
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
