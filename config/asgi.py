"""The ASGI application: a Channels router that sends /a2a/... to the gateway's lean handler
and /mcp to the MCP bridge before Django's view and middleware stack, and everything else to
Django."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django_asgi_app = get_asgi_application()

from asgiref.sync import markcoroutinefunction  # noqa: E402
from channels.routing import ProtocolTypeRouter  # noqa: E402

from core.lifecycle import lifespan_app  # noqa: E402
from mcp_bridge.server import routes as mcp_routes  # noqa: E402
from node.edge import limit_body  # noqa: E402
from node.router import http_application  # noqa: E402

_http = limit_body(http_application(django_asgi_app, apps=mcp_routes()))
_other = ProtocolTypeRouter({"http": _http, "lifespan": lifespan_app})


def application(scope, receive, send):
    """Channels' ``ProtocolTypeRouter``, with HTTP dispatched first: a plain function returning
    the HTTP application's coroutine, so the hot path has no router coroutine level (the
    router's ``await`` would sit under every suspension of every request)."""
    if scope["type"] == "http":
        return _http(scope, receive, send)
    return _other(scope, receive, send)


# ASGI 3 for the servers that inspect it: Channels and Daphne read this flag, uvicorn asks
# asyncio.iscoroutinefunction (which the marker answers true).
application._asgi_single_callable = True  # type: ignore[attr-defined]  # a marker for Channels
markcoroutinefunction(application)
