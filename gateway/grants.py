"""A node-wide bound on what Redis holds for one entry node: grants for the pieces of large replies.

A reply message larger than ``PIECE_BYTES`` crosses the broker as the message with its first
piece and the pieces that follow (gateway.envelope). A stream's pieces cross at most a window
ahead of what the entry node took, but that bounds each call, not their sum: twenty large sync
answers to one entry node at once, published faster than it reads, would pile up in Redis's
output buffer for its subscription until Redis closes it (``client-output-buffer-limit pubsub
32mb 8mb 60``), failing every call crossing it.

So the entry node *grants* the pieces (its Query's ``a2a_grant`` tag): the owner publishes the
pieces of a call's large messages only as far as that call was granted (cumulative bytes, raised
by ``stream_credit`` messages carrying ``a2a_granted``), and the entry node grants from one
:class:`Budget` of ``A2A_BROKER_INFLIGHT_BYTES`` for all its calls: a grant is bytes Redis may
hold for it, given back as the pieces arrive. A call holds at most :attr:`Budget.step`
ungranted-but-unreceived bytes at once and the calls wanting more are served in turn, so one
huge answer never starves the others. When the budget is spent the owners wait (and stop
reading the agents); an owner that waits longer than the call may take gives up the rest of the
message, and the entry node ends the call as it ends any reply with messages missing.

Entry side: :class:`Budget` and one :class:`CallGrant` per call (joined to the call's
gateway.inbox.Reassembly). Owner side: :class:`Allowance`, one per call whose Query carries the
tag (gateway.subscriber.BrokerSink waits on it before each piece).
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections import deque
from typing import Any

from gateway import envelope as env
from gateway.conf import NodeSettings

logger = logging.getLogger(__name__)

#: The most one call may hold of the budget at once.
STEP_BYTES = 1024 * 1024


class Budget:
    """The entry node's budget of bytes in flight through Redis towards it (pieces granted and
    not yet taken from its subscription), shared by all its calls."""

    __slots__ = ("total", "free", "step", "queue", "layer")

    def __init__(self, total: int, layer: Any) -> None:
        self.total = total
        self.free = total
        self.layer = layer
        # A call may hold a quarter of the budget (at most STEP_BYTES), in whole pieces.
        self.step = max(env.PIECE_BYTES,
                        min(total // 4, STEP_BYTES) // env.PIECE_BYTES * env.PIECE_BYTES)
        self.queue: deque[CallGrant] = deque()

    def call(self, request_id: str, channel: str) -> CallGrant:
        """The grant of a new call (its pieces come from the owner subscribed to ``channel``)."""
        return CallGrant(self, request_id, channel)

    @property
    def in_flight(self) -> int:
        return self.total - self.free

    def ask(self, call: CallGrant) -> None:
        if not call.queued:
            call.queued = True
            self.queue.append(call)
        self.serve()

    def give_back(self, size: int) -> None:
        if size > 0:
            self.free += size
            if self.queue:
                self.serve()

    def serve(self) -> None:
        queue, piece = self.queue, env.PIECE_BYTES  # partial grants: at least a piece
        while queue:
            call = queue[0]
            wants = 0 if call.closed else min(call.needed - call.granted,
                                              self.step - call.outstanding)
            if wants <= 0:
                queue.popleft()
                call.queued = False
                continue
            size = min(wants, self.free)
            if size < min(wants, piece):
                return  # spent: served again as pieces arrive or calls end
            queue.popleft()
            call.queued = False
            self.free -= size
            call.granted += size
            call.send()
            if call.wanting():
                call.queued = True
                queue.append(call)


class CallGrant:
    """One call's grants (entry side): what the owner may send of its pieces, what came."""

    __slots__ = ("budget", "request_id", "channel", "granted", "received", "needed",
                 "reported", "queued", "closed", "_sending")

    def __init__(self, budget: Budget, request_id: str, channel: str) -> None:
        self.budget = budget
        self.request_id = request_id
        self.channel = channel
        self.granted = 0  # cumulative piece bytes the owner may send
        self.received = 0  # cumulative piece bytes taken from the broker
        self.needed = 0  # cumulative piece bytes announced (an upper bound until complete)
        self.reported = 0
        self.queued = False
        self.closed = False
        self._sending = False

    @property
    def outstanding(self) -> int:
        return max(self.granted - self.received, 0)

    def wanting(self) -> bool:
        return (not self.closed and self.needed > self.granted
                and self.outstanding <= self.budget.step // 2)

    def announced(self, pieces: int) -> None:
        """A message announced ``pieces`` pieces (at most ``PIECE_BYTES`` each)."""
        self.needed = max(self.needed, self.received) + pieces * env.PIECE_BYTES
        if self.wanting():
            self.budget.ask(self)

    def took(self, size: int) -> None:
        """A piece of ``size`` bytes came: what it held of the budget is free again."""
        freed = min(size, self.outstanding)
        self.received += size
        self.budget.give_back(freed)
        if self.wanting():
            self.budget.ask(self)

    def complete(self) -> None:
        """The pieced message is whole: what was announced beyond its size is not needed."""
        self.needed = self.received

    def close(self) -> None:
        """The call ended here: its grants not used yet go back to the budget."""
        if not self.closed:
            self.closed = True
            self.budget.give_back(self.outstanding)
            self.granted = self.received

    def send(self) -> None:
        if self._sending or self.closed:
            return
        self._sending = True
        task = asyncio.get_running_loop().create_task(self._send())
        _tasks.add(task)
        task.add_done_callback(_tasks.discard)

    async def _send(self) -> None:
        try:
            while self.granted > self.reported and not self.closed:
                self.reported = granted = self.granted
                message = env.query(b"", {
                    env.TAG_METHOD: env.CREDIT_METHOD,
                    env.TAG_STREAM_ID: self.request_id,
                    env.TAG_GRANTED: str(granted),
                    env.TAG_REQUEST_ID: self.request_id + ".grant",
                    env.TAG_REPLY_CHANNEL: "",
                })
                try:
                    await self.budget.layer.send(self.channel, message)
                except Exception as exc:  # the owner's wait is bounded; the call ends on its own
                    logger.warning("piece grant not delivered: %s", exc)
        finally:
            self._sending = False


_tasks: set[asyncio.Task[None]] = set()


# --- the owner's side ----------------------------------------------------------------------


class Allowance:
    """What the entry node allows of one call's pieces (owner side)."""

    __slots__ = ("granted", "used", "timeout", "refused", "_waiter", "__weakref__")

    def __init__(self, granted: int, timeout: float) -> None:
        self.granted = granted
        self.used = 0
        self.timeout = timeout
        self.refused = False
        self._waiter: asyncio.Future[None] | None = None

    def grant(self, total: int) -> None:
        if total > self.granted:
            self.granted = total
            waiter = self._waiter
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

    async def take(self, size: int) -> bool:
        """Wait until a piece of ``size`` bytes is allowed (bounded). False: no grant came in
        time; this and every later piece of the call are not sent."""
        if self.refused:
            return False
        if self.used + size > self.granted:
            try:
                async with asyncio.timeout(self.timeout):
                    while self.used + size > self.granted:
                        self._waiter = asyncio.get_running_loop().create_future()
                        try:
                            await self._waiter
                        finally:
                            self._waiter = None
            except TimeoutError:
                self.refused = True
                logger.warning("no piece grant for %g s: the rest of a reply is not sent",
                               self.timeout)
                return False
        self.used += size
        return True


#: The allowances of calls in flight, by request id (gone with their reply's sink).
_allowances: weakref.WeakValueDictionary[str, Allowance] = weakref.WeakValueDictionary()


def allowance(tags: dict[str, Any], request_id: str,
              settings: NodeSettings) -> Allowance | None:
    """The Query's allowance, if its entry node grants pieces (``a2a_grant``), else None. Its
    wait for a grant is bounded by what the call may take at the entry node: a stream's stall
    timeout, a sync call's timeout (plus the gateway's buffer either way)."""
    value = tags.get(env.TAG_GRANT)
    if value is None:
        return None
    try:
        granted = max(int(value), 0)
    except (TypeError, ValueError):
        return None
    if tags.get(env.TAG_METHOD) in env.STREAMING_METHODS \
            or tags.get(env.TAG_METHOD) == env.RESUME_METHOD:
        timeout = settings.A2A_SSE_STALL_TIMEOUT_SECONDS
    else:
        try:
            timeout = float(tags.get(env.TAG_TIMEOUT) or settings.A2A_DEFAULT_TIMEOUT_SECONDS)
        except ValueError:
            timeout = settings.A2A_DEFAULT_TIMEOUT_SECONDS
    timeout = min(timeout, settings.A2A_MAX_TIMEOUT_SECONDS) \
        + settings.A2A_GATEWAY_TIMEOUT_BUFFER_SECONDS
    found = _allowances[request_id] = Allowance(granted, timeout)
    return found


def credit(tags: dict[str, Any]) -> None:
    """A ``stream_credit`` carrying ``a2a_granted``: raise that call's allowance."""
    value = tags.get(env.TAG_GRANTED)
    if value is None:
        return
    found = _allowances.get(tags.get(env.TAG_STREAM_ID) or "")
    if found is not None:
        try:
            found.grant(int(value))
        except (TypeError, ValueError):
            pass
