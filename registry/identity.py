"""External identity: ``Authorization: Bearer <JWT>`` from trusted issuers (docs/identity.md).

A JWT is one more kind of bearer token the process's one token cache
(:mod:`registry.token_cache`) resolves to an :class:`~registry.permissions.Actor`: every
surface that takes API keys takes these too, through the same cache, and a JWT verified before
is answered from memory like a verified API key.

* **Issuers** come only from ``A2A_JWT_ISSUERS`` (:func:`parse_issuers`): issuer URL,
  audience, where the keys are (OIDC discovery by default, a JWKS URL, or a JWKS file), the
  accepted algorithms (asymmetric only) and the claim mappings to the platform's scopes,
  allowed agents and tenant. No issuer: JWTs are not looked at (off).
* **Keys** are parsed by the card-signature code (:func:`registry.signatures.parse_jwks`: size
  cap, public signing keys only) and kept per issuer in memory (:class:`IssuerKeys`). They are
  fetched on threads of their own (``a2a-jwks``), never on the event loop, through the outbound
  policy (TLS, proxy, refused addresses at connect) after the URL checks agent URLs get
  (:func:`registry.netcheck.check_agent_url`). Keys older than ``A2A_JWT_JWKS_TTL_SECONDS``
  keep serving while a refresh runs in the background; a failed refresh keeps the last good
  keys, so calls keep being verified while the identity provider is down. A ``kid`` not in
  the set forces a refresh (key rotation), at most once per
  ``A2A_JWT_JWKS_MIN_REFRESH_SECONDS`` per issuer, so tokens naming random kids cannot make
  the node hammer the identity provider. (The card-signature JWKS fetcher lives in discovery,
  above this layer, with discovery's timeouts: the few lines of GET here are this layer's own,
  with the provider's timeout, ``A2A_JWT_FETCH_TIMEOUT_SECONDS``.)
* **Verification** is PyJWT's (signature, ``exp``, ``nbf``, ``iat``, ``iss``, ``aud``, with
  ``A2A_JWT_LEEWAY_SECONDS``); what PyJWT would leave to configuration is refused here first:
  ``alg: none``, every HS* algorithm (a public key used as an HMAC secret: algorithm
  confusion), an algorithm the key's type does not sign with, a token over
  ``A2A_JWT_MAX_BYTES``. Each refusal is a :class:`TokenRefused` whose message names the
  reason; the surfaces answer it as their 401.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import os
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed

from core import threads
from outbound import clients
from outbound import policy as outbound_policy
from registry import netcheck
from registry.ids import DEFAULT_TENANT, tenant_error
from registry.permissions import ALL_SCOPES, SCOPE_ADMIN, SCOPE_REGISTER, Actor
from registry.signatures import ALGORITHMS, MAX_JWKS_BYTES, parse_jwks

logger = logging.getLogger(__name__)

#: Key types each accepted algorithm signs with (a JWK of another type never verifies it).
_KEY_TYPES = {"RS": "RSA", "PS": "RSA", "ES": "EC", "Ed": "OKP"}
#: Default mapping of the scopes claim's values to the platform's scopes.
DEFAULT_SCOPE_MAP = {"a2a.call": ["call"], "a2a.register": ["register"], "a2a.admin": ["admin"]}
_CONFIG_KEYS = {"issuer", "audience", "name", "jwks_uri", "jwks_file", "algorithms", "claims",
                "scope_map", "default_scopes", "tenant"}
_CLAIM_KEYS = {"subject", "scopes", "allowed_agents", "tenant"}
#: Client ids of JWT callers start with this (``jwt:<issuer name>:<subject>``).
CLIENT_PREFIX = "jwt:"


class TokenRefused(Exception):
    """The JWT is not accepted; the message names the reason (answered with a 401)."""


class UnknownKey(TokenRefused):
    """No key of the issuer has the token's kid (not remembered: it may be published soon)."""


class KeysUnavailable(TokenRefused):
    """The issuer's keys have never been fetched (identity provider unreachable): retryable."""


