"""The handover protocol: an agent's ownership moving between two live nodes.

Handover (ownership moving between two live nodes on a pub/sub layer, ``direct`` or ``pubsub``,
where every process receiving on ``_AGENTS_.{agent_id}`` gets every message): for a while both
the old owner's and the new owner's subscriber receive on the channel, and each Query must be
executed by exactly one of them. Redis delivers a channel's messages to all its subscribers in
one order, so the new owner marks a point in that order:

1. The new subscriber starts in *standby*: it receives, but drops the Queries it gets through
   the broker (the old owner, still active, answers them).
2. It publishes ``a2a_probe`` (with a nonce of its own) until it receives its own probe: its
   subscription is then in place. It publishes ``a2a_takeover`` once.
3. Every subscriber sees the takeover at the same place among the Queries. The new one becomes
   *active* when it receives its own takeover: it answers every Query after it. The old one,
   on a takeover that is not its own, becomes *draining*: it answers no Query after it (the new
   one does), keeps serving the control messages of its own streams (``stream_cancel``,
   ``stream_credit``, ``stream_resume``), lets its in-flight calls finish, then unsubscribes.

So a Query before the takeover is the old owner's, one after it the new owner's: none runs
twice, none is dropped. The local fast path is never affected (a Query handed over in-process
never went through the channel). Bounds: a new subscriber that never hears its own takeover
goes active after ``HANDOVER_SIGNAL_SECONDS``; an old one never told drains after the same
time; draining ends after ``A2A_HANDOVER_TIMEOUT_SECONDS`` (what still runs is cancelled).

:class:`Handover` is one subscriber's side of it (its mode, the signals it publishes and hears);
the subscriber (gateway.subscriber) decides by :attr:`Handover.active` whether it answers a
Query that came through the broker, and drains its calls once :attr:`Handover.draining`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from gateway import envelope as env

logger = logging.getLogger(__name__)

#: How long a new subscriber waits to hear its own takeover (else it goes active), and how long
#: an old one keeps answering while waiting for the takeover (else it drains).
HANDOVER_SIGNAL_SECONDS = 5.0
#: The interval of a standby subscriber's probes until it hears one.
PROBE_INTERVAL_SECONDS = 0.1
ACTIVE, STANDBY, DRAINING = "active", "standby", "draining"

# Nonces: this process's random prefix and a counter (a node creates one subscriber per agent
# registered; a uuid4 each cost a system call).
_NONCE_PREFIX = uuid.uuid4().hex[:16]
_nonces = itertools.count()

#: Publishes one control message's tags on the agent's channel (errors handled by it).
Publish = Callable[[dict[str, str]], Awaitable[None]]


class Handover:
    """One subscriber's mode in the protocol: ``active`` (answers Queries from the broker),
    ``standby`` (a new owner before its takeover) or ``draining`` (an old owner after a new
    owner's takeover)."""

    # A node holds one per agent it owns and almost all of them stay active for life: what
    # only a new owner needs (its publish callable, its nonce, its two events) is made by
    # :meth:`standby`, so an active one is 80 bytes (scale bench: 10,000 subscribers).
    __slots__ = ("name", "publish", "mode", "nonce", "_probe_heard", "_takeover_heard")

    def __init__(self, name: str) -> None:
        self.name = name
        self.mode = ACTIVE
        self.publish: Publish | None = None
        self.nonce: str | None = None
        self._probe_heard: asyncio.Event | None = None
        self._takeover_heard: asyncio.Event | None = None

    @property
    def active(self) -> bool:
        return self.mode == ACTIVE

    @property
    def draining(self) -> bool:
        return self.mode == DRAINING

    def standby(self, publish: Publish) -> None:
        """A new owner, from the moment it subscribes: it answers no Query from the broker until
        :meth:`take_over` hears its takeover, signalled through ``publish``."""
        self.mode = STANDBY
        self.publish = publish
        self.nonce = f"{_NONCE_PREFIX}{next(_nonces):x}"  # unique per subscriber ever made
        self._probe_heard = asyncio.Event()
        self._takeover_heard = asyncio.Event()

    async def take_over(self) -> None:
        """A new owner in standby: probe until its subscription hears its own probe, publish
        the takeover, go active when it comes back (or after HANDOVER_SIGNAL_SECONDS)."""
        probe_heard, takeover_heard = self._probe_heard, self._takeover_heard
        publish, nonce = self.publish, self.nonce
        if probe_heard is None or takeover_heard is None or publish is None or nonce is None:
            raise RuntimeError("take_over() without standby()")
        base = {env.TAG_NONCE: nonce, env.TAG_REQUEST_ID: "", env.TAG_REPLY_CHANNEL: ""}
        try:
            async with asyncio.timeout(HANDOVER_SIGNAL_SECONDS):
                while not probe_heard.is_set():
                    await publish({**base, env.TAG_METHOD: env.PROBE_METHOD})
                    try:
                        async with asyncio.timeout(PROBE_INTERVAL_SECONDS):
                            await probe_heard.wait()
                    except TimeoutError:
                        pass
                await publish({**base, env.TAG_METHOD: env.TAKEOVER_METHOD})
                await takeover_heard.wait()
        except TimeoutError:
            logger.warning("%s: takeover not confirmed in %g s; going active", self.name,
                           HANDOVER_SIGNAL_SECONDS)
        if self.mode == STANDBY:
            self.mode = ACTIVE

    def heard(self, tags: dict[str, Any]) -> bool:
        """A control message received on the channel. True when it made this subscriber start
        draining (another subscriber's takeover)."""
        method = tags.get(env.TAG_METHOD)
        mine = self.nonce is not None and tags.get(env.TAG_NONCE) == self.nonce
        if method == env.PROBE_METHOD:
            if mine and self._probe_heard is not None:
                self._probe_heard.set()
            return False
        if mine:
            if self.mode == STANDBY:
                self.mode = ACTIVE
            if self._takeover_heard is not None:
                self._takeover_heard.set()
            return False
        if self.mode == DRAINING:
            return False
        logger.info("%s: taken over by another node; draining", self.name)
        self.mode = DRAINING
        return True

    async def until_taken_over(self) -> None:
        """An old owner told its agent moved: wait for the new owner's takeover (at most
        HANDOVER_SIGNAL_SECONDS, answering meanwhile), then be draining."""
        try:
            async with asyncio.timeout(HANDOVER_SIGNAL_SECONDS):
                while self.mode != DRAINING:
                    await asyncio.sleep(0.05)
        except TimeoutError:
            self.mode = DRAINING
