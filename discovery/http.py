"""Discovery's one HTTP client per process.

Card fetches are many and small, so they run concurrently on one ``httpx.AsyncClient`` that
lives on a private event loop in a daemon thread; synchronous callers (Celery tasks, the
management command, admin actions) submit coroutines to it with :func:`run`. Source queries and
webhooks use :func:`sync_client`. Both have explicit timeouts and pool limits, redirects off
(the card cache follows them itself, only onto allowlisted hosts). A forked child (Celery
prefork) builds its own on first use.
"""

from __future__ import annotations

import asyncio
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


def _ensure() -> None:
    if _state["pid"] == os.getpid() and _state["thread"] and _state["thread"].is_alive():
        return
    with _lock:
        if _state["pid"] == os.getpid() and _state["thread"] and _state["thread"].is_alive():
            return
        loop = asyncio.new_event_loop()
        ready = threading.Event()

        def main() -> None:
            asyncio.set_event_loop(loop)
            _state["client"] = httpx.AsyncClient(
                timeout=fetch_timeout(), limits=_limits(), follow_redirects=False,
                headers={"User-Agent": "a2a-registry-discovery/1"},
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