@dataclass(frozen=True)
class Issuer:
    """One trusted issuer, as configured in ``A2A_JWT_ISSUERS``."""

    issuer: str
    audiences: tuple[str, ...]
    name: str
    jwks_uri: str
    jwks_file: str
    algorithms: tuple[str, ...]
    subject_claim: str
    scopes_claim: str
    scope_map: tuple[tuple[str, tuple[str, ...]], ...]
    default_scopes: tuple[str, ...]
    allowed_agents_claim: str
    tenant_claim: str
    #: The tenant of this issuer's tokens that carry no tenant claim (docs/tenants.md).
    tenant: str = DEFAULT_TENANT

    @property
    def discovery_url(self) -> str:
        return self.issuer.rstrip("/") + "/.well-known/openid-configuration"

    def scopes(self, claims: dict[str, Any]) -> frozenset[str]:
        granted = set(self.default_scopes)
        mapping = dict(self.scope_map)
        for value in _words(_claim(claims, self.scopes_claim)):
            granted.update(mapping.get(value, ()))
        return frozenset(granted)


def _fail(index: int, message: str) -> ImproperlyConfigured:
    return ImproperlyConfigured(f"A2A_JWT_ISSUERS[{index}]: {message}")


def _strings(value: Any, index: int, what: str) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(v, str) and v for v in items):
        raise _fail(index, f"{what} must be a string or a list of strings")
    return tuple(items)


def _issuer(index: int, entry: Any) -> Issuer:
    if not isinstance(entry, dict):
        raise _fail(index, "each issuer is a JSON object")
    unknown = set(entry) - _CONFIG_KEYS
    if unknown:
        raise _fail(index, f"unknown key(s) {sorted(unknown)}; known: {sorted(_CONFIG_KEYS)}")
    issuer = entry.get("issuer")
    if not isinstance(issuer, str) or not issuer:
        raise _fail(index, '"issuer" (the iss claim, e.g. the realm URL) is required')
    if "audience" not in entry:
        raise _fail(index, '"audience" (the aud claim this platform accepts) is required')
    audiences = _strings(entry["audience"], index, "audience")
    jwks_uri, jwks_file = entry.get("jwks_uri", ""), entry.get("jwks_file", "")
    if jwks_uri and jwks_file:
        raise _fail(index, 'give "jwks_uri" or "jwks_file", not both')
    for where in [jwks_uri] if jwks_uri else [] if jwks_file else [issuer]:
        try:
            netcheck.check_agent_url(where, allowlist=[], resolve=False)
        except netcheck.UnsafeUrl as exc:
            raise _fail(index, f"{where}: {exc}") from None
    algorithms = _strings(entry.get("algorithms", list(ALGORITHMS)), index, "algorithms")
    refused = [a for a in algorithms if a not in ALGORITHMS]
    if refused:
        raise _fail(index, f"algorithms {refused} not accepted (asymmetric only: {ALGORITHMS})")
    claims = entry.get("claims", {})
    if not isinstance(claims, dict) or set(claims) - _CLAIM_KEYS or \
            not all(isinstance(v, str) for v in claims.values()):
        raise _fail(index, f'"claims" maps {sorted(_CLAIM_KEYS)} to claim names')
    scope_map = entry.get("scope_map", DEFAULT_SCOPE_MAP)
    if not isinstance(scope_map, dict):
        raise _fail(index, '"scope_map" maps claim values to lists of platform scopes')
    mapped = {k: _strings(v, index, f"scope_map[{k!r}]") for k, v in scope_map.items()}
    defaults = _strings(entry.get("default_scopes", []), index, "default_scopes") \
        if entry.get("default_scopes") else ()
    for scope in [s for v in mapped.values() for s in v] + list(defaults):
        if scope not in ALL_SCOPES:
            raise _fail(index, f"unknown platform scope {scope!r} (scopes: {ALL_SCOPES})")
    name = entry.get("name") or urlsplit(issuer).hostname or issuer
    tenant = entry.get("tenant", DEFAULT_TENANT)
    if tenant_error(tenant):
        raise _fail(index, f'"tenant": {tenant_error(tenant)}')
    return Issuer(
        issuer=issuer, audiences=audiences, name=str(name), jwks_uri=jwks_uri or "",
        jwks_file=jwks_file or "", algorithms=algorithms,
        subject_claim=claims.get("subject", "sub"), scopes_claim=claims.get("scopes", "scope"),
        scope_map=tuple(mapped.items()), default_scopes=defaults,
        allowed_agents_claim=claims.get("allowed_agents", ""),
        tenant_claim=claims.get("tenant", ""), tenant=tenant,
    )


