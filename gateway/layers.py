"""The embedded mode's channel layer: Channels' in-memory layer, with its expiry sweep made cheap.

``channels.layers.InMemoryChannelLayer`` sweeps every channel for expired messages on every
``receive()`` and ``group_send()``. A node keeps one channel per virtual subscriber (a waiting
``receive()`` holds an empty queue in ``channels``), so with 10,000 agents each call walked
10,000 queues (measured: 5 ms per send/receive pair, which made registrations slow down as the
registry grew). Two bounds fix it:

- the sweep runs at most once per :attr:`SWEEP_INTERVAL_SECONDS` (messages expire after
  ``expiry``, 60 s, anyway: removing them that often is plenty to bound memory);
- it walks only the channels a message was sent to since they were last found empty
  (``_holding``), not every waiting subscriber's empty queue: a channel that never held a
  message has nothing to expire. Still measured at 10,000 agents: walking them all once a
  second was a fifth of the node's CPU under a registration burst.

``_clean_expired`` is a private Channels method: tests/gateway/test_layers.py fails if a
Channels release renames it or stops calling it from ``receive()``/``group_send()``.
"""

from __future__ import annotations

import time
from typing import Any

from channels.layers import InMemoryChannelLayer as _InMemoryChannelLayer


class InMemoryChannelLayer(_InMemoryChannelLayer):
    SWEEP_INTERVAL_SECONDS = 1.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._next_sweep = 0.0
        self._holding: set[str] = set()  # channels sent to since last seen empty

    async def send(self, channel: str, message: dict[str, Any]) -> None:
        await super().send(channel, message)
        self._holding.add(channel)  # after the put: a refused send (ChannelFull) adds nothing new

    async def flush(self) -> None:
        await super().flush()
        self._holding.clear()

    def _clean_expired(self) -> None:
        now = time.monotonic()
        if now < self._next_sweep:
            return
        self._next_sweep = now + self.SWEEP_INTERVAL_SECONDS
        # Channels' own sweep (same expiry rules), shown only the channels that may hold a
        # message; a channel it forgets (emptied by expiry) is forgotten here too.
        everything = self.channels  # type: ignore[has-type]  # untyped in Channels
        before = {name: everything[name] for name in self._holding if name in everything}
        self.channels = dict(before)
        try:
            super()._clean_expired()
        finally:
            kept, self.channels = self.channels, everything
        for name, queue in before.items():
            if name not in kept and everything.get(name) is queue:
                del everything[name]
        self._holding = {name for name in self._holding
                         if name in everything and not everything[name].empty()}
