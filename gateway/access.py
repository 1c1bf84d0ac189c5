"""Who may read ``GET /metrics``: it names every agent, so it is not public outside embedded
mode.

``A2A_METRICS_REQUIRE_TOKEN`` (default: on in distributed mode, or whenever
``A2A_METRICS_TOKEN`` is set) requires ``Authorization: Bearer <A2A_METRICS_TOKEN>`` (for a
Prometheus scrape config) or an admin-scope API token.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Any

from django.conf import settings

from registry.auth import bearer_token
from registry.token_cache import AuthFailed, shared_token_cache

UNAUTHORIZED = (
    b'{"error": "metrics need Authorization: Bearer <A2A_METRICS_TOKEN or an admin token>"}'
)


def _authorization(scope: dict[str, Any]) -> str | None:
    headers: list[tuple[bytes, bytes]] = scope["headers"]
    for name, value in headers:
        if name == b"authorization":
            return value.decode("latin-1")
    return None


async def metrics_allowed(scope: dict[str, Any]) -> bool:
    """Whether this request may read the metrics."""
    if not settings.A2A_METRICS_REQUIRE_TOKEN:
        return True
    authorization = _authorization(scope)
    token = bearer_token(authorization)
    if token is None:
        return False
    expected = settings.A2A_METRICS_TOKEN
    if expected and hmac.compare_digest(token.encode(), expected.encode()):
        return True
    try:
        # The process's one token cache: a revoked admin token stops reading metrics when it
        # stops calling agents.
        actor = await shared_token_cache().actor(authorization)
    except AuthFailed:
        return False
    return actor is not None and actor.is_admin and not actor.is_anonymous


async def refuse(send: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 401,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(UNAUTHORIZED)).encode()),
                (b"www-authenticate", b'Bearer realm="metrics"'),
            ],
        }
    )
    await send({"type": "http.response.body", "body": UNAUTHORIZED})
