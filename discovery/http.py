"""Discovery's one HTTP client per process, built by the shared outbound layer.

Card fetches are many and small, so they run concurrently on one ``httpx.AsyncClient`` that
lives on a private event loop in a daemon thread; synchronous callers (Celery tasks, the
management command, admin actions) submit coroutines to it with :func:`run`. Source queries and
webhooks use :func:`sync_client`. Both come from ``outbound.clients``: TLS with the system store
and ``A2A_OUTBOUND_CA_FILE``, the policy's proxy, explicit timeouts and pool limits, redirects
off (the card cache follows them itself, only onto allowlisted hosts) and the connect-time
address check on every new connection (a card host re-pointed at the metadata address is never
reached). A forked child (Celery prefork) builds its own on first use; a changed outbound
policy (settings) rebuilds both.

The async client keeps the httpx API over an aiohttp transport (``DISCOVERY_HTTP_TRANSPORT``,
default ``aiohttp``; ``httpx`` for httpx's own): ``outbound.clients`` says why that transport is
ours and not the ``httpx-aiohttp`` package, with the measurement.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import os
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

import httpx
from django.conf import settings

from core import threads
from outbound import clients
from outbound import policy as outbound_policy

T = TypeVar("T")

USER_AGENT = {"User-Agent": "a2a-registry-discovery/1"}

_lock = threading.Lock()
_state: dict[str, Any] = {"pid": None, "loop": None, "thread": None, "client": None, "sync": None}


def fetch_timeout() -> httpx.Timeout:
    """5 s per fetch, 3 s to connect (settings may shorten them, e.g. in tests)."""
    total = settings.DISCOVERY_FETCH_TIMEOUT_SECONDS
    return httpx.Timeout(total, connect=min(settings.DISCOVERY_CONNECT_TIMEOUT_SECONDS, total))


def _limits() -> httpx.Limits:
    size = settings.DISCOVERY_FETCH_CONCURRENCY
    return httpx.Limits(max_connections=size, max_keepalive_connections=size, keepalive_expiry=30)


def _ensure() -> None:
    if _state["pid"] == os.getpid() and _state["thread"] and _state["thread"].is_alive():
        return
    with _lock:
        if _state["pid"] == os.getpid() and _state["thread"] and _state["thread"].is_alive():
            return
        try:
            import uvloop

            loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
        except ImportError:
            loop = asyncio.new_event_loop()
        ready = threading.Event()

        def main() -> None:
            asyncio.set_event_loop(loop)
            ready.set()
            loop.run_forever()

        thread = threads.start("discovery-http", main)
        ready.wait(10)
        _state.update(pid=os.getpid(), loop=loop, thread=thread, client=None, sync=None)


def async_client() -> httpx.AsyncClient:
    """The shared async client (use only inside coroutines given to :func:`run`)."""
    _ensure()
    client = _state["client"]
    if client is None:  # built on the discovery loop, where it is used
        client = _state["client"] = clients.httpx_async_client(
            timeout=fetch_timeout(),
            limits=_limits(),
            headers=USER_AGENT,
            transport=settings.DISCOVERY_HTTP_TRANSPORT,
        )
    return client


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
                client = clients.httpx_client(
                    timeout=httpx.Timeout(10, connect=3),
                    limits=httpx.Limits(max_connections=20),
                    headers=USER_AGENT,
                )
                _state["sync"] = client
    return client


def _rebuild(_policy: Any) -> None:
    """The outbound policy changed (TLS, proxy, ...): both clients are rebuilt on next use."""
    old_async, old_sync = _state["client"], _state["sync"]
    _state["client"] = _state["sync"] = None
    loop = _state["loop"]
    if old_async is not None and loop is not None and _state["pid"] == os.getpid():
        try:
            asyncio.run_coroutine_threadsafe(old_async.aclose(), loop)
        except RuntimeError:
            pass
    if old_sync is not None:
        old_sync.close()


outbound_policy.on_change(_rebuild)


def _close_at_exit() -> None:
    """Close the async client's pooled connections on its loop before the process exits."""
    client, loop = _state["client"], _state["loop"]
    if client is None or loop is None or not loop.is_running() or _state["pid"] != os.getpid():
        return
    try:
        asyncio.run_coroutine_threadsafe(client.aclose(), loop).result(2)
    except Exception:  # exiting anyway; a slow or failed close must not block it
        pass


atexit.register(_close_at_exit)
