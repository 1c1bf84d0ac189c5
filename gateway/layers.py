"""The embedded mode's channel layer: Channels' in-memory layer, with its expiry sweep throttled.

``channels.layers.InMemoryChannelLayer`` sweeps every channel for expired messages on every
``receive()`` and ``group_send()``. A node keeps one channel per virtual subscriber, so with 10,000
agents each call walked 10,000 queues (measured: 5 ms per send/receive pair, which made
registrations slow down as the registry grew). Expired messages only need removing often
enough to bound memory: once per :attr:`SWEEP_INTERVAL_SECONDS` is plenty, since messages
expire after ``expiry`` (60 s) anyway.

``_clean_expired`` is a private Channels method: tests/gateway/test_layers.py fails if a
Channels release renames it or stops calling it from ``receive()``/``group_send()``.
"""

from __future__ import annotations

import time

from channels.layers import InMemoryChannelLayer as _InMemoryChannelLayer


class InMemoryChannelLayer(_InMemoryChannelLayer):
    SWEEP_INTERVAL_SECONDS = 1.0

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._next_sweep = 0.0

    def _clean_expired(self) -> None:
        now = time.monotonic()
        if now < self._next_sweep:
            return
        self._next_sweep = now + self.SWEEP_INTERVAL_SECONDS
        super()._clean_expired()
