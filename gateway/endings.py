"""Where a call ended, told again after its end: the owner's side of a lost last message.

The entry node detects a lost reply message by the skipped number of the next one
(gateway.inbox.Reassembly); the *last* messages of a call have no next one, and a stream that
lost a message and then goes quiet has none for a while. So the owner remembers, per reply
channel, the calls whose last reply message it published lately, and the calls of several
messages still running, and publishes ``a2a.ended`` (gateway.envelope) on each such channel
every :data:`~gateway.envelope.ENDED_EVERY_SECONDS`: an ended call with the number of its last
message, in :data:`~gateway.envelope.ENDED_REPEATS` beats (a notice lost with the publishing
connection that lost the call's last message is sent again on the next connection), a running
one with the number of the last message whose publish is over (every beat while it runs). One
message per reply channel and beat whatever the number of calls, and nothing at all while no
call runs or ended lately.

Bounded: at most :data:`MAX_CALLS` calls per channel wait for a beat (the oldest go first); the
beat stops when nothing is left.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from typing import Any

from gateway import envelope as env

logger = logging.getLogger(__name__)

#: Calls remembered per reply channel between two beats (at high rates the oldest are dropped:
#: their entry node had them for a beat already, or they are the rare loss left to the timeout).
MAX_CALLS = 50_000


class Endings:
    """The calls that ended lately, by reply channel, for one layer on one event loop."""

    def __init__(self, layer: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.layer = layer
        self.loop = loop
        #: channel -> request id -> (number of the call's last message, beats left)
        self.calls: dict[str, dict[str, list[int]]] = {}
        #: channel -> request id -> the reply sink of a call running (``done``: the number of
        #: its last message published), held weakly: a call that never ends is forgotten
        self.live: dict[str, weakref.WeakValueDictionary[str, Any]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def watch(self, sink: Any) -> None:
        live = self.live.get(sink.channel)
        if live is None:
            live = self.live[sink.channel] = weakref.WeakValueDictionary()
        live[sink.request_id] = sink
        if self._timer is None:
            self._timer = self.loop.call_later(env.ENDED_EVERY_SECONDS, self._beat)

    def ended(self, channel: str, request_id: str, number: int) -> None:
        live = self.live.get(channel)
        if live is not None:
            live.pop(request_id, None)
        calls = self.calls.get(channel)
        if calls is None:
            calls = self.calls[channel] = {}
        calls[request_id] = [number, env.ENDED_REPEATS]
        if len(calls) > MAX_CALLS:
            del calls[next(iter(calls))]
        if self._timer is None:
            self._timer = self.loop.call_later(env.ENDED_EVERY_SECONDS, self._beat)

    def _beat(self) -> None:
        self._timer = None
        for channel in list(self.calls.keys() | self.live.keys()):
            notice: dict[str, int] = {}
            live = self.live.get(channel)
            if live is not None:
                for request_id, sink in list(live.items()):
                    if sink.done:
                        notice[request_id] = sink.done
                if not live:
                    del self.live[channel]
            calls = self.calls.get(channel)
            if calls is not None:
                for request_id, entry in list(calls.items()):
                    notice[request_id] = entry[0]
                    entry[1] -= 1
                    if entry[1] <= 0:
                        del calls[request_id]
                if not calls:
                    del self.calls[channel]
            if notice:
                task = self.loop.create_task(self._send(channel, env.ended(notice)))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        if self.calls or self.live:
            self._timer = self.loop.call_later(env.ENDED_EVERY_SECONDS, self._beat)

    async def _send(self, channel: str, message: dict[str, Any]) -> None:
        try:
            await self.layer.send(channel, message)
        except Exception as exc:  # the broker is down: the next beat tries again
            logger.info("call endings to %s not sent: %s: %s", channel, type(exc).__name__, exc)


_by_layer: weakref.WeakKeyDictionary[Any, Endings] = weakref.WeakKeyDictionary()


def _of(layer: Any) -> Endings:
    loop = asyncio.get_running_loop()
    endings = _by_layer.get(layer)
    if endings is None or endings.loop is not loop:
        endings = _by_layer[layer] = Endings(layer, loop)
    return endings


def ended(layer: Any, channel: str, request_id: str, number: int) -> None:
    """The last reply message of ``request_id`` (number ``number``) was published on
    ``channel`` (its entry node's inbox): tell that node again shortly."""
    _of(layer).ended(channel, request_id, number)


def watch(sink: Any) -> None:
    """A call of several reply messages began (``sink``: its gateway.subscriber.BrokerSink,
    with ``layer``, ``channel``, ``request_id`` and ``done``): tell its entry node, every beat
    while it runs, how far its publishes got."""
    _of(sink.layer).watch(sink)
