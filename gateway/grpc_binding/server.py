"""The node's gRPC listener: grpcio's asyncio server on the node's own event loop, started and
stopped with the node (``core.lifecycle``'s hooks, registered by ``GatewayConfig.ready``), under
both servers (uvicorn's lifespan, Daphne's hooks in ``manage.py serve``).

Off unless ``manage.py serve --grpc-port`` or ``A2A_GRPC_PORT`` names a port
(:func:`core.lifecycle.grpc_address`). Bounds, like the HTTP path's: a request message above
``A2A_MAX_REQUEST_BYTES`` is refused by gRPC itself (``RESOURCE_EXHAUSTED``, before the gateway
reads it), so is a call whose metadata is above :data:`MAX_METADATA_BYTES`, at most
``A2A_GRPC_MAX_CONCURRENT_STREAMS`` calls at once per connection (HTTP/2
``SETTINGS_MAX_CONCURRENT_STREAMS``), at most ``A2A_HTTP_MAX_CONNECTIONS`` connections (the
frame guard's), and each call takes the agent's concurrency cap, rate
limits and timeouts like any gateway call. The port is bound exclusively (no
``SO_REUSEPORT``): a port another process holds is an error at start, not a shared port.

Callers reach grpcio through :mod:`gateway.grpc_binding.frame_guard`, which holds the node's
gRPC address and bounds the HTTP/2 floods grpcio's core does not (a header block that never
ends, PINGs from a peer that never reads); grpcio itself listens on a loopback port of its own.

A node stopping (SIGTERM) stops taking gRPC calls when it begins to drain, and lets the calls
in flight finish for up to ``A2A_SHUTDOWN_DRAIN_SECONDS`` (those still running are then
cancelled).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from django.conf import settings

from core import lifecycle as node_config

logger = logging.getLogger(__name__)

#: The metadata (HPACK-counted: name, value and 32 bytes per entry) a call may send. grpcio's
#: own default refuses between a soft limit (8 KiB) and a hard one (16 KiB) at random; one
#: limit for both makes the refusal certain above it and never below it.
MAX_METADATA_BYTES = 16 * 1024

_server: Any = None
_guard: Any = None  # frame_guard.FrameGuard
_loop: asyncio.AbstractEventLoop | None = None
_stopping: asyncio.Task[None] | None = None


def bound_port() -> int | None:
    """The port the listener is bound to, None when it does not run."""
    return node_config.grpc_port()


async def start() -> None:
    """Node startup hook: start the listener when one is configured."""
    global _server, _guard, _loop, _stopping
    address = node_config.grpc_address()
    if address is None or _server is not None:
        return
    import grpc

    from gateway.grpc_binding.calls import handlers
    from gateway.grpc_binding.frame_guard import FrameGuard

    host, port = address
    server = grpc.aio.server(options=[
        ("grpc.max_receive_message_length", settings.A2A_MAX_REQUEST_BYTES),
        ("grpc.max_send_message_length", -1),  # the agent's answer is capped on its way in
        ("grpc.max_concurrent_streams", settings.A2A_GRPC_MAX_CONCURRENT_STREAMS),
        ("grpc.max_metadata_size", MAX_METADATA_BYTES),
        ("grpc.absolute_max_metadata_size", MAX_METADATA_BYTES),
        ("grpc.so_reuseport", 0),
    ])
    server.add_generic_rpc_handlers(handlers())
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    upstream = server.add_insecure_port("127.0.0.1:0")  # only the frame guard connects here
    if not upstream:
        raise RuntimeError("gRPC listener: grpcio could not listen on a loopback port")
    guard = FrameGuard(upstream, settings.A2A_HTTP_MAX_CONNECTIONS)
    try:
        bound = await guard.listen(host, port)
    except OSError as exc:
        raise RuntimeError(f"gRPC listener: cannot listen on {where}: {exc}") from None
    await server.start()
    _server, _guard, _loop, _stopping = server, guard, asyncio.get_running_loop(), None
    node_config.grpc_listening(bound)
    logger.info("gRPC listener on %s:%d (lf.a2a.v1.A2AService, a2a.v1.A2AService)", host, bound)


def drain() -> None:
    """Drain callback (signal-safe: schedules the stop): no new calls from now on, the calls in
    flight get ``A2A_SHUTDOWN_DRAIN_SECONDS``."""
    loop = _loop
    if _server is None or loop is None or loop.is_closed():
        return
    loop.call_soon_threadsafe(_begin_stop)


#: The grace of a stop without a drain before it (a test's server, a second signal).
STOP_GRACE_SECONDS = 1.0


def _begin_stop(grace: float | None = None) -> None:
    global _stopping
    if _server is not None and _stopping is None:
        if _guard is not None:
            _guard.stop_accepting()
        seconds = settings.A2A_SHUTDOWN_DRAIN_SECONDS if grace is None else grace
        _stopping = asyncio.get_running_loop().create_task(_server.stop(seconds))


async def stop() -> None:
    """Node shutdown hook: stop the listener (after the drain, when one began)."""
    global _server, _guard, _loop, _stopping
    server = _server
    if server is None or _loop is not asyncio.get_running_loop():
        return
    _begin_stop(STOP_GRACE_SECONDS)
    stopping = _stopping
    try:
        if stopping is not None:
            await stopping
    finally:
        from gateway.grpc_binding import passthrough, slots

        if _guard is not None:
            await _guard.close()
        await passthrough.close_channels()
        await slots.close()
        _server, _guard, _loop, _stopping = None, None, None, None
        node_config.grpc_listening(None)
        logger.info("gRPC listener stopped")
