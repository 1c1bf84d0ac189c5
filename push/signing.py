"""The platform's signature on every delivered push, and the JWKS that verifies it.

Each delivery carries ``X-A2A-Push-Signature``: a compact JWS (a JWT) signed with the
platform's first key, whose claims are ``iss`` (``a2a-gateway``), ``iat`` (seconds),
``task_id``, ``config_id`` (the caller's config id, else the relay id), ``relay_id``,
``seq``, ``jti`` (the delivery's idempotency key) and ``body_sha256`` (hex SHA-256 of the exact
body bytes). Its header names the key (``kid``: the RFC 7638 thumbprint). Every configured key
is published at ``/.well-known/jwks.json`` so a key can be rotated: add the new key first (it
signs), keep the old one listed until receivers no longer hold deliveries signed with it, then
drop it (docs/push.md).

Keys: ``A2A_PUSH_SIGNING_KEY_FILES`` (PEM private keys: EC P-256 -> ES256, Ed25519 -> EdDSA);
unset, one Ed25519 key derived from ``SECRET_KEY`` (every node of a cluster shares it, and it
survives restarts), so an embedded node signs with no setup at all.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed

HEADER = "X-A2A-Push-Signature"
ISSUER = "a2a-gateway"
_DERIVATION_LABEL = b"a2a-push-signing-key/v1:"


@dataclass(frozen=True)
class SigningKey:
    kid: str
    algorithm: str  # "ES256" or "EdDSA"
    private: Any
    jwk: dict[str, str]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _public_jwk(private: Any) -> tuple[str, dict[str, str]]:
    if isinstance(private, ed25519.Ed25519PrivateKey):
        raw = private.public_key().public_bytes(serialization.Encoding.Raw,
                                                serialization.PublicFormat.Raw)
        members = {"crv": "Ed25519", "kty": "OKP", "x": _b64(raw)}
        algorithm = "EdDSA"
    elif isinstance(private, ec.EllipticCurvePrivateKey) and \
            isinstance(private.curve, ec.SECP256R1):
        numbers = private.public_key().public_numbers()
        members = {"crv": "P-256", "kty": "EC", "x": _b64(numbers.x.to_bytes(32, "big")),
                   "y": _b64(numbers.y.to_bytes(32, "big"))}
        algorithm = "ES256"
    else:
        raise ImproperlyConfigured("A2A_PUSH_SIGNING_KEY_FILES: a key must be an EC P-256 or "
                                   "an Ed25519 private key")
    # RFC 7638 thumbprint: the required members, sorted, no whitespace.
    canonical = json.dumps(members, sort_keys=True, separators=(",", ":")).encode()
    kid = _b64(hashlib.sha256(canonical).digest())
    return algorithm, {**members, "kid": kid, "use": "sig", "alg": algorithm}


def _key(private: Any) -> SigningKey:
    algorithm, jwk = _public_jwk(private)
    return SigningKey(kid=jwk["kid"], algorithm=algorithm, private=private, jwk=jwk)


def _load(path: str) -> SigningKey:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ImproperlyConfigured(
            f"A2A_PUSH_SIGNING_KEY_FILES: cannot read {path}: {exc.strerror}") from None
    try:
        private = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise ImproperlyConfigured(
            f"A2A_PUSH_SIGNING_KEY_FILES: {path} is not an unencrypted PEM private key: "
            f"{exc}") from None
    return _key(private)


def derived_key(secret: str) -> SigningKey:
    """The Ed25519 key derived from ``secret`` (the ``SECRET_KEY`` default)."""
    seed = hashlib.sha256(_DERIVATION_LABEL + secret.encode()).digest()
    return _key(ed25519.Ed25519PrivateKey.from_private_bytes(seed))


_lock = threading.Lock()
_keys: list[SigningKey] | None = None


def keys() -> list[SigningKey]:
    """The configured keys, the signing one first (read once, again after a settings change)."""
    global _keys
    with _lock:
        if _keys is None:
            files = [f for f in settings.A2A_PUSH_SIGNING_KEY_FILES if f.strip()]
            _keys = [_load(f.strip()) for f in files] if files \
                else [derived_key(settings.SECRET_KEY)]
        return _keys


def _forget(*, setting: str, **_: Any) -> None:
    global _keys
    if setting in ("A2A_PUSH_SIGNING_KEY_FILES", "SECRET_KEY"):
        with _lock:
            _keys = None


setting_changed.connect(_forget)


def jwks() -> dict[str, list[dict[str, str]]]:
    """The public keys, as a JWK Set."""
    return {"keys": [key.jwk for key in keys()]}


def body_sha256(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def sign(*, body: bytes, task_id: str, config_id: str, relay_id: str, sequence: int,
         idempotency_key: str, now: float | None = None) -> str:
    """The ``X-A2A-Push-Signature`` value of one delivery of ``body``."""
    key = keys()[0]
    claims = {
        "iss": ISSUER, "iat": int(time.time() if now is None else now),
        "task_id": task_id, "config_id": config_id, "relay_id": relay_id,
        "seq": sequence, "jti": idempotency_key, "body_sha256": body_sha256(body),
    }
    return jwt.encode(claims, key.private, algorithm=key.algorithm,
                      headers={"kid": key.kid, "typ": "JWT"})
