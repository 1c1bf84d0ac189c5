"""gRPC pass-through: a call of the gRPC binding forwarded to the agent's own gRPC server.

An agent whose card lists its own gRPC interface of the caller's protocol version (1.0:
``lf.a2a.v1.A2AService``, 0.3: ``a2a.v1.A2AService``) gets the caller's call as it came: the
same method path and the caller's serialized request bytes, relayed with grpcio's generic
``unary_unary`` / ``unary_stream`` calls and identity (de)serializers -- the agent's replies
reach the caller as the bytes the agent wrote, nothing re-encoded.

- **Tenant.** The caller's ``tenant`` is the gateway's (it names the agent). A 1.0 request
  reaches the agent with the ``tenant`` its card's gRPC interface names, ``""`` when it names
  none: one length-delimited field appended to the request's bytes (protobuf: the last value
  of a field wins), so nothing else of the message is touched. 0.3 requests have no tenant.
- **Metadata** mirrors the header rules (:mod:`gateway.headers`): the caller's metadata goes
  through the same decisions as an HTTP caller's headers (``authorization`` only to an agent
  with credential passthrough; hop-by-hop, cookies, forwarding headers never; the
  caller-identity header set by the gateway); gRPC's own ``grpc-*``, ``content-type``, ``te``,
  ``-bin`` entries and ``tenant`` never travel. The agent's initial and trailing metadata come
  back under the response-header rules; ``grpc-status-details-bin`` (the A2A error's
  ``google.rpc.Status``) is relayed, any ``x-a2a-*`` of the agent's is not.
- **Connections.** One ``grpc.aio`` channel per agent target, reused by every call to it, at
  most :data:`MAX_CHANNELS` (the least recently used is closed after its calls), each renewed
  after :data:`CHANNEL_MAX_AGE_SECONDS` or a failed connect. The target's name is resolved and
  its addresses checked by the outbound policy (:func:`outbound.resolve.resolve`: the SSRF
  rules of every outbound connection) when a channel is made, and the channel connects to the
  checked address (the name stays the ``:authority`` and TLS name): a name re-pointed later is
  checked again with the next channel. ``grpcs://`` / ``https://`` targets use TLS
  (``A2A_OUTBOUND_CA_FILE`` as the trust roots when set).
- **Bounds.** The agent's concurrency cap (``busy`` past it, counted across the cluster:
  :mod:`.slots`), the request capped at ``A2A_MAX_REQUEST_BYTES`` by the listener, each reply
  message at ``A2A_MAX_RESPONSE_BYTES`` (``response_too_large``), the deadline of the timeout
  rules (what remains of the caller's, capped at ``A2A_MAX_TIMEOUT_SECONDS``, else
  ``A2A_DEFAULT_TIMEOUT_SECONDS``); a stream waits at most ``A2A_SSE_IDLE_TIMEOUT_SECONDS`` for
  the agent's next message and ``A2A_SSE_STALL_TIMEOUT_SECONDS`` for a caller that stopped
  reading, the caller's own deadline if it set one; each stream's HTTP/2 receive window is
  ``A2A_SSE_BUFFER_BYTES`` (no BDP growth), what waits on this node for a caller that stopped
  reading.
- **Tracing** (on): the entry span continues the caller's ``traceparent`` metadata and the
  agent call's span under it replaces the ``traceparent``/``tracestate`` the agent gets
  (:func:`start_trace`, ended with the call by :func:`finish_call`; docs/tracing.md).
- **Executed.** A connect that fails (refused, unresolvable, a refused address, no connection
  within ``A2A_OUTBOUND_CONNECT_TIMEOUT_SECONDS``) is ``unreachable`` with executed false: no
  byte of the call was sent. Every later outcome counts as executed.

Where it runs: on the node whose listener took the call, which connects to the agent itself (not
through the owning node's virtual subscriber, which speaks HTTP): the agent's gRPC address must
be reachable from every node. The agent's concurrency cap is not the subscriber's count: each
call takes a slot of :mod:`.slots` (this node's count, and in distributed mode a lease in Redis
that every node counts), beside the subscriber's count of the agent's HTTP calls.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import grpc
from django.conf import settings

from core import lifecycle as node_config
from gateway import errors, metrics, recorder, tracing
from gateway.grpc_binding import slots
from gateway.headers import outbound_headers, relayed_response_headers, scan_request_headers
from gateway.translation import CORE, V10
from outbound import policy
from outbound.errors import OutboundError
from outbound.resolve import resolve

logger = logging.getLogger(__name__)

EXECUTED = "x-a2a-executed"
STATUS_DETAILS = "grpc-status-details-bin"
MAX_CHANNELS = 256
CHANNEL_MAX_AGE_SECONDS = 300.0
#: Caller metadata that never reaches the agent (besides ``grpc-*``, ``:*`` and ``-bin``).
_DROPPED_METADATA = frozenset({"content-type", "content-length", "te", "tenant"})
_METADATA_KEY = frozenset(b"abcdefghijklmnopqrstuvwxyz0123456789-_.")
#: The ``tenant`` field's number in each 1.0 request message (all are length-delimited).
_TENANT_FIELDS: dict[str, int] = {
    name: method.request.DESCRIPTOR.fields_by_name["tenant"].number
    for name, method in CORE.items() if "tenant" in method.request.DESCRIPTOR.fields_by_name}

#: (code, details, trailing metadata): what the call answers when it does not answer a reply.
Metadata = list[tuple[str, str | bytes]]
Fail = Callable[[str, str, bool], Awaitable[None]]


@dataclass(slots=True)
class Passed:
    """The caller's answer of a passed-through call: ``reply`` (a unary call's reply bytes),
    or None (a stream, or a status set on the context)."""

    reply: bytes | None


class CallRecord:
    """What the metrics and the console's recorder read of a finished call to an agent's gRPC
    server (passed through, or translated: :mod:`.outbound_translate`)."""

    __slots__ = ("outcome", "started", "status", "nbytes")

    def __init__(self) -> None:
        self.outcome = "unknown"
        self.started = False
        self.status = 0
        self.nbytes = 0


# --- the tenant ----------------------------------------------------------------------------


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def with_tenant(data: bytes, method: str, tenant: str) -> bytes:
    """``data`` (a serialized 1.0 request of ``method``) with its ``tenant`` set to ``tenant``:
    the field appended (the last occurrence wins), the rest of the bytes as they were."""
    number = _TENANT_FIELDS.get(method)
    if number is None:
        return data
    value = tenant.encode("utf-8")
    return data + _varint(number << 3 | 2) + _varint(len(value)) + value


# --- metadata ------------------------------------------------------------------------------


def valid_metadata(name: str, value: str) -> bool:
    return bool(name) and all(ord(c) in _METADATA_KEY for c in name) \
        and all(0x20 <= ord(c) < 0x7F for c in value)


def request_headers(metadata: Sequence[tuple[str, str | bytes]] | None,
                    dropped: frozenset[str]) -> list[tuple[bytes, bytes]]:
    """A gRPC caller's text metadata as the request headers the gateway's header rules read,
    without gRPC's own (``grpc-*``, pseudo-headers), binary ones and the ``dropped`` keys."""
    out = []
    for key, value in metadata or ():
        key = key.lower()
        if key.startswith((":", "grpc-")) or key.endswith("-bin") or key in dropped \
                or not isinstance(value, str):
            continue
        out.append((key.encode("latin-1"), value.encode("latin-1", errors="replace")))
    return out


