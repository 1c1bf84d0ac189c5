"""The handover protocol on its own (gateway.handover): two subscribers of one agent channel,
the old owner active and a new one taking over, hearing every message in the one order a
pub/sub channel delivers. A Query before the takeover is the old owner's, one after it the new
owner's: none is answered twice, none dropped. Cross-node handovers of real nodes are in
tests/gateway/test_cluster.py and tests/reliability/test_failover.py."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway import envelope as env
from gateway import handover
from gateway.handover import Handover


class Channel:
    """One agent channel: every message reaches every subscriber, in one order, each through
    its own queue (as each process's subscription receives it)."""

    def __init__(self) -> None:
        self.queues: list[asyncio.Queue[dict[str, Any]]] = []
        self.answered: dict[str, list[str]] = {}

    async def publish(self, tags: dict[str, str]) -> None:
        for queue in self.queues:
            queue.put_nowait(tags)

    def subscribe(self, name: str, side: Handover) -> asyncio.Task[None]:
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.queues.append(queue)

        async def receive() -> None:  # what the subscriber's receive loop does with each
            while True:
                tags = await queue.get()
                if env.TAG_NONCE in tags:
                    side.heard(tags)
                elif side.active:
                    self.answered.setdefault(tags["query"], []).append(name)

        return asyncio.get_running_loop().create_task(receive())


async def test_every_query_is_answered_once_across_the_takeover():
    channel = Channel()
    old = Handover("old")
    new = Handover("new")
    tasks = [channel.subscribe("old", old)]
    for n in range(5):
        await channel.publish({"query": f"before-{n}"})
    tasks.append(channel.subscribe("new", new))
    new.standby(channel.publish)
    taking = asyncio.get_running_loop().create_task(new.take_over())
    for n in range(50):  # Queries keep arriving while the signals cross the channel
        await channel.publish({"query": f"during-{n}"})
        await asyncio.sleep(0)
    await asyncio.wait_for(taking, 2)
    for n in range(5):
        await channel.publish({"query": f"after-{n}"})
    await asyncio.sleep(0.05)
    for task in tasks:
        task.cancel()
    assert (old.mode, new.mode) == ("draining", "active")
    assert len(channel.answered) == 60
    assert all(len(names) == 1 for names in channel.answered.values()), channel.answered
    order = [channel.answered[f"during-{n}"][0] for n in range(50)]
    switch = order.index("new") if "new" in order else len(order)
    assert order == ["old"] * switch + ["new"] * (50 - switch)  # one point in the order
    assert {channel.answered[f"after-{n}"][0] for n in range(5)} == {"new"}


async def test_a_new_owner_nobody_hears_goes_active_after_the_signal_time(monkeypatch, caplog):
    monkeypatch.setattr(handover, "HANDOVER_SIGNAL_SECONDS", 0.3)
    sent: list[str] = []

    async def lost(tags: dict[str, str]) -> None:
        sent.append(tags[env.TAG_METHOD])

    new = Handover("new")
    new.standby(lost)
    assert not new.active
    await asyncio.wait_for(new.take_over(), 2)
    assert new.active
    assert set(sent) == {env.PROBE_METHOD}  # it never heard its probe: no takeover sent
    assert "takeover not confirmed" in caplog.text


async def test_an_old_owner_never_told_drains_after_the_signal_time(monkeypatch):
    monkeypatch.setattr(handover, "HANDOVER_SIGNAL_SECONDS", 0.2)
    old = Handover("old")
    await asyncio.wait_for(old.until_taken_over(), 2)
    assert old.draining and not old.active


async def test_its_own_signals_and_repeats_do_not_drain_it():
    async def nowhere(tags: dict[str, str]) -> None:
        pass

    side = Handover("one")
    side.standby(nowhere)
    own = {env.TAG_NONCE: side.nonce}
    assert side.heard({**own, env.TAG_METHOD: env.PROBE_METHOD}) is False
    assert not side.active
    assert side.heard({**own, env.TAG_METHOD: env.TAKEOVER_METHOD}) is False
    assert side.active
    assert side.heard({**own, env.TAG_METHOD: env.TAKEOVER_METHOD}) is False  # a repeat
    assert side.active
    other = {env.TAG_NONCE: "someone-else", env.TAG_METHOD: env.TAKEOVER_METHOD}
    assert side.heard({**other, env.TAG_METHOD: env.PROBE_METHOD}) is False  # a probe: nothing
    assert side.heard(other) is True and side.draining
    assert side.heard(other) is False  # already draining


async def test_an_owner_never_on_standby_takes_no_signal_for_its_own():
    """Only a new owner has a nonce: a signal naming none, or an empty one, is another's."""
    for nonce in (None, ""):
        side = Handover("old")
        assert side.heard({env.TAG_NONCE: nonce, env.TAG_METHOD: env.TAKEOVER_METHOD}) is True
        assert side.draining


async def test_take_over_needs_standby_first():
    with pytest.raises(RuntimeError):
        await Handover("x").take_over()
