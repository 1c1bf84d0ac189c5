"""A small OpenID Connect identity provider on loopback for tests: discovery document, JWKS,
signing keys made in the test (cryptography), tokens signed with PyJWT.

``GET /.well-known/openid-configuration`` names the issuer (the server's own URL) and its
``jwks_uri`` (``/jwks.json``); every request is counted by path, so a test can assert how often
the platform fetched the keys. :meth:`IdentityProvider.stop` takes it off the network
(connections refused), as an identity provider outage looks to the platform.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
import uuid
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

AUDIENCE = "a2a-registry"


class SigningKey:
    """A private key made in the test and its public JWK."""

    def __init__(self, kid: str, alg: str = "RS256") -> None:
        self.kid, self.alg = kid, alg
        if alg.startswith(("RS", "PS")):
            self.private: Any = rsa.generate_private_key(public_exponent=65537, key_size=2048)
            jwk = json.loads(RSAAlgorithm.to_jwk(self.private.public_key()))
        else:
            self.private = ec.generate_private_key(ec.SECP256R1())
            jwk = json.loads(ECAlgorithm.to_jwk(self.private.public_key()))
        self.jwk = {**jwk, "kid": kid, "alg": alg, "use": "sig"}

    def public_pem(self) -> bytes:
        return self.private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class IdentityProvider:
    """Serves discovery and the JWKS of :attr:`keys` (change it to rotate) on 127.0.0.1."""

    def __init__(self, *keys: SigningKey) -> None:
        self.keys = list(keys)
        self.requests: Counter[str] = Counter()
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 -- http.server's name
                provider.requests[self.path] += 1
                if self.path == "/.well-known/openid-configuration":
                    body = {"issuer": provider.url, "jwks_uri": f"{provider.url}/jwks.json"}
                elif self.path == "/jwks.json":
                    body = {"keys": [k.jwk for k in provider.keys]}
                else:
                    self.send_error(404)
                    return
                raw = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def jwks_fetches(self) -> int:
        return self.requests["/jwks.json"]

    def stop(self) -> None:
        if self.thread.is_alive():
            self.server.shutdown()
            self.server.server_close()

    def claims(self, **overrides: Any) -> dict[str, Any]:
        now = int(time.time())
        claims = {"iss": self.url, "aud": AUDIENCE, "sub": "alice", "iat": now, "nbf": now,
                  "exp": now + 600, "jti": uuid.uuid4().hex, "scope": "a2a.call"}
        claims.update(overrides)
        return {k: v for k, v in claims.items() if v is not None}

    def token(self, key: SigningKey | None = None, *, kid: str | None = None,
              **claims: Any) -> str:
        """A token signed by ``key`` (the first key by default) with :meth:`claims`."""
        key = key or self.keys[0]
        return jwt.encode(self.claims(**claims), key.private, algorithm=key.alg,
                          headers={"kid": kid or key.kid})

    def unsigned_token(self, **claims: Any) -> str:
        """``alg: none``: a header, the claims and an empty signature."""
        header = _b64(json.dumps({"alg": "none", "typ": "JWT"}).encode())
        return f"{header}.{_b64(json.dumps(self.claims(**claims)).encode())}."

    def hmac_with_public_key(self, key: SigningKey, **claims: Any) -> str:
        """HS256 keyed with ``key``'s public PEM: the algorithm-confusion attack (PyJWT itself
        refuses to make one, so it is made by hand)."""
        header = _b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": key.kid}).encode())
        signing_input = f"{header}.{_b64(json.dumps(self.claims(**claims)).encode())}"
        mac = hmac.new(key.public_pem(), signing_input.encode(), hashlib.sha256).digest()
        return f"{signing_input}.{_b64(mac)}"
