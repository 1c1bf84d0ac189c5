"""Who is calling: bearer tokens resolved to an Actor, cached in memory, usable without the
database.

* A cache is given its lifetime (:class:`TokenCache`). A process has one,
  :func:`shared_token_cache` (lifetime ``A2A_AUTH_CACHE_SECONDS``), used by every surface --
  DRF (``registry.auth``, through :meth:`TokenCache.actor_sync`), the heartbeat fast path and
  the gateway -- so a revoked token stops working after the same delay everywhere.
* A hit costs one dict lookup keyed by the header as sent. Entries are fresh for the lifetime;
  then the next call looks the token up again.
* The call path does not need the database: a lookup that fails (database down, pool exhausted,
  slower than the lookup timeout, ``A2A_AUTH_LOOKUP_TIMEOUT_SECONDS``) falls back to the last
  verified answer for up to the stale window (``A2A_AUTH_STALE_SECONDS``) after it was
  verified. Once a lookup has failed, nobody waits for the database again for
  :attr:`TokenCache.RETRY_SECONDS`: verified tokens are served at once, unknown ones get
  :class:`AuthUnavailable` at once. Revocations are honoured as soon as a lookup succeeds
  again.
* Lookups are single-flight per token (concurrent misses share one, and share its failure: no
  waiter retries on its own) and run on a small executor of their own, so they never queue
  behind heartbeats or /readyz in the default thread pool; the number in flight is bounded.
* Unknown tokens are cached apart (bounded, oldest evicted first), so a flood of bad tokens never
  pushes verified ones out and a repeated bad token costs no lookup. Credentials that are not in
  this platform's token format cost no lookup at all (and with anonymous access on are ignored).
* JWTs from trusted issuers (``A2A_JWT_ISSUERS``, :mod:`registry.identity`) are the other kind
  of bearer token: verified without the database against the issuer's keys held in memory,
  then cached here like an API key, never past the token's own ``exp``. A refused JWT is
  remembered with its reason, which every surface answers in its 401.
* :meth:`TokenCache.watch_client` lets a long-lived stream learn, within the cache delay, that
  its client was revoked.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeGuard

from django.conf import settings
from django.core.signals import setting_changed
from django.db import close_old_connections
from django.db.models import Q
from django.utils import timezone

from core import threads
from registry import identity
from registry.ids import DEFAULT_TENANT
from registry.models import ApiClient
from registry.permissions import ANONYMOUS_ID, Actor, anonymous_actor
from registry.selectors import actor_from_token, tenant_exists

logger = logging.getLogger(__name__)

INVALID_TOKEN = "invalid or revoked token"
BAD_HEADER = "Authorization must be 'Bearer <token>'"
UNAVAILABLE = "authentication unavailable: the token cannot be checked right now; retry shortly"
#: The shape of every token ``create_client`` and the admin issue (KeyGenerator's defaults):
#: ``<8-character prefix>.<32-character secret>``, letters and digits.
PLATFORM_TOKEN_RE = re.compile(r"[A-Za-z0-9]{8}\.[A-Za-z0-9]{32}")


def bearer_token(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` (or ``Api-Key <token>``) header."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() not in ("bearer", "api-key") or not token.strip():
        return None
    return token.strip()


def is_platform_token(token: str | None) -> TypeGuard[str]:
    """Whether ``token`` has the shape of this platform's tokens (it may still be unknown)."""
    return token is not None and PLATFORM_TOKEN_RE.fullmatch(token) is not None


def platform_token(header: str | None) -> str | None:
    """The platform token an Authorization header carries, or None when it carries none (no
    header, another scheme, or a credential in another format, e.g. an agent's own key)."""
    token = bearer_token(header)
    return token if is_platform_token(token) else None


class AuthFailed(Exception):
    """The Authorization header is malformed or names an unknown, revoked or expired token."""


class AuthUnavailable(AuthFailed):
    """The token could not be checked (database unreachable) and no verified answer is on hand.

    A subclass of :class:`AuthFailed` so a surface that knows nothing better refuses the call;
    the gateway and the heartbeat fast path answer it as retryable (503, Retry-After)."""


class _LookupFailed(Exception):
    """Internal: the database did not answer the lookup in time."""


_inflight = 0  # lookups submitted and not finished (timed-out threads included)


def _pool() -> ThreadPoolExecutor:
    return threads.pool("a2a-auth", settings.A2A_AUTH_LOOKUP_THREADS)


