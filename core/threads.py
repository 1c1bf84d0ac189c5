"""The one owner of the process's background threads: named, bounded, shut down together.

Every thread pool of the platform comes from :func:`pool` (a name, a fixed number of workers,
created on first use and shared by that name), so ``/readyz`` checks, token lookups, DNS
lookups at registration, ARD searches and the database probe each have their own bounded
threads, none can starve another, and a node's shutdown stops them all in one place
(:func:`shutdown`, run by the node's lifecycle hooks). Long-lived single threads (the index
writer, the embedder, the liveness refresher, discovery's HTTP loop) start through
:func:`start`, which names them and keeps them listed (:func:`running`) for diagnosis; each
stops through its own owner's ``stop``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

_pools: dict[str, ThreadPoolExecutor] = {}
_threads: list[threading.Thread] = []
_lock = threading.Lock()


def pool(name: str, workers: int) -> ThreadPoolExecutor:
    """The pool called ``name`` (threads ``name-0``, ``name-1``...), created on first use with
    ``workers`` threads at most; later calls get the same pool."""
    with _lock:
        executor = _pools.get(name)
        if executor is None:
            executor = _pools[name] = ThreadPoolExecutor(
                max_workers=max(1, workers), thread_name_prefix=name
            )
        return executor


def start(name: str, target: Callable[..., Any], *args: Any) -> threading.Thread:
    """Start a named daemon thread running ``target(*args)`` and list it."""
    thread = threading.Thread(target=target, args=args, name=name, daemon=True)
    with _lock:
        _threads[:] = [t for t in _threads if t.is_alive()]
        _threads.append(thread)
    thread.start()
    return thread


def running() -> dict[str, int]:
    """Pool name -> its worker count, and each live listed thread's name -> 1."""
    with _lock:
        found = {name: executor._max_workers for name, executor in _pools.items()}
        found.update({t.name: 1 for t in _threads if t.is_alive()})
    return found


def shutdown() -> None:
    """Stop every pool: queued work is dropped, running work finishes on its own; a pool asked
    for again afterwards is created anew (tests start nodes one after another in a process)."""
    with _lock:
        pools = list(_pools.values())
        _pools.clear()
    for executor in pools:
        executor.shutdown(wait=False, cancel_futures=True)


def discard(name: str) -> None:
    """Stop the pool called ``name`` (as :func:`shutdown` does) and forget it."""
    with _lock:
        executor = _pools.pop(name, None)
    if executor is not None:
        executor.shutdown(wait=False, cancel_futures=True)
