"""A fixed log-scale latency histogram: buckets grow by sqrt(2) from 0.1 ms.

Fixed buckets make histograms of different nodes and minutes summable cell by cell, so p50 and
p95 of any window over any set of nodes come from one sum (within one bucket, <= 41 % wide).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

BASE_MS = 0.1
BUCKETS = 48  # the last bucket's upper bound is ~1,190 s: past every gateway timeout


def bucket_of(seconds: float) -> int:
    """The bucket index of a latency (bucket i holds (0.1 ms * 2**((i-1)/2), 0.1 ms * 2**(i/2)])."""
    ms = seconds * 1000.0
    if ms <= BASE_MS:
        return 0
    index = math.ceil(2.0 * math.log2(ms / BASE_MS))
    return index if index < BUCKETS else BUCKETS - 1


def upper_ms(index: int) -> float:
    return float(BASE_MS * 2.0 ** (index / 2.0))


def merge(histograms: Iterable[Sequence[int]]) -> list[int]:
    total = [0] * BUCKETS
    for hist in histograms:
        for i, count in enumerate(hist[:BUCKETS]):
            total[i] += count
    return total


def percentile_ms(hist: Sequence[int], q: float) -> float | None:
    """The q-quantile (0..1) in ms: the geometric middle of the bucket it falls in."""
    total = sum(hist)
    if not total:
        return None
    rank = q * total
    seen = 0
    for i, count in enumerate(hist):
        seen += count
        if count and seen >= rank:
            return upper_ms(i) if i == 0 else BASE_MS * 2.0 ** ((i - 0.5) / 2.0)
    return upper_ms(len(hist) - 1)
