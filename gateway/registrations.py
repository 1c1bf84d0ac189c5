"""Registrations answered before Django's view stack, as heartbeats are (gateway.heartbeats).

``POST /api/v1/agents`` (a JSON body with a ``Content-Length``) and KubeMQ's
``POST /agents/register``, with a bearer token or none, are answered here: the token from the
process's token cache (the one DRF uses), then, in a worker thread, the very functions the DRF
views call (:func:`registry.api.views.v1_register`, :func:`registry.kubemq_api.kubemq_register`:
one validation, one URL check, one card parser, the same events, audit and quotas), their
refusals answered by the views' own exception handlers. The DRF views stay the documented
implementation (OpenAPI) and answer what this path passes on: staff sessions, other content
types, bodies without a ``Content-Length`` on /api/v1. Django's view and middleware stack and
its one-at-a-time sync thread cost more than a registration itself (PERFORMANCE.md).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any

from django.conf import settings

from config import outage
from gateway.bodies import BodyTooLarge, Disconnected, read_body
from gateway.heartbeats import authenticate, call_registry, send_json
from registry.api.exceptions import exception_handler
from registry.api.parsers import parse_json
from registry.api.views import v1_register
from registry.kubemq_api import (
    kubemq_exception_handler,
    kubemq_register,
    kubemq_too_large,
    parse_object,
)
from registry.permissions import Actor

_V1_PATH = re.compile(r"^/api/v1/agents/?\Z")
_KUBEMQ_PATH = re.compile(r"^/agents/register/?\Z")


def route(scope: dict[str, Any]) -> Callable[..., Awaitable[None]] | None:
    """The fast handler for this request, or None to let Django answer it."""
    if scope["method"] != "POST":
        return None
    path = scope["path"]
    if _V1_PATH.match(path):
        kind = "v1"
    elif _KUBEMQ_PATH.match(path):
        kind = "kubemq"
    else:
        return None
    authorization = cookie = content_type = length = None
    for name, value in scope["headers"]:
        if name == b"authorization":
            authorization = value.decode("latin-1")
        elif name == b"cookie":
            cookie = value
        elif name == b"content-type":
            content_type = value
        elif name == b"content-length":
            length = value
    if authorization is None and cookie is not None:
        return None  # a staff session: Django's authentication (and CSRF) handles it
    if kind == "v1":
        # DRF picks the parser by Content-Type and reads no body without a Content-Length:
        # anything but a JSON body of announced length goes to the view.
        if length is None or content_type is None or \
                content_type.split(b";", 1)[0].strip() != b"application/json":
            return None

    async def app(scope, receive, send) -> None:
        await _answer(kind, authorization, receive, send)

    return app


async def _answer(kind: str, authorization: str | None, receive, send) -> None:
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE if kind == "v1" else settings.A2A_MAX_CARD_BYTES
    too_large = False
    try:
        body = await read_body(receive, limit)
    except Disconnected:
        return
    except BodyTooLarge:
        body, too_large = b"", True
    # DRF authenticates before the view reads the body: a refusal of the caller comes first.
    status, payload, extra, actor = await authenticate(authorization)
    if actor is not None:
        if too_large:
            status, payload = 413, (
                {"error": "request body too large"} if kind == "v1"  # the API's RequestDataTooBig
                else {"error": str(kubemq_too_large())}
            )
        else:
            fn = _v1 if kind == "v1" else _kubemq
            status, payload = await call_registry(fn, extra, actor=actor, body=body)
    await send_json(send, status, payload, extra)


def _v1(*, actor: Actor, body: bytes) -> tuple[int, dict]:
    try:
        data = parse_json(body) if body else {}  # DRF: no body, no parser, empty data
        return v1_register(actor=actor, data=data, body=body)
    except Exception as exc:
        return _refusal(exception_handler, exc)


def _kubemq(*, actor: Actor, body: bytes) -> tuple[int, dict]:
    try:
        return 200, kubemq_register(actor=actor, data=parse_object(body), body=body)
    except Exception as exc:
        return _refusal(kubemq_exception_handler, exc)


def _refusal(handler, exc: Exception) -> tuple[int, dict]:
    """The view's own exception handler's answer to ``exc`` (outages re-raised: the caller
    answers them as every surface does)."""
    if outage.is_database_outage(exc):
        raise exc
    response = handler(exc, {})
    if response is None:
        raise exc
    return response.status_code, response.data
