"""Agent card signatures (A2A ``signatures``: JWS over the JCS-canonical card).

Verification uses the a2a-sdk's own signing helpers (``a2a.utils.signing``, extra ``signing``:
PyJWT). Trusted keys come only from configuration: a JWKS file (``A2A_CARD_JWKS_FILE``) and JWKS
URLs (``A2A_CARD_JWKS_URLS``, which is also the allowlist). A ``jku`` in a signature's protected
header is honoured only when it is one of those URLs; any other ``jku`` is never fetched and
the signature counts as made by an unknown key.

What is signed. The SDK verifies over its own view of the card: the card parsed into its A2A
1.0 protobuf type, dumped, empty values removed, JCS (RFC 8785). That view drops every field the
1.0 type does not know (an A2A 0.3 ``url``, a KubeMQ ``agent_id``), so a card could carry an
unsigned ``url`` the registry would route to. The SDK path is therefore used only when its view
covers the whole card as registered (same canonical bytes); otherwise -- 0.3 and KubeMQ-shaped
cards, 1.0 cards with extra fields -- the payload is the card as registered, ``signatures``
removed, empty values removed, canonicalized with the SDK's JCS, and each signature is checked
with PyJWT exactly as the SDK's verifier does it. Nothing here implements JOSE itself.

Results (stored on :class:`registry.models.CardVersion`): ``valid``, ``invalid``, ``unsigned``,
``unknown_key``. Results are cached by the card's sha256 and the key set's generation, so a
re-registration with the same bytes costs a dict lookup.

JWKS URLs are fetched through a fetcher that the discovery app installs
(:func:`set_jwks_fetcher`: its shared HTTP client, conditional GET with ETag); the registry
never imports discovery.
"""

from __future__ import annotations

import copy
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from django.conf import settings

logger = logging.getLogger(__name__)

VALID = "valid"
INVALID = "invalid"
UNSIGNED = "unsigned"
UNKNOWN_KEY = "unknown_key"
STATUSES = (VALID, INVALID, UNSIGNED, UNKNOWN_KEY)

# Asymmetric algorithms only: a JWKS publishes public keys, and allowing HS* would let a
# public key be used as an HMAC secret (algorithm confusion).
ALGORITHMS = [
    "RS256",
    "RS384",
    "RS512",
    "PS256",
    "PS384",
    "PS512",
    "ES256",
    "ES384",
    "ES512",
    "EdDSA",
]
MAX_KEYS = 100  # per JWKS document
MAX_JWKS_BYTES = 256 * 1024
_RESULT_CACHE_SIZE = 4096


@dataclass(frozen=True)
class SignatureResult:
    """The outcome of checking one card: a status and, when known, the key id or the reason."""

    status: str
    kid: str = ""
    detail: str = ""

    @property
    def valid(self) -> bool:
        return self.status == VALID


@dataclass(frozen=True)
class JwksResponse:
    """What a JWKS fetcher returns: status (None on a network error), body, cache headers."""

    status: int | None
    body: bytes = b""
    etag: str = ""
    cache_control: str = ""
    error: str = ""


JwksFetcher = Callable[[str, str], JwksResponse]  # (url, etag to revalidate) -> response


@dataclass
class _UrlKeys:
    keys: dict[str, Any] = field(default_factory=dict)
    etag: str = ""
    fetched_at: float = 0.0
    expires_at: float = 0.0
    error: str = ""


