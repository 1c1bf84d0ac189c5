"""Who is calling: bearer tokens resolved to an Actor, cached in memory for a short TTL.

The database lookup (``registry.selectors.actor_from_token``) runs in a worker thread only on a
cache miss; concurrent misses for one token share one lookup. Unknown tokens are cached too
(for the same short time), so a client hammering with a bad token costs no database load.
"""

from __future__ import annotations

import asyncio
import time

from asgiref.sync import sync_to_async
from django.db import close_old_connections

from gateway.conf import conf
from registry.auth import bearer_token
from registry.permissions import Actor, anonymous_actor
from registry.selectors import actor_from_token


class AuthFailed(Exception):
    """The Authorization header is malformed or names an unknown, revoked or expired token."""


def _lookup(token: str) -> Actor | None:
    close_old_connections()
    try:
        return actor_from_token(token=token)
    finally:
        close_old_connections()


class TokenCache:
    MAX_ENTRIES = 50_000

    def __init__(self) -> None:
        self._entries: dict[str, tuple[Actor | None, float]] = {}
        self._pending: dict[str, asyncio.Future] = {}

    def clear(self) -> None:
        self._entries.clear()

    async def actor(self, authorization: str | None) -> Actor | None:
        """The caller's actor; None when there is no Authorization header and anonymous access
        is off. Raises :class:`AuthFailed` for a bad header or token."""
        if not authorization:
            return anonymous_actor()
        # Keyed by the header as sent: a hit costs one dict lookup, no parsing.
        entry = self._entries.get(authorization)
        if entry is not None and entry[1] > time.monotonic():
            actor = entry[0]
        else:
            token = bearer_token(authorization)
            if token is None:
                raise AuthFailed("Authorization must be 'Bearer <token>'")
            actor = await self._resolve(authorization, token)
        if actor is None:
            raise AuthFailed("invalid or revoked token")
        return actor

    async def _resolve(self, key: str, token: str) -> Actor | None:
        pending = self._pending.get(key)
        if pending is not None:
            try:
                return await asyncio.shield(pending)
            except asyncio.CancelledError:
                if not pending.cancelled():
                    raise  # this request itself was cancelled
            # the shared lookup failed or was cancelled: look up on our own below
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        self._pending[key] = future
        try:
            actor = await sync_to_async(_lookup, thread_sensitive=False)(token)
        except BaseException:
            future.cancel()  # waiters retry on their own
            raise
        finally:
            if self._pending.get(key) is future:
                del self._pending[key]
        if len(self._entries) >= self.MAX_ENTRIES:
            self._entries.clear()
        self._entries[key] = (actor, time.monotonic() + conf.A2A_AUTH_CACHE_SECONDS)
        future.set_result(actor)
        return actor
