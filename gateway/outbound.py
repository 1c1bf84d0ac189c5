"""The one pooled outbound HTTP client of the proxy hot path (aiohttp), behind this module.

Why aiohttp and not httpx here: measured on this machine kind (PERFORMANCE.md, uvicorn + raw
ASGI proxy, 1 KiB message/send, wrk pinned): aiohttp 3,650 req/s at c=1 and 7,200 at c=64;
httpx over the aiohttp transport 2,030 / 2,700; plain httpx 1,230 / 500-680 (its pool checks
every pooled connection per request, so it degrades with concurrency). The virtual subscriber's
outbound POST is the gateway's ceiling, so it uses aiohttp directly. httpx stays the project's
HTTP API everywhere else (card fetching, discovery, tests).

One session per event loop (a process normally has one; tests run several servers, each on its
own loop), created lazily and closed on node shutdown. Settings that matter for a transparent,
shared proxy: no cookie jar (cookies of one caller must never reach another), no automatic
decompression (bodies are relayed byte for byte with their Content-Encoding), no redirects, no
automatic User-Agent/Accept headers, and a keep-alive expiry just under the common 5 s idle
timeout of agent servers (uvicorn, Node) so a pooled connection is not reused as the agent
closes it.
"""

from __future__ import annotations

import asyncio
import weakref

import aiohttp
from yarl import URL

KEEPALIVE_SECONDS = 4.0
CONNECT_TIMEOUT_SECONDS = 10.0

_sessions: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, aiohttp.ClientSession] = (
    weakref.WeakKeyDictionary()
)
_timeouts: dict[tuple[float | None, float | None], aiohttp.ClientTimeout] = {}
_urls: dict[str, URL] = {}

#: Raised by the client when the agent cannot be reached or drops the connection.
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (aiohttp.ClientError, OSError)


def session() -> aiohttp.ClientSession:
    """The shared client session of the running loop."""
    loop = asyncio.get_running_loop()
    current = _sessions.get(loop)
    if current is None or current.closed:
        connector = aiohttp.TCPConnector(
            limit=0,  # the per-agent concurrency cap bounds connections, not the pool
            limit_per_host=0,
            keepalive_timeout=KEEPALIVE_SECONDS,
            ttl_dns_cache=60,
            enable_cleanup_closed=False,
        )
        current = aiohttp.ClientSession(
            connector=connector,
            cookie_jar=aiohttp.DummyCookieJar(),
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding"),
            timeout=aiohttp.ClientTimeout(total=None, connect=CONNECT_TIMEOUT_SECONDS),
            read_bufsize=2**18,
            max_line_size=16 * 1024,
            max_field_size=16 * 1024,
        )
        _sessions[loop] = current
    return current


async def close_session() -> None:
    """Close the running loop's session (node shutdown)."""
    current = _sessions.pop(asyncio.get_running_loop(), None)
    if current is not None and not current.closed:
        await current.close()


def timeout(total: float | None, *, sock_read: float | None = None) -> aiohttp.ClientTimeout:
    """A cached ClientTimeout (requests reuse a handful of distinct values)."""
    key = (total, sock_read)
    value = _timeouts.get(key)
    if value is None:
        value = aiohttp.ClientTimeout(
            total=total, connect=CONNECT_TIMEOUT_SECONDS, sock_read=sock_read
        )
        if len(_timeouts) < 1024:
            _timeouts[key] = value
    return value


def url(endpoint: str) -> URL:
    """The parsed agent URL, cached (yarl parsing costs more than the lookup)."""
    value = _urls.get(endpoint)
    if value is None:
        value = URL(endpoint)
        if len(_urls) < 100_000:
            _urls[endpoint] = value
    return value