def parse_issuers(raw: Any) -> tuple[Issuer, ...]:
    """The issuers of ``A2A_JWT_ISSUERS`` (a JSON list, or its text); raises
    ``ImproperlyConfigured`` naming the entry and the key that is wrong."""
    if isinstance(raw, str):
        if not raw.strip():
            return ()
        try:
            raw = json.loads(raw)
        except ValueError as exc:
            raise ImproperlyConfigured(f"A2A_JWT_ISSUERS is not JSON: {exc}") from None
    if not isinstance(raw, list):
        raise ImproperlyConfigured("A2A_JWT_ISSUERS must be a JSON list of issuers")
    parsed = tuple(_issuer(i, entry) for i, entry in enumerate(raw))
    if len({p.issuer for p in parsed}) != len(parsed):
        raise ImproperlyConfigured("A2A_JWT_ISSUERS names an issuer twice")
    return parsed


def _claim(claims: dict[str, Any], path: str) -> Any:
    """A claim by name, or by a dotted path into nested objects (``realm_access.roles``)."""
    if not path:
        return None
    if path in claims:
        return claims[path]
    value: Any = claims
    for part in path.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def _words(value: Any) -> list[str]:
    """A claim as a list of strings: a list's strings, or a string split on spaces and commas
    (OAuth's ``scope`` is space-separated)."""
    if isinstance(value, str):
        return value.replace(",", " ").split()
    if isinstance(value, list):
        return [v for v in value if isinstance(v, str) and v]
    return []


# --- keys ----------------------------------------------------------------------------------


def _get(url: str, etag: str = "") -> tuple[int | None, bytes, str, str]:
    """``(status, body, etag, error)`` of a GET through the outbound policy, after the agent-URL
    checks; never raises for network or HTTP errors."""
    try:
        netcheck.check_agent_url(url, allowlist=[])
    except netcheck.UnsafeUrl as exc:
        return None, b"", "", f"{url} refused: {exc}"
    headers = {"Accept": "application/json"}
    if etag:
        headers["If-None-Match"] = etag
    try:
        with _client().stream("GET", url, headers=headers) as resp:
            if resp.status_code == 304:
                return 304, b"", resp.headers.get("etag", etag), ""
            if resp.status_code != 200:
                return resp.status_code, b"", "", f"{url} answered HTTP {resp.status_code}"
            body = bytearray()
            for chunk in resp.iter_bytes():
                body += chunk
                if len(body) > MAX_JWKS_BYTES:
                    return None, b"", "", f"{url}: larger than {MAX_JWKS_BYTES} bytes"
            return 200, bytes(body), resp.headers.get("etag", ""), ""
    except httpx.HTTPError as exc:
        return None, b"", "", f"{url}: {type(exc).__name__}: {exc}".rstrip(": ")


_shared: dict[str, Any] = {}
_client_lock = threading.Lock()


def _client() -> httpx.Client:
    """The process's identity-provider client (rebuilt after a fork, a change of outbound policy
    or of ``A2A_JWT_FETCH_TIMEOUT_SECONDS``)."""
    timeout = float(settings.A2A_JWT_FETCH_TIMEOUT_SECONDS)
    key = (os.getpid(), outbound_policy.current(), timeout)
    with _client_lock:
        if _shared.get("key") != key:
            _shared.update(key=key, client=clients.httpx_client(
                timeout=httpx.Timeout(timeout), limits=httpx.Limits(max_connections=4)))
        return _shared["client"]


