"""Body limits for requests that go to Django, enforced before Django reads the body.

Django's ASGI handler reads a whole request body (spooling it to a temporary file) before any
view or ``DATA_UPLOAD_MAX_MEMORY_SIZE`` check runs. This wrapper answers 413 at once when the
announced ``Content-Length`` is above ``A2A_MAX_API_BODY_BYTES``, and cuts a chunked body at
that size (413, and Django sees the client leave). The ``/a2a/`` gateway enforces its own cap.
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


def limit_body(app):
    """Wrap a Django ASGI application with the API body cap."""
    cap = settings.DATA_UPLOAD_MAX_MEMORY_SIZE

    async def guarded(scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await app(scope, receive, send)
            return
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

    return guarded
