"""HTTP routing: ``/a2a/...`` and ``/metrics`` to lean ASGI handlers, the rest to Django.

Django's view and middleware stack alone caps a core near 1,000 req/s (PERFORMANCE.md), so the
gateway's hot path never enters it; the admin, the REST API and everything else do.
"""

from __future__ import annotations

from gateway.handler import a2a_app
from gateway.metrics import metrics_app


def http_application(django_app):
    """The ``http`` application of the Channels ``ProtocolTypeRouter``."""

    async def router(scope, receive, send) -> None:
        path = scope["path"]
        if path.startswith("/a2a/"):
            await a2a_app(scope, receive, send)
        elif path == "/metrics":
            await metrics_app(scope, receive, send)
        else:
            await django_app(scope, receive, send)

    return router