class IssuerKeys:
    """One issuer's verification keys by kid, refreshed off the hot path."""

    def __init__(self, issuer: Issuer) -> None:
        self.issuer = issuer
        self.keys: dict[str, Any] = {}
        self.loaded = False  # a key set was read at least once
        self.error = ""
        self.fetches = 0  # attempts to read the key set (tests and the bench read it)
        self._jwks_uri = issuer.jwks_uri
        self._etag = ""
        self._file_sig: tuple[float, int] | None = None
        self._expires_at = 0.0  # monotonic
        self._started_at = float("-inf")  # monotonic: the last refresh submitted
        self._lock = threading.Lock()
        self._pending: Future | None = None

    def find(self, kid: str | None) -> Any | None:
        if kid is None:
            return next(iter(self.keys.values())) if len(self.keys) == 1 else None
        return self.keys.get(kid)

    def refresh_if_due(self) -> None:
        """Start a background refresh when the keys are older than their TTL (no wait)."""
        if time.monotonic() >= self._expires_at:
            self.submit(force=False)

    def submit(self, *, force: bool) -> Future | None:
        """The refresh under way or a new one on the ``a2a-jwks`` threads; None when ``force``
        (an unknown kid) comes within ``A2A_JWT_JWKS_MIN_REFRESH_SECONDS`` of the last one."""
        with self._lock:
            pending = self._pending
            if pending is not None and not pending.done():
                return pending
            now = time.monotonic()
            if force and now - self._started_at < settings.A2A_JWT_JWKS_MIN_REFRESH_SECONDS:
                return None
            if not force and now < self._expires_at:
                return None
            self._started_at = now
            self._pending = threads.pool("a2a-jwks", 2).submit(self.refresh)
            return self._pending

    def refresh(self) -> None:
        """Read the key set now (blocking: call it on the ``a2a-jwks`` threads or a worker
        thread); a failure keeps the last good keys."""
        self.fetches += 1
        try:
            keys = self._read()
        except Exception as exc:  # whatever fails, the last good keys stay
            if not isinstance(exc, TokenRefused):
                logger.exception("JWT issuer %s: reading the keys failed", self.issuer.issuer)
            self.error = str(exc) or type(exc).__name__
            retry = max(1.0, settings.A2A_JWT_JWKS_MIN_REFRESH_SECONDS)
            self._expires_at = time.monotonic() + retry
            logger.warning("JWT issuer %s: %s (keeping %d cached key(s))", self.issuer.issuer,
                           exc, len(self.keys))
            return
        if keys is not None:
            self.keys = keys
        self.loaded, self.error = True, ""
        self._expires_at = time.monotonic() + settings.A2A_JWT_JWKS_TTL_SECONDS

    def _read(self) -> dict[str, Any] | None:
        """The new key set, None when unchanged; :class:`TokenRefused` when unreadable."""
        if self.issuer.jwks_file:
            path = self.issuer.jwks_file
            try:
                st = os.stat(path)
                if (st.st_mtime, st.st_size) == self._file_sig:
                    return None
                with open(path, "rb") as fh:
                    keys = parse_jwks(fh.read(MAX_JWKS_BYTES + 1), where=path)
            except (OSError, ValueError) as exc:
                raise TokenRefused(f"{path}: {exc}") from None
            self._file_sig = (st.st_mtime, st.st_size)
            return keys
        uri = self._jwks_uri or self._discover()
        status, body, etag, error = _get(uri, self._etag if self.loaded else "")
        if status == 304 and self.loaded:
            return None
        if status != 200:
            if not self.issuer.jwks_uri:
                self._jwks_uri = ""  # discover again next time: the provider may have moved it
            raise TokenRefused(error or f"{uri} answered HTTP {status}")
        try:
            keys = parse_jwks(body, where=uri)
        except ValueError as exc:
            raise TokenRefused(f"{uri}: {exc}") from None
        self._etag = etag
        return keys

    def _discover(self) -> str:
        url = self.issuer.discovery_url
        status, body, _, error = _get(url)
        if status != 200:
            raise TokenRefused(error or f"{url} answered HTTP {status}")
        try:
            doc = json.loads(body)
        except ValueError:
            raise TokenRefused(f"{url}: not JSON") from None
        if not isinstance(doc, dict) or doc.get("issuer") != self.issuer.issuer:
            # OpenID Connect Discovery 1.0, section 4.3: the document names its own issuer.
            raise TokenRefused(f"{url}: its issuer is not {self.issuer.issuer}")
        uri = doc.get("jwks_uri")
        if not isinstance(uri, str) or not uri:
            raise TokenRefused(f"{url}: no jwks_uri")
        self._jwks_uri = uri
        return uri