class KeyStore:
    """Trusted verification keys: the JWKS file (re-read when it changes) and the JWKS URLs
    (cached per ``Cache-Control``, revalidated with ``If-None-Match``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.generation = 0
        self._file_sig: tuple[str, float, int] | None = None
        self._file_keys: dict[str, Any] = {}
        self._urls: dict[str, _UrlKeys] = {}
        self._fetcher: JwksFetcher | None = None

    # -- configuration --

    def set_fetcher(self, fetcher: JwksFetcher | None) -> None:
        self._fetcher = fetcher

    def reset(self) -> None:
        """Forget every cached key (settings changed, tests)."""
        with self._lock:
            self._file_sig = None
            self._file_keys = {}
            self._urls = {}
            self.generation += 1

    # -- keys --

    def _load_file(self) -> dict[str, Any]:
        path = settings.A2A_CARD_JWKS_FILE
        if not path:
            if self._file_sig is not None:
                self._file_sig, self._file_keys = None, {}
                self.generation += 1
            return self._file_keys
        try:
            st = os.stat(path)
            sig = (path, st.st_mtime, st.st_size)
        except OSError as exc:
            sig = (path, -1.0, -1)
            if self._file_sig != sig:
                logger.error("A2A_CARD_JWKS_FILE %s: cannot read: %s", path, exc)
                self._file_sig, self._file_keys = sig, {}
                self.generation += 1
            return self._file_keys
        if sig != self._file_sig:
            try:
                with open(path, "rb") as fh:
                    keys = parse_jwks(fh.read(MAX_JWKS_BYTES + 1), where=path)
            except (OSError, ValueError) as exc:
                logger.error("A2A_CARD_JWKS_FILE %s: %s", path, exc)
                keys = {}
            self._file_sig, self._file_keys = sig, keys
            self.generation += 1
        return self._file_keys

    def _url_keys(self, url: str, *, force: bool = False) -> dict[str, Any]:
        entry = self._urls.setdefault(url, _UrlKeys())
        now = time.time()
        due = now >= entry.expires_at
        if force:
            # An unknown kid may mean the key rotated: revalidate, but at most once per
            # A2A_CARD_JWKS_MIN_REFRESH_SECONDS so cards naming random kids cannot make us
            # hammer the JWKS server.
            due = now - entry.fetched_at >= settings.A2A_CARD_JWKS_MIN_REFRESH_SECONDS
        if not due or self._fetcher is None:
            return entry.keys
        response = self._fetcher(url, entry.etag if entry.keys else "")
        entry.fetched_at = now
        if response.status == 304 and entry.keys:
            entry.expires_at = now + jwks_lifetime(response.cache_control)
            entry.etag = response.etag or entry.etag
            return entry.keys
        if response.status == 200:
            try:
                keys = parse_jwks(response.body, where=url)
            except ValueError as exc:
                response = JwksResponse(status=None, error=str(exc))
            else:
                if keys != entry.keys:
                    self.generation += 1
                entry.keys, entry.etag, entry.error = keys, response.etag, ""
                entry.expires_at = now + jwks_lifetime(response.cache_control)
                return entry.keys
        # Failure: keep the last good keys (stale) and retry after a short backoff.
        entry.error = response.error or f"HTTP {response.status}"
        entry.expires_at = now + 30.0
        logger.warning("JWKS %s: %s (keeping %d cached key(s))", url, entry.error, len(entry.keys))
        return entry.keys

    def trusted_urls(self) -> list[str]:
        return list(settings.A2A_CARD_JWKS_URLS)

    def refresh(self) -> int:
        """Load the file and every URL that is due; returns the generation."""
        with self._lock:
            self._load_file()
            for url in self.trusted_urls():
                self._url_keys(url)
            return self.generation

    def find(self, kid: str | None, jku: str | None) -> tuple[Any | None, str]:
        """The trusted key for ``kid`` (within ``jku``'s set when given), or (None, reason)."""
        with self._lock:
            if jku:
                if jku not in self.trusted_urls():
                    return None, f"jku {jku} is not a trusted JWKS URL"
                sources: list[str | None] = [jku]
            else:
                sources = [None, *self.trusted_urls()]  # None: the JWKS file
            for force in (False, True):
                for source in sources:
                    keys = (
                        self._load_file() if source is None else self._url_keys(source, force=force)
                    )
                    if kid is None and len(keys) == 1:
                        return next(iter(keys.values())), ""
                    if kid is not None and kid in keys:
                        return keys[kid], ""
            return None, f"no trusted key with kid {kid!r}"


def jwks_lifetime(cache_control: str) -> float:
    """JWKS lifetime from Cache-Control max-age; 5 minutes when absent (like cards)."""
    for part in (cache_control or "").lower().split(","):
        name, _, value = part.strip().partition("=")
        if name == "max-age" and value.strip('"').isdigit():
            return float(value.strip('"'))
        if name in ("no-cache", "no-store"):
            return 0.0
    return 300.0


def parse_jwks(raw: bytes, *, where: str) -> dict[str, Any]:
    """Public signing keys of a JWKS document by kid. Raises ValueError when unusable."""
    from jwt import PyJWK
    from jwt.exceptions import PyJWKError

    if len(raw) > MAX_JWKS_BYTES:
        raise ValueError(f"JWKS larger than {MAX_JWKS_BYTES} bytes")
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"JWKS is not JSON: {exc}") from None
    entries = doc.get("keys") if isinstance(doc, dict) else None
    if not isinstance(entries, list):
        raise ValueError('JWKS must be an object with a "keys" list')
    keys: dict[str, Any] = {}
    for i, jwk in enumerate(entries[:MAX_KEYS]):
        if not isinstance(jwk, dict) or jwk.get("use", "sig") != "sig":
            continue
        if any(name in jwk for name in ("d", "p", "q", "k")):
            logger.warning("%s: keys[%d] is a private or symmetric key; ignored", where, i)
            continue
        try:
            key = PyJWK(jwk)
        except PyJWKError as exc:
            logger.warning("%s: keys[%d] unusable: %s", where, i, exc)
            continue
        keys[str(jwk.get("kid") or f"#{i}")] = key
    return keys


_store = KeyStore()
_results: dict[str, tuple[int, SignatureResult]] = {}


def key_store() -> KeyStore:
    return _store


def set_jwks_fetcher(fetcher: JwksFetcher | None) -> None:
    """Install the function that GETs a JWKS URL (the discovery app installs its client)."""
    _store.set_fetcher(fetcher)


