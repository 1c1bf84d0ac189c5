"""The HTTP side of the card cache (:mod:`discovery.card_cache`): how a batch of card URLs is
fetched and what a response says about caching.

* Conditional GET with ``If-None-Match`` (the ETag of a card the cache holds).
* Lifetime from ``Cache-Control: max-age`` (:data:`DEFAULT_LIFETIME` when absent; ``no-cache``
  revalidates every time; ``no-store`` keeps nothing in the database).
* A failing endpoint is retried after :func:`backoff_seconds`.
* Fetches: ``DISCOVERY_FETCH_TIMEOUT_SECONDS`` for the whole fetch (redirects included),
  ``DISCOVERY_FETCH_CONCURRENCY`` at once, the document's size cap (declared or counted),
  redirects followed only onto admitted hosts, all on the process's one shared
  ``httpx.AsyncClient`` (:mod:`discovery.http`).

Nothing here knows the cache's entries or its table: a fetch answers a :class:`Fetched` per
URL, the cache turns it into an entry.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin

import httpx
from django.conf import settings

from core import tracing
from discovery import http

DEFAULT_LIFETIME = 300.0
MAX_REDIRECTS = 3

Admit = Callable[[str], bool]


@dataclass(frozen=True)
class Fetched:
    """What one URL's fetch answered: a status (None: no response) and, for a 200, the body."""

    status: int | None
    body: bytes | None = None
    etag: str = ""
    cache_control: str = ""
    error: str | None = None


_MAX_AGE = re.compile(r"(?:^|,)\s*max-age\s*=\s*\"?(\d+)\"?", re.I)


def cache_lifetime(cache_control: str) -> tuple[float, bool]:
    """``(lifetime seconds, no_store)`` from a Cache-Control header."""
    directives = {d.strip().split("=")[0].lower() for d in cache_control.split(",") if d.strip()}
    if "no-store" in directives:
        return 0.0, True
    if "no-cache" in directives:
        return 0.0, False
    match = _MAX_AGE.search(cache_control)
    if match:
        return float(match.group(1)), False
    return DEFAULT_LIFETIME, False


def backoff_seconds(failures: int) -> float:
    """Retry delay after a failure, given the failures counted before it."""
    return float(min(300, 5 * 2 ** min(failures, 6)))


def lock_seconds() -> float:
    """The longest a fetch of one URL can take, redirects included (how long a peer waits)."""
    return float(settings.DISCOVERY_FETCH_TIMEOUT_SECONDS * (MAX_REDIRECTS + 1))


async def fetch_all(urls: list[str], etags: dict[str, str], admit: Admit | None,
                    trace_parent: Any = None, *, limit: int, document_kind: str
                    ) -> dict[str, Fetched]:
    """Fetch every URL (at most ``DISCOVERY_FETCH_CONCURRENCY`` at once), each conditional on
    its ``etags`` entry when there is one, each body at most ``limit`` bytes."""
    client = http.async_client()
    gate = asyncio.Semaphore(settings.DISCOVERY_FETCH_CONCURRENCY)
    timeout = http.fetch_timeout()

    deadline = settings.DISCOVERY_FETCH_TIMEOUT_SECONDS

    async def one(url: str) -> tuple[str, Fetched]:
        if trace_parent is None:  # tracing off
            return await fetch(url)
        with tracing.child_span("discovery.card_fetch", trace_parent, url=url) as span:
            got = await fetch(url)
            tracing.annotate(span, **{"http.response.status_code": got[1].status,
                                      "a2a.error": got[1].error})
            return got

    async def fetch(url: str) -> tuple[str, Fetched]:
        async with gate:
            try:  # the whole fetch, redirects included, within the fetch timeout
                async with asyncio.timeout(deadline):
                    return url, await fetch_one(
                        client, url, etags.get(url, ""), admit, timeout,
                        limit=limit, document_kind=document_kind,
                    )
            except TimeoutError:
                return url, Fetched(None, error=f"{url}: timed out")

    return dict(await asyncio.gather(*(one(u) for u in urls)))


async def fetch_one(client: httpx.AsyncClient, url: str, etag: str, admit: Admit | None,
                    timeout: httpx.Timeout, *, limit: int, document_kind: str) -> Fetched:
    """One URL's fetch, following at most :data:`MAX_REDIRECTS` admitted redirects."""
    headers = {"Accept": "application/json"}
    if etag:
        headers["If-None-Match"] = etag
    target = url
    try:
        for _ in range(MAX_REDIRECTS + 1):
            async with client.stream("GET", target, headers=headers, timeout=timeout) as resp:
                status = resp.status_code
                if status in (301, 302, 303, 307, 308):
                    location = resp.headers.get("location")
                    if not location:
                        return Fetched(status, error=f"HTTP {status} without a Location")
                    nxt = urljoin(target, location)
                    if admit is not None and not admit(nxt):
                        return Fetched(status, error=f"redirect to {nxt} refused: "
                                                     "not an admitted host")
                    target = nxt
                    continue
                cache_control = resp.headers.get("cache-control", "")
                etag = resp.headers.get("etag", "")
                if status == 304:
                    return Fetched(304, etag=etag, cache_control=cache_control)
                if status != 200:
                    return Fetched(status, error=f"HTTP {status}")
                declared = resp.headers.get("content-length")
                if declared and declared.isdigit() and int(declared) > limit:
                    return Fetched(status, error=f"{document_kind} is larger "
                                                 f"than {limit} bytes")
                body = bytearray()
                async for chunk in resp.aiter_bytes():
                    body += chunk
                    if len(body) > limit:
                        return Fetched(status, error=f"{document_kind} is larger "
                                                     f"than {limit} bytes")
                return Fetched(200, bytes(body), etag, cache_control)
        return Fetched(None, error="too many redirects")
    except httpx.TimeoutException:
        return Fetched(None, error=f"{target}: timed out")
    except httpx.HTTPError as exc:
        return Fetched(None, error=f"{target}: {type(exc).__name__}: {exc}".rstrip(": "))
