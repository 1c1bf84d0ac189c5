"""The embedded channel layer: same semantics as Channels' in-memory layer, cheap at scale."""

import asyncio

from gateway.layers import InMemoryChannelLayer


async def test_delivers_and_still_expires_messages():
    layer = InMemoryChannelLayer(expiry=0.05, capacity=100)
    await layer.send("_AGENTS_.a", {"type": "one"})
    assert (await layer.receive("_AGENTS_.a"))["type"] == "one"
    await layer.send("_AGENTS_.stale", {"type": "old"})
    await asyncio.sleep(0.1)
    layer._next_sweep = 0  # the next receive sweeps
    await layer.send("_AGENTS_.b", {"type": "two"})
    assert (await layer.receive("_AGENTS_.b"))["type"] == "two"
    assert "_AGENTS_.stale" not in layer.channels


async def test_sweep_runs_at_most_once_per_interval():
    layer = InMemoryChannelLayer(capacity=100)
    sweeps = 0
    original = InMemoryChannelLayer.__mro__[1]._clean_expired

    def counting(self):
        nonlocal sweeps
        sweeps += 1
        original(self)

    InMemoryChannelLayer.__mro__[1]._clean_expired = counting
    try:
        for i in range(50):
            await layer.send(f"_AGENTS_.c{i}", {"type": "x"})
            assert (await layer.receive(f"_AGENTS_.c{i}"))["type"] == "x"
    finally:
        InMemoryChannelLayer.__mro__[1]._clean_expired = original
    assert sweeps == 1


def test_channels_still_has_the_private_hook_we_override():
    """gateway.layers overrides Channels' private ``_clean_expired``. If a Channels release
    renames it or stops calling it from receive()/group_send(), the override silently does nothing
    (and the O(channels) sweep is back on every call): this test fails loudly instead."""
    import inspect

    from channels.layers import InMemoryChannelLayer as ChannelsLayer

    assert callable(getattr(ChannelsLayer, "_clean_expired", None)), (
        "channels.layers.InMemoryChannelLayer._clean_expired is gone: revisit gateway/layers.py"
    )
    for method in ("receive", "group_send"):
        source = inspect.getsource(getattr(ChannelsLayer, method))
        assert "self._clean_expired()" in source, (
            f"Channels' {method}() no longer calls _clean_expired: revisit gateway/layers.py"
        )
    assert InMemoryChannelLayer._clean_expired is not ChannelsLayer._clean_expired


async def test_the_sweep_skips_waiting_receivers_and_still_expires_what_was_sent():
    """Waiting subscribers' empty queues are not walked; a channel that held a message is, until
    it is empty again (then it is not walked either)."""
    layer = InMemoryChannelLayer(expiry=0.05, capacity=100)
    waiters = [asyncio.create_task(layer.receive(f"_AGENTS_.w{i}")) for i in range(100)]
    await asyncio.sleep(0)
    assert len(layer.channels) == 100 and not layer._holding
    await layer.send("_AGENTS_.w7", {"type": "for-w7"})
    await layer.send("_AGENTS_.nobody", {"type": "stale"})
    assert (await waiters[7])["type"] == "for-w7"
    assert layer._holding == {"_AGENTS_.w7", "_AGENTS_.nobody"}
    await asyncio.sleep(0.1)
    walked: list[int] = []
    original = InMemoryChannelLayer.__mro__[1]._clean_expired

    def counting(self):
        walked.append(len(self.channels))
        original(self)

    InMemoryChannelLayer.__mro__[1]._clean_expired = counting
    try:
        layer._next_sweep = 0
        layer._clean_expired()
    finally:
        InMemoryChannelLayer.__mro__[1]._clean_expired = original
    assert walked == [1]  # only the channel holding a message, not the 99 waiting receivers
    assert "_AGENTS_.nobody" not in layer.channels  # expired and dropped, as Channels does
    assert not layer._holding  # both empty now: neither is walked again
    assert len(layer.channels) == 99  # the other receivers still wait
    for task in waiters:
        task.cancel()
    await asyncio.gather(*waiters, return_exceptions=True)
