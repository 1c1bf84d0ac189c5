"""Who is calling: bearer tokens resolved to an Actor, cached in memory for a short TTL.

The database lookup (``registry.selectors.actor_from_token``) runs in a worker thread only on a
cache miss; concurrent misses for one token share one lookup. Unknown tokens are cached too
(for the same short time), so a client hammering with a bad token costs no database load.

A cache is given its lifetime (:class:`TokenCache`). A process has one,
:func:`shared_token_cache` (lifetime ``A2A_AUTH_CACHE_SECONDS``), used by every surface -- DRF
(``registry.auth``), the heartbeat fast path and the gateway -- so a revoked token stops
working after the same delay everywhere.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from channels.db import database_sync_to_async
from django.conf import settings
from django.core.signals import setting_changed

from registry.permissions import Actor, anonymous_actor
from registry.selectors import actor_from_token


class AuthFailed(Exception):
    """The Authorization header is malformed or names an unknown, revoked or expired token."""


def bearer_token(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` (or ``Api-Key <token>``) header."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() not in ("bearer", "api-key") or not token.strip():
        return None
    return token.strip()


def _lookup(token: str) -> Actor | None:
    return actor_from_token(token=token)


class TokenCache:
    MAX_ENTRIES = 50_000

    def __init__(self, *, lifetime_seconds: float) -> None:
        """``lifetime_seconds``: how long a resolved token (known or not) is believed; a
        revoked token keeps working that long."""
        self.lifetime_seconds = lifetime_seconds
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
            actor = await database_sync_to_async(_lookup, thread_sensitive=False)(token)
        except BaseException:
            future.cancel()  # waiters retry on their own
            raise
        finally:
            if self._pending.get(key) is future:
                del self._pending[key]
        if len(self._entries) >= self.MAX_ENTRIES:
            self._entries.clear()
        self._entries[key] = (actor, time.monotonic() + self.lifetime_seconds)
        future.set_result(actor)
        return actor

    def actor_sync(self, authorization: str) -> Actor | None:
        """:meth:`actor` for synchronous callers (DRF, in a worker thread): the same entries,
        the lookup on a miss done in the calling thread. None for an unknown token; raises
        :class:`AuthFailed` for a malformed header."""
        entry = self._entries.get(authorization)
        if entry is not None and entry[1] > time.monotonic():
            return entry[0]
        token = bearer_token(authorization)
        if token is None:
            raise AuthFailed("Authorization must be 'Bearer <token>'")
        actor = _lookup(token)
        if len(self._entries) >= self.MAX_ENTRIES:
            self._entries.clear()
        self._entries[authorization] = (actor, time.monotonic() + self.lifetime_seconds)
        return actor


_shared: TokenCache | None = None


def shared_token_cache() -> TokenCache:
    """The process's one token cache (lifetime ``A2A_AUTH_CACHE_SECONDS``)."""
    global _shared
    if _shared is None:
        _shared = TokenCache(lifetime_seconds=settings.A2A_AUTH_CACHE_SECONDS)
    return _shared


def _on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    """A test changed ``A2A_AUTH_CACHE_SECONDS`` (pytest-django's ``settings`` fixture): the
    process's cache takes the new lifetime at once and forgets what it believed under the old
    one, as running nodes take changed gateway settings (``gateway.conf``). Nothing else
    changes settings at run time."""
    if setting == "A2A_AUTH_CACHE_SECONDS" and _shared is not None:
        _shared.lifetime_seconds = settings.A2A_AUTH_CACHE_SECONDS
        _shared.clear()


setting_changed.connect(_on_setting_changed, dispatch_uid="registry.token_cache")
