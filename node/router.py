"""HTTP routing: ``/a2a/...``, ``/metrics``, heartbeats and registrations to lean ASGI handlers,
the rest to Django.

Django's view and middleware stack alone caps a core near 1,000 req/s (docs/adr/0001), so the
gateway's hot path never enters it; the admin, the REST API and everything else do. The router
hands each ``/a2a`` request the node it serves (:class:`gateway.runtime.NodeHost`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from gateway.bodies import Receive, Send
from gateway.handler import a2a_app
from gateway.metrics import metrics_app
from gateway.runtime import NodeHost
from gateway.runtime import host as process_host
from node import heartbeats, registrations

#: An ASGI application.
App = Callable[[dict[str, Any], Receive, Send], Awaitable[None]]


def http_application(django_app: Callable[..., Awaitable[None]], host: NodeHost | None = None,
                     apps: Mapping[str, App] | None = None) -> App:
    """The ``http`` application of the Channels ``ProtocolTypeRouter``, serving ``host``'s
    node (default: the process's). ``apps`` maps exact paths to ASGI applications of the
    packages above the gateway (the MCP bridge's ``/mcp``), given by the composition root."""
    node_host = host or process_host
    exact = dict(apps or {})

    async def a2a_starting(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        # No lifespan started a node (a server without one): the first request starts it.
        node = await node_host.ensure()
        await a2a_app(node, scope, receive, send)

    def router(scope: dict[str, Any], receive: Receive, send: Send) -> Awaitable[None]:
        # Returns the chosen app's coroutine instead of awaiting it: no extra coroutine level.
        path = scope["path"]
        if path.startswith("/a2a/"):
            node = node_host.node
            if node is None:
                return a2a_starting(scope, receive, send)
            return a2a_app(node, scope, receive, send)
        if path == "/metrics":
            return metrics_app(scope, receive, send)
        app = exact.get(path)
        if app is not None:
            return app(scope, receive, send)
        fast = heartbeats.route(scope) or registrations.route(scope)
        if fast is not None:
            return fast(scope, receive, send)
        return django_app(scope, receive, send)

    router._asgi_single_callable = True  # type: ignore[attr-defined]  # a marker for Channels
    return router
