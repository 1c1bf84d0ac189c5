"""Keys made in the test, cards signed with the a2a-sdk signer, and a JWKS server.

A2A 1.0 cards are signed by ``a2a.utils.signing.create_agent_card_signer`` on the SDK's
AgentCard type. Cards the SDK type cannot represent (A2A 0.3, KubeMQ) are signed over the JCS
form of the card as written (the SDK's canonicalizer, PyJWT's JWS), the way a 0.3-era or
non-Python signer does it.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections import Counter
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt import api_jws
from jwt.algorithms import ECAlgorithm, RSAAlgorithm


class TestKey:
    """A private key made in the test, with its public JWK."""

    __test__ = False

    def __init__(self, alg: str, kid: str) -> None:
        self.alg, self.kid = alg, kid
        if alg.startswith("RS"):
            self.private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
            jwk = json.loads(RSAAlgorithm.to_jwk(self.private.public_key()))
        else:
            self.private = ec.generate_private_key(ec.SECP256R1())
            jwk = json.loads(ECAlgorithm.to_jwk(self.private.public_key()))
        self.jwk = {**jwk, "kid": kid, "alg": alg, "use": "sig"}

    def header(self, jku: str | None = None) -> dict[str, Any]:
        return {"kid": self.kid, "alg": self.alg, "jku": jku, "typ": "JOSE"}


def jwks(*keys: TestKey) -> dict[str, Any]:
    return {"keys": [k.jwk for k in keys]}


def sign_10(card: dict[str, Any], key: TestKey, *, jku: str | None = None) -> dict[str, Any]:
    """An A2A 1.0 card signed by the a2a-sdk's signer, as the SDK serves it (JSON)."""
    from a2a.types import AgentCard
    from a2a.utils.signing import create_agent_card_signer
    from google.protobuf.json_format import MessageToDict, ParseDict

    proto = ParseDict(copy.deepcopy(card), AgentCard())
    header = key.header(jku)
    if jku is None:
        header.pop("jku")
    create_agent_card_signer(key.private, header)(proto)
    return MessageToDict(proto)


def sign_raw(card: dict[str, Any], key: TestKey, *, jku: str | None = None) -> dict[str, Any]:
    """Any card signed over its own JCS form (``signatures`` and empty values removed)."""
    from registry.sdk_signing import canonical_card_payload

    payload = canonical_card_payload(card).encode()
    headers = {k: v for k, v in key.header(jku).items() if v is not None}
    token = api_jws.encode(payload, key.private, algorithm=key.alg, headers=headers)
    protected, _, signature = token.split(".")
    return {
        **card,
        "signatures": [
            *card.get("signatures", []),
            {"protected": protected, "signature": signature},
        ],
    }


class JwksServer:
    """A JWKS document at ``/jwks.json`` with an ETag; ``If-None-Match`` answers 304. Every
    request is counted, with the validator it carried."""

    def __init__(self, *keys: TestKey) -> None:
        self.set_keys(*keys)
        self.requests: Counter[str] = Counter()
        self.validators: list[str] = []

    def set_keys(self, *keys: TestKey, pad: int = 0) -> None:
        document = jwks(*keys)
        if pad:
            document["padding"] = "x" * pad
        self.body = json.dumps(document).encode()
        self.etag = '"' + hashlib.sha256(self.body).hexdigest()[:16] + '"'

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        path = scope["path"]
        self.requests[path] += 1
        inm = dict(scope["headers"]).get(b"if-none-match", b"").decode()
        self.validators.append(inm)
        if path != "/jwks.json":
            status, body, headers = 404, b"{}", []
        elif inm == self.etag:
            status, body, headers = 304, b"", [(b"etag", self.etag.encode())]
        else:
            status, body = 200, self.body
            headers = [
                (b"etag", self.etag.encode()),
                (b"content-type", b"application/json"),
                (b"cache-control", b"max-age=300"),
            ]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