def agent_metadata(metadata: Sequence[tuple[str, str | bytes]] | None, caller_id: str, *,
                   passthrough: bool) -> list[tuple[str, str]]:
    """The metadata the agent gets: the caller's, through the header rules."""
    headers = scan_request_headers(request_headers(metadata, _DROPPED_METADATA))
    # A credential-passthrough agent's caller authenticated with x-gateway-authorization:
    # its ``authorization`` is the agent's (the header rules' scan keeps it aside).
    if passthrough and headers.authorization is not None:
        headers.tags["a2a_hdr_authorization"] = headers.authorization
    out = []
    for name, value in outbound_headers(headers.tags, caller_id, passthrough=passthrough).items():
        name = name.lower()
        if valid_metadata(name, value):
            out.append((name, value))
    return out


def relayed_metadata(metadata: Sequence[tuple[str, str | bytes]] | None, *,
                     passthrough: bool) -> Metadata:
    """The agent's metadata the caller gets: the response-header rules, no ``x-a2a-*`` (the
    gateway's), no gRPC-reserved names but the error details."""
    out: Metadata = []
    for key, value in metadata or ():
        name = key.lower()
        if name.startswith("x-a2a-") or (name.startswith("grpc-") and name != STATUS_DETAILS) \
                or name.startswith(":"):
            continue
        if isinstance(value, bytes):
            if name.endswith("-bin"):
                out.append((name, value))
            continue
        if relayed_response_headers([(name.encode("latin-1"), b"")], passthrough):
            out.append((name, value))
    return out