def policy() -> str:
    """``off``, ``verify`` or ``require`` (settings.A2A_CARD_SIGNATURES)."""
    return settings.A2A_CARD_SIGNATURES


def _raw_view(card: dict[str, Any]) -> str:
    from registry.sdk_signing import canonical_card_payload

    return canonical_card_payload(card)


def _sdk_view(card: dict[str, Any]) -> tuple[Any, str] | None:
    """The SDK's AgentCard for ``card`` and its canonical payload, or None if it can't read it."""
    import warnings

    from a2a.client.card_resolver import parse_agent_card
    from google.protobuf.json_format import ParseError

    from registry.sdk_signing import canonical_sdk_card_payload

    try:
        proto = parse_agent_card(copy.deepcopy(card))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # missing required fields: not our concern here
            return proto, canonical_sdk_card_payload(proto)
    except (ParseError, ValueError, TypeError, RecursionError):
        return None


def _verify(card: dict[str, Any]) -> SignatureResult:
    from a2a.utils.signing import (
        InvalidSignaturesError,
        NoSignatureError,
        create_signature_verifier,
    )
    from jwt.exceptions import PyJWKError

    sigs = card.get("signatures")
    if not sigs:
        return SignatureResult(UNSIGNED)
    if not isinstance(sigs, list) or not all(
        isinstance(s, dict)
        and isinstance(s.get("protected"), str)
        and isinstance(s.get("signature"), str)
        for s in sigs
    ):
        return SignatureResult(INVALID, detail="malformed signatures list")
    seen: dict[str, str] = {}  # kid -> why no key
    used: list[str] = []

    def key_provider(kid: str | None, jku: str | None) -> Any:
        key, reason = _store.find(kid, jku)
        if key is None:
            seen[str(kid)] = reason
            raise PyJWKError(reason)  # a PyJWTError: the SDK tries the next signature
        used.append(str(kid or ""))
        return key

    try:
        raw_payload = _raw_view(card)
    except (ValueError, TypeError, RecursionError) as exc:
        return SignatureResult(INVALID, detail=f"card cannot be canonicalized: {exc}")
    sdk = _sdk_view(card)
    try:
        if sdk is not None and sdk[1] == raw_payload:
            # The SDK's view covers the whole card: the SDK verifies it, start to end.
            create_signature_verifier(key_provider, ALGORITHMS)(sdk[0])
        else:
            _verify_payload(sigs, raw_payload.encode(), key_provider)
    except NoSignatureError:
        return SignatureResult(UNSIGNED)
    except InvalidSignaturesError:
        if seen and len(seen) >= len(sigs) and not used:
            kid, reason = next(iter(seen.items()))
            return SignatureResult(
                UNKNOWN_KEY, kid=kid if kid != "None" else "", detail=reason[:300]
            )
        return SignatureResult(
            INVALID,
            kid=used[-1] if used else "",
            detail="no signature verifies over the card as registered",
        )
    return SignatureResult(VALID, kid=used[-1] if used else "")


def _verify_payload(
    sigs: list[dict[str, Any]],
    payload: bytes,
    key_provider: Callable[[str | None, str | None], Any],
) -> None:
    """The SDK verifier's loop over a payload the SDK cannot derive (see module docstring):
    each signature's compact JWS (protected.payload.signature) is checked by PyJWT."""
    import binascii

    from a2a.utils.signing import InvalidSignaturesError
    from jwt import api_jws
    from jwt.exceptions import PyJWTError
    from jwt.utils import base64url_decode, base64url_encode

    encoded = base64url_encode(payload).decode()
    for sig in sigs:
        try:
            header = orjson.loads(base64url_decode(sig["protected"].encode()))
        except (binascii.Error, ValueError, orjson.JSONDecodeError):
            continue
        if not isinstance(header, dict):
            continue
        try:
            key = key_provider(header.get("kid"), header.get("jku"))
            api_jws.decode_complete(
                f"{sig['protected']}.{encoded}.{sig['signature']}", key, algorithms=ALGORITHMS
            )
            return
        except PyJWTError:
            continue
    raise InvalidSignaturesError("No valid signature found")


def verify_card(card: dict[str, Any], *, sha256: str) -> SignatureResult:
    """Check ``card``'s signatures against the trusted keys (cached by sha256 + key set)."""
    if not card.get("signatures"):
        return SignatureResult(UNSIGNED)
    generation = _store.refresh()
    cached = _results.get(sha256)
    if cached is not None and cached[0] == generation:
        return cached[1]
    result = _verify(card)
    generation = _store.generation  # a refetch for a rotated key may have moved it
    if len(_results) >= _RESULT_CACHE_SIZE:
        _results.clear()
    _results[sha256] = (generation, result)
    return result


def reset() -> None:
    """Forget cached keys and results (tests, settings changes)."""
    _store.reset()
    _results.clear()
