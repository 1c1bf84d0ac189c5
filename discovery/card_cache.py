"""A card cache that respects HTTP (the seed's ``CardCache``), persisted in the database.

* Conditional GET with ``If-None-Match``; lifetime from ``Cache-Control: max-age`` (5 minutes
  when absent; ``no-cache`` revalidates every time; ``no-store`` keeps nothing in the database
  and revalidates every time); expiry jittered (±10 % by default) so entries written together
  do not all expire together.
* A 304 keeps the card. Change is the sha256 of the bytes, not the ETag: a 200 with the same
  bytes keeps the parsed card; the card is re-parsed only when the bytes change.
* Single-flight: concurrent refreshes of one URL share one fetch within a process (an in-flight
  map of futures) and across Celery workers and nodes (Redis locks, then a re-read of the row a
  peer may just have written).
* Stale on error: a failing endpoint keeps its last card, is retried after
  ``min(300, 5 * 2**min(failures, 6))`` seconds and counts failures; a never-seen endpoint that
  fails surfaces the error.
* Fetches: 5 s timeout, 3 s connect, the card size cap, redirects followed only onto admitted
  hosts, all on the process's one shared ``httpx.AsyncClient``.

The in-process index (``card_url`` -> :class:`CardEntry`) serves reads; the table lets a restart
start warm and lets workers see each other's fetches. Fetching (HTTP, caching headers, redirects,
size caps) is :mod:`discovery.card_http`; the table's reads and writes, :mod:`discovery.card_store`.
"""

from __future__ import annotations

import hashlib
import itertools
import random
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from django.conf import settings

from core import tracing
from core.locks import LocalLocks, RedisLocks, default_locks
from discovery import card_store, http, metrics
from discovery.card_http import Admit, Fetched, backoff_seconds, cache_lifetime, fetch_all
from discovery.card_http import lock_seconds as _lock_seconds
from discovery.card_store import BATCH, CardEntry
from registry.cards import CardError, parse_card

Clock = Callable[[], float]


class Outcome(StrEnum):
    FETCHED = "fetched"  # 200, new or changed bytes (parsed)
    UNCHANGED = "unchanged"  # 200, same bytes as cached (not re-parsed)
    NOT_MODIFIED = "not_modified"  # 304
    FAILED = "failed"  # error; a cached card (if any) is served stale
    FRESH = "fresh"  # not due: served from the cache without a request
    SHARED = "shared"  # another worker refreshed it while we waited


@dataclass(frozen=True)
class RefreshResult:
    card_url: str
    outcome: Outcome
    entry: CardEntry | None
    error: str | None = None
    previous: CardEntry | None = None

    @property
    def attempted(self) -> bool:
        """A request was made for this caller (health observes these)."""
        return self.outcome in (
            Outcome.FETCHED, Outcome.UNCHANGED, Outcome.NOT_MODIFIED, Outcome.FAILED
        )

    @property
    def ok(self) -> bool:
        return self.outcome in (Outcome.FETCHED, Outcome.UNCHANGED, Outcome.NOT_MODIFIED)

    @property
    def changed(self) -> bool:
        """The bytes changed from a card we had before."""
        return (
            self.outcome == Outcome.FETCHED and self.previous is not None
            and self.previous.has_card and self.entry is not None
            and self.entry.sha256 != self.previous.sha256
        )


@dataclass
class _Batch:
    urls: list[str]
    future: Future
    acquired: set[str]
    to_fetch: list[str] = field(default_factory=list)
    previous: dict[str, CardEntry | None] = field(default_factory=dict)
    results: dict[str, RefreshResult] = field(default_factory=dict)
    fetching: Future | None = None


class CardFetchFailed(Exception):
    """A never-seen endpoint failed: there is no card to serve."""


