"""Snapshots: immutable, versioned lists of selected agents and their cards.

The digest is the sha256 over the selected agents sorted by local name, as
``local_name NUL card_sha256 LF`` lines: it identifies an agent tree. Each tenant has its own
snapshots (docs/tenants.md): one is published (a new row, the tenant's version + 1) only when the
digest differs from the tenant's current one. Snapshots are
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
from django.db.models import Count, Max, OuterRef, Subquery

from discovery import metrics
from discovery.models import CardBlob, SessionPin, Snapshot
from registry.ids import DEFAULT_TENANT

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


def snapshot_current(tenant: str = DEFAULT_TENANT) -> Snapshot | None:
    """``tenant``'s current snapshot."""
    return Snapshot.objects.current(tenant)


def snapshot_get(*, digest: str, tenant: str | None = DEFAULT_TENANT) -> Snapshot | None:
    """``tenant``'s latest retained snapshot with ``digest`` (None: any tenant's, the default
    tenant's first: a platform admin's look-up)."""
    rows = Snapshot.objects.filter(digest=digest)
    if tenant is not None:
        return rows.filter(tenant_id=tenant).order_by("-version").first()
    return min(rows, key=lambda s: (s.tenant_id != DEFAULT_TENANT, s.tenant_id, -s.version),
               default=None)


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


def snapshot_publish(*, agents: list[SelectedAgent], tenant: str = DEFAULT_TENANT
                     ) -> tuple[Snapshot, bool]:
    """Publish ``tenant``'s snapshot of ``agents`` unless its current one has the same digest.

    Returns ``(snapshot, published)``. Versions are monotonic per tenant: concurrent publishers
    retry on the unique (tenant, version).
    """
    ordered = sorted(agents, key=lambda a: a.local_name)
    digest = snapshot_digest((a.local_name, a.card_sha256) for a in ordered)
    for _ in range(5):
        current = snapshot_current(tenant)
        if current is not None and current.digest == digest:
            return current, False
        try:
            with transaction.atomic():
                _store_blobs(ordered)
                version = (Snapshot.objects.filter(tenant_id=tenant)
                           .aggregate(v=Max("version"))["v"] or 0) + 1
                snapshot = Snapshot.objects.create(
                    tenant_id=tenant, version=version, digest=digest,
                    agents=[a.as_row() for a in ordered],
                    agent_count=len(ordered),
                )
        except IntegrityError:
            continue
        metrics.SNAPSHOTS_PUBLISHED.inc()
        metrics.TENANT_SNAPSHOT_VERSION.labels(tenant=tenant).set(snapshot.version)
        metrics.TENANT_SNAPSHOT_AGENTS.labels(tenant=tenant).set(snapshot.agent_count)
        if tenant == DEFAULT_TENANT:  # the unlabelled gauges, as before tenants existed
            metrics.SNAPSHOT_VERSION.set(snapshot.version)
            metrics.SNAPSHOT_AGENTS.set(snapshot.agent_count)
        logger.info("discovery snapshot v%d of tenant %s published: %s (%d agents)",
                    snapshot.version, tenant, digest[:12], len(ordered))
        return snapshot, True
    raise RuntimeError("could not publish a snapshot: version conflicts")


def _currents_qs():
    """Every tenant's current snapshot (one query)."""
    top = Snapshot.objects.filter(tenant_id=OuterRef("tenant_id")).order_by("-version")
    return Snapshot.objects.filter(version=Subquery(top.values("version")[:1]))


def snapshots_current() -> list[Snapshot]:
    """Every tenant's current snapshot."""
    return list(_currents_qs())


def snapshots_retained(tenant: str = DEFAULT_TENANT) -> list[Snapshot]:
    """``tenant``'s current snapshot and every snapshot of its that a session pins."""
    current = snapshot_current(tenant)
    pinned = Snapshot.objects.filter(tenant_id=tenant, pins__isnull=False).distinct()
    rows = {s.pk: s for s in pinned}
    if current is not None:
        rows[current.pk] = current
    return list(rows.values())


def snapshot_agent_ids_retained(tenant: str = DEFAULT_TENANT) -> set[str]:
    """Agent ids (bare, ``tenant``'s) its retained snapshots reference (their leases are
    kept)."""
    return {a["agent_id"] for s in snapshots_retained(tenant) for a in s.agents}


def snapshots_evict() -> list[str]:
    """Delete snapshots no session pins (except each tenant's current one) and card bytes no
    retained snapshot uses. Returns the evicted digests."""
    from discovery import tree_factory

    victims = Snapshot.objects.annotate(n=Count("pins")).filter(n=0).exclude(
        pk__in=_currents_qs().values("pk"))
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
