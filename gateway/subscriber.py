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

Replies are reply messages (gateway.envelope) written to a *sink*: the broker reply channel
(:class:`gateway.broker_sink.BrokerSink`), or the receiving gateway itself on the local fast
path. The same handlers serve both; those that call the agent are in
:mod:`gateway.agent_calls`.

Handover between two live nodes (gateway.handover): a subscriber in *standby* or *draining*
drops the Queries it gets through the broker, keeps serving its own streams' control
messages, and a draining one stops once its calls are done.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any

from gateway import envelope as env
from gateway import errors, grants, tracing
from gateway import metrics as m
from gateway.agent_calls import AgentCalls
from gateway.broker_sink import BrokerSink, Sink, spawn
from gateway.conf import NodeSettings
from gateway.handover import Handover
from gateway.resume import REST_FORWARDED, ReplayStream, not_found, valid_form
from outbound import http1 as outbound
from registry.events import AgentRoute
from registry.ids import agent_channel

logger = logging.getLogger(__name__)

#: Methods the subscriber handles itself (never forwarded as a sync call).
_CONTROL_METHODS = frozenset({env.CANCEL_METHOD, env.CREDIT_METHOD, env.RESUME_METHOD})
#: How many stream_cancels for not-yet-seen streams a subscriber remembers.
EARLY_CANCELS = 1024
#: A cancelled stream task still running after this long is cancelled again (at most
#: CANCEL_RETRIES times): its cancellation was swallowed by something it awaited.
CANCEL_RETRY_SECONDS = 0.5
CANCEL_RETRIES = 20
#: The subscribers' background tasks (answers, acks, notices), referenced until they end: one
#: set for all of them, since nothing waits on or cancels them per subscriber (a set each cost
#: 216 bytes a subscriber, with a subscriber per owned agent).
_BACKGROUND: set[asyncio.Task[Any]] = set()


class VirtualSubscriber(AgentCalls):
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
        #: stream_cancels for request ids with no stream here (oldest first, bounded; made on
        #: the first, as most subscribers never see one)
        self._cancelled_early: dict[str, bool] | None = None
        # Resumable streams (A2A_SSE_RESUME_SECONDS > 0): by public stream id, and by the
        # request id of each caller connection attached to one (gateway.resume).
        self._replays: dict[str, ReplayStream] = {}
        self._attached: dict[str, ReplayStream] = {}
        self._tasks = _BACKGROUND
        self._receiver: asyncio.Task[Any] | None = None
        self._stopping = False
        self.sse_active = 0  # read by the metrics collector at scrape time
        self._client: outbound.Client | None = None  # the loop's shared client, looked up once
        self.handover = Handover(self.client_id)
        self._drained: asyncio.Event | None = None  # set when draining and nothing runs

    # --- lifecycle -------------------------------------------------------------------------

    def start(self, *, after: asyncio.Task[Any] | None = None, standby: bool = False) -> None:
        """Start receiving; ``after`` is a previous subscriber's teardown to wait for.
        ``standby``: another live node's subscriber owns the channel now; take it over
        (gateway.handover)."""
        loop = asyncio.get_running_loop()
        self._receiver = loop.create_task(self._receive_loop(after), name=self.client_id)
        if standby:
            self.handover.standby(self._publish)
            spawn(self._tasks, self.handover.take_over())

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
        if not local and (early := self._cancelled_early) and \
                early.pop(request_id, None) is not None:
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
                                      self._replay_ended, _stream_form(tags))
                self._replays[replay.stream_id] = replay
                self._attached[request_id] = replay
                sink = replay
            task = asyncio.get_running_loop().create_task(self._run_stream(query, sink, request_id))
            self.streams[request_id] = task
            task.add_done_callback(lambda _t, rid=request_id: self._stream_done(rid))  # type: ignore[misc]  # default-bound id
        elif local:
            await self._run_sync(query, sink, request_id)
        else:
            spawn(self._tasks, self._run_sync(query, sink, request_id))

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
            spawn(self._tasks, sink(message))

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
            if early is None:
                early = self._cancelled_early = {}
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
            spawn(self._tasks, sink(not_found(request_id, why or "")))
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
        spawn(self._tasks, self._attach(replay, sink, request_id, last))

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

def _stream_form(tags: dict[str, str]) -> str:
    """The binding a resumable stream's id names (gateway.resume.stream_form): HTTP+JSON
    forwarded (the Query names the caller's HTTP path), translated (the entry node says how),
    or JSON-RPC."""
    form = tags.get(env.TAG_STREAM_FORM, "")
    if form and valid_form(form):
        return form
    return REST_FORWARDED if env.TAG_HTTP_PATH in tags else ""


#: Control messages of a stream already running: a draining (or standby) subscriber still
#: serves those of its own streams (unknown stream ids are no-ops).
_STREAM_CONTROL = frozenset((env.CANCEL_METHOD, env.CREDIT_METHOD, env.RESUME_METHOD))
