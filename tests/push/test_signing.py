"""The platform's push signature and its JWKS: keys from files (the first signs, all are
published: rotation), the key derived from ``SECRET_KEY`` when none is set, refusals of keys
that cannot sign. No database: one pass."""

from __future__ import annotations

import hashlib

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from django.core.exceptions import ImproperlyConfigured

from push import signing

pytestmark = pytest.mark.one_pass("embedded")


def _pem(tmp_path, name: str, key) -> str:
    path = tmp_path / name
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    return str(path)


def _verify(token: str) -> dict:
    keys = jwt.PyJWKSet.from_dict(signing.jwks())
    kid = jwt.get_unverified_header(token)["kid"]
    [key] = [k for k in keys.keys if k.key_id == kid]
    return jwt.decode(token, key, algorithms=["ES256", "EdDSA"], issuer=signing.ISSUER)


def test_the_first_key_signs_and_every_key_is_published(tmp_path, settings):
    new = _pem(tmp_path, "new.pem", ec.generate_private_key(ec.SECP256R1()))
    old = _pem(tmp_path, "old.pem", ed25519.Ed25519PrivateKey.generate())
    settings.A2A_PUSH_SIGNING_KEY_FILES = [new, old]
    published = signing.jwks()["keys"]
    assert [(k["kty"], k["alg"]) for k in published] == [("EC", "ES256"), ("OKP", "EdDSA")]
    token = signing.sign(body=b'{"a": 1}', task_id="t", config_id="c", relay_id="r",
                         sequence=3, idempotency_key="r.3")
    assert jwt.get_unverified_header(token)["kid"] == published[0]["kid"]
    claims = _verify(token)
    assert claims["body_sha256"] == hashlib.sha256(b'{"a": 1}').hexdigest()
    assert (claims["task_id"], claims["config_id"], claims["seq"], claims["jti"]) == (
        "t", "c", 3, "r.3")
    # Rotated: the old key dropped, a receiver holding the new JWKS still verifies new tokens.
    settings.A2A_PUSH_SIGNING_KEY_FILES = [new]
    assert [k["kid"] for k in signing.jwks()["keys"]] == [published[0]["kid"]]
    assert _verify(signing.sign(body=b"", task_id="t", config_id="c", relay_id="r",
                                sequence=1, idempotency_key="r.1"))["seq"] == 1


def test_without_keys_one_is_derived_from_the_secret_key(settings):
    settings.A2A_PUSH_SIGNING_KEY_FILES = []
    settings.SECRET_KEY = "one-cluster-secret"
    first = signing.jwks()
    settings.SECRET_KEY = "another-secret"
    assert signing.jwks() != first
    settings.SECRET_KEY = "one-cluster-secret"
    assert signing.jwks() == first  # every node sharing the secret publishes the same key
    assert first["keys"][0]["alg"] == "EdDSA"


@pytest.mark.parametrize("content,message", [
    (None, "cannot read"),
    (b"not a key", "not an unencrypted PEM private key"),
    ("rsa", "EC P-256 or an Ed25519"),
])
def test_a_key_that_cannot_sign_is_refused_with_a_clear_error(tmp_path, settings, content,
                                                              message):
    path = tmp_path / "key.pem"
    if content == "rsa":
        _pem(tmp_path, "key.pem", rsa.generate_private_key(public_exponent=65537, key_size=2048))
    elif content is not None:
        path.write_bytes(content)
    settings.A2A_PUSH_SIGNING_KEY_FILES = [str(path)]
    with pytest.raises(ImproperlyConfigured, match=message):
        signing.jwks()
