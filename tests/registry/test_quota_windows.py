"""The registration window's bounds (registry.quota_windows): a Redis that accepts connections
but never answers costs one registration at most the bounded wait, then the node counts on
its own for a while without asking it, still refusing past the limit; the in-memory window
lets registrations through again once the wait it answered has passed."""

from __future__ import annotations

import socket
import time

from registry import quota_windows


def test_a_silent_redis_costs_the_bounded_wait_then_the_node_counts_alone():
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # accepts (the kernel's backlog), never reads nor answers
    try:
        port = silent.getsockname()[1]
        windows = quota_windows.RedisWindows(f"redis://127.0.0.1:{port}/0", "test")
        started = time.monotonic()
        assert windows.take("acme", 1, 60.0) is None  # counted in memory
        waited = time.monotonic() - started
        assert waited < quota_windows.REDIS_WAIT_SECONDS * 2 + 0.5, waited
        started = time.monotonic()
        wait = windows.take("acme", 1, 60.0)  # Redis not asked again for a while: no wait
        assert wait is not None and 0 < wait <= 120.0
        assert time.monotonic() - started < quota_windows.REDIS_WAIT_SECONDS
    finally:
        silent.close()


def test_the_window_admits_again_after_the_wait_it_answered():
    windows = quota_windows.LocalWindows()
    assert windows.take("acme", 2, 0.5) is None
    assert windows.take("acme", 2, 0.5) is None
    wait = windows.take("acme", 2, 0.5)
    assert wait is not None and wait <= 1.0
    assert windows.take("beta", 2, 0.5) is None  # another tenant's window
    time.sleep(wait + 0.01)
    assert windows.take("acme", 2, 0.5) is None
    assert 0 < windows.used("acme", 0.5) <= 2
