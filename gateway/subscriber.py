"""The virtual subscriber ``a2a-vsub-{agent_id}``: the per-agent bridge from a Query to HTTP.

It receives Query envelopes on ``_AGENTS_.{agent_id}`` (one long-lived receive loop; the local
fast path hands envelopes to :meth:`VirtualSubscriber.handle` directly), enforces the agent's
concurrency cap (overflow is answered ``busy`` at once, never queued, no work spawned) and
dispatches on the ``a2a_method`` tag:

- streaming methods -> the SSE handler: opens the agent's event stream and relays whole events
  as they arrive, with keepalives while idle and an idle timeout;
- ``stream_cancel`` -> the cancel handler: stops a relayed stream (the caller went away);
- everything else -> the sync handler: POSTs the body unchanged and relays the answer.

An HTTP+JSON call (tags ``a2a_http_method``/``a2a_http_path``, gateway.rest) goes the same way
to the agent's HTTP+JSON interface URL with that method and path; its streaming methods
(``SendStreamingMessage``, ``SubscribeToTask``) take the SSE handler.

Replies are reply messages (gateway.envelope) written to a *sink*: the broker reply channel, or
the receiving gateway itself on the local fast path. The same handlers serve both.

Handover between two live nodes (gateway.handover): a subscriber in *standby* or *draining*
drops the Queries it gets through the broker, keeps serving its own streams' control
messages, and a draining one stops once its calls are done.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, cast

import orjson

from gateway import endings, errors, grants, tracing
from gateway import envelope as env
from gateway import metrics as m
from gateway.conf import NodeSettings
from gateway.handover import Handover
from gateway.headers import outbound_headers, relayed_response_headers
from gateway.jsonrpc import parse_request
from gateway.resume import ReplayStream, not_found
from gateway.sse import KEEPALIVE, largest_event, split_events
from outbound import http1 as outbound
from outbound.errors import classify, describe
from registry.events import AgentRoute
from registry.ids import agent_channel

logger = logging.getLogger(__name__)

Sink = Callable[[dict[str, Any]], Awaitable[None]]

#: Bodies up to this size (with a known Content-Length) are read in one go and sent as one
#: message; larger ones are relayed chunk by chunk as they arrive.
WHOLE_BODY_BYTES = 256 * 1024
#: Through the broker, a request still running after this long is acknowledged, so the gateway
#: can tell a slow agent from a missing subscriber.
ACK_AFTER_SECONDS = 0.5
#: How long the kubemq profile's stream_cancel notice to the agent may take.
CANCEL_NOTICE_TIMEOUT_SECONDS = 5.0
#: Methods the subscriber handles itself (never forwarded as a sync call).
_CONTROL_METHODS = frozenset({env.CANCEL_METHOD, env.CREDIT_METHOD, env.RESUME_METHOD})
#: How many stream_cancels for not-yet-seen streams a subscriber remembers.
EARLY_CANCELS = 1024
#: A cancelled stream task still running after this long is cancelled again (at most
#: CANCEL_RETRIES times): its cancellation was swallowed by something it awaited.
CANCEL_RETRY_SECONDS = 0.5
CANCEL_RETRIES = 20


class StreamStalled(Exception):
    """The gateway relaying a stream took no more of it for too long (no stream_credit)."""


class BrokerSink:
    """Writes reply messages to the gateway's reply channel through the Channels layer.

    For a stream whose Query names a window (``a2a_window``), at most that many body bytes are
    sent ahead of what the caller has read (``stream_credit`` from the gateway): the relay then
    waits here, so it stops reading the agent, and one slow caller never floods the broker or
    the gateway node's inbox. Each stream waits on its own; the receive loop never does.
    """

    __slots__ = ("layer", "channel", "request_id", "_ack_timer", "_tasks", "window", "sent",
                 "credited", "credit_timeout", "_credit_waiter", "number", "piece",
                 "pieces_sent", "pieces_received", "allowance", "done", "__weakref__")

    def __init__(self, layer: Any, channel: str, request_id: str,
                 tasks: set[asyncio.Task[Any]]) -> None:
        self.layer = layer
        self.channel = channel
        self.request_id = request_id
        self._ack_timer: asyncio.TimerHandle | None = None
        self._tasks = tasks
        self.window = 0  # 0: no flow control (sync replies, bounded by the response cap)
        self.sent = 0
        self.credited = 0
        #: How long a flow-controlled stream waits for credit (set with ``window``).
        self.credit_timeout = 0.0
        self._credit_waiter: asyncio.Future[None] | None = None
        #: The number of the last reply message published (gateway.envelope: numbered, so the
        #: entry node detects a lost one).
        self.number = 0
        #: The largest body sent in one message (0: whole messages; the entry node's
        #: ``a2a_pieces``), and the bytes of pieced messages sent / taken by the entry node.
        self.piece = 0
        self.pieces_sent = 0
        self.pieces_received = 0
        #: What the entry node grants of the pieces (gateway.grants; None: not asked).
        self.allowance: grants.Allowance | None = None
        #: The number of the last reply message whose publish is over (gateway.endings).
        self.done = 0

    def credit(self, total: int, received: int = 0) -> None:
        """The gateway has delivered ``total`` body bytes of this stream to its caller, and
        taken ``received`` bytes of pieced messages from the broker."""
        if total > self.credited or received > self.pieces_received:
            self.credited = max(total, self.credited)
            self.pieces_received = max(received, self.pieces_received)
            waiter = self._credit_waiter
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

    async def _wait_credit(self, pieces: bool = False) -> None:
        # Bounded: a gateway that vanished, or credits lost in the broker, end the stream
        # after the gateway's own stall timeout would have (plus its buffer) - never a hang.
        limit = self.credit_timeout
        try:
            async with asyncio.timeout(limit):
                while (self.pieces_sent - self.pieces_received if pieces
                       else self.sent - self.credited) >= self.window:
                    self._credit_waiter = asyncio.get_running_loop().create_future()
                    try:
                        await self._credit_waiter
                    finally:
                        self._credit_waiter = None
        except TimeoutError:
            raise StreamStalled(f"no stream credit for {limit:g} s") from None

    def arm_ack(self) -> None:
        self._ack_timer = asyncio.get_running_loop().call_later(ACK_AFTER_SECONDS, self._ack)

    def _ack(self) -> None:
        self._ack_timer = None
        _spawn(self._tasks, self._send(env.ack(self.request_id)))

    async def __call__(self, message: dict[str, Any]) -> None:
        if self._ack_timer is not None:
            self._ack_timer.cancel()
            self._ack_timer = None
        body = message.get("body")
        window = self.window
        if window and body:
            if self.sent - self.credited >= window:
                await self._wait_credit()
            self.sent += len(body)
        # Numbered (acks are not: they carry nothing for the caller), and a large body crosses
        # in pieces, which the entry node joins back (gateway.envelope).
        self.number += 1
        if self.number == 1 and not env.is_last(message):
            endings.watch(self)  # a call of several messages: its progress is told meanwhile
        size = self.piece
        if not size or not body or len(body) <= size:
            message["n"] = self.number
            await self._send(message)
            if env.is_last(message):  # told again shortly: a lost last message shows
                endings.ended(self.layer, self.channel, self.request_id, self.number)
            return
        # A flow-controlled stream's pieces cross at most a window ahead of what the entry
        # node has taken (its credits' a2a_received): Redis never queues more for it.
        rest = range(size, len(body), size)
        self.pieces_sent += size
        await self._send({**message, "body": body[:size], "n": self.number, "pc": len(rest)})
        for at in rest:
            if window and self.pieces_sent - self.pieces_received >= window:
                await self._wait_credit(pieces=True)
            self.number += 1
            part = env.piece(self.request_id, body[at:at + size])
            part["n"] = self.number
            self.pieces_sent += len(part["body"])
            await self._send(part)
        if env.is_last(message):
            endings.ended(self.layer, self.channel, self.request_id, self.number)

    async def _send(self, message: dict[str, Any]) -> None:
        try:
            # a piece without a grant in time is not sent: the entry node ends the call
            # (gateway.grants)
            if self.allowance is None or message["k"] != env.PIECE \
                    or await self.allowance.take(len(message["body"])):
                await self.layer.send(self.channel, message)
        except Exception as exc:  # broker down: the gateway times out and answers itself
            logger.warning("reply to %s lost: %s: %s", self.channel, type(exc).__name__, exc)
        self.done = message.get("n") or self.done


def _spawn(tasks: set[asyncio.Task[Any]], coro: Awaitable[Any]) -> asyncio.Task[Any]:
    # A sink's answer is a coroutine typed as the Awaitable its protocol promises.
    task = asyncio.get_running_loop().create_task(cast(Coroutine[Any, Any, Any], coro))
    tasks.add(task)
    task.add_done_callback(tasks.discard)
    return task


class VirtualSubscriber:
    """One agent's subscriber on its owning node."""

    def __init__(self, route: AgentRoute, layer: Any, settings: NodeSettings) -> None:
        self.settings = settings
        self.agent_id = route.agent_id
        self.client_id = f"a2a-vsub-{route.agent_id}"
        self.channel = agent_channel(route.agent_id)
        self.layer = layer
        self.route = route
        self.in_flight = 0
        self.streams: dict[str, asyncio.Task[Any]] = {}
        self._stream_sinks: dict[str, BrokerSink] = {}  # flow-controlled streams (broker)
        self._cancel_requested: dict[str, Any] = {}  # request id -> the stream's JSON-RPC id
        #: stream_cancels for request ids with no stream here (oldest first, bounded)
        self._cancelled_early: dict[str, bool] = {}
        # Resumable streams (A2A_SSE_RESUME_SECONDS > 0): by public stream id, and by the
        # request id of each caller connection attached to one (gateway.resume).
        self._replays: dict[str, ReplayStream] = {}
        self._attached: dict[str, ReplayStream] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._receiver: asyncio.Task[Any] | None = None
        self._stopping = False
        self.sse_active = 0  # read by the metrics collector at scrape time
        self._client: outbound.Client | None = None  # the loop's shared client, looked up once
        self.handover = Handover(self.client_id, self._publish)
        self._drained: asyncio.Event | None = None  # set when draining and nothing runs

    # --- lifecycle -------------------------------------------------------------------------

    def start(self, *, after: asyncio.Task[Any] | None = None, standby: bool = False) -> None:
        """Start receiving; ``after`` is a previous subscriber's teardown to wait for.
        ``standby``: another live node's subscriber owns the channel now; take it over
        (gateway.handover)."""
        loop = asyncio.get_running_loop()
        self._receiver = loop.create_task(self._receive_loop(after), name=self.client_id)
        if standby:
            self.handover.standby()
            _spawn(self._tasks, self.handover.take_over())

    async def _publish(self, tags: dict[str, str]) -> None:
        try:
            await self.layer.send(self.channel, env.query(b"", tags))
        except Exception as exc:
            logger.warning("%s: handover signal not sent: %s", self.client_id, exc)

    async def hand_off(self, timeout: float) -> None:
        """The agent moved to another live node: keep answering until its subscriber takes
        over (gateway.handover), let in-flight calls finish (at most ``timeout``), then
        stop."""
        if self._drained is None:
            self._drained = asyncio.Event()
        await self.handover.until_taken_over()
        self._check_drained()
        try:
            async with asyncio.timeout(timeout):
                await self._drained.wait()
        except TimeoutError:
            logger.warning("%s: %d call(s) still running after %g s of handover; ending them",
                           self.client_id, self.in_flight, timeout)
        await self.stop()

    def _check_drained(self) -> None:
        if self.handover.draining and self._drained is not None and self.in_flight <= 0 \
                and not self.streams:
            self._drained.set()

    def update(self, route: AgentRoute) -> None:
        self.route = route

    async def stop(self) -> None:
        """Tear down: stop receiving (unsubscribes the channel) and end relayed streams.
        Sync requests already running finish on their own (each is bounded by its timeout)."""
        self._stopping = True
        tasks = list(self.streams.values())
        if self._receiver is not None:
            tasks.append(self._receiver)
        for replay in list(self._replays.values()):
            if replay.expiry is not None:
                replay.expiry.cancel()
        self._replays.clear()
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=1.0)

    @property
    def running(self) -> bool:
        return self._receiver is not None and not self._receiver.done()

    async def _receive_loop(self, after: asyncio.Task[Any] | None) -> None:
        # One long-lived receive() per channel, never cancelled and re-issued (messages are lost
        # that way on both Redis layers); cancelled only on teardown.
        if after is not None:
            await asyncio.wait([after])
        layer = self.layer
        while True:
            try:
                message = await layer.receive(self.channel)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # broker hiccup: keep the loop alive
                logger.warning("%s: receive failed: %s: %s", self.client_id,
                               type(exc).__name__, exc)
                await asyncio.sleep(0.5)
                continue
            tags = message.get("tags") if isinstance(message, dict) else None
            if not isinstance(tags, dict):
                continue
            if env.TAG_NONCE in tags:
                if self.handover.heard(tags):
                    self._check_drained()
                continue
            if not self.handover.active and (
                tags.get(env.TAG_METHOD) not in _STREAM_CONTROL
                or (tags.get(env.TAG_METHOD) == env.RESUME_METHOD
                    and tags.get(env.TAG_STREAM_ID) not in self._replays)
            ):
                continue  # handover: the other owner answers this Query (gateway.handover)
            reply_channel = tags.get(env.TAG_REPLY_CHANNEL)
            request_id = tags.get(env.TAG_REQUEST_ID)
            if not isinstance(reply_channel, str) or not isinstance(request_id, str):
                continue
            sink = BrokerSink(layer, reply_channel, request_id, self._tasks)
            pieces = tags.get(env.TAG_PIECES)
            if pieces:  # the entry node joins pieces: large bodies cross in pieces
                try:
                    sink.piece = max(int(pieces), 4096)
                except ValueError:
                    pass
                sink.allowance = grants.allowance(tags, request_id, self.settings)
            try:
                await self.handle(message, sink, local=False)
            except Exception:
                logger.exception("%s: dispatch failed", self.client_id)

    # --- dispatch --------------------------------------------------------------------------

    def local_call(self, query: dict[str, Any], sink: Sink) -> Awaitable[None] | None:
        """The local fast path of a sync (non-streaming) method, for the gateway's handler:
        the handler coroutine itself to await (one coroutine level fewer than :meth:`handle`),
        or None when :meth:`handle` must decide (tracing on, stopping, at the concurrency cap,
        or a control method)."""
        tags = query["tags"]
        if (
            tracing.ENABLED
            or self._stopping
            or self.in_flight >= self.route.max_concurrency
            or tags.get(env.TAG_METHOD) in _CONTROL_METHODS
        ):
            return None
        self.in_flight += 1
        return self._run_sync(query, sink, tags.get(env.TAG_REQUEST_ID, ""))

    async def handle(self, query: dict[str, Any], sink: Sink, *, local: bool) -> None:
        """Dispatch one Query. On the local path a sync request runs in the caller's task;
        through the broker every accepted request runs in a task of its own."""
        tags = query["tags"]
        method = tags.get(env.TAG_METHOD, "")
        request_id = tags.get(env.TAG_REQUEST_ID, "")
        if method == env.CANCEL_METHOD and env.TAG_STREAM_ID in tags:
            self.cancel_stream(tags[env.TAG_STREAM_ID])
            return
        if method == env.CREDIT_METHOD and env.TAG_STREAM_ID in tags:
            stream_sink = self._stream_sinks.get(tags[env.TAG_STREAM_ID])
            if stream_sink is not None:
                try:
                    stream_sink.credit(int(tags.get(env.TAG_CREDIT) or 0),
                                       int(tags.get(env.TAG_RECEIVED) or 0))
                except ValueError:
                    pass
            grants.credit(tags)
            return
        if method == env.RESUME_METHOD:
            self._resume(query, sink, local)
            return
        if not local and self._cancelled_early.pop(request_id, None) is not None:
            return  # its caller left (stream_cancel came first): nobody wants the answer
        if tracing.ENABLED:  # a child span of the entry node's; the agent gets its context
            path = tags.get(env.TAG_HTTP_PATH)
            endpoint = self.route.endpoint if path is None \
                else self.route.http_json_endpoint.rstrip("/") + path.split("?", 1)[0]
            sink = tracing.subscriber_sink(query, sink, agent_id=self.agent_id,
                                           endpoint=endpoint, local=local,
                                           node_id=self.settings.NODE_ID)
        if self._stopping:
            await self._refuse(sink, env.error(request_id, errors.UNREACHABLE,
                                               "agent is deregistering"), local)
            return
        if self.in_flight >= self.route.max_concurrency:
            m.count_busy(self.agent_id)
            await self._refuse(sink, env.error(request_id, errors.BUSY), local)
            return
        self.in_flight += 1
        if not local:
            sink.arm_ack()  # type: ignore[attr-defined]  # not local: a BrokerSink
        if method in env.STREAMING_METHODS:
            if not local:
                try:
                    sink.window = max(int(tags.get(env.TAG_WINDOW) or 0), 0)  # type: ignore[attr-defined]  # a BrokerSink
                except ValueError:
                    pass
                settings = self.settings
                sink.credit_timeout = (  # type: ignore[attr-defined]  # not local: a BrokerSink
                    settings.A2A_SSE_STALL_TIMEOUT_SECONDS
                    + settings.A2A_GATEWAY_TIMEOUT_BUFFER_SECONDS
                )
                self._stream_sinks[request_id] = sink  # type: ignore[assignment]  # not local: a BrokerSink
            if self.settings.A2A_SSE_RESUME_SECONDS > 0:
                replay = ReplayStream(request_id, tags.get(env.TAG_CALLER) or "anonymous",
                                      self.settings.A2A_SSE_RESUME_BUFFER_BYTES, sink,
                                      self._replay_ended)
                self._replays[replay.stream_id] = replay
                self._attached[request_id] = replay
                sink = replay
            task = asyncio.get_running_loop().create_task(self._run_stream(query, sink, request_id))
            self.streams[request_id] = task
            task.add_done_callback(lambda _t, rid=request_id: self._stream_done(rid))  # type: ignore[misc]  # default-bound id
        elif local:
            await self._run_sync(query, sink, request_id)
        else:
            _spawn(self._tasks, self._run_sync(query, sink, request_id))

    async def _refuse(self, sink: Sink, message: dict[str, Any], local: bool) -> None:
        """Answer a Query without running it. Through the broker the reply is sent from a task
        of its own: the receive loop must never wait on a publish (the Redis pub/sub
        layer publishes one message at a time per connection, so a busy reply queued behind
        the relayed streams' publishes held the loop for seconds while the stream_cancel and
        stream_credit messages piled up on the agent's channel, and every waiting stream kept
        its slot, so more Queries were answered busy - the loop never caught up)."""
        if local:
            await sink(message)
        else:
            _spawn(self._tasks, sink(message))

    def _stream_done(self, request_id: str) -> None:
        # The slot is released here, not in the stream task: a stream cancelled before its
        # task first ran never enters ``_run_stream`` (its ``finally`` never runs), and a
        # cancel can come that soon - the Redis pub/sub layer queues messages locally, so the
        # receive loop may take the Query and its stream_cancel in one go.
        self.in_flight -= 1
        self.streams.pop(request_id, None)
        self._stream_sinks.pop(request_id, None)
        self._cancel_requested.pop(request_id, None)
        if self.handover.draining:
            self._check_drained()

    def cancel_stream(self, request_id: str) -> bool:
        """The cancel handler: the caller of a relayed stream went away. A resumable stream is
        detached and kept for ``A2A_SSE_RESUME_SECONDS`` instead (gateway.resume)."""
        if self._attached:
            replay = self._attached.pop(request_id, None)
            if replay is not None:
                if request_id != replay.origin:
                    self._stream_sinks.pop(request_id, None)
                seconds = self.settings.A2A_SSE_RESUME_SECONDS
                if seconds > 0 and not self._stopping and replay.detach(
                    request_id, seconds, lambda: self._expire(replay)
                ):
                    return True
                self._drop_replay(replay)
                request_id = replay.origin
        task = self.streams.get(request_id)
        if task is None:
            # Its Query may still be on the way (a layer need not keep one sender's messages
            # in order): remembered, bounded, so that Query is dropped instead of run.
            early = self._cancelled_early
            early[request_id] = True
            if len(early) > EARLY_CANCELS:
                del early[next(iter(early))]
            return False
        if task.done():
            return False
        self._cancel(request_id, task)
        return True

    def _cancel(self, request_id: str, task: asyncio.Task[Any],
                tries: int = CANCEL_RETRIES) -> None:
        """Cancel a stream's task, and cancel it again while it keeps running: a cancellation
        can be swallowed by code the relay awaits (redis-py's asyncio client, under
        channels-redis, sometimes completes a ``publish`` whose task was cancelled meanwhile;
        the relay then went on to wait for stream credit until the credit timeout)."""
        if task.done():
            return
        self._cancel_requested[request_id] = True
        task.cancel()
        if tries > 0:
            asyncio.get_running_loop().call_later(
                CANCEL_RETRY_SECONDS, self._cancel, request_id, task, tries - 1)
        else:
            logger.warning("%s: stream %s ignores cancellation", self.client_id, request_id)

    # --- resumable streams (gateway.resume) ---------------------------------------------------

    def _resume(self, query: dict[str, Any], sink: Sink, local: bool) -> None:
        """``stream_resume``: reattach a caller to a detached stream of the same client, replay
        what it missed, continue live. Never waits here (the receive loop must not)."""
        tags = query["tags"]
        request_id = tags.get(env.TAG_REQUEST_ID, "")
        replay = self._replays.get(tags.get(env.TAG_STREAM_ID) or "")
        try:
            last = int(tags.get(env.TAG_LAST_EVENT) or 0)
        except ValueError:
            last = -1
        why = "unknown or expired stream" if replay is None or last < 0 else replay.check(
            tags.get(env.TAG_CALLER) or "anonymous", last)
        if why is not None or replay is None:
            _spawn(self._tasks, sink(not_found(request_id, why or "")))
            return
        if not local:
            try:
                sink.window = max(int(tags.get(env.TAG_WINDOW) or 0), 0)  # type: ignore[attr-defined]  # a BrokerSink
            except ValueError:
                pass
            settings = self.settings
            sink.credit_timeout = (  # type: ignore[attr-defined]  # not local: a BrokerSink
                settings.A2A_SSE_STALL_TIMEOUT_SECONDS
                + settings.A2A_GATEWAY_TIMEOUT_BUFFER_SECONDS
            )
            self._stream_sinks[request_id] = sink  # type: ignore[assignment]  # not local: a BrokerSink
        self._attached[request_id] = replay
        _spawn(self._tasks, self._attach(replay, sink, request_id, last))

    async def _attach(self, replay: ReplayStream, sink: Sink, request_id: str,
                      last: int) -> None:
        try:
            await replay.attach(sink, request_id, last)
        except Exception:
            logger.exception("%s: resuming a stream failed", self.client_id)

    def _expire(self, replay: ReplayStream) -> None:
        """The resume window passed with nobody back: cancel the stream as a disconnect does."""
        self._drop_replay(replay)
        task = self.streams.get(replay.origin)
        if task is not None:
            self._cancel(replay.origin, task)

    def _replay_ended(self, replay: ReplayStream) -> None:
        """The stream's end went to its caller: still resumable for the window, then gone."""
        replay.expiry = asyncio.get_running_loop().call_later(
            self.settings.A2A_SSE_RESUME_SECONDS, self._drop_replay, replay)

    def _drop_replay(self, replay: ReplayStream) -> None:
        if replay.expiry is not None:
            replay.expiry.cancel()
            replay.expiry = None
        self._replays.pop(replay.stream_id, None)
        for request_id in [k for k, v in self._attached.items() if v is replay]:
            del self._attached[request_id]
            if request_id != replay.origin:
                self._stream_sinks.pop(request_id, None)

    # --- handlers --------------------------------------------------------------------------

    async def _run_sync(self, query: dict[str, Any], sink: Sink, request_id: str) -> None:
        """The sync handler: POST the caller's bytes unchanged, relay the agent's answer.

        Kept flat on purpose: it is the proxy's hot path, and every coroutine level costs on
        each suspension. A small answer is read whole and relayed in one message; SSE, large
        502/503/504 answers and statuses outside 100-599 go through :meth:`_relay`.
        """
        tags = query["tags"]
        try:
            settings = self.settings
            try:
                seconds = float(tags.get(env.TAG_TIMEOUT) or settings.A2A_DEFAULT_TIMEOUT_SECONDS)
            except ValueError:
                seconds = float(settings.A2A_DEFAULT_TIMEOUT_SECONDS)
            headers = outbound_headers(tags, tags.get(env.TAG_CALLER) or "anonymous",
                                       passthrough=self.route.credential_passthrough)
            client = self._client
            if client is None or client.closed:
                client = self._client = outbound.client()
            try:
                path = tags.get(env.TAG_HTTP_PATH)
                if path is None:
                    response = await client.post(self.route.endpoint, query["body"], headers,
                                                 seconds)
                else:
                    rest = self.route.http_json_endpoint
                    if not rest:
                        await sink(env.error(request_id, errors.BINDING_UNAVAILABLE))
                        return
                    response = await client.request(
                        tags.get(env.TAG_HTTP_METHOD) or "POST", rest, query["body"], headers,
                        seconds, suffix=path)
                try:
                    status = response.status
                    length = response.content_length
                    cap = settings.A2A_MAX_RESPONSE_BYTES
                    if (
                        status in (502, 503, 504)
                        or not 100 <= status <= 599
                        or (length is not None and (length > WHOLE_BODY_BYTES or length > cap))
                        or _is_event_stream(response)
                    ):
                        await self._relay(response, sink, request_id)
                        return
                    # The own client's answers are mostly complete by now: taken without a
                    # coroutine (aiohttp's never are before read).
                    body = response.take(cap) if response.complete else await response.read(cap)
                finally:
                    response.finish()
                if body is None:
                    await sink(env.error(request_id, errors.RESPONSE_TOO_LARGE, executed=True))
                    return
                await sink(env.start(request_id, status, relayed_response_headers(
                    response.headers, self.route.credential_passthrough), body, more=False,
                    sse=False))
            except TRANSPORT_ERRORS as exc:
                await sink(transport_error(request_id, exc))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.exception("%s: handler failed", self.client_id)
            await sink(env.error(request_id, errors.UNREACHABLE, f"{type(exc).__name__}",
                                 executed=True))
        finally:
            self.in_flight -= 1
            if self.handover.draining:
                self._check_drained()

    async def _run_stream(self, query: dict[str, Any], sink: Sink, request_id: str) -> None:
        tags = query["tags"]
        try:
            await self._stream(query["body"], tags, sink, request_id)
        except asyncio.CancelledError:
            if request_id in self._cancel_requested:
                self._cancel_requested.pop(request_id)
                if self.settings.A2A_ERROR_PROFILE == "kubemq" \
                        and env.TAG_HTTP_PATH not in tags:  # a JSON-RPC notice, to JSON-RPC
                    _spawn(self._tasks, self._notify_cancel(tags, query["body"]))
            elif self._stopping:
                await sink(env.error(request_id, errors.UNREACHABLE, "agent deregistered"))
            raise
        except Exception as exc:
            logger.exception("%s: stream handler failed", self.client_id)
            await sink(env.error(request_id, errors.UNREACHABLE, f"{type(exc).__name__}",
                                 executed=True))
        # the slot is released by _stream_done (which also runs the drain check), when the
        # task is done

    async def _stream(
        self, body: bytes, tags: dict[str, str], sink: Sink, request_id: str
    ) -> None:
        """The SSE handler: open the agent's stream and relay it event by event."""
        headers = outbound_headers(tags, tags.get(env.TAG_CALLER) or "anonymous",
                                   passthrough=self.route.credential_passthrough)
        try:
            # No overall timeout for streams; waiting for the agent's first bytes is bounded
            # by the idle timeout, like every later silence.
            async with asyncio.timeout(self.settings.A2A_SSE_IDLE_TIMEOUT_SECONDS):
                path = tags.get(env.TAG_HTTP_PATH)
                if path is None:
                    response = await outbound.client().post(self.route.endpoint, body, headers,
                                                            None)
                else:
                    rest = self.route.http_json_endpoint
                    if not rest:
                        await sink(env.error(request_id, errors.BINDING_UNAVAILABLE))
                        return
                    response = await outbound.client().request(
                        tags.get(env.TAG_HTTP_METHOD) or "POST", rest, body, headers, None,
                        suffix=path)
        except TRANSPORT_ERRORS as exc:
            await sink(transport_error(request_id, exc))
            return
        try:
            await self._relay(response, sink, request_id)
        except StreamStalled as exc:
            logger.warning("%s: stream ended: %s", self.client_id, exc)
            # the agent's stream was flowing: it had the request
            await sink(env.error(request_id, errors.STREAM_STALLED, str(exc), executed=True))
        except TRANSPORT_ERRORS as exc:
            await sink(transport_error(request_id, exc))
        finally:
            outbound.finish(response)  # an unfinished stream's connection is closed

    async def _relay(self, response: Any, sink: Sink, request_id: str) -> None:
        status = response.status
        if not 100 <= status <= 599:
            # No server can relay it (uvicorn has no status line for 999; Daphne would): one
            # documented error on both, for both outbound clients. The agent had the request.
            await sink(env.error(request_id, errors.BAD_AGENT_STATUS, status=status,
                                 executed=True))
            return
        if status in (502, 503):
            await sink(env.error(request_id, errors.UPSTREAM_UNAVAILABLE, status=status))
            return
        if status == 504:
            await sink(env.error(request_id, errors.TIMEOUT, status=status))
            return
        headers = relayed_response_headers(response.headers,
                                           self.route.credential_passthrough)
        if _is_event_stream(response):
            await self._relay_events(response, headers, sink, request_id)
        else:
            await self._relay_body(response, headers, sink, request_id)

    async def _relay_body(self, response: Any, headers: list[tuple[bytes, bytes]], sink: Sink,
                          request_id: str) -> None:
        cap = self.settings.A2A_MAX_RESPONSE_BYTES
        length = response.content_length
        status = response.status
        if length is not None and length > cap:
            await sink(env.error(request_id, errors.RESPONSE_TOO_LARGE, executed=True))
            return
        if length is None or length <= WHOLE_BODY_BYTES:
            # Unknown length: buffered up to the cap, so an oversize answer can still become a
            # clean response_too_large instead of a truncated relay.
            body = await response.read(cap)
            if body is None:
                await sink(env.error(request_id, errors.RESPONSE_TOO_LARGE, executed=True))
            else:
                await sink(env.start(request_id, status, headers, body, more=False, sse=False))
            return
        headers.append((b"content-length", str(length).encode()))
        await sink(env.start(request_id, status, headers, b"", more=True, sse=False))
        while piece := await response.read_chunk():
            await sink(env.chunk(request_id, piece, more=True))
        await sink(env.chunk(request_id, b"", more=False))

    async def _relay_events(self, response: Any, headers: list[tuple[bytes, bytes]], sink: Sink,
                            request_id: str) -> None:
        settings = self.settings
        cap = settings.A2A_MAX_RESPONSE_BYTES
        keepalive = settings.A2A_SSE_KEEPALIVE_SECONDS
        idle = settings.A2A_SSE_IDLE_TIMEOUT_SECONDS
        loop = asyncio.get_running_loop()
        await sink(env.start(request_id, response.status, headers, b"", more=True, sse=True))
        self.sse_active += 1
        try:
            now = loop.time()
            last_data = last_sent = now
            tail = b""
            while True:
                wait = min(last_sent + keepalive, last_data + idle) - loop.time()
                try:
                    async with asyncio.timeout(max(wait, 0.0)):
                        piece = await response.read_chunk()
                except TimeoutError:
                    now = loop.time()
                    if now >= last_data + idle:
                        await sink(env.error(request_id, errors.TIMEOUT, "stream idle timeout"))
                        return
                    await sink(env.chunk(request_id, KEEPALIVE, more=True))
                    last_sent = now
                    continue
                if not piece:
                    await sink(env.chunk(request_id, tail, more=False))
                    return
                last_data = loop.time()
                events, tail = split_events(tail + piece if tail else piece)
                del piece  # copied into events and tail: not held while the sink waits
                if len(tail) > cap or (len(events) > cap and largest_event(events) > cap):
                    await sink(env.error(request_id, errors.RESPONSE_TOO_LARGE, executed=True))
                    return
                if events:
                    await sink(env.chunk(request_id, events, more=True))
                    # The sink waits while the caller lags (backpressure): that wait is not the
                    # agent's silence, so the idle and keepalive clocks restart after it.
                    last_sent = last_data = loop.time()
        finally:
            self.sse_active -= 1

    async def _notify_cancel(self, tags: dict[str, str], body: bytes) -> None:
        """kubemq profile: tell the agent its stream was cancelled (KubeMQ-style agents
        implement a ``stream_cancel`` JSON-RPC method)."""
        try:
            original = parse_request(body).get("id")
        except (orjson.JSONDecodeError, AttributeError):
            original = None
        notice = orjson.dumps({
            "jsonrpc": "2.0", "id": str(uuid.uuid4()), "method": env.CANCEL_METHOD,
            "params": {"id": original, "request_id": original},
        })
        headers = outbound_headers(tags, tags.get(env.TAG_CALLER) or "anonymous",
                                   passthrough=self.route.credential_passthrough)
        headers.pop("content-type", None)
        headers.pop("accept", None)
        headers["content-type"] = "application/json"
        try:
            response = await outbound.client().post(self.route.endpoint, notice, headers,
                                                    CANCEL_NOTICE_TIMEOUT_SECONDS)
            try:
                await response.read(64 * 1024)
            finally:
                outbound.finish(response)
        except TRANSPORT_ERRORS as exc:
            logger.info("%s: stream_cancel notice failed: %s", self.client_id, describe(exc))


def _is_event_stream(response: outbound.Response) -> bool:
    content_type = response.header(b"content-type") or b""
    return content_type[:17].lower() == b"text/event-stream"


#: Control messages of a stream already running: a draining (or standby) subscriber still
#: serves those of its own streams (unknown stream ids are no-ops).
_STREAM_CONTROL = frozenset((env.CANCEL_METHOD, env.CREDIT_METHOD, env.RESUME_METHOD))

#: What an outbound exchange raises when the agent cannot be reached or breaks the exchange.
TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (TimeoutError, *outbound.CONNECTION_ERRORS)


def transport_error(request_id: str, exc: BaseException) -> dict[str, Any]:
    """The one mapping of an outbound failure to an error reply: kind, detail and whether the
    agent may have received the request (``executed``), from ``outbound.errors.classify``."""
    failure = classify(exc)
    return env.error(request_id, failure.kind, failure.detail, executed=failure.executed)
