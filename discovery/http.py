"""Discovery's one HTTP client per process.

Card fetches are many and small, so they run concurrently on one ``httpx.AsyncClient`` that
lives on a private event loop in a daemon thread; synchronous callers (Celery tasks, the
management command, admin actions) submit coroutines to it with :func:`run`. Source queries and
webhooks use :func:`sync_client`. Both have explicit timeouts and pool limits, redirects off
(the card cache follows them itself, only onto allowlisted hosts). A forked child (Celery
prefork) builds its own on first use.

The async client keeps the httpx API over an aiohttp transport (``DISCOVERY_HTTP_TRANSPORT``,
default ``aiohttp``; ``httpx`` for httpx's own). Measured here (bench/discovery_bench.py's card
server, 3,000 GETs on loopback): plain httpx 1,260/s at concurrency 2 falling to 720/s at 16 (its
pool scans every connection per request, PERFORMANCE.md), aiohttp 11,000/s; the 10,000-card
all-304 cycle needs the latter to stay within 10 s on two cores.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

import httpx
from django.conf import settings

T = TypeVar("T")

_lock = threading.Lock()
_state: dict[str, Any] = {"pid": None, "loop": None, "thread": None, "client": None, "sync": None}


def fetch_timeout() -> httpx.Timeout:
    """5 s per fetch, 3 s to connect (settings may shorten them, e.g. in tests)."""
    total = settings.DISCOVERY_FETCH_TIMEOUT_SECONDS
    return httpx.Timeout(total, connect=min(settings.DISCOVERY_CONNECT_TIMEOUT_SECONDS, total))


def _limits() -> httpx.Limits:
    size = settings.DISCOVERY_FETCH_CONCURRENCY
    return httpx.Limits(max_connections=size, max_keepalive_connections=size, keepalive_expiry=30)


class _AiohttpStream(httpx.AsyncByteStream):
    def __init__(self, response: Any) -> None:
        self._response = response

    async def __aiter__(self):
        import aiohttp

        try:
            async for chunk in self._response.content.iter_chunked(65536):
                yield chunk
        except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
            raise httpx.ReadTimeout(str(exc) or "read timed out") from exc
        except aiohttp.ClientError as exc:
            raise httpx.ReadError(str(exc)) from exc

    async def aclose(self) -> None:
        self._response.release()


class AiohttpTransport(httpx.AsyncBaseTransport):
    """httpx requests carried by one pooled ``aiohttp.ClientSession`` (created on its loop)."""

    def __init__(self, *, limits: httpx.Limits) -> None:
        self._limit = limits.max_connections or 100
        self._keepalive = limits.keepalive_expiry or 30
        self._session: Any = None

    def _client_session(self) -> Any:
        import aiohttp

        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=self._limit, keepalive_timeout=self._keepalive, ttl_dns_cache=60
                ),
                auto_decompress=False,  # httpx decodes Content-Encoding itself
                skip_auto_headers=("User-Agent", "Accept-Encoding"),
            )
        return self._session

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        import aiohttp

        t = request.extensions.get("timeout") or {}
        timeout = aiohttp.ClientTimeout(
            total=None, connect=t.get("connect"), sock_read=t.get("read"),
        )
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers.raw
                   if k.lower() != b"host"]
        try:
            response = await self._client_session().request(
                request.method, str(request.url), headers=headers,
                data=request.content or None, allow_redirects=False, timeout=timeout,
            )
        except aiohttp.ConnectionTimeoutError as exc:
            raise httpx.ConnectTimeout(str(exc) or "connect timed out", request=request) from exc
        except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
            raise httpx.ReadTimeout(str(exc) or "timed out", request=request) from exc
        except aiohttp.ClientConnectorError as exc:
            raise httpx.ConnectError(str(exc), request=request) from exc
        except aiohttp.ClientError as exc:
            raise httpx.ReadError(str(exc), request=request) from exc
        return httpx.Response(
            status_code=response.status,
            headers=[(k.decode("latin-1"), v.decode("latin-1")) for k, v in response.raw_headers],
            stream=_AiohttpStream(response), request=request,
        )

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


def _ensure() -> None:
    if _state["pid"] == os.getpid() and _state["thread"] and _state["thread"].is_alive():
        return
    with _lock:
        if _state["pid"] == os.getpid() and _state["thread"] and _state["thread"].is_alive():
            return
        try:
            import uvloop

            loop = uvloop.new_event_loop()
        except ImportError:
            loop = asyncio.new_event_loop()
        ready = threading.Event()

        def main() -> None:
            asyncio.set_event_loop(loop)
            limits = _limits()
            transport = (
                AiohttpTransport(limits=limits)
                if settings.DISCOVERY_HTTP_TRANSPORT == "aiohttp" else None
            )
            _state["client"] = httpx.AsyncClient(
                timeout=fetch_timeout(), limits=limits, follow_redirects=False,
                headers={"User-Agent": "a2a-registry-discovery/1"}, transport=transport,
            )
            ready.set()
            loop.run_forever()

        thread = threading.Thread(target=main, name="discovery-http", daemon=True)
        thread.start()
        ready.wait(10)
        _state.update(pid=os.getpid(), loop=loop, thread=thread, sync=None)


def async_client() -> httpx.AsyncClient:
    """The shared async client (use only inside coroutines given to :func:`run`)."""
    _ensure()
    return _state["client"]


def run(coro: Coroutine[Any, Any, T], *, timeout: float | None = None) -> T:
    """Run ``coro`` on the discovery HTTP loop and wait for its result."""
    _ensure()
    future = asyncio.run_coroutine_threadsafe(coro, _state["loop"])
    try:
        return future.result(timeout)
    except BaseException:
        future.cancel()
        raise


def submit(coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
    """Start ``coro`` on the discovery HTTP loop; the caller waits on the returned future."""
    _ensure()
    return asyncio.run_coroutine_threadsafe(coro, _state["loop"])


def sync_client() -> httpx.Client:
    """The shared synchronous client for source queries and alert webhooks."""
    _ensure()
    client = _state["sync"]
    if client is None:
        with _lock:
            client = _state["sync"]
            if client is None:
                client = httpx.Client(
                    timeout=httpx.Timeout(10, connect=3), limits=httpx.Limits(max_connections=20),
                    follow_redirects=False, headers={"User-Agent": "a2a-registry-discovery/1"},
                )
                _state["sync"] = client
    return client
