"""Who may read ``GET /metrics``: it names every agent, so it is not public outside embedded
mode.

``A2A_METRICS_REQUIRE_TOKEN`` (default: on in distributed mode, or whenever
``A2A_METRICS_TOKEN`` is set) requires ``Authorization: Bearer <A2A_METRICS_TOKEN>`` (for a
Prometheus scrape config) or an admin-scope API token or JWT; a refusal names its reason.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from django.conf import settings

from registry.auth import bearer_token
from registry.token_cache import AuthFailed, shared_token_cache

NEEDS_TOKEN = "metrics need Authorization: Bearer <A2A_METRICS_TOKEN or an admin token>"


def _authorization(scope: dict[str, Any]) -> str | None:
    headers: list[tuple[bytes, bytes]] = scope["headers"]
    for name, value in headers:
        if name == b"authorization":
            return value.decode("latin-1")
    return None


async def metrics_refusal(scope: dict[str, Any]) -> str | None:
    """None when this request may read the metrics, else why not (answered in the 401)."""
    if not settings.A2A_METRICS_REQUIRE_TOKEN:
        return None
    authorization = _authorization(scope)
    token = bearer_token(authorization)
    if token is None:
        return NEEDS_TOKEN
    expected = settings.A2A_METRICS_TOKEN
    if expected and hmac.compare_digest(token.encode(), expected.encode()):
        return None
    try:
        # The process's one token cache: a revoked admin token (or an expired JWT) stops
        # reading metrics when it stops calling agents.
        actor = await shared_token_cache().actor(authorization)
    except AuthFailed as exc:
        return str(exc)
    if actor is not None and actor.is_platform_admin and not actor.is_anonymous:
        return None
    return NEEDS_TOKEN


async def refuse(send: Callable[[dict[str, Any]], Awaitable[None]], reason: str) -> None:
    body = orjson.dumps({"error": reason})
    await send(
        {
            "type": "http.response.start",
            "status": 401,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"www-authenticate", b'Bearer realm="metrics"'),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
