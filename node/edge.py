"""Body limits for everything but the gateway, enforced before the body is read.

Django's ASGI handler reads a whole request body (spooling it to a temporary file) before any
view or ``DATA_UPLOAD_MAX_MEMORY_SIZE`` check runs, and the heartbeat fast path reads a body to
its end. This wrapper answers 413 at once when the announced ``Content-Length`` is above
``A2A_MAX_API_BODY_BYTES``, and cuts a chunked body at that size (413, and the application
sees the client leave). The ``/a2a/`` gateway and the ``/mcp`` bridge enforce their own cap.
"""

from __future__ import annotations

import orjson
from django.conf import settings


def _too_large(cap: int) -> tuple[dict, dict]:
    body = orjson.dumps({"error": f"request body too large: the limit is {cap} bytes"})
    start = {
        "type": "http.response.start",
        "status": 413,
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ],
    }
    return start, {"type": "http.response.body", "body": body}


#: Paths that cap their own bodies at ``A2A_MAX_REQUEST_BYTES`` (the MCP bridge: a tool call
#: carries what a gateway call would).
_OWN_CAP = frozenset({"/mcp", "/mcp/"})


def limit_body(app):
    """Wrap the node's HTTP application with the API body cap (``/a2a/`` and ``/mcp`` pass
    untouched: the gateway reads, caps and authenticates its own bodies on the hot path, the
    MCP bridge authenticates first and caps at the gateway's request cap)."""
    cap = settings.DATA_UPLOAD_MAX_MEMORY_SIZE

    def router(scope, receive, send):
        # Returns the app's coroutine itself for paths without a body to guard: no extra
        # coroutine level on the gateway's hot path.
        path = scope["path"]
        if path.startswith("/a2a/") or path in _OWN_CAP or \
                scope["method"] in ("GET", "HEAD", "OPTIONS"):
            return app(scope, receive, send)
        return guarded(scope, receive, send)

    async def guarded(scope, receive, send) -> None:
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    announced = int(value)
                except ValueError:
                    announced = 0
                if announced > cap:
                    start, body = _too_large(cap)
                    await send(start)
                    await send(body)
                    return
                break
        size = 0
        refused = False

        async def capped_receive():
            nonlocal size, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                size += len(message.get("body", b""))
                if size > cap:
                    refused = True
                    start, body = _too_large(cap)
                    await send(start)
                    await send(body)
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message) -> None:
            if not refused:
                await send(message)

        await app(scope, capped_receive, guarded_send)

    router._asgi_single_callable = True  # type: ignore[attr-defined]  # a marker for Channels
    return router
