"""HTTP routing: ``/a2a/...``, ``/metrics`` and heartbeats to lean ASGI handlers, the rest to
Django.

Django's view and middleware stack alone caps a core near 1,000 req/s (PERFORMANCE.md), so the
gateway's hot path never enters it; the admin, the REST API and everything else do.
"""

from __future__ import annotations

from collections.abc import Awaitable

from gateway.handler import a2a_app
from gateway.metrics import metrics_app
from registry import heartbeats


def http_application(django_app):
    """The ``http`` application of the Channels ``ProtocolTypeRouter``."""

    def router(scope, receive, send) -> Awaitable[None]:
        # Returns the chosen app's coroutine instead of awaiting it: no extra coroutine level.
        path = scope["path"]
        if path.startswith("/a2a/"):
            return a2a_app(scope, receive, send)
        if path == "/metrics":
            return metrics_app(scope, receive, send)
        fast = heartbeats.route(scope)
        if fast is not None:
            return fast(scope, receive, send)
        return django_app(scope, receive, send)

    router._asgi_single_callable = True  # type: ignore[attr-defined]  (for Channels)
    return router