class _Registry:
    """The configured issuers and their keys (rebuilt when ``A2A_JWT_ISSUERS`` changes)."""

    def __init__(self) -> None:
        self.source: Any = object()
        self.by_issuer: dict[str, IssuerKeys] = {}

    def current(self) -> dict[str, IssuerKeys]:
        raw = settings.A2A_JWT_ISSUERS
        if raw is not self.source:
            self.by_issuer = {i.issuer: IssuerKeys(i) for i in parse_issuers(raw)}
            self.source = raw
        return self.by_issuer


_registry = _Registry()


def issuers() -> dict[str, IssuerKeys]:
    """The trusted issuers by ``iss`` value, with their keys."""
    return _registry.current()


def enabled() -> bool:
    return bool(settings.A2A_JWT_ISSUERS)


def looks_like_jwt(token: str) -> bool:
    """Whether a bearer credential is to be verified as a JWT: issuers are configured and it
    has a JWS compact form's three parts (an API key has two)."""
    return token.count(".") == 2 and bool(settings.A2A_JWT_ISSUERS)


# --- verification ------------------------------------------------------------------------


@dataclass(frozen=True)
class Verified:
    """A verified JWT: the caller and until when (epoch seconds) the token is valid."""

    actor: Actor
    expires_at: float


@dataclass(frozen=True)
class _Inspected:
    keys: IssuerKeys
    alg: str
    kid: str | None


def _segment(text: str) -> dict[str, Any]:
    value = orjson.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")
    return value


