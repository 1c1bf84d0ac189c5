"""Sign an agent card for a registry that checks signatures, and write the JWKS it trusts.

    # once: a signing key (private, keep it secret) and the JWKS of public keys the registry reads
    .venv/bin/python examples/sign_card.py keygen --key card-key.pem --kid card-key-1 \\
        --jwks jwks.json
    # every time the card changes: sign it
    .venv/bin/python examples/sign_card.py sign card.json --key card-key.pem --kid card-key-1 \\
        --out card.signed.json

Then run the registry with ``A2A_CARD_JWKS_FILE=jwks.json`` (and ``A2A_CARD_SIGNATURES=require``
to refuse unsigned cards), and register ``card.signed.json`` -- or serve it as the agent's
``/.well-known/agent-card.json``. docs/signatures.md explains what is checked.

The signature is a JWS (ES256 here) over the card's JCS (RFC 8785) canonical form, with
``signatures`` and empty values left out, canonicalized by the a2a-sdk's own helpers: the
payload the registry (and the SDK's ``create_signature_verifier``) checks, for A2A 1.0, 0.3 and
KubeMQ-shaped cards alike. ``keygen`` on an existing JWKS adds the new key beside the others
(rotation: keep the old key until no card signed with it is in circulation).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from a2a.utils.signing import _clean_empty, canonicalize
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from jwt import api_jws
from jwt.algorithms import ECAlgorithm


def keygen(key_path: Path, kid: str, jwks_path: Path) -> None:
    if key_path.exists():
        sys.exit(f"{key_path} exists: not overwriting a private key")
    private = ec.generate_private_key(ec.SECP256R1())
    pem = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(pem)
    public = json.loads(ECAlgorithm.to_jwk(private.public_key()))
    jwks = json.loads(jwks_path.read_text()) if jwks_path.exists() else {"keys": []}
    jwks["keys"] = [k for k in jwks["keys"] if k.get("kid") != kid]
    jwks["keys"].append({**public, "kid": kid, "alg": "ES256", "use": "sig"})
    jwks_path.write_text(json.dumps(jwks, indent=2) + "\n")
    print(f"private key: {key_path} (keep it secret); public key {kid!r} added to {jwks_path}")


def sign(card: dict, key_path: Path, kid: str) -> dict:
    private = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    body = {k: v for k, v in card.items() if k != "signatures"}
    payload = canonicalize(_clean_empty(body) or {}).encode()
    token = api_jws.encode(payload, private, algorithm="ES256",
                           headers={"kid": kid, "alg": "ES256", "typ": "JOSE"})
    protected, _, signature = token.split(".")  # detached: the card itself is the payload
    return {**card, "signatures": [{"protected": protected, "signature": signature}]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    gen = commands.add_parser("keygen", help="make a signing key and add it to a JWKS file")
    gen.add_argument("--key", type=Path, required=True, help="private key file to create")
    gen.add_argument("--kid", required=True, help="the key's id, named in each signature")
    gen.add_argument("--jwks", type=Path, required=True, help="JWKS file to create or extend")
    signer = commands.add_parser("sign", help="sign a card (replaces its signatures)")
    signer.add_argument("card", type=Path)
    signer.add_argument("--key", type=Path, required=True)
    signer.add_argument("--kid", required=True)
    signer.add_argument("--out", type=Path, help="default: standard output")
    args = parser.parse_args()
    if args.command == "keygen":
        keygen(args.key, args.kid, args.jwks)
        return
    card = json.loads(args.card.read_text())
    if not isinstance(card, dict):
        sys.exit(f"{args.card}: a card is a JSON object")
    signed = json.dumps(sign(card, args.key, args.kid), indent=2) + "\n"
    if args.out:
        args.out.write_text(signed)
    else:
        sys.stdout.write(signed)


if __name__ == "__main__":
    main()
