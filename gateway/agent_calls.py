"""The virtual subscriber's calls to its agent: a sync call POSTed unchanged and its answer
relayed (:meth:`AgentCalls._run_sync`), an event stream relayed event by event with keepalives
and an idle timeout (:meth:`AgentCalls._stream`), an HTTP+JSON call to the agent's HTTP+JSON
interface with the caller's method and path; every answer written to the Query's sink as reply
messages (gateway.envelope), every outbound failure mapped once (:func:`transport_error`)."""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

import orjson

from gateway import envelope as env
from gateway import errors
from gateway.broker_sink import Sink, StreamStalled, spawn
from gateway.conf import NodeSettings
from gateway.handover import Handover
from gateway.headers import outbound_headers, relayed_response_headers
from gateway.jsonrpc import parse_request
from gateway.sse import KEEPALIVE, largest_event, split_events
from outbound import http1 as outbound
from outbound.errors import classify, describe
from registry.events import AgentRoute

logger = logging.getLogger(__name__)

#: Bodies up to this size (with a known Content-Length) are read in one go and sent as one
#: message; larger ones are relayed chunk by chunk as they arrive.
WHOLE_BODY_BYTES = 256 * 1024
#: How long the kubemq profile's stream_cancel notice to the agent may take.
CANCEL_NOTICE_TIMEOUT_SECONDS = 5.0


class AgentCalls:
    """The handlers of :class:`~gateway.subscriber.VirtualSubscriber` that call the agent (the
    subscriber's state they use is declared here, set by the subscriber)."""

    settings: NodeSettings
    route: AgentRoute
    client_id: str
    in_flight: int
    sse_active: int
    handover: Handover
    _client: outbound.Client | None
    _cancel_requested: dict[str, Any]
    _stopping: bool
    _tasks: set[asyncio.Task[Any]]

    def _check_drained(self) -> None:
        raise NotImplementedError

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
                    spawn(self._tasks, self._notify_cancel(tags, query["body"]))
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


#: What an outbound exchange raises when the agent cannot be reached or breaks the exchange.
TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (TimeoutError, *outbound.CONNECTION_ERRORS)


def transport_error(request_id: str, exc: BaseException) -> dict[str, Any]:
    """The one mapping of an outbound failure to an error reply: kind, detail and whether the
    agent may have received the request (``executed``), from ``outbound.errors.classify``."""
    failure = classify(exc)
    return env.error(request_id, failure.kind, failure.detail, executed=failure.executed)
