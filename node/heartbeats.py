"""Heartbeats answered before Django's view stack (the registry's hottest call).

10,000 agents heartbeating every 10 s is 1,000 requests/s; Django's view and middleware stack
alone caps a core near that (docs/adr/0001), and sync views under ASGI run one at a time on
one thread. So ``POST /api/v1/agents/{id}/heartbeat`` and KubeMQ's ``POST /agents/heartbeat``
with a bearer token are answered here: token from the process's token cache (the one DRF
uses), the lease renewed with the heartbeats arriving with it (one ``UPDATE ... RETURNING``
per batch, in a worker thread: core.batching), the same status and body functions as
the DRF views (:func:`registry.api.views.v1_heartbeat`,
:func:`registry.kubemq_api.kubemq_heartbeat`). Requests with a session cookie and no token
(staff in a browser) go to Django. A body over ``A2A_MAX_CARD_BYTES`` is answered 413 without
reading further (a heartbeat carries at most an agent id). While the database is down (or a
token cannot be checked) the answer is the JSON 503 with ``Retry-After`` every surface gives
(core.outage). An edge handler like ``/a2a``, so
it lives with the other ASGI entry points (node.router); the registry knows no ASGI.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from channels.db import database_sync_to_async
from django.conf import settings

from core import outage
from core.batching import Coalescer, Overloaded, per_loop
from gateway.bodies import BodyTooLarge, Disconnected, Receive, Send, read_body
from gateway.cards import host_allowed
from registry.api.views import v1_heartbeat, v1_heartbeat_answer
from registry.auth import UNAUTHENTICATED_MESSAGE
from registry.kubemq_api import kubemq_heartbeat, kubemq_heartbeat_answer, kubemq_heartbeat_id
from registry.permissions import Actor
from registry.services import HeartbeatResult, agents_heartbeat
from registry.token_cache import AuthFailed, AuthUnavailable, shared_token_cache

_V1_PATH = re.compile(r"^/api/v1/agents/([^/]+)/heartbeat/?\Z")
_KUBEMQ_PATH = "/agents/heartbeat"
_JSON = (b"content-type", b"application/json")

logger = logging.getLogger(__name__)


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
    authorization = cookie = host = None
    for name, value in scope["headers"]:
        if name == b"authorization":
            authorization = value.decode("latin-1")
        elif name == b"cookie":
            cookie = value
        elif name == b"host":
            host = value
    if authorization is None and cookie is not None:
        return None  # a staff session: Django's authentication handles it
    if host is not None and not host_allowed(host.decode("latin-1")):
        return None  # Django refuses a Host outside ALLOWED_HOSTS (node.views.bad_request)

    async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        await _answer(kind, agent_id, authorization, receive, send)

    return app


async def _answer(kind: str, agent_id: str | None, authorization: str | None,
                  receive: Receive, send: Send) -> None:
    limit = settings.A2A_MAX_CARD_BYTES
    try:
        body = await read_body(receive, limit)
    except Disconnected:
        return
    except BodyTooLarge:
        await send_json(send, 413, {"error": f"request body too large: the limit is {limit} bytes"})
        return
    status, payload, extra, actor = await authenticate(authorization)
    if actor is not None:
        status, payload = await _heartbeat(kind, agent_id, body, actor, extra)
    await send_json(send, status, payload, extra)


async def _heartbeat(kind: str, agent_id: str | None, body: bytes, actor: Actor,
                     extra: list[tuple[bytes, bytes]]) -> tuple[int, dict[str, Any]]:
    """Renew the lease in the loop's next batch of heartbeats (group commit); whatever the
    batch did not renew (unknown, forbidden, a malformed body) is answered by the views' own
    function, whose reads tell those apart."""
    if kind == "kubemq":
        try:
            agent_id = kubemq_heartbeat_id(body)
        except Exception:
            agent_id = None  # kubemq_heartbeat answers the body's 400 or 413
    if agent_id is not None:
        try:
            check_breaker()
            beat = await _renewals().submit((actor, agent_id))
        except Overloaded:
            extra.append((b"retry-after", b"1"))
            return 503, {"error": "this node has too many heartbeats waiting; retry"}
        except Exception as exc:
            return outage_answer(exc, extra)
        if beat is not None:
            return v1_heartbeat_answer(beat) if kind == "v1" else kubemq_heartbeat_answer(beat)
    fn, kwargs = (v1_heartbeat, {"agent_id": agent_id}) if kind == "v1" \
        else (kubemq_heartbeat, {"body": body})
    return await call_registry(fn, extra, actor=actor, **kwargs)


async def _renew(beats: list[tuple[Actor, str]]) -> list[HeartbeatResult | None]:
    """One batch of heartbeats, one statement (:func:`registry.services.agents_heartbeat`).

    With no batch running a heartbeat is written at once, so an idle registry adds no delay;
    at 1,000 heartbeats/s the commits, each a round trip and a WAL flush that queued in the
    worker threads, become one per batch.
    """
    try:
        renewed: list[HeartbeatResult | None] = await database_sync_to_async(
            agents_heartbeat, thread_sensitive=False)(beats=beats)
        return renewed
    except Exception as exc:
        if outage.is_database_outage(exc):
            raise
        # Anything else (a deadlock between two nodes' batches, say): each heartbeat goes the
        # single way and meets its own error there, if any.
        logger.warning("a batch of %d heartbeats failed (%s): renewing them one by one",
                       len(beats), exc)
        return [None] * len(beats)


MAX_BATCH = 500
MAX_WAITING = 20_000  # past this many waiting heartbeats a node answers 503 at once
_renewals = per_loop(lambda: Coalescer(_renew, max_batch=MAX_BATCH, max_waiting=MAX_WAITING))


async def authenticate(authorization: str | None
                       ) -> tuple[int, dict[str, Any], list[tuple[bytes, bytes]], Actor | None]:
    """The caller's actor from the process's token cache (the one DRF uses), or the refusal
    (status, body, extra headers) every surface gives; ``actor`` None means refused."""
    extra: list[tuple[bytes, bytes]] = []
    try:
        actor: Actor | None = await shared_token_cache().actor(authorization)
    except AuthUnavailable:
        extra.append((b"retry-after", str(outage.RETRY_AFTER_SECONDS).encode()))
        return 503, outage.payload(), extra, None
    except AuthFailed as exc:
        extra.append((b"www-authenticate", b'Bearer realm="api"'))
        return 401, {"error": str(exc)}, extra, None
    if actor is None:
        extra.append((b"www-authenticate", b'Bearer realm="api"'))
        return 401, {"error": UNAUTHENTICATED_MESSAGE}, extra, None
    return 0, {}, extra, actor


async def call_registry(fn: Callable[..., tuple[int, dict[str, Any]]],
                        extra: list[tuple[bytes, bytes]],
                        **kwargs: Any) -> tuple[int, dict[str, Any]]:
    """``fn(**kwargs)`` (a registry function answering status and body) in a worker thread;
    the JSON 503 (``Retry-After`` appended to ``extra``) while the database is down."""
    try:
        check_breaker()
        answer: tuple[int, dict[str, Any]] = await database_sync_to_async(
            fn, thread_sensitive=False)(**kwargs)
        return answer
    except Exception as exc:
        return outage_answer(exc, extra)


def check_breaker() -> None:
    """Raise at once while the database is known to be down (core.outage)."""
    if outage.breaker.is_open:
        outage.breaker.ensure_probe()
        raise outage.DatabaseUnavailable


def outage_answer(exc: Exception, extra: list[tuple[bytes, bytes]]) -> tuple[int, dict[str, Any]]:
    """The JSON 503 for a database outage (``Retry-After`` appended to ``extra``); any other
    error is re-raised."""
    if not outage.is_database_outage(exc):
        raise exc
    outage.breaker.trip(exc)
    extra.append((b"retry-after", str(outage.RETRY_AFTER_SECONDS).encode()))
    return 503, outage.payload()


async def send_json(send: Send, status: int, payload: dict[str, Any],
                extra: list[tuple[bytes, bytes]] | None = None) -> None:
    data = orjson.dumps(payload)
    await send({"type": "http.response.start", "status": status,
                "headers": [_JSON, (b"content-length", str(len(data)).encode()), *(extra or [])]})
    await send({"type": "http.response.body", "body": data})