def _unverified(token: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The header and claims, unverified: only to pick the issuer and key. One parse here and
    PyJWT's own when it verifies (its base64 decoding of the whole token is the costly part of
    a verification, so it runs once)."""
    try:
        head, payload, _signature = token.split(".")
        return _segment(head), _segment(payload)
    except (ValueError, binascii.Error) as exc:  # orjson's error is a ValueError
        raise TokenRefused(f"token refused: not a valid JWT ({exc})") from None


def _inspect(token: str) -> _Inspected:
    """The checks that need no key: size, form, algorithm, trusted issuer."""
    cap = settings.A2A_JWT_MAX_BYTES
    if len(token) > cap:
        raise TokenRefused(f"token refused: larger than the {cap}-byte cap")
    header, claims = _unverified(token)
    alg = header.get("alg")
    if not isinstance(alg, str) or not alg:
        raise TokenRefused("token refused: no alg in its header")
    if alg.lower() == "none":
        raise TokenRefused("token refused: alg none (unsigned tokens are never accepted)")
    if alg.upper().startswith("HS"):
        raise TokenRefused(
            f"token refused: {alg} is a symmetric algorithm; only the issuer's public keys "
            "verify tokens here (algorithm confusion)")
    iss = claims.get("iss")
    keys = issuers().get(iss) if isinstance(iss, str) else None
    if keys is None:
        raise TokenRefused(f"token refused: wrong issuer {iss!r} (not a trusted issuer)")
    if alg not in keys.issuer.algorithms:
        raise TokenRefused(f"token refused: algorithm {alg} is not accepted for this issuer")
    kid = header.get("kid")
    return _Inspected(keys=keys, alg=alg, kid=kid if isinstance(kid, str) else None)


def _unknown_key(inspected: _Inspected) -> TokenRefused:
    keys = inspected.keys
    if not keys.loaded:
        why = keys.error or "not fetched yet"
        return KeysUnavailable(
            f"identity provider keys unavailable for {keys.issuer.issuer}: {why}")
    return UnknownKey(f"token refused: unknown key (kid {inspected.kid!r} is not in the "
                        f"issuer's key set)")


def _finish(token: str, inspected: _Inspected, key: Any) -> Verified:
    import jwt

    issuer = inspected.keys.issuer
    wanted = _KEY_TYPES.get(inspected.alg[:2])
    if wanted is None or key.key_type != wanted:
        raise TokenRefused(f"token refused: key {inspected.kid!r} ({key.key_type}) does not sign "
                           f"{inspected.alg}")
    try:
        claims = jwt.decode(
            token, key.key, algorithms=[inspected.alg], audience=list(issuer.audiences),
            issuer=issuer.issuer, leeway=settings.A2A_JWT_LEEWAY_SECONDS,
            options={"require": ["exp", "iss", "aud"]},
        )
    except jwt.ExpiredSignatureError:
        raise TokenRefused("token refused: expired") from None
    except jwt.ImmatureSignatureError:
        raise TokenRefused("token refused: not yet valid (nbf or iat in the future)") from None
    except jwt.InvalidAudienceError:
        raise TokenRefused(
            f"token refused: wrong audience (expected {', '.join(issuer.audiences)})") from None
    except jwt.InvalidIssuerError:
        raise TokenRefused("token refused: wrong issuer") from None
    except jwt.MissingRequiredClaimError as exc:
        raise TokenRefused(f"token refused: claim {exc.claim!r} missing") from None
    except jwt.InvalidSignatureError:
        raise TokenRefused("token refused: bad signature") from None
    except (jwt.PyJWTError, TypeError, ValueError) as exc:
        raise TokenRefused(f"token refused: {exc}") from None
    return Verified(actor=_actor(issuer, claims), expires_at=float(claims["exp"]))


def _actor(issuer: Issuer, claims: dict[str, Any]) -> Actor:
    subject = _claim(claims, issuer.subject_claim)
    if not isinstance(subject, str) or not subject:
        raise TokenRefused(f"token refused: claim {issuer.subject_claim!r} missing")
    allowed: frozenset[str] = frozenset()
    if issuer.allowed_agents_claim:
        allowed = frozenset(_words(_claim(claims, issuer.allowed_agents_claim)))
        if not allowed:
            # An empty allowed list means "any agent": a missing claim must not grant that.
            raise TokenRefused(
                f"token refused: claim {issuer.allowed_agents_claim!r} (allowed agents) missing")
    scopes = issuer.scopes(claims)
    if SCOPE_REGISTER in scopes and not allowed and SCOPE_ADMIN not in scopes:
        # A JWT caller owns no agent row: what it may register, heartbeat and deregister is
        # what its allowed-agents claim names; without one, register would reach every agent
        # no API client owns.
        scopes -= {SCOPE_REGISTER}
    tenant = _claim(claims, issuer.tenant_claim) if issuer.tenant_claim else None
    if tenant is None or tenant == "":
        tenant = issuer.tenant  # no claim: the issuer's tenant (docs/tenants.md)
    elif tenant_error(tenant):
        shown = tenant[:80] if isinstance(tenant, str) else type(tenant).__name__
        raise TokenRefused(f"token refused: claim {issuer.tenant_claim!r} (tenant) names no "
                           f"valid tenant ({shown!r})")
    # Whether the tenant exists is checked by the token cache (a database read, cached).
    return Actor(
        client_id=f"{CLIENT_PREFIX}{issuer.name}:{subject[:200]}",
        scopes=scopes,
        allowed_agents=allowed,
        tenant=tenant,
        external=True,
    )


async def verify(token: str, *, wait_seconds: float) -> Verified:
    """Verify a JWT on the event loop. Keys in memory: no wait (a due refresh starts in the
    background). A kid not in memory: one bounded refresh, waited for at most
    ``wait_seconds``. Raises :class:`TokenRefused` (:class:`KeysUnavailable` when the issuer's
    keys could never be read)."""
    inspected = _inspect(token)
    keys = inspected.keys
    key = keys.find(inspected.kid)
    if key is not None:
        keys.refresh_if_due()
        return _finish(token, inspected, key)
    future = keys.submit(force=True)
    if future is not None:
        try:
            await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), wait_seconds)
        except TimeoutError:
            pass
    key = keys.find(inspected.kid)
    if key is None:
        raise _unknown_key(inspected)
    return _finish(token, inspected, key)


def verify_sync(token: str, *, wait_seconds: float) -> Verified:
    """:func:`verify` for a worker thread (DRF, ARD): the same keys, the same bounds."""
    inspected = _inspect(token)
    keys = inspected.keys
    key = keys.find(inspected.kid)
    if key is None:
        future = keys.submit(force=True)
        if future is not None:
            try:
                future.result(timeout=wait_seconds)
            except TimeoutError:
                pass
        key = keys.find(inspected.kid)
        if key is None:
            raise _unknown_key(inspected)
    else:
        keys.refresh_if_due()
    return _finish(token, inspected, key)


def _on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    if setting == "A2A_JWT_ISSUERS":
        _registry.source = object()


setting_changed.connect(_on_setting_changed, dispatch_uid="registry.identity")
