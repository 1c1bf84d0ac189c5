"""ARD catalogs as a discovery source: ``/.well-known/ai-catalog.json`` of listed domains.

A catalog is read through a :class:`CatalogCache` -- the card cache's machinery (conditional
GET, single-flight within the process and across workers, stale-on-error with backoff, the
allowlist on every URL and redirect) applied to catalog documents. Its entries become endpoint
records for the usual loop, so resolver, health with hysteresis, alerts and snapshots apply
unchanged:

* ``application/a2a-agent-card+json`` with ``url``: a record whose card is fetched (and cached)
  at that URL; with inline ``data``: a record carrying the card bytes (its endpoint must be
  admitted);
* ``application/ai-catalog+json``: a nested catalog, inline (``data``) or by ``url``, followed
  down to ``max_depth`` levels;
* anything else (MCP servers, skills, registries, datasets...) is ignored, counted by reason.

Every entry's ``trustManifest``, when present, is recorded in :class:`CatalogListing`. Bounds:
catalog size (``DISCOVERY_CATALOG_MAX_BYTES``), entries per catalog and catalogs per source.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urljoin, urlsplit

import orjson
from django.conf import settings
from django.utils import timezone
from prometheus_client import Counter as PromCounter

from core.locks import default_locks
from discovery.card_cache import CardCache
from discovery.models import CatalogListing
from discovery.names import derive_local_name
from discovery.records import EndpointRecord, SourceError
from discovery.resolver import Admission, allowlist_entries
from registry.cards import CardError, card_endpoint, card_sha256, parse_card

logger = logging.getLogger(__name__)

WELL_KNOWN_CATALOG_PATH = "/.well-known/ai-catalog.json"
A2A_TYPES = frozenset({"application/a2a-agent-card+json", "application/agent-card+json"})
CATALOG_TYPE = "application/ai-catalog+json"
DEFAULT_MAX_DEPTH = 3
MAX_DEPTH_LIMIT = 10
MAX_ENTRIES_PER_CATALOG = 1000
MAX_CATALOGS_PER_SOURCE = 50

IGNORED = PromCounter(
    "a2a_discovery_catalog_entries_ignored_total",
    "ai-catalog entries discovery did not follow, by reason.",
    ["reason"],
)


class CatalogCache(CardCache):
    """The card cache, for catalog documents (same table, same HTTP rules)."""

    document_kind = "catalog"

    def max_body_bytes(self) -> int:
        return settings.DISCOVERY_CATALOG_MAX_BYTES

    def parse_body(self, body: bytes) -> dict[str, Any]:
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise CardError(f"not valid JSON: {exc}") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("entries"), list):
            raise CardError("an ai-catalog is an object with an 'entries' array")
        return doc


_default: dict[int, CatalogCache] = {}
_default_lock = threading.Lock()


def default_catalog_cache() -> CatalogCache:
    """This process's catalog cache."""
    pid = os.getpid()
    if pid not in _default:
        with _default_lock:
            if pid not in _default:
                _default[pid] = CatalogCache(locks=default_locks())
    return _default[pid]


def catalog_url_for(location: str) -> str:
    """A configured catalog: a domain (``partner.example.com``: https and the well-known path)
    or a URL (its well-known path added unless it names a ``.json`` document)."""
    location = location.strip()
    if "://" not in location:
        return f"https://{location.strip('/')}{WELL_KNOWN_CATALOG_PATH}"
    if urlsplit(location).path.endswith(".json"):
        return location
    return location.rstrip("/") + WELL_KNOWN_CATALOG_PATH


@dataclass(frozen=True)
class CatalogRecord(EndpointRecord):
    """An endpoint proposed by a catalog entry: its card is at ``entry_card_url`` (the entry's
    ``url``), not under a base URL."""

    entry_card_url: str = ""
    identifier: str = ""

    @property
    def card_url(self) -> str:
        if self.inline_card is not None:
            return f"catalog:{self.identifier}"
        return self.entry_card_url


@dataclass
class CatalogReport:
    """What reading one configured catalog (and its nested ones) found."""

    records: list[EndpointRecord] = field(default_factory=list)
    ignored: Counter = field(default_factory=Counter)
    catalogs: list[str] = field(default_factory=list)
    trust: dict[str, tuple[dict[str, Any], str]] = field(default_factory=dict)

    def ignore(self, reason: str, n: int = 1) -> None:
        self.ignored[reason] += n
        IGNORED.labels(reason=reason).inc(n)


def _media_type(value: Any) -> str:
    return value.split(";")[0].strip().lower() if isinstance(value, str) else ""


def _terminal_name(identifier: str) -> str:
    return identifier.rsplit(":", 1)[-1] if identifier else ""


