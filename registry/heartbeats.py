"""Heartbeats answered before Django's view stack (the registry's hottest call).

10,000 agents heartbeating every 10 s is 1,000 requests/s; Django's view and middleware stack
alone caps a core near that (PERFORMANCE.md), and sync views under ASGI run one at a time on
one thread. So ``POST /api/v1/agents/{id}/heartbeat`` and KubeMQ's ``POST /agents/heartbeat``
with a bearer token are answered here: token from the in-memory cache, one ``UPDATE ...
RETURNING`` in a worker thread, the same status and body functions as the DRF views
(:func:`registry.api.views.v1_heartbeat`, :func:`registry.kubemq_api.kubemq_heartbeat`).
Requests with a session cookie and no token (staff in a browser) go to Django.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import close_old_connections

from config import outage
from registry.api.views import v1_heartbeat
from registry.auth import UNAUTHENTICATED_MESSAGE
from registry.kubemq_api import kubemq_heartbeat
from registry.permissions import Actor
from registry.token_cache import AuthFailed, AuthUnavailable, TokenCache

_V1_PATH = re.compile(r"^/api/v1/agents/([^/]+)/heartbeat/?\Z")
_KUBEMQ_PATH = "/agents/heartbeat"
_JSON = (b"content-type", b"application/json")

tokens = TokenCache()


def route(scope: dict[str, Any]) -> Callable[..., Awaitable[None]] | None:
    """The fast handler for this request, or None to let Django answer it."""
    if scope["method"] != "POST":
        return None
    path = scope["path"]
    if path == _KUBEMQ_PATH:
        kind, agent_id = "kubemq", None
    else:
        match = _V1_PATH.match(path)
        if match is None:
            return None
        kind, agent_id = "v1", match.group(1)
    authorization = cookie = None
    for name, value in scope["headers"]:
        if name == b"authorization":
            authorization = value.decode("latin-1")
        elif name == b"cookie":
            cookie = value
    if authorization is None and cookie is not None:
        return None  # a staff session: Django's authentication handles it

    async def app(scope, receive, send) -> None:
        await _answer(kind, agent_id, authorization, receive, send)

    return app


async def _read_body(receive, limit: int) -> bytes | None:
    """The body, cut at ``limit + 1`` bytes (enough for the body functions to refuse it as too
    large); None when the caller went away."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        if size <= limit:
            chunks.append(chunk[: limit + 1 - size])
            size += len(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


def _in_thread(fn: Callable[..., tuple[int, dict]], **kwargs) -> tuple[int, dict]:
    close_old_connections()
    try:
        return fn(**kwargs)
    finally:
        close_old_connections()


async def _answer(kind: str, agent_id: str | None, authorization: str | None, receive,
                  send) -> None:
    body = await _read_body(receive, settings.A2A_MAX_CARD_BYTES)
    if body is None:
        return
    extra: list[tuple[bytes, bytes]] = []
    try:
        actor: Actor | None = await tokens.actor(authorization)
    except AuthUnavailable:
        status, payload, actor = 503, outage.payload(), None
        extra.append((b"retry-after", str(outage.RETRY_AFTER_SECONDS).encode()))
    except AuthFailed as exc:
        status, payload = 401, {"error": str(exc)}
        extra.append((b"www-authenticate", b'Bearer realm="api"'))
        actor = None
    else:
        if actor is None:
            status, payload = 401, {"error": UNAUTHENTICATED_MESSAGE}
            extra.append((b"www-authenticate", b'Bearer realm="api"'))
    if actor is not None:
        fn, kwargs = (v1_heartbeat, {"agent_id": agent_id}) if kind == "v1" \
            else (kubemq_heartbeat, {"body": body})
        try:
            if outage.breaker.is_open:  # the database is down: answer at once (config.outage)
                outage.breaker.ensure_probe()
                raise outage.DatabaseUnavailable
            status, payload = await sync_to_async(_in_thread, thread_sensitive=False)(
                fn, actor=actor, **kwargs
            )
        except Exception as exc:
            if not outage.is_database_outage(exc):
                raise
            outage.breaker.trip(exc)
            status, payload = 503, outage.payload()
            extra.append((b"retry-after", str(outage.RETRY_AFTER_SECONDS).encode()))
    data = orjson.dumps(payload)
    await send({"type": "http.response.start", "status": status,
                "headers": [_JSON, (b"content-length", str(len(data)).encode()), *extra]})
    await send({"type": "http.response.body", "body": data})