# --- channels ------------------------------------------------------------------------------


@dataclass(slots=True)
class _Channel:
    channel: grpc.aio.Channel
    created: float


_channels: collections.OrderedDict[str, _Channel] = collections.OrderedDict()
_closing: set[asyncio.Task[None]] = set()


def target_of(url: str) -> tuple[str, int, bool]:
    """``(host, port, tls)`` of a card's gRPC interface URL: ``host:port``, ``[v6]:port``,
    or with a scheme (``grpc://``, ``http://``; ``grpcs://``, ``https://`` for TLS). Raises
    ValueError for anything else."""
    text = url.strip()
    scheme = ""
    if "://" in text:
        scheme = text.split("://", 1)[0].lower()
        if scheme not in ("grpc", "grpcs", "http", "https"):
            raise ValueError(f"not a gRPC address: {url!r}")
    else:
        text = "grpc://" + text
    parts = urlsplit(text)
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"not a gRPC address: {url!r}") from None
    tls = scheme in ("grpcs", "https")
    if not parts.hostname:
        raise ValueError(f"not a gRPC address: {url!r}")
    return parts.hostname, port or (443 if tls else 80), tls


def _close_later(channel: grpc.aio.Channel) -> None:
    """Close a channel no longer handed out, once the calls on it ended (bounded)."""
    grace = float(settings.A2A_MAX_TIMEOUT_SECONDS)
    task = asyncio.get_running_loop().create_task(channel.close(grace))
    _closing.add(task)
    task.add_done_callback(_closing.discard)


def forget(url: str, channel: grpc.aio.Channel) -> None:
    entry = _channels.get(url)
    if entry is not None and entry.channel is channel:
        del _channels[url]
        _close_later(channel)


async def channel_for(url: str) -> grpc.aio.Channel:
    """The channel to the agent target ``url`` (made, resolved and checked when there is none
    or it is too old). Raises ValueError (not an address) or OutboundError (refused or
    unresolvable name)."""
    now = time.monotonic()
    entry = _channels.get(url)
    if entry is not None and now - entry.created < CHANNEL_MAX_AGE_SECONDS:
        _channels.move_to_end(url)
        return entry.channel
    host, port, tls = target_of(url)
    family, address = (await resolve(host, port))[0]
    pinned = f"ipv6:[{address}]:{port}" if family == socket.AF_INET6 else \
        f"ipv4:{address}:{port}"
    authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    options: list[tuple[str, Any]] = [
        ("grpc.default_authority", authority),
        ("grpc.max_receive_message_length", settings.A2A_MAX_RESPONSE_BYTES),
        ("grpc.max_send_message_length", settings.A2A_MAX_REQUEST_BYTES),
        ("grpc.initial_reconnect_backoff_ms", 200),
        ("grpc.max_reconnect_backoff_ms", 2000),
        ("grpc.enable_retries", 0),
        ("grpc.use_local_subchannel_pool", 1),
        # Each stream's receive window: A2A_SSE_BUFFER_BYTES, what the HTTP relay lets wait
        # for a slow caller. (BDP probing would grow it to megabytes, held on this node for a
        # caller that stopped reading.)
        ("grpc.http2.bdp_probe", 0),
        ("grpc.http2.lookahead_bytes", settings.A2A_SSE_BUFFER_BYTES),
    ]
    if tls:
        ca_file = policy.current().ca_file
        roots = None
        if ca_file:
            with open(ca_file, "rb") as pem:
                roots = pem.read()
        options.append(("grpc.ssl_target_name_override", host))
        channel = grpc.aio.secure_channel(pinned, grpc.ssl_channel_credentials(roots),
                                          options=options)
    else:
        channel = grpc.aio.insecure_channel(pinned, options=options)
    if entry is not None:
        forget(url, entry.channel)
    _channels[url] = _Channel(channel, now)
    while len(_channels) > MAX_CHANNELS:
        _, oldest = _channels.popitem(last=False)
        _close_later(oldest.channel)
    return channel