class _Reader:
    def __init__(
        self, *, source_url: str, options: dict[str, Any], cache: CatalogCache, admission
    ) -> None:
        self.source_url = source_url
        self.max_depth = min(int(options.get("max_depth", DEFAULT_MAX_DEPTH)), MAX_DEPTH_LIMIT)
        self.prefix = str(options.get("prefix") or "")
        self.cache = cache
        self.admission = admission
        self.report = CatalogReport()

    def read(self) -> CatalogReport:
        self.seen: set[str] = {self.source_url}
        doc = self._fetch(self.source_url, top=True)
        self.report.catalogs.append(self.source_url)
        self._entries(doc.get("entries") if doc else None, self.source_url, 0)
        return self.report

    def _fetch(self, url: str, *, top: bool) -> dict[str, Any] | None:
        refusal = self.admission.refusal(url)
        if refusal:
            if top:
                raise SourceError(f"catalog {url}: {refusal}")
            self.report.ignore("nested catalog not admitted")
            return None
        result = self.cache.refresh(url, admit=self.admission.admits)
        entry = result.entry
        if entry is None or not entry.has_card:
            if top:
                raise SourceError(f"catalog {url}: {result.error or 'unavailable'}")
            self.report.ignore("nested catalog unavailable")
            return None
        if result.error:  # served stale: say so, keep going with the last good copy
            logger.warning("catalog %s: %s (serving the cached copy)", url, result.error)
        return entry.card

    def _entries(self, entries: Any, catalog_url: str, depth: int) -> None:
        if not isinstance(entries, list):
            self.report.ignore("catalog without an entries array")
            return
        if len(entries) > MAX_ENTRIES_PER_CATALOG:
            self.report.ignore(
                "over the entries-per-catalog limit", len(entries) - MAX_ENTRIES_PER_CATALOG
            )
            entries = entries[:MAX_ENTRIES_PER_CATALOG]
        for entry in entries:
            self._entry(entry, catalog_url, depth)

    def _entry(self, entry: Any, catalog_url: str, depth: int) -> None:
        if not isinstance(entry, dict) or not isinstance(entry.get("identifier"), str):
            self.report.ignore("entry without an identifier")
            return
        has_url, has_data = isinstance(entry.get("url"), str), "data" in entry
        if has_url == has_data:
            self.report.ignore("entry without exactly one of url and data")
            return
        media_type = _media_type(entry.get("type"))
        if media_type in A2A_TYPES:
            self._agent(entry, catalog_url)
        elif media_type == CATALOG_TYPE:
            if depth + 1 > self.max_depth:
                self.report.ignore("nested catalog beyond max_depth")
            elif has_data:
                data = entry["data"]
                if not isinstance(data, dict):
                    self.report.ignore("inline catalog is not an object")
                else:
                    self._entries(data.get("entries"), catalog_url, depth + 1)
            else:
                nested = urljoin(catalog_url, entry["url"])
                self._queue_nested(nested, depth + 1)
        else:
            self.report.ignore(f"media type {media_type or 'missing'}")

    def _queue_nested(self, url: str, depth: int) -> None:
        """Follow a nested catalog by URL (each at most once: cycles end here)."""
        if url in self.seen:
            self.report.ignore("catalog listed twice")
            return
        if len(self.seen) >= MAX_CATALOGS_PER_SOURCE:
            self.report.ignore("over the catalogs-per-source limit")
            return
        self.seen.add(url)
        doc = self._fetch(url, top=False)
        if doc is not None:
            self.report.catalogs.append(url)
            self._entries(doc.get("entries"), url, depth)

    def _agent(self, entry: dict[str, Any], catalog_url: str) -> None:
        identifier = entry["identifier"]
        name = derive_local_name(
            f"{self.prefix}_{_terminal_name(identifier)}"
            if self.prefix
            else _terminal_name(identifier)
        )
        trust = entry.get("trustManifest") if isinstance(entry.get("trustManifest"), dict) else None
        if isinstance(entry.get("url"), str):
            card_url = urljoin(catalog_url, entry["url"])
            record = CatalogRecord(
                local_name=name,
                base_url=card_url,
                source="catalog",
                entry_card_url=card_url,
                identifier=identifier,
            )
        else:
            data = entry["data"]
            if not isinstance(data, dict):
                self.report.ignore("inline card is not an object")
                return
            raw = orjson.dumps(data)
            try:
                endpoint = card_endpoint(parse_card(raw).card)
            except CardError:
                self.report.ignore("inline card is not a valid A2A card")
                return
            refusal = self.admission.refusal(endpoint) if endpoint else "no endpoint"
            if refusal:
                self.report.ignore("inline card endpoint not admitted")
                return
            card_url = f"catalog:{identifier}"
            record = CatalogRecord(
                local_name=name,
                base_url=endpoint,  # type: ignore[arg-type]  # set: refused above when missing
                source="catalog",
                identifier=identifier,
                inline_card=raw,
                inline_sha256=card_sha256(raw),
            )
        self.report.records.append(record)
        self.report.trust[card_url] = (
            {
                "identifier": identifier,
                "display_name": str(entry.get("displayName") or "")[:500],
                "catalog_url": catalog_url,
                "trust_manifest": trust,
            },
            identifier,
        )


def _record_listings(source_url: str, report: CatalogReport) -> None:
    """Keep :class:`CatalogListing` in step with what this catalog lists now."""
    now = timezone.now()
    for card_url, (fields, _identifier) in report.trust.items():
        CatalogListing.objects.update_or_create(
            card_url=card_url[:2048],
            defaults={
                **fields,
                "identifier": fields["identifier"][:500],
                "source_url": source_url,
                "seen_at": now,
            },
        )
    CatalogListing.objects.filter(source_url=source_url).exclude(
        card_url__in=list(report.trust)
    ).delete()


def catalog_records(
    *,
    url: str,
    options: dict[str, Any] | None = None,
    cache: CatalogCache | None = None,
    admission=None,
) -> CatalogReport:
    """Read one configured catalog (and what it nests); raises :class:`SourceError` when the
    catalog itself cannot be had (no cached copy to fall back on)."""
    if admission is None:
        admission = Admission(allowlist_entries())
    reader = _Reader(
        source_url=url,
        options=options or {},
        cache=cache or default_catalog_cache(),
        admission=admission,
    )
    report = reader.read()
    _record_listings(url, report)
    if report.ignored:
        logger.info(
            "catalog %s: %d agent(s); ignored %s", url, len(report.records), dict(report.ignored)
        )
    return report