class CardCache:
    """The card cache of one process (or, in tests, of one simulated worker).

    ``clock`` returns POSIX seconds and is injectable so tests can walk through expiry and
    backoff without sleeping; ``locks`` defaults to Redis locks in distributed mode.
    """

    #: What the cached documents are (in error messages); subclasses cache other JSON documents.
    document_kind = "card"

    def max_body_bytes(self) -> int:
        return settings.A2A_MAX_CARD_BYTES

    def parse_body(self, body: bytes) -> dict[str, Any]:
        """The parsed document of a 200's bytes; raises :class:`CardError` when unacceptable."""
        return parse_card(body).card

    def __init__(
        self,
        *,
        clock: Clock = time.time,
        jitter: float | None = None,
        rng: random.Random | None = None,
        locks: LocalLocks | RedisLocks | None = None,
    ) -> None:
        self.clock = clock
        self.jitter = settings.DISCOVERY_EXPIRY_JITTER if jitter is None else jitter
        self.rng = rng or random.Random()
        self.locks = locks if locks is not None else default_locks()
        self._index: dict[str, CardEntry] = {}
        self._seen: dict[str, tuple] = {}
        #: When each entry was last stored, in :attr:`_stores` ticks: a row read from the
        #: table before a newer store of its URL must not replace it (:meth:`_reload`).
        self._stored_at: dict[str, int] = {}
        self._stores = itertools.count(1)
        self._mutex = threading.Lock()
        self._inflight: dict[str, Future] = {}
        self.parse_count = 0
        self.fetch_count = 0

    # --- reads -----------------------------------------------------------------------------

    def get(self, card_url: str) -> CardEntry | None:
        """The cached entry (fresh or stale), loading it from the database on first sight."""
        entry = self._index.get(card_url)
        if entry is None:
            self._reload([card_url])
            entry = self._index.get(card_url)
        return entry

    def card(self, card_url: str) -> dict[str, Any]:
        """The cached card; raises :class:`CardFetchFailed` when none was ever fetched."""
        entry = self.get(card_url)
        if entry is None or not entry.has_card:
            raise CardFetchFailed(entry.last_error if entry else f"{card_url}: never fetched")
        return entry.card  # type: ignore[return-value]  # has_card means card is not None

    def entries(self) -> dict[str, CardEntry]:
        return dict(self._index)

    def forget(self) -> None:
        """Drop the in-process index (the table stays): the next read reloads."""
        with self._mutex:
            self._index.clear()
            self._seen.clear()
            self._stored_at.clear()

    def _store(self, entry: CardEntry) -> None:
        self._index[entry.card_url] = entry
        self._seen[entry.card_url] = card_store.seen_key(entry)
        self._stored_at[entry.card_url] = next(self._stores)

    def _reload(self, urls: Iterable[str]) -> None:
        """Load ``urls``' rows into the index, except those another thread of this process
        stored anew while they were read: that thread's entry is the newer (a row read just
        before a refresh was written would make the URL look due again, and fetched twice)."""
        started = next(self._stores)
        for entry in card_store.load(list(urls)):
            if self._stored_at.get(entry.card_url, 0) > started:
                continue
            old = self._index.get(entry.card_url)
            if entry.no_store and old is not None and old.has_card and not entry.has_card:
                entry = replace(entry, card=old.card, raw=old.raw)  # kept in memory only
            self._store(entry)

    def sync(self, urls: Iterable[str]) -> None:
        """Bring the index up to date with rows other workers wrote (cheap: one light query)."""
        wanted = set(urls)
        if not wanted:
            return
        stale = card_store.changed_rows(wanted, self._seen)
        if stale:
            self._reload(stale)

    # --- refresh ---------------------------------------------------------------------------

    def refresh(self, card_url: str, *, force: bool = False, admit: Admit | None = None
                ) -> RefreshResult:
        return self.refresh_many([card_url], force=force, admit=admit)[card_url]

    def refresh_many(
        self,
        card_urls: Iterable[str],
        *,
        force: bool = False,
        admit: Admit | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> dict[str, RefreshResult]:
        """Refresh every due URL (all of them with ``force``); return one result per URL."""
        urls = list(dict.fromkeys(card_urls))
        self.sync(urls)
        now = self.clock()
        results: dict[str, RefreshResult] = {}
        due: list[str] = []
        for url in urls:
            entry = self._index.get(url)
            if force or entry is None or entry.expires_at <= now:
                due.append(url)
            else:
                results[url] = RefreshResult(url, Outcome.FRESH, entry)
        if progress and results:
            progress(len(results))
        mine: list[str] = []
        theirs: dict[str, Future] = {}
        chunks: list[tuple[list[str], Future]] = []
        with self._mutex:
            now = self.clock()
            for url in due:
                running = self._inflight.get(url)
                entry = self._index.get(url)
                if running is not None:
                    theirs[url] = running  # someone in this process is already fetching
                elif not force and entry is not None and entry.expires_at > now:
                    # Refreshed by another thread since we looked (it stores before settling).
                    results[url] = RefreshResult(url, Outcome.SHARED, entry)
                else:
                    mine.append(url)
            # One future per chunk of claimed URLs: waiters pick their URL from its results.
            for i in range(0, len(mine), BATCH):
                claimed: tuple[list[str], Future] = (mine[i:i + BATCH], Future())
                chunks.append(claimed)
                for url in claimed[0]:
                    self._inflight[url] = claimed[1]
        pending: _Batch | None = None
        try:
            # Pipelined: the next chunk is on the wire while this one is written.
            for chunk, future in chunks:
                batch = self._begin(chunk, future, force=force, admit=admit)
                if pending is not None:
                    self._finish(pending, results, progress)
                pending = batch
            if pending is not None:
                self._finish(pending, results, progress)
                pending = None
        except BaseException as exc:
            with self._mutex:
                for chunk, future in chunks:
                    for url in chunk:
                        if self._inflight.get(url) is future:
                            del self._inflight[url]
                    if not future.done():
                        future.set_exception(exc)
            if pending is not None:
                self.locks.release_many(pending.acquired)
            raise
        for url, future in theirs.items():
            shared: RefreshResult = future.result()[url]
            results[url] = replace(shared, outcome=Outcome.SHARED) if shared.attempted else shared
        if progress and theirs:
            progress(len(theirs))
        return {url: results[url] for url in urls}

    def _begin(self, urls: list[str], future: Future, *, force: bool, admit: Admit | None
               ) -> _Batch:
        """Lock a chunk (across workers), re-check it, and put its fetches on the wire."""
        ttl = _lock_seconds() + 30
        acquired = self.locks.acquire_many(urls, ttl=ttl)
        batch = _Batch(urls=urls, future=future, acquired=acquired)
        try:
            if isinstance(self.locks, RedisLocks):
                self.sync(acquired)  # a peer may have refreshed it between our read and lock
            now = self.clock()
            for url in urls:
                if url not in acquired:
                    continue
                entry = self._index.get(url)
                if force or entry is None or entry.expires_at <= now:
                    batch.to_fetch.append(url)
                else:
                    batch.results[url] = RefreshResult(url, Outcome.SHARED, entry)
            if batch.to_fetch:
                batch.previous = {u: self._index.get(u) for u in batch.to_fetch}
                etags = {u: e.etag for u, e in batch.previous.items()
                         if e is not None and e.has_card and e.etag}
                self.fetch_count += len(batch.to_fetch)
                batch.fetching = http.submit(fetch_all(
                    batch.to_fetch, etags, admit, tracing.current_context(),
                    limit=self.max_body_bytes(), document_kind=self.document_kind,
                ))
        except BaseException:
            self.locks.release_many(acquired)
            raise
        return batch

    def _finish(self, batch: _Batch, results: dict[str, RefreshResult],
                progress: Callable[[int], None] | None) -> None:
        """Apply and persist a chunk's responses, release its locks, settle its waiters."""
        try:
            if batch.fetching is not None:
                fetched = batch.fetching.result()
                new, full = self._apply(fetched, batch.previous)
                self._persist(new, full)
                for url, result in new.items():
                    batch.results[url] = result
                    if result.entry is not None:
                        self._store(result.entry)
        finally:
            self.locks.release_many(batch.acquired)
        waiting = [u for u in batch.urls if u not in batch.acquired]
        if waiting:
            self.locks.wait_released(waiting, timeout=_lock_seconds())
            self._reload(waiting)
            for url in waiting:
                entry = self._index.get(url)
                batch.results[url] = RefreshResult(
                    url, Outcome.SHARED, entry,
                    error=None if entry and entry.has_card else "another worker is fetching it",
                )
        results.update(batch.results)
        with self._mutex:
            for url in batch.urls:
                if self._inflight.get(url) is batch.future:
                    del self._inflight[url]
            batch.future.set_result(batch.results)
        if progress:
            progress(len(batch.urls))

    def _expiry(self, now: float, lifetime: float) -> float:
        if lifetime <= 0:
            return now
        return now + lifetime * (1 + self.rng.uniform(-self.jitter, self.jitter))

    def _apply(self, fetched: dict[str, Fetched], previous: dict[str, CardEntry | None]
               ) -> tuple[dict[str, RefreshResult], set[str]]:
        """Turn responses into entries; ``full`` names rows whose card bytes must be written."""
        now = self.clock()
        results: dict[str, RefreshResult] = {}
        full: set[str] = set()
        for url, got in fetched.items():
            old = previous.get(url)
            error = got.error
            parsed_card = None
            if error is None and got.status == 304 and (old is None or not old.has_card):
                error = "HTTP 304 but no card is cached"
            if error is None and got.status == 200:
                sha = hashlib.sha256(got.body or b"").hexdigest()
                if old is None or not old.has_card or sha != old.sha256:
                    try:
                        parsed_card = self.parse_body(got.body or b"")
                        self.parse_count += 1
                        metrics.CARD_PARSES.inc()
                    except CardError as exc:
                        error = f"invalid {self.document_kind}: {exc}"
            if error is not None:
                metrics.CARD_FETCH_ERRORS.inc()
                failures = old.failures if old else 0
                base = old or CardEntry(card_url=url)
                entry = replace(
                    base, failures=failures + 1, expires_at=now + backoff_seconds(failures),
                    last_error=error[:2000], last_status=got.status,
                )
                results[url] = RefreshResult(url, Outcome.FAILED, entry, error, old)
                if old is None:
                    full.add(url)
                continue
            lifetime, no_store = cache_lifetime(got.cache_control)
            common: dict[str, Any] = {
                "expires_at": self._expiry(now, lifetime), "fetched_at": now, "failures": 0,
                "last_error": "", "last_status": got.status, "cache_control": got.cache_control,
                "no_store": no_store,
            }
            if got.status == 304:
                metrics.CARD_FETCH_304.inc()
                assert old is not None
                entry = replace(old, etag=got.etag or old.etag, **common)
                results[url] = RefreshResult(url, Outcome.NOT_MODIFIED, entry, None, old)
                continue
            metrics.CARD_FETCH_200.inc()
            etag = "" if no_store else got.etag
            if parsed_card is None:  # same bytes: keep the parsed card
                assert old is not None
                entry = replace(old, etag=etag, **common)
                results[url] = RefreshResult(url, Outcome.UNCHANGED, entry, None, old)
                if old.no_store != no_store:
                    full.add(url)
                continue
            entry = CardEntry(
                card_url=url, etag=etag, sha256=hashlib.sha256(got.body or b"").hexdigest(),
                card=parsed_card, raw=got.body, changed_at=now, **common,
            )
            results[url] = RefreshResult(url, Outcome.FETCHED, entry, None, old)
            full.add(url)
        return results, full

    # --- persistence -----------------------------------------------------------------------

    def _persist(self, results: dict[str, RefreshResult], full: set[str]) -> None:
        card_store.persist(
            [r.entry for u, r in results.items() if u in full and r.entry],
            [r.entry for u, r in results.items() if u not in full and r.entry],
        )

    def mark_due(self, card_urls: Iterable[str]) -> None:
        """Make entries due now (revalidated by the next refresh)."""
        urls = list(card_urls)
        now = self.clock()
        with self._mutex:
            for url in urls:
                entry = self._index.get(url)
                if entry is not None:
                    self._store(replace(entry, expires_at=now))
        card_store.mark_due(urls, now)

    def expire_all(self) -> None:
        """Mark every entry due now (the index and the table): a mass expiry, e.g. after a
        deploy. Used by tests and the benchmark to check that refreshes stay single-flight."""
        now = self.clock()
        with self._mutex:
            for entry in list(self._index.values()):
                self._store(replace(entry, expires_at=now))
        card_store.expire_all(now)


_default: dict[int, CardCache] = {}
_default_lock = threading.Lock()


def default_cache() -> CardCache:
    """This process's card cache."""
    import os

    pid = os.getpid()
    if pid not in _default:
        with _default_lock:
            if pid not in _default:
                _default[pid] = CardCache()
    return _default[pid]
