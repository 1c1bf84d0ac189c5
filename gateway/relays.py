"""The relays of an admitted call's replies from the agent's subscriber to the caller's
:class:`~gateway.exchange.Exchange`: a sync call through the broker (:func:`remote_sync`), and
a stream (:func:`relay_stream`) -- locally or through the broker, with its flow control
(:class:`_Credit`), its cancellation when the caller leaves, and the re-attach of a resumable
stream after a gap (:class:`_Reattach`)."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from gateway import envelope as env
from gateway import errors
from gateway.bodies import Receive
from gateway.exchange import Exchange, discard
from gateway.inbox import STREAM_GAP, Reassembly
from gateway.liveness import BROKER_LOST, OWNER_LOST
from gateway.replicator import ORIGIN
from gateway.resume import STREAM_ID_HEADER
from gateway.sse import OVERFLOW, StreamBuffer, flow_controlled
from registry.ids import agent_channel

if TYPE_CHECKING:
    from gateway.runtime import GatewayNode
    from gateway.subscriber import VirtualSubscriber

logger = logging.getLogger(__name__)

#: How long a Query sent through the broker may go without any sign of life from the
#: subscriber (a reply or an ack) before the gateway answers `unreachable`.
ACK_TIMEOUT_SECONDS = 3.0
#: The ``stream_gap`` error's message (after its prefix).
GAP_DETAIL = "reply messages between the nodes were lost; events may be missing"
#: Numbers the gateway's request ids and the ids of the JSON-RPC requests it makes itself.
request_numbers = itertools.count(1)
_ORIGIN = ORIGIN[:12]  # request ids are unique per process and across nodes


def new_request_id() -> str:
    """A request id (the envelope's ``a2a_request_id``), unique per process and across
    nodes."""
    return f"{_ORIGIN}.{next(request_numbers)}"


async def remote_sync(node: GatewayNode, query: dict[str, Any], exchange: Exchange, wait: float,
                      owner: str) -> None:
    """Send the Query through the broker and relay the reply messages as they come. The call
    ends at once (``owner_lost``) if the owning node is found dead meanwhile."""
    tags = query["tags"]
    request_id = tags[env.TAG_REQUEST_ID]
    # Bounded: an agent answering a sync method with an endless event stream, to a caller that
    # does not read, must not grow this node (replies beyond the response cap end the call).
    queue = StreamBuffer(node.settings.A2A_MAX_RESPONSE_BYTES)
    received = await _send_query(node, query, queue, exchange)
    if received is None:
        return
    _track_call(node, owner, request_id, queue.push)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    acked = False
    try:
        while not exchange.done:
            remaining = deadline - loop.time()
            limit = remaining if acked else min(remaining, ACK_TIMEOUT_SECONDS)
            try:
                async with asyncio.timeout(max(limit, 0.0)):
                    message = await queue.get()
            except TimeoutError:
                if not acked and remaining > ACK_TIMEOUT_SECONDS:
                    # No subscriber acknowledged it. With a checked send one received it (a
                    # loaded owner, or one in a handover's standby): it may have run, so never
                    # executed false then.
                    await exchange.fail(errors.UNREACHABLE, "no live subscriber for this agent",
                                        executed=received)
                else:  # the subscriber had it: the agent may have it (a reply lost between nodes)
                    await exchange.fail(errors.TIMEOUT, executed=True)
                return
            if message is OVERFLOW:  # the agent's answer outgrew the cap: it had the request
                await exchange.fail(errors.RESPONSE_TOO_LARGE, executed=True)
                return
            if message is OWNER_LOST:
                # The Query was published while the owner was up: it may have reached the
                # agent (acked or not yet), so executed is true (docs/operations.md).
                await exchange.fail(errors.OWNER_LOST, f"node {owner} died during the call",
                                    executed=True)
                return
            if message is BROKER_LOST:  # the reply may be lost with the connection
                await exchange.fail(errors.BROKER_LOST, node.broker_lost_detail, executed=True)
                return
            if message is STREAM_GAP:  # part of the reply was lost between the nodes
                await exchange.fail(errors.STREAM_GAP, GAP_DETAIL, executed=True)
                return
            acked = True
            await exchange.deliver(message)
    finally:
        node.inbox.pending.pop(request_id, None)
        _forget_call(node, owner, request_id)


def _track_call(node: GatewayNode, owner: str, request_id: str,
                push: Callable[[dict[str, Any]], None]) -> None:
    """The call's buffer, fed whatever its owner sends for it (until :func:`_forget_call`)."""
    node.inflight.setdefault(owner, {})[request_id] = push


def _forget_call(node: GatewayNode, owner: str, request_id: str) -> None:
    calls = node.inflight.get(owner)
    if calls is not None:
        calls.pop(request_id, None)
        if not calls and node.inflight.get(owner) is calls:
            del node.inflight[owner]


_PIECES = str(env.PIECE_BYTES)


async def _send_query(node: GatewayNode, query: dict[str, Any], queue: StreamBuffer,
                      exchange: Exchange,
                      credit: _Credit | None = None) -> bool | None:
    """Publish the Query on the agent's channel. None: refused and answered (no broker, or
    nobody listens); True: a subscriber received it (a checked send); False: sent, and
    whether anyone received it is unknown (channels-redis's layers) until an ack comes."""
    tags = query["tags"]
    if not node.inbox.ready:
        await exchange.fail(errors.UNREACHABLE, "broker unavailable")
        return None
    try:
        listeners = await _publish(node, query, queue, exchange, credit)
    except Exception as exc:  # broker down: answer at once, never queue
        await exchange.fail(errors.UNREACHABLE, f"broker unavailable: {type(exc).__name__}")
        return None
    # A checked send (gateway.redis_layer returns how many processes got it; channels-redis's
    # layers return None, and the missing ack answers instead, after ACK_TIMEOUT_SECONDS).
    if listeners == 0:
        node.inbox.pending.pop(tags[env.TAG_REQUEST_ID], None)
        await exchange.fail(errors.UNREACHABLE, "no live subscriber for this agent")
        return None
    if listeners is None:
        return False
    if listeners > 1:
        logger.warning("%d subscribers got the query for %s: more than one owner",
                       listeners, exchange.agent_id)
    return True


async def _publish(node: GatewayNode, query: dict[str, Any], buffer: StreamBuffer,
                   exchange: Exchange, credit: _Credit | None) -> int | None:
    """Publish the Query on the agent's channel (the inbox ready), its answer expected into
    ``buffer``: how many subscribers got it (None: unknown). Raises, the expected answer
    dropped, when the broker refuses."""
    tags = query["tags"]
    channel = node.inbox.channel
    assert channel is not None  # the inbox is ready: it has its channel
    tags[env.TAG_REPLY_CHANNEL] = channel
    # Numbered, large bodies in pieces (gateway.envelope): joined in order here, and a lost
    # message ends the call.
    tags[env.TAG_PIECES] = _PIECES
    reassembly = Reassembly(buffer.put_nowait, buffer.push,
                            node.settings.A2A_MAX_RESPONSE_BYTES + env.PIECE_BYTES)
    if credit is not None:
        reassembly.on_piece = credit.received
    node.inbox.expect(tags, reassembly, exchange.agent_id)
    try:
        listeners: int | None = await node.layer.send(agent_channel(exchange.agent_id), query)
    except Exception:
        node.inbox.pending.pop(tags[env.TAG_REQUEST_ID], None)
        raise
    return listeners


_DISCONNECT: dict[str, Any] = {"k": "disconnect"}
_REVOKED: dict[str, Any] = {"k": "revoked"}


async def relay_stream(node: GatewayNode, subscriber: VirtualSubscriber | None,
                       query: dict[str, Any], exchange: Exchange, receive: Receive,
                       owner: str) -> None:
    """Relay a stream: reply messages in, SSE (or an up-front JSON answer) out, while watching
    for the caller going away (then the subscriber is told to cancel the stream).

    Backpressure end to end: at most ``A2A_SSE_BUFFER_BYTES`` wait for the caller
    (:class:`~gateway.sse.StreamBuffer`); the local subscriber waits for room, and through the
    broker the owner sends at most that window ahead of what the caller has read (``stream_credit``
    messages move it on), so the agent is no longer read while the caller lags. A caller whose
    connection takes nothing for ``A2A_SSE_STALL_TIMEOUT_SECONDS`` gets a terminal
    ``stream_stalled`` error event and the stream is freed on both sides.

    Through the broker, the owning node dying ends the stream with ``owner_lost`` as soon as
    its liveness key expires, or once an event stream misses two keepalives, whichever first;
    this node losing its connection to the broker ends it at once with ``broker_lost``; a reply
    message lost between the nodes (gateway.inbox.Reassembly) ends it with ``stream_gap``, or,
    for a resumable stream, re-attaches it after the last event relayed (:class:`_Reattach`).
    """
    tags = query["tags"]
    request_id = tags[env.TAG_REQUEST_ID]
    settings = node.settings
    window = settings.A2A_SSE_BUFFER_BYTES
    stall = settings.A2A_SSE_STALL_TIMEOUT_SECONDS
    buffer = StreamBuffer(window)
    remote = subscriber is None or not settings.A2A_LOCAL_FAST_PATH
    credit: _Credit | None = None
    received: bool | None = None
    if remote:
        tags[env.TAG_WINDOW] = str(window)
        credit = _Credit(node, query, exchange.agent_id, window)
        received = await _send_query(node, query, buffer, exchange, credit)
        if received is None:
            return
        _track_call(node, owner, request_id, buffer.push)
    else:
        assert subscriber is not None  # not remote: the subscriber is in this process
        await subscriber.handle(query, buffer.put, local=True)
    exchange.send = flow_controlled(exchange.send)

    gone = False

    async def watch() -> None:
        nonlocal gone
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                gone = True  # handled before anything still buffered for the caller
                buffer.push(_DISCONNECT)
                return

    stopped = False

    async def stop() -> None:
        nonlocal stopped
        stopped = True
        if not remote:
            buffer.close()  # a resumable stream's writer must not wait on a caller who left
        await _cancel_stream(node, subscriber, query, exchange.agent_id, remote)

    loop = asyncio.get_running_loop()
    watcher = loop.create_task(watch())
    # A client revoked while its stream is open: the stream ends within the cache delay.
    unwatch = node.tokens.watch_client(tags.get(env.TAG_CALLER, ""),
                                       lambda: buffer.push(_REVOKED))
    buffer_seconds = settings.A2A_GATEWAY_TIMEOUT_BUFFER_SECONDS
    guard = settings.A2A_SSE_IDLE_TIMEOUT_SECONDS + buffer_seconds
    # An event stream relayed through the broker gets a keepalive at least every
    # A2A_SSE_KEEPALIVE_SECONDS from its owner: two missed ones mean the owner is gone.
    missed = 2 * settings.A2A_SSE_KEEPALIVE_SECONDS + buffer_seconds
    acked = not remote
    # Resumable streams through the broker: what a re-attach after a gap needs.
    reattach = _Reattach(tags) if remote and settings.A2A_SSE_RESUME_SECONDS > 0 \
        and tags.get(env.TAG_METHOD) != env.RESUME_METHOD else None
    resuming = False  # re-attached: the owner's start is not relayed again

    async def resume_stream(*, outage: bool) -> bool:
        """Re-attach a resumable stream after the last event relayed (docs/streams.md):
        a ``stream_resume`` of a new request replaces the current one. ``outage``: the broker
        was lost; wait (at most REATTACH_SECONDS) until this node is subscribed again and the
        owner listens. False: not resumable here, or it could not be sent."""
        nonlocal query, tags, request_id, buffer, credit, stopped, resuming, acked
        if reattach is None or not reattach.last or reattach.tries >= REATTACH_TRIES \
                or not exchange.started:
            return False
        reattach.tries += 1
        node.inbox.pending.pop(request_id, None)
        _forget_call(node, owner, request_id)
        if not outage or not reattach.until:  # one wait per outage, whatever the tries
            reattach.until = loop.time() + REATTACH_SECONDS
        deadline = reattach.until
        while True:
            if gone:
                return False
            if not outage or _subscribed(node):
                query = reattach.query(query)
                tags = query["tags"]
                request_id = tags[env.TAG_REQUEST_ID]
                buffer = StreamBuffer(window)
                credit = _Credit(node, query, exchange.agent_id, window)
                if await _reattach(node, query, buffer, credit, exchange):
                    break
                if not outage:
                    return False
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(0.25)
        stopped = False
        resuming = True
        acked = False
        _track_call(node, owner, request_id, buffer.push)
        return True

    try:
        while not exchange.done:
            if not acked:
                limit = ACK_TIMEOUT_SECONDS
            elif remote and exchange.sse:
                limit = min(guard, missed)
            else:
                limit = guard
            try:
                async with asyncio.timeout(limit):
                    message = await buffer.get()
            except TimeoutError:
                if resuming and not acked and await resume_stream(outage=True):
                    continue  # the re-attach's answer was lost too (the broker was not back)
                if remote and exchange.sse and limit < guard:
                    await exchange.fail(errors.OWNER_LOST, "two keepalives missed",
                                        executed=True)
                elif exchange.started:
                    await exchange.fail(errors.TIMEOUT, "stream lost")
                else:
                    await exchange.fail(errors.UNREACHABLE if not acked else errors.TIMEOUT,
                                        "no live subscriber for this agent",
                                        executed=acked or bool(received))
                await stop()
                return
            if message is _DISCONNECT or gone:
                exchange.outcome = "client_disconnect"
                await stop()
                return
            if message is OVERFLOW:
                await stop()
                await _end_stalled(exchange, stall,
                                   f"more than {window} bytes buffered for the caller")
                return
            if message is OWNER_LOST:
                # Published while the owner was up: it may have reached the agent.
                await exchange.fail(errors.OWNER_LOST, f"node {owner} died during the stream",
                                    executed=True)
                return
            if message is BROKER_LOST:
                # Events published while the connection was down are gone: never relay around
                # that gap. A resumable stream is re-attached once the broker is back (within
                # REATTACH_SECONDS); else it ends now, and the owner is told to cancel (if
                # Redis is back by then).
                if reattach is not None:
                    reattach.until = 0.0  # a new outage: a new wait
                if await resume_stream(outage=True):
                    continue
                await exchange.fail(errors.BROKER_LOST, node.broker_lost_detail, executed=True)
                await stop()
                return
            if message is STREAM_GAP or (resuming and message.get("k") == env.ERROR):
                # A message from the owner went missing (its number skipped): never relay
                # around it. A resumable stream is re-attached after the last event relayed
                # (the owner's replay buffer has the rest); else, or if that fails, the stream
                # ends saying events may be missing, and the owner's stream is cancelled.
                await stop()
                if message is STREAM_GAP and await resume_stream(outage=False):
                    continue
                await exchange.fail(errors.STREAM_GAP, GAP_DETAIL, executed=True)
                return
            if resuming:
                if message.get("k") == env.START:
                    continue  # the caller has the response's start already
                resuming = False
            if message is _REVOKED:
                await stop()
                try:  # a terminal error event, if the caller's connection takes one
                    async with asyncio.timeout(min(max(stall, 1.0), 5.0)):
                        await exchange.fail(errors.UNAUTHENTICATED, "token revoked")
                except TimeoutError:
                    pass
                return
            acked = True
            try:
                async with asyncio.timeout(stall):
                    await exchange.deliver(message)
            except TimeoutError:
                await stop()
                await _end_stalled(exchange, stall, f"the caller read nothing for {stall:g} s")
                return
            if credit is not None:
                body = message.get("body")
                if body:
                    credit.delivered(len(body))
                    if reattach is not None:
                        reattach.relayed(body)
                elif reattach is not None and message.get("k") == env.START and exchange.sse:
                    reattach.started(message)
        if exchange.mapped:  # answered already; the rest of the agent's body is not wanted
            await stop()
    finally:
        unwatch()
        watcher.cancel()
        if not stopped and not (exchange.done and not exchange.mapped):
            # Left early (the server cancelled this task: Daphne does after a disconnect): a
            # subscriber waiting for room in the buffer must not wait forever.
            if remote:
                _background(loop, _cancel_stream(node, subscriber, query, exchange.agent_id,
                                                 remote))
            elif subscriber is not None:  # not remote: always
                subscriber.cancel_stream(request_id)
        close = getattr(exchange.send, "close", None)
        if close is not None:
            close()
        if remote:
            node.inbox.pending.pop(request_id, None)
            _forget_call(node, owner, request_id)


#: How many times one stream is re-attached after gaps before it ends with ``stream_gap``.
REATTACH_TRIES = 3
#: After the broker was lost, how long a resumable stream waits for it to be back before it
#: ends with ``broker_lost`` (within the keepalive window the other endings keep).
REATTACH_SECONDS = 12.0


def _subscribed(node: GatewayNode) -> bool:
    """Whether this node's subscription to the broker is up (layers that cannot tell: yes)."""
    check = getattr(node.layer, "subscribed", None)
    return True if check is None else bool(check())


class _Reattach:
    """A resumable stream relayed through the broker: its stream id (from the owner's start)
    and the id of the last event relayed, so that after a gap the entry node can resume it
    from the owner's replay buffer (a ``stream_resume`` Query, as a reconnecting caller's)."""

    __slots__ = ("caller", "stream_id", "last", "tries", "until")

    def __init__(self, tags: dict[str, str]) -> None:
        self.caller = tags.get(env.TAG_CALLER, "")
        self.stream_id = ""
        self.last = 0
        self.tries = 0
        self.until = 0.0  # after a broker loss: the re-attach's deadline

    def started(self, message: dict[str, Any]) -> None:
        for name, value in message["headers"]:
            if name == STREAM_ID_HEADER:
                self.stream_id = value.decode("latin-1")

    def relayed(self, body: bytes) -> None:
        """The owner appends ``id: <stream id>:<n>`` to each whole event (gateway.resume)."""
        if not self.stream_id:
            return
        at = body.rfind(b"\nid: ")
        if at < 0:
            return
        line = body[at + 5:body.find(b"\n", at + 5)]
        _, _, number = line.partition(b":")
        if line.startswith(self.stream_id.encode()) and number.isdigit():
            self.last = int(number)

    def query(self, previous: dict[str, Any]) -> dict[str, Any]:
        return env.query(b"", {
            env.TAG_METHOD: env.RESUME_METHOD,
            env.TAG_STREAM_ID: self.stream_id,
            env.TAG_LAST_EVENT: str(self.last),
            env.TAG_CALLER: self.caller,
            env.TAG_REQUEST_ID: new_request_id(),
            env.TAG_WINDOW: previous["tags"].get(env.TAG_WINDOW, ""),
        })


async def _reattach(node: GatewayNode, query: dict[str, Any], buffer: StreamBuffer,
                    credit: _Credit,
                    exchange: Exchange) -> bool:
    """Send a re-attach Query (after the previous request's stream_cancel, on the same
    connection, so the owner detaches first). False: it could not be sent."""
    tags = query["tags"]
    if not node.inbox.ready:
        return False
    try:
        listeners = await _publish(node, query, buffer, exchange, credit)
    except Exception as exc:
        logger.warning("re-attaching a stream after a gap failed: %s", exc)
        listeners = 0
    if listeners == 0:
        node.inbox.pending.pop(tags[env.TAG_REQUEST_ID], None)
        return False
    logger.warning("stream to %s re-attached after event %s: messages were lost between "
                   "the nodes", exchange.agent_id, tags[env.TAG_LAST_EVENT])
    return True


_background_tasks: set[asyncio.Task[None]] = set()


def _background(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, None]) -> None:
    task = loop.create_task(coro)
    _background_tasks.add(task)
    task.add_done_callback(_background_tasks.discard)