async def connected(channel: grpc.aio.Channel, seconds: float) -> bool:
    """Whether ``channel`` is (or gets) connected within ``seconds``; False at once when its
    connection attempt failed."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    state = channel.get_state(try_to_connect=True)
    while state is not grpc.ChannelConnectivity.READY:
        if state in (grpc.ChannelConnectivity.TRANSIENT_FAILURE,
                     grpc.ChannelConnectivity.SHUTDOWN):
            return False
        remaining = deadline - loop.time()
        if remaining <= 0:
            return False
        try:
            async with asyncio.timeout(remaining):
                await channel.wait_for_state_change(state)
        except TimeoutError:
            return False
        state = channel.get_state(try_to_connect=True)
    return True


async def close_channels() -> None:
    """Close every channel (the listener stopping): no grace left for calls on them."""
    for task in list(_closing):
        task.cancel()
    entries = list(_channels.values())
    _channels.clear()
    for entry in entries:
        await entry.channel.close(None)


# --- the call ------------------------------------------------------------------------------


async def forward(*, path: str, core_method: str, version: str, streaming: bool, data: bytes,
                  context: Any, agent_id: str, client_id: str, target: str, tenant: str,
                  max_concurrency: int, credential_passthrough: bool, timeout: float,
                  started: float, fail: Fail) -> Passed:
    """Forward one admitted call to the agent's own gRPC server and answer the caller.

    ``fail(kind, detail, executed)`` answers a gateway error (the caller's status, the executed
    flag in its trailers); the agent's own statuses are relayed as it answered them."""
    record = CallRecord()
    metrics.count_request(agent_id, core_method)
    trace = None
    if tracing.ENABLED:
        metadata = context.invocation_metadata()
        trace = start_trace(agent_id=agent_id, method=core_method, binding="GRPC",
                            traceparent=metadata_value(metadata, "traceparent"),
                            tracestate=metadata_value(metadata, "tracestate"), payload=None,
                            request_bytes=len(data), caller=client_id, endpoint=target)
    slot = await slots.take_slot(agent_id, max_concurrency)
    if slot is None:
        metrics.count_busy(agent_id)
        await _gateway_error(record, fail, errors.BUSY, "", False)
        finish_call(record, agent_id, client_id, core_method, len(data), started, trace)
        return Passed(None)
    try:
        return await _forward(path, core_method, version, streaming, data, context, client_id,
                              target, tenant, credential_passthrough, timeout, fail, record,
                              trace)
    except asyncio.CancelledError:
        if record.outcome in ("unknown", "ok"):
            record.outcome = "client_disconnect"
        raise
    finally:
        slots.release_slot(slot)
        finish_call(record, agent_id, client_id, core_method, len(data), started, trace)


def metadata_value(metadata: Sequence[tuple[str, str | bytes]] | None, name: str) -> str | None:
    """The text value of the caller's metadata entry ``name`` (None when it sent none)."""
    for key, value in metadata or ():
        if key.lower() == name and isinstance(value, str):
            return value
    return None