def _lookup(token: str) -> Actor | None:
    """On the lookup executor: a connection of this thread's own, closed after use."""
    close_old_connections()
    try:
        return actor_from_token(token=token)
    finally:
        close_old_connections()


def _tenant_lookup(slug: str) -> bool:
    """On the lookup executor: whether the tenant exists."""
    close_old_connections()
    try:
        return tenant_exists(slug=slug)
    finally:
        close_old_connections()


def unknown_tenant(tenant: str) -> identity.TokenRefused:
    return identity.TokenRefused(
        f"token refused: unknown tenant {tenant!r} (no such tenant on this platform)")


def _usable_client_ids(client_ids: list[str]) -> set[str]:
    """The clients among ``client_ids`` that still exist, are not revoked and not expired."""
    close_old_connections()
    try:
        return set(
            ApiClient.objects.filter(revoked=False, client_id__in=client_ids)
            .filter(Q(expiry_date__isnull=True) | Q(expiry_date__gt=timezone.now()))
            .values_list("client_id", flat=True)
        )
    finally:
        close_old_connections()


async def _in_pool(fn: Callable, timeout: float, *args):
    """Run ``fn`` on the lookup executor within ``timeout`` seconds; :class:`_LookupFailed`
    when the database fails, is too slow, or too many lookups are already in flight."""
    global _inflight
    pool = _pool()
    if _inflight >= pool._max_workers * 4:
        raise _LookupFailed("too many token lookups in flight")
    _inflight += 1
    loop = asyncio.get_running_loop()
    work = loop.run_in_executor(pool, fn, *args)

    def finished(future) -> None:
        global _inflight
        _inflight -= 1
        if not future.cancelled():
            # Retrieved here: a lookup abandoned at its timeout (the shield below) fails later,
            # e.g. with the driver's pool timeout, and nobody else looks at it -- asyncio would
            # log "Future exception was never retrieved" with a traceback for each. The failure
            # was already counted: the caller got _LookupFailed at the timeout.
            future.exception()

    work.add_done_callback(finished)
    try:
        # shield: a timed-out lookup keeps its slot until its thread really ends
        return await asyncio.wait_for(asyncio.shield(work), timeout)
    except asyncio.CancelledError:
        raise
    except TimeoutError:
        raise _LookupFailed("token lookup timed out") from None
    except Exception as exc:  # the driver's errors: refused, pool timeout, broken connection
        raise _LookupFailed(f"{type(exc).__name__}: {exc}") from exc


