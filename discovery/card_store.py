"""The card cache's table (:class:`discovery.models.CardCacheEntry`): a cached card as an
entry (:class:`CardEntry`), and the reads and writes of :mod:`discovery.card_cache` in batches
of :data:`BATCH` URLs. The table lets a restart start warm and lets workers see each other's
fetches; a ``no-store`` entry keeps neither its bytes nor its ETag there.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.db import connection, transaction

from discovery.models import CardCacheEntry

BATCH = 500


@dataclass(frozen=True)
class CardEntry:
    card_url: str
    etag: str = ""
    sha256: str = ""
    card: dict[str, Any] | None = None
    raw: bytes | None = None
    cache_control: str = ""
    expires_at: float = 0.0
    fetched_at: float | None = None
    changed_at: float | None = None
    failures: int = 0
    last_error: str = ""
    last_status: int | None = None
    no_store: bool = False

    @property
    def has_card(self) -> bool:
        return self.card is not None


def dt(ts: float | None) -> datetime | None:
    return None if ts is None else datetime.fromtimestamp(ts, tz=UTC)


def ts(value: datetime | None) -> float | None:
    return None if value is None else value.timestamp()


def seen_key(entry: CardEntry) -> tuple:
    """What :func:`changed_rows` compares an entry with, at the table's (microsecond)
    precision."""
    return (entry.sha256, entry.etag if not entry.no_store else "", ts(dt(entry.expires_at)),
            entry.failures)


def _entry_from_row(row: CardCacheEntry) -> CardEntry:
    return CardEntry(
        card_url=row.card_url, etag=row.etag, sha256=row.sha256, card=row.card,
        raw=bytes(row.raw) if row.raw is not None else None, cache_control=row.cache_control,
        expires_at=row.expires_at.timestamp(), fetched_at=ts(row.fetched_at),
        changed_at=ts(row.changed_at), failures=row.failures, last_error=row.last_error,
        last_status=row.last_status, no_store="no-store" in row.cache_control.lower(),
    )


def _row_from_entry(entry: CardEntry) -> CardCacheEntry:
    keep = not entry.no_store
    return CardCacheEntry(
        card_url=entry.card_url, etag=entry.etag if keep else "", sha256=entry.sha256,
        raw=entry.raw if keep else None, card=entry.card if keep else None,
        cache_control=entry.cache_control[:300],
        expires_at=datetime.fromtimestamp(entry.expires_at, tz=UTC),
        fetched_at=dt(entry.fetched_at), changed_at=dt(entry.changed_at),
        failures=entry.failures, last_error=entry.last_error[:2000],
        last_status=entry.last_status,
    )


_FULL_FIELDS = [
    "etag", "sha256", "raw", "card", "cache_control", "expires_at", "fetched_at", "changed_at",
    "failures", "last_error", "last_status",
]


def load(urls: list[str]) -> Iterator[CardEntry]:
    """The stored entries of ``urls``."""
    for i in range(0, len(urls), BATCH):
        for row in CardCacheEntry.objects.filter(card_url__in=urls[i:i + BATCH]):
            yield _entry_from_row(row)


def changed_rows(wanted: set[str], seen: dict[str, tuple]) -> list[str]:
    """The URLs of ``wanted`` whose row differs from what ``seen`` (:func:`seen_key` of the
    entries a process holds) says: one light query."""
    qs = CardCacheEntry.objects.values_list(
        "card_url", "sha256", "etag", "expires_at", "failures"
    )
    rows: Iterable[tuple[str, str, str, datetime, int]] = []
    if len(wanted) <= BATCH:
        rows = qs.filter(card_url__in=list(wanted))
    elif len(wanted) <= 4 * BATCH:
        ordered = list(wanted)
        rows = [r for i in range(0, len(ordered), BATCH)
                for r in qs.filter(card_url__in=ordered[i:i + BATCH])]
    else:
        rows = qs.iterator(chunk_size=2000)
    stale = []
    for url, sha, etag, expires_at, failures in rows:
        if url in wanted and seen.get(url) != (sha, etag, expires_at.timestamp(), failures):
            stale.append(url)
    return stale


def persist(full: list[CardEntry], touch: list[CardEntry]) -> None:
    """Write ``full`` entries whole (card bytes included) and only the fetch state of
    ``touch`` ones (their card did not change), in one transaction."""
    rows = [_row_from_entry(entry) for entry in full]
    with transaction.atomic():
        if rows:
            CardCacheEntry.objects.bulk_create(
                rows, batch_size=BATCH, update_conflicts=True, unique_fields=["card_url"],
                update_fields=_FULL_FIELDS,
            )
        if touch:
            table = CardCacheEntry._meta.db_table
            adapt = connection.ops.adapt_datetimefield_value
            sql = (
                f"UPDATE {table} SET etag = %s, cache_control = %s, expires_at = %s, "
                "fetched_at = %s, failures = %s, last_error = %s, last_status = %s "
                "WHERE card_url = %s"
            )
            params = [
                (e.etag if not e.no_store else "", e.cache_control[:300],
                 adapt(dt(e.expires_at)), adapt(dt(e.fetched_at)), e.failures,
                 e.last_error[:2000], e.last_status, e.card_url)
                for e in touch
            ]
            with connection.cursor() as cursor:
                cursor.executemany(sql, params)


def mark_due(urls: list[str], now: float) -> None:
    """Stored entries of ``urls`` due at ``now``."""
    for i in range(0, len(urls), BATCH):
        CardCacheEntry.objects.filter(card_url__in=urls[i:i + BATCH]).update(expires_at=dt(now))


def expire_all(now: float) -> None:
    """Every stored entry due at ``now``."""
    CardCacheEntry.objects.update(expires_at=dt(now))