def start_trace(*, agent_id: str, method: str, binding: str, traceparent: str | None,
                tracestate: str | None, payload: dict[str, Any] | None, request_bytes: int,
                caller: str, endpoint: str) -> tracing.DirectCallTrace:
    """The spans of a call this node makes to the agent's gRPC server itself (tracing on):
    :func:`gateway.tracing.start_direct_call` on this node."""
    return tracing.start_direct_call(
        agent_id=agent_id, method=method, binding=binding, traceparent=traceparent,
        tracestate=tracestate, payload=payload, request_bytes=request_bytes, caller=caller,
        node_id=node_config.node_id(), endpoint=endpoint)


def finish_call(record: CallRecord, agent_id: str, caller: str, method: str, size: int,
                started: float, trace: tracing.DirectCallTrace | None = None) -> None:
    """The call's latency into the metrics, the call into the console's recorder, and its
    spans ended (tracing on)."""
    seconds = time.perf_counter() - started
    metrics.observe_latency(agent_id, record.outcome, seconds)
    recorder.record(agent_id, caller, method, record, size, seconds)
    if trace is not None:
        trace.end(record.outcome, executed=record.started, status=record.status,
                  response_bytes=record.nbytes)


async def open_channel(target: str, timeout: float) -> tuple[grpc.aio.Channel | None, str]:
    """The (cached) channel to the agent's gRPC server at ``target``, connected within the
    policy's connect timeout (at most ``timeout``); or None and why (``unreachable``)."""
    try:
        channel = await channel_for(target)
    except (ValueError, OSError, OutboundError) as exc:
        return None, f"the agent's gRPC interface {target}: {exc}"
    if not await connected(channel, min(policy.current().connect_timeout, timeout)):
        forget(target, channel)  # the next call makes a new connection (and resolves again)
        return None, f"cannot connect to the agent's gRPC interface {target}"
    return channel, ""


def gateway_failure(exc: grpc.aio.AioRpcError, deadline: float | None) -> tuple[str, str] | None:
    """The gateway's own error (kind, detail) for a call that ended with a status: its
    deadline, a reply above the cap, a connection lost without an answer; None when the
    status is the agent's own (relayed, or translated)."""
    code = exc.code()
    details = exc.details() or ""
    if code is grpc.StatusCode.DEADLINE_EXCEEDED and deadline is not None \
            and time.monotonic() >= deadline - 0.05:
        return errors.TIMEOUT, "the agent did not answer in time"
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in details:
        return errors.RESPONSE_TOO_LARGE, ""
    if code is grpc.StatusCode.UNAVAILABLE and not exc.trailing_metadata():
        return errors.UNREACHABLE, f"the agent's connection failed: {details}"[:300]
    return None


async def _gateway_error(record: CallRecord, fail: Fail, kind: str, detail: str,
                         executed: bool) -> Passed:
    record.outcome = kind
    record.status = errors.rest_status_for(kind)
    await fail(kind, detail, executed)
    return Passed(None)


async def _forward(path: str, core_method: str, version: str, streaming: bool, data: bytes,
                   context: Any, client_id: str, target: str, tenant: str,
                   credential_passthrough: bool, timeout: float, fail: Fail,
                   record: CallRecord, trace: tracing.DirectCallTrace | None) -> Passed:
    channel, why = await open_channel(target, timeout)
    if channel is None:
        return await _gateway_error(record, fail, errors.UNREACHABLE, why, False)
    if version == V10:
        data = with_tenant(data, core_method, tenant)
    metadata = agent_metadata(context.invocation_metadata(), client_id,
                              passthrough=credential_passthrough)
    if trace is not None:  # the agent's traceparent: the gateway's span of its call
        metadata = trace.agent_metadata(metadata)
    record.started = True
    if streaming:
        return await _stream(channel, path, data, metadata, context, credential_passthrough,
                             fail, record)
    deadline = time.monotonic() + timeout
    call = channel.unary_unary(path)(data, metadata=metadata, timeout=timeout)
    try:
        reply: bytes = await call
    except grpc.aio.AioRpcError as exc:
        return await _agent_failed(exc, deadline, context, credential_passthrough, fail,
                                   record)
    initial = relayed_metadata(await call.initial_metadata(), passthrough=credential_passthrough)
    if initial:
        await context.send_initial_metadata(tuple(initial))
    trailing = relayed_metadata(await call.trailing_metadata(),
                                passthrough=credential_passthrough)
    context.set_trailing_metadata((*trailing, (EXECUTED, "true")))
    record.outcome, record.status, record.nbytes = "ok", 200, len(reply)
    return Passed(reply)