def _put(table: dict, key, value, cap: int) -> None:
    """Insert as the newest entry, evicting the oldest tenth when the table is full."""
    table.pop(key, None)
    if len(table) >= cap:
        for _ in range(max(1, cap // 10)):
            try:
                table.pop(next(iter(table)), None)
            except (StopIteration, RuntimeError):  # emptied by another thread (DRF's)
                break
    table[key] = value


def _noop() -> None:
    return None


class TokenCache:
    MAX_ENTRIES = 50_000
    #: Unknown tokens remembered (they cost no lookup while remembered).
    MAX_UNKNOWN = 10_000
    #: After a failed lookup, how long no call waits for the database again.
    RETRY_SECONDS = 1.0

    def __init__(
        self,
        *,
        lifetime_seconds: float,
        stale_seconds: float = 0.0,
        lookup_timeout_seconds: float = 1.0,
    ) -> None:
        """``lifetime_seconds``: how long a resolved token (known or not) is believed; a
        revoked token keeps working that long. ``stale_seconds``: how long after its last
        successful check a verified token is still served while the database cannot be reached
        (0: only within its lifetime). ``lookup_timeout_seconds``: how long a lookup may take
        before it counts as failed."""
        self.configure(
            lifetime_seconds=lifetime_seconds,
            stale_seconds=stale_seconds,
            lookup_timeout_seconds=lookup_timeout_seconds,
        )
        # header -> (actor, fresh until, usable-while-the-database-is-down until)
        self._entries: dict[str, tuple[Actor, float, float]] = {}
        self._unknown: dict[str, tuple[float, str]] = {}  # header -> (fresh until, reason)
        self._tenants: dict[str, float] = {}  # tenant slug -> known to exist until
        self._pending: dict[str, asyncio.Future] = {}
        self._down_until = 0.0
        self._outage_since: float | None = None  # the first failed lookup of an outage
        self._watchers: dict[str, set[Callable[[], None]]] = {}
        self._watch_task: asyncio.Task | None = None

    def configure(
        self, *, lifetime_seconds: float, stale_seconds: float, lookup_timeout_seconds: float
    ) -> None:
        """Set the cache's times (at construction; tests that change a setting call it again
        through :func:`shared_token_cache`'s ``setting_changed`` receiver)."""
        self.lifetime_seconds = lifetime_seconds
        self.stale_seconds = stale_seconds
        self.lookup_timeout_seconds = lookup_timeout_seconds

    def clear(self) -> None:
        self._entries.clear()
        self._unknown.clear()
        self._tenants.clear()

    @property
    def database_down(self) -> bool:
        """Whether the last lookup failed less than :attr:`RETRY_SECONDS` ago."""
        return time.monotonic() < self._down_until

    def verified(self, authorization: str | None) -> bool:
        """Whether this header names a client token verified recently (no lookup): such a caller
        is not refused with the flood of refused calls from its address."""
        entry = self._entries.get(authorization) if authorization else None
        return entry is not None and entry[2] > time.monotonic() and not entry[0].is_anonymous

    def fresh_client(self, authorization: str | None) -> Actor | None:
        """The client this header names if it was verified within the cache lifetime (no
        await, no lookup: the gateway's hot path), else None (then ask :meth:`actor`)."""
        entry = self._entries.get(authorization) if authorization else None
        if entry is not None and entry[1] > time.monotonic() and not entry[0].is_anonymous:
            return entry[0]
        return None

    async def actor(self, authorization: str | None) -> Actor | None:
        """The caller's actor; None when there is no Authorization header and anonymous access
        is off. Raises :class:`AuthFailed` for a bad header or token, and its subclass
        :class:`AuthUnavailable` when the token cannot be checked now."""
        if not authorization:
            return anonymous_actor()
        entry = self._entries.get(authorization)
        now = time.monotonic()
        if entry is not None and entry[1] > now:
            return entry[0]
        return await self._miss(authorization, entry, now)

    async def _miss(self, key: str, entry, now: float) -> Actor:
        unknown = self._unknown.get(key)
        if unknown is not None and unknown[0] > now:
            raise AuthFailed(unknown[1])
        token = bearer_token(key)
        if token is not None and not is_platform_token(token) and identity.looks_like_jwt(token):
            try:
                verified = await identity.verify(token, wait_seconds=self.jwt_wait_seconds())
                tenant = verified.actor.tenant
                if not self._tenant_fresh(tenant, now) and not await self._tenant_known(tenant):
                    raise unknown_tenant(tenant)
            except identity.TokenRefused as exc:
                return self._jwt_refused(key, entry, now, exc)
            return self._remember_jwt(key, verified)
        if not is_platform_token(token):
            anonymous = anonymous_actor()
            if anonymous is not None:
                # Not one of ours (an agent's own key, a foreign scheme): ignored, as KubeMQ
                # without gateway auth ignores it. Never forwarded either (gateway.headers).
                fresh = now + self.lifetime_seconds
                _put(self._entries, key, (anonymous, fresh, fresh), self.MAX_ENTRIES)
                return anonymous
            raise AuthFailed(BAD_HEADER if token is None else INVALID_TOKEN)
        stale = entry[0] if entry is not None and entry[2] > now else None
        if now < self._down_until:
            if stale is not None:
                return stale
            raise AuthUnavailable(UNAVAILABLE)
        try:
            actor = await self._shared_lookup(key, token)
        except _LookupFailed:
            if stale is not None:
                return stale
            raise AuthUnavailable(UNAVAILABLE) from None
        if actor is None:
            raise AuthFailed(INVALID_TOKEN)
        return actor

    def _tenant_fresh(self, tenant: str, now: float) -> bool:
        """Whether ``tenant`` is known to exist without a lookup (the default tenant always)."""
        return tenant == DEFAULT_TENANT or self._tenants.get(tenant, 0.0) > now

    async def _tenant_known(self, tenant: str) -> bool:
        """Whether a JWT's tenant exists (one bounded lookup, then remembered for the cache
        lifetime). Raises :class:`identity.KeysUnavailable` when it cannot be checked now."""
        try:
            known = await _in_pool(_tenant_lookup, self.lookup_timeout_seconds, tenant)
        except _LookupFailed as exc:
            self._failed(exc)
            raise identity.KeysUnavailable(UNAVAILABLE) from None
        self._succeeded()
        if known:
            _put(self._tenants, tenant, time.monotonic() + self.lifetime_seconds,
                 self.MAX_UNKNOWN)
        return known

    async def _shared_lookup(self, key: str, token: str) -> Actor | None:
        loop = asyncio.get_running_loop()
        pending = self._pending.get(key)
        if pending is None or pending.get_loop() is not loop:
            pending = loop.create_future()
            # Retrieve the outcome even when every waiter went away (no "never retrieved").
            pending.add_done_callback(lambda f: f.cancelled() or f.exception())
            self._pending[key] = pending
            loop.create_task(self._lookup_into(key, token, pending))
        return await asyncio.shield(pending)

    async def _lookup_into(self, key: str, token: str, future: asyncio.Future) -> None:
        try:
            actor = await _in_pool(_lookup, self.lookup_timeout_seconds, token)
        except _LookupFailed as exc:
            self._failed(exc)
            future.set_exception(exc)
            return
        except BaseException as exc:
            future.set_exception(_LookupFailed(repr(exc)))
            raise
        finally:
            if self._pending.get(key) is future:
                del self._pending[key]
        self._succeeded()
        self._remember(key, actor)
        future.set_result(actor)

    def _failed(self, exc: Exception) -> None:
        """A lookup failed: one warning per outage (its first failure), however long it lasts
        and however many lookups fail meanwhile."""
        now = time.monotonic()
        if self._outage_since is None:
            self._outage_since = now
            logger.warning("token lookup failed, serving verified tokens from memory: %s", exc)
        self._down_until = now + self.RETRY_SECONDS

    def _succeeded(self) -> None:
        self._down_until = 0.0
        since = self._outage_since
        if since is not None:
            self._outage_since = None
            logger.warning("token lookups work again after %.1fs", time.monotonic() - since)

    def _remember(self, key: str, actor: Actor | None) -> None:
        now = time.monotonic()
        fresh = now + self.lifetime_seconds
        if actor is None:
            self._entries.pop(key, None)  # revoked: its verified entry must not serve any more
            _put(self._unknown, key, (fresh, INVALID_TOKEN), self.MAX_UNKNOWN)
            return
        self._unknown.pop(key, None)
        usable = now + max(self.lifetime_seconds, self.stale_seconds)
        _put(self._entries, key, (actor, fresh, usable), self.MAX_ENTRIES)

    @staticmethod
    def jwt_wait_seconds() -> float:
        """How long a JWT naming a key not in memory waits for the issuer's key set."""
        return float(settings.A2A_JWT_FETCH_TIMEOUT_SECONDS) + 1.0

    def _remember_jwt(self, key: str, verified: identity.Verified) -> Actor:
        """Cache a verified JWT like a verified API key, never past its own expiry."""
        now = time.monotonic()
        ends = now + verified.expires_at + settings.A2A_JWT_LEEWAY_SECONDS - time.time()
        fresh = min(now + self.lifetime_seconds, ends)
        usable = min(now + max(self.lifetime_seconds, self.stale_seconds), ends)
        self._unknown.pop(key, None)
        _put(self._entries, key, (verified.actor, fresh, usable), self.MAX_ENTRIES)
        return verified.actor

    def _jwt_refused(self, key: str, entry, now: float, exc: identity.TokenRefused) -> Actor:
        """A JWT not verified now: the last verified answer while the issuer's keys cannot be
        read (the stale window), else the refusal (remembered unless it may pass soon: an
        unknown key may be a rotation, unreadable keys an outage)."""
        if isinstance(exc, identity.KeysUnavailable):
            if entry is not None and entry[2] > now:
                return entry[0]
            raise AuthUnavailable(str(exc))
        self._entries.pop(key, None)
        if not isinstance(exc, identity.UnknownKey):
            _put(self._unknown, key, (now + self.lifetime_seconds, str(exc)), self.MAX_UNKNOWN)
        raise AuthFailed(str(exc))

    def actor_sync(self, authorization: str) -> Actor | None:
        """:meth:`actor` for synchronous callers (DRF, in a worker thread): the same entries,
        the lookup on a miss done in the calling thread (its errors propagate: the surface
        answers its database-outage 503). None for an unknown token; raises
        :class:`AuthFailed` for a header that carries no platform token."""
        now = time.monotonic()
        entry = self._entries.get(authorization)
        if entry is not None and entry[1] > now:
            return entry[0]
        unknown = self._unknown.get(authorization)
        if unknown is not None and unknown[0] > now:
            if unknown[1] != INVALID_TOKEN:
                raise AuthFailed(unknown[1])
            return None
        token = bearer_token(authorization)
        if token is not None and not is_platform_token(token) and identity.looks_like_jwt(token):
            try:
                verified = identity.verify_sync(token, wait_seconds=self.jwt_wait_seconds())
                tenant = verified.actor.tenant
                if not self._tenant_fresh(tenant, now):
                    if not tenant_exists(slug=tenant):
                        raise unknown_tenant(tenant)
                    _put(self._tenants, tenant, now + self.lifetime_seconds, self.MAX_UNKNOWN)
            except identity.TokenRefused as exc:
                return self._jwt_refused(authorization, entry, now, exc)
            return self._remember_jwt(authorization, verified)
        if not is_platform_token(token):
            raise AuthFailed(BAD_HEADER if token is None else INVALID_TOKEN)
        actor = actor_from_token(token=token)
        self._remember(authorization, actor)
        return actor

    # --- revocation of long-lived streams --------------------------------------------------

    def watch_client(self, client_id: str, on_revoked: Callable[[], None]) -> Callable[[], None]:
        """Call ``on_revoked`` (once) when the client is revoked, expires or is deleted.

        Watched clients are checked together, one query per cache lifetime, so a
        stream learns of a revocation within the cache delay. While the database is down
        nothing is revoked (the stale window applies); the check resumes when it is back.
        Returns the function that stops watching (call it when the stream ends)."""
        if not client_id or client_id == ANONYMOUS_ID or \
                client_id.startswith(("staff:", identity.CLIENT_PREFIX)):
            # Not API clients: a staff session, or a JWT (valid until its own exp).
            return _noop
        loop = asyncio.get_running_loop()

        def notify() -> None:
            # The process's one cache serves every loop it runs (tests run nodes on several):
            # the stream hears of it on its own loop.
            try:
                loop.call_soon_threadsafe(on_revoked)
            except RuntimeError:  # that loop is closed: the stream is gone
                pass

        callbacks = self._watchers.setdefault(client_id, set())
        callbacks.add(notify)
        task = self._watch_task
        if task is None or task.done() or not task.get_loop().is_running():
            self._watch_task = loop.create_task(self._watch_loop(), name="token-revocation-watch")

        def unwatch() -> None:
            found = self._watchers.get(client_id)
            if found is not None:
                found.discard(notify)
                if not found:
                    del self._watchers[client_id]

        return unwatch

    async def _watch_loop(self) -> None:
        while self._watchers:
            await asyncio.sleep(max(0.1, self.lifetime_seconds))
            ids = list(self._watchers)
            if not ids or self.database_down:
                continue
            try:
                usable = await _in_pool(_usable_client_ids, self.lookup_timeout_seconds, ids)
            except _LookupFailed as exc:
                self._failed(exc)
                continue
            self._succeeded()
            for client_id in ids:
                if client_id in usable:
                    continue
                self._forget_client(client_id)
                for callback in list(self._watchers.pop(client_id, ())):
                    try:
                        callback()
                    except Exception:
                        logger.exception("revocation callback failed")

    def _forget_client(self, client_id: str) -> None:
        for key in [k for k, e in list(self._entries.items()) if e[0].client_id == client_id]:
            self._entries.pop(key, None)


_shared: TokenCache | None = None
#: The settings :func:`shared_token_cache` is built from.
_SETTINGS = ("A2A_AUTH_CACHE_SECONDS", "A2A_AUTH_STALE_SECONDS", "A2A_AUTH_LOOKUP_TIMEOUT_SECONDS")


def _times() -> dict[str, float]:
    return {
        "lifetime_seconds": settings.A2A_AUTH_CACHE_SECONDS,
        "stale_seconds": settings.A2A_AUTH_STALE_SECONDS,
        "lookup_timeout_seconds": settings.A2A_AUTH_LOOKUP_TIMEOUT_SECONDS,
    }


def shared_token_cache() -> TokenCache:
    """The process's one token cache (lifetime ``A2A_AUTH_CACHE_SECONDS``, stale window
    ``A2A_AUTH_STALE_SECONDS``, lookup timeout ``A2A_AUTH_LOOKUP_TIMEOUT_SECONDS``)."""
    global _shared
    if _shared is None:
        _shared = TokenCache(**_times())
    return _shared


def _on_setting_changed(*, setting: str, **kwargs) -> None:
    """Tests that change an auth setting while the process serves: the shared cache takes the
    new times, and forgets what it resolved under the old ones (anonymous access included)."""
    if _shared is None or setting not in (*_SETTINGS, "A2A_ALLOW_ANONYMOUS", "A2A_JWT_ISSUERS"):
        return
    _shared.configure(**_times())
    _shared.clear()


setting_changed.connect(_on_setting_changed, dispatch_uid="registry.token_cache")