async def _end_stalled(exchange: Exchange, stall: float, detail: str) -> None:
    """End a stream whose caller stopped reading with a terminal error event and the
    response's end. Under uvicorn and Daphne the last message never waits for the connection
    to drain (:func:`gateway.sse.flow_controlled`): both buffer it, so a caller that reads
    again gets the same ending on both. Another server gets the stall timeout (at least 1 s,
    at most 5 s) for it, else the response is abandoned."""
    exchange.outcome = errors.STREAM_STALLED
    logger.warning("stream to %s ended: %s", exchange.agent_id, detail)
    try:
        async with asyncio.timeout(min(max(stall, 1.0), 5.0)):
            # the agent's stream was flowing: it had the request
            await exchange.fail(errors.STREAM_STALLED, detail, executed=True)
    except TimeoutError:
        pass


class _Credit:
    """The caller's side of a stream's flow control through the broker: tells the owning
    subscriber how many body bytes the caller has taken, and how many bytes of pieced messages
    this node has taken from the broker (both cumulative, so a lost credit is made good by the
    next one), every quarter window of either.

    Sent from a task of its own, one at a time (a later total replaces an unsent one): the
    relay never waits on a publish, so a caller leaving is acted on at once even while the
    layer's publishes queue up (the Redis pub/sub layer publishes one message at a time per
    connection)."""

    __slots__ = ("node", "tags", "agent_id", "step", "total", "reported", "got",
                 "got_reported", "_sending")

    def __init__(self, node: GatewayNode, query: dict[str, Any], agent_id: str,
                 window: int) -> None:
        self.node = node
        self.tags = query["tags"]
        self.agent_id = agent_id
        self.step = max(window // 4, 1)
        self.total = 0
        self.reported = 0
        # bytes of pieced messages taken from the broker (gateway.inbox.Reassembly)
        self.got = 0
        self.got_reported = 0
        self._sending = False

    def delivered(self, size: int) -> None:
        self.total += size
        self._maybe_send()

    def received(self, size: int) -> None:
        self.got += size
        self._maybe_send()

    def _due(self) -> bool:
        return (self.total - self.reported >= self.step
                or self.got - self.got_reported >= self.step)

    def _maybe_send(self) -> None:
        if self._sending or not self._due():
            return
        self._sending = True
        _background(asyncio.get_running_loop(), self._send())

    async def _send(self) -> None:
        try:
            while self._due():
                self.reported = self.total
                self.got_reported = self.got
                await self._publish(self.total, self.got)
        finally:
            self._sending = False

    async def _publish(self, total: int, got: int) -> None:
        tags = self.tags
        message = env.query(b"", {
            env.TAG_METHOD: env.CREDIT_METHOD,
            env.TAG_STREAM_ID: tags[env.TAG_REQUEST_ID],
            env.TAG_CREDIT: str(total),
            env.TAG_RECEIVED: str(got),
            env.TAG_REQUEST_ID: tags[env.TAG_REQUEST_ID] + ".credit",
            env.TAG_REPLY_CHANNEL: tags.get(env.TAG_REPLY_CHANNEL, ""),
        })
        try:
            await self.node.layer.send(agent_channel(self.agent_id), message)
        except Exception as exc:  # the next credit carries the total; the stall timeout bounds
            logger.warning("stream_credit not delivered: %s", exc)


async def _cancel_stream(node: GatewayNode, subscriber: VirtualSubscriber | None,
                         query: dict[str, Any], agent_id: str, remote: bool) -> None:
    tags = query["tags"]
    cancel = env.query(b"", {
        env.TAG_METHOD: env.CANCEL_METHOD,
        env.TAG_STREAM_ID: tags[env.TAG_REQUEST_ID],
        env.TAG_REQUEST_ID: tags[env.TAG_REQUEST_ID] + ".cancel",
        env.TAG_CALLER: tags.get(env.TAG_CALLER, ""),
        env.TAG_REPLY_CHANNEL: tags.get(env.TAG_REPLY_CHANNEL, ""),
    })
    if not remote:
        assert subscriber is not None  # local: the subscriber is in this process
        await subscriber.handle(cancel, discard, local=True)
        return
    try:
        await node.layer.send(agent_channel(agent_id), cancel)
    except Exception as exc:
        logger.warning("stream_cancel not delivered: %s", exc)