async def _agent_failed(exc: grpc.aio.AioRpcError, deadline: float | None, context: Any,
                        passthrough: bool, fail: Fail, record: CallRecord) -> Passed:
    """A call that ended with a status: the gateway's own (its deadline, a reply above the
    cap, a connection lost without an answer) or the agent's, relayed."""
    own = gateway_failure(exc, deadline)
    if own is not None:
        return await _gateway_error(record, fail, own[0], own[1], True)
    relayed = relayed_metadata(exc.trailing_metadata(), passthrough=passthrough)
    context.set_code(exc.code())
    context.set_details(exc.details() or "")
    context.set_trailing_metadata((*relayed, (EXECUTED, "true")))
    record.outcome, record.status = "agent_error", 200
    return Passed(None)


async def _stream(channel: grpc.aio.Channel, path: str, data: bytes,
                  metadata: list[tuple[str, str]], context: Any, passthrough: bool,
                  fail: Fail, record: CallRecord) -> Passed:
    remaining = context.time_remaining()
    deadline = None if remaining is None else time.monotonic() + remaining
    call = channel.unary_stream(path)(data, metadata=metadata, timeout=remaining)
    idle = float(settings.A2A_SSE_IDLE_TIMEOUT_SECONDS)
    stall = float(settings.A2A_SSE_STALL_TIMEOUT_SECONDS)
    initial_sent = False
    try:
        while True:
            message = await read_or_idle(call, idle)
            if message is None:
                return await _gateway_error(record, fail, errors.TIMEOUT,
                                            "the agent's stream went idle", True)
            if message is grpc.aio.EOF:
                break
            if not initial_sent:
                initial_sent = True
                await _send_initial(context, call, passthrough)
            try:
                async with asyncio.timeout(stall):
                    await context.write(message)
            except TimeoutError:
                call.cancel()
                return await _gateway_error(record, fail, errors.STREAM_STALLED,
                                            "the caller stopped reading", True)
            record.nbytes += len(message)
    except grpc.aio.AioRpcError as exc:
        return await _agent_failed(exc, deadline, context, passthrough, fail, record)
    except BaseException:
        call.cancel()
        raise
    if not initial_sent:
        await _send_initial(context, call, passthrough)
    code = await call.code()
    trailing = relayed_metadata(await call.trailing_metadata(), passthrough=passthrough)
    context.set_trailing_metadata((*trailing, (EXECUTED, "true")))
    record.status = 200
    if code is not grpc.StatusCode.OK:  # read() raises on a status; kept for safety
        context.set_code(code)
        context.set_details(await call.details())
        record.outcome = "agent_error"
    else:
        record.outcome = "ok"
    return Passed(None)


async def read_or_idle(call: Any, idle: float) -> Any:
    """The agent's stream's next message (``grpc.aio.EOF`` at its end); None, the call
    cancelled, when none came within ``idle`` seconds."""
    try:
        async with asyncio.timeout(idle):
            return await call.read()
    except TimeoutError:
        call.cancel()
        return None


async def _send_initial(context: Any, call: Any, passthrough: bool) -> None:
    initial = relayed_metadata(await call.initial_metadata(), passthrough=passthrough)
    if initial:
        await context.send_initial_metadata(tuple(initial))
