"""A node's lifecycle: startup and shutdown hooks shared by every way of serving the app.

Apps register coroutines with :func:`on_startup` / :func:`on_shutdown` (the gateway's
Subscriber Manager does, from its AppConfig). Uvicorn reaches them through the ASGI lifespan
protocol (:func:`lifespan_app`); Daphne has no lifespan, so ``manage.py serve`` calls
:func:`start` and :func:`stop` itself.

A stop drains first (:func:`begin_drain`): the server stops accepting connections, closes its
idle ones and lets the requests in flight finish for up to ``A2A_SHUTDOWN_DRAIN_SECONDS``; then
the shutdown hooks run (the gateway hands its agents over).

The process's node id is decided here once: ``NODE_ID`` when configured, else what ``manage.py
serve`` derives from the port it serves on (:func:`serve_as`). The gateway's settings object and
the registry's ownership rule both read it through :func:`node_id`; nothing mutates Django's
settings.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from core import threads

logger = logging.getLogger(__name__)

Hook = Callable[[], Awaitable[None]]
_startup: list[Hook] = []
_shutdown: list[Hook] = []
_started = False
_served_id: str | None = None
_draining = False
_drain: list[Callable[[], None]] = []
#: ``manage.py serve``'s gRPC listener address (``--grpc-port`` on its ``--host``), when given.
_grpc_serve: tuple[str, int | None] | None = None
#: The port the gRPC listener is bound to while it runs (the served cards name it).
_grpc_bound: int | None = None


def begin_drain() -> None:
    """The server stopped taking new work (SIGTERM / SIGINT): the requests it is answering
    get ``A2A_SHUTDOWN_DRAIN_SECONDS`` to finish; those the server then cancels are answered
    ``node_stopping`` (gateway.forwarding) instead of being cut off. Signal-safe: sets a flag and
    calls the :func:`on_drain` callbacks (each signal-safe itself: it schedules its work)."""
    global _draining
    if _draining:
        return
    _draining = True
    for fn in list(_drain):
        try:
            fn()
        except Exception:
            logger.exception("drain callback %r failed", fn)


def on_drain(fn: Callable[[], None]) -> Callable[[], None]:
    """Call ``fn`` when the node begins to drain (the gRPC listener stops taking calls then,
    as the HTTP server stops taking connections). ``fn`` must only schedule its work."""
    if fn not in _drain:
        _drain.append(fn)
    return fn


def serve_grpc(host: str, port: int | None) -> None:
    """``manage.py serve``'s gRPC listener: on ``host`` at ``port`` (0: any free port), or
    off (None), whatever ``A2A_GRPC_PORT`` says."""
    global _grpc_serve
    _grpc_serve = (host, port)


def grpc_address() -> tuple[str, int] | None:
    """Where this node's gRPC listener listens: serve's ``--grpc-port`` on its ``--host``,
    else ``A2A_GRPC_PORT`` on 127.0.0.1; None: no listener."""
    if _grpc_serve is not None:
        host, port = _grpc_serve
        return None if port is None else (host, port)
    from django.conf import settings

    port = settings.A2A_GRPC_PORT
    return None if port is None else ("127.0.0.1", port)


def grpc_listening(port: int | None) -> None:
    """The gRPC listener is bound to ``port`` (None: it stopped)."""
    global _grpc_bound
    _grpc_bound = port


def grpc_port() -> int | None:
    """The port this node's gRPC listener is bound to, None when it does not run."""
    return _grpc_bound


def serving() -> bool:
    """Whether this process serves as a node (its startup hooks ran, its stop has not)."""
    return _started


def draining() -> bool:
    """Whether this node is stopping (its server drains the requests in flight)."""
    return _draining


def serve_as(default_node_id: str) -> None:
    """The id this process serves as when ``NODE_ID`` is not configured (``manage.py serve``
    derives it from its port before the node starts)."""
    global _served_id
    _served_id = default_node_id


def node_id() -> str:
    """This process's node id: the served-as id, else ``settings.NODE_ID`` (the configured
    ``NODE_ID`` or its default)."""
    if _served_id is not None:
        return _served_id
    from django.conf import settings

    return settings.NODE_ID


def on_startup(fn: Hook) -> Hook:
    if fn not in _startup:
        _startup.append(fn)
    return fn


def on_shutdown(fn: Hook) -> Hook:
    if fn not in _shutdown:
        _shutdown.append(fn)
    return fn


async def start() -> None:
    global _started
    if _started:
        return
    _started = True
    for fn in _startup:
        await fn()


async def stop() -> None:
    global _started
    if not _started:
        return
    _started = False
    for fn in reversed(_shutdown):
        try:
            await fn()
        except Exception:
            logger.exception("shutdown hook %r failed", fn)
    threads.shutdown()  # after the hooks: they may still hand work to a pool
    logger.info("node stopped: %d shutdown hook(s) ran", len(_shutdown))


async def lifespan_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            try:
                await start()
            except Exception as exc:
                logger.exception("node startup failed")
                await send({"type": "lifespan.startup.failed", "message": str(exc)})
                return
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await stop()
            await send({"type": "lifespan.shutdown.complete"})
            return
