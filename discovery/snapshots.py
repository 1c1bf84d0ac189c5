"""Snapshots: immutable, versioned lists of selected agents and their cards.

The digest is the sha256 over the selected agents sorted by local name, as
``local_name NUL card_sha256 LF`` lines: it identifies an agent tree. A snapshot is published
(a new row, version + 1) only when the digest differs from the current one. Snapshots are
retained while a session pins them and evicted (reference-counted) after, together with card
bytes no retained snapshot uses; the current snapshot is always retained.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Count, Max

from discovery import metrics
from discovery.models import CardBlob, SessionPin, Snapshot

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SelectedAgent:
    local_name: str
    description: str
    agent_id: str
    card_sha256: str
    card_url: str
    source: str
    critical: bool = False
    # How well it matched a need (0-100): 100 by tag and for static agents; a need given as
    # text, the ranker's score. Not published: it only orders the cap.
    score: int = field(default=100, compare=False)
    card: dict[str, Any] | None = field(default=None, repr=False, compare=False)
    raw: bytes | None = field(default=None, repr=False, compare=False)

    def as_row(self) -> dict[str, Any]:
        return {
            "local_name": self.local_name, "description": self.description,
            "agent_id": self.agent_id, "card_sha256": self.card_sha256,
            "card_url": self.card_url, "source": self.source, "critical": self.critical,
        }


def snapshot_digest(pairs: Iterable[tuple[str, str]]) -> str:
    """sha256 over ``(local_name, card_sha256)`` pairs sorted by local name."""
    h = hashlib.sha256()
    for name, sha in sorted(pairs):
        h.update(f"{name}\0{sha}\n".encode())
    return h.hexdigest()


def select_capped(candidates: list[SelectedAgent], *, max_agents: int
                  ) -> tuple[list[SelectedAgent], list[SelectedAgent]]:
    """Keep at most ``max_agents``: critical first, then configured, then discovered, each
    the better matches first (:attr:`SelectedAgent.score`), then by local name. Returns
    ``(kept, left_out)``."""
    order = {"static": 0, "probe": 1}
    ranked = sorted(
        candidates,
        key=lambda a: (not a.critical, order.get(a.source, 2), -a.score, a.local_name),
    )
    return ranked[:max_agents], ranked[max_agents:]


def snapshot_current() -> Snapshot | None:
    return Snapshot.objects.current()


def snapshot_get(*, digest: str) -> Snapshot | None:
    """The latest retained snapshot with ``digest``."""
    return Snapshot.objects.filter(digest=digest).order_by("-version").first()


def _store_blobs(agents: list[SelectedAgent]) -> None:
    wanted = {a.card_sha256: a for a in agents if a.raw is not None and a.card is not None}
    have = set()
    shas = list(wanted)
    for i in range(0, len(shas), 500):
        have |= set(CardBlob.objects.filter(sha256__in=shas[i:i + 500])
                    .values_list("sha256", flat=True))
    CardBlob.objects.bulk_create(
        [CardBlob(sha256=s, raw=a.raw, card=a.card) for s, a in wanted.items() if s not in have],
        batch_size=500, ignore_conflicts=True,
    )


def snapshot_publish(*, agents: list[SelectedAgent]) -> tuple[Snapshot, bool]:
    """Publish a snapshot of ``agents`` unless the current one has the same digest.

    Returns ``(snapshot, published)``. Versions are monotonic: concurrent publishers retry on
    the unique version.
    """
    ordered = sorted(agents, key=lambda a: a.local_name)
    digest = snapshot_digest((a.local_name, a.card_sha256) for a in ordered)
    for _ in range(5):
        current = snapshot_current()
        if current is not None and current.digest == digest:
            return current, False
        try:
            with transaction.atomic():
                _store_blobs(ordered)
                version = (Snapshot.objects.aggregate(v=Max("version"))["v"] or 0) + 1
                snapshot = Snapshot.objects.create(
                    version=version, digest=digest, agents=[a.as_row() for a in ordered],
                    agent_count=len(ordered),
                )
        except IntegrityError:
            continue
        metrics.SNAPSHOTS_PUBLISHED.inc()
        metrics.SNAPSHOT_VERSION.set(snapshot.version)
        metrics.SNAPSHOT_AGENTS.set(snapshot.agent_count)
        logger.info("discovery snapshot v%d published: %s (%d agents)",
                    snapshot.version, digest[:12], len(ordered))
        return snapshot, True
    raise RuntimeError("could not publish a snapshot: version conflicts")


def snapshots_retained() -> list[Snapshot]:
    """The current snapshot and every snapshot a session pins."""
    current = snapshot_current()
    pinned = Snapshot.objects.filter(pins__isnull=False).distinct()
    rows = {s.pk: s for s in pinned}
    if current is not None:
        rows[current.pk] = current
    return list(rows.values())


def snapshot_agent_ids_retained() -> set[str]:
    """Agent ids any retained snapshot references (their leases are kept)."""
    return {a["agent_id"] for s in snapshots_retained() for a in s.agents}


def snapshots_evict() -> list[str]:
    """Delete snapshots no session pins (except the current one) and card bytes no retained
    snapshot uses. Returns the evicted digests."""
    from discovery import tree_factory

    current = snapshot_current()
    victims = Snapshot.objects.annotate(n=Count("pins")).filter(n=0)
    if current is not None:
        victims = victims.exclude(pk=current.pk)
    evicted = list(victims.values_list("pk", "digest"))
    if not evicted:
        return []
    with transaction.atomic():
        # A pin taken since the query protects its snapshot: re-check inside the delete.
        deleted_digests = []
        for pk, digest in evicted:
            if not SessionPin.objects.filter(snapshot_id=pk).exists():
                Snapshot.objects.filter(pk=pk).delete()
                deleted_digests.append(digest)
        used = {a["card_sha256"] for s in Snapshot.objects.all() for a in s.agents}
        unused = [pk for pk, sha in CardBlob.objects.values_list("pk", "sha256") if sha not in used]
        for i in range(0, len(unused), 500):
            CardBlob.objects.filter(pk__in=unused[i:i + 500]).delete()
    retained = set(Snapshot.objects.values_list("digest", flat=True))
    gone = [d for d in deleted_digests if d not in retained]
    tree_factory.forget(gone)
    return gone
