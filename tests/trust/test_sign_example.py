"""``examples/sign_card.py`` as docs/signatures.md tells a user to run it: a key and a JWKS
file, cards of each shape signed, and a registry requiring signatures accepting them (valid)
over a running node -- and refusing the same card once altered."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.registry.cards import card_03, card_10

ROOT = Path(__file__).resolve().parents[2]


def _example(*args: str) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "examples/sign_card.py", *args], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result


@pytest.mark.django_db(transaction=True)
def test_cards_signed_by_the_example_register_as_valid(live_server_url, admin_token, settings,
                                                       tmp_path):
    key, jwks = tmp_path / "card-key.pem", tmp_path / "jwks.json"
    _example("keygen", "--key", str(key), "--kid", "card-key-1", "--jwks", str(jwks))
    assert key.stat().st_mode & 0o077 == 0  # the private key is the user's alone
    assert [k["kid"] for k in json.loads(jwks.read_text())["keys"]] == ["card-key-1"]
    assert "d" not in json.loads(jwks.read_text())["keys"][0]  # public only
    settings.A2A_CARD_JWKS_FILE = str(jwks)
    settings.A2A_CARD_SIGNATURES = "require"
    headers = {"Authorization": f"Bearer {admin_token}"}
    with httpx.Client(base_url=live_server_url, headers=headers, timeout=30) as api:
        for agent_id, card in (("signed-03", card_03()), ("signed-10", card_10())):
            path = tmp_path / f"{agent_id}.json"
            path.write_text(json.dumps(card))
            out = tmp_path / f"{agent_id}.signed.json"
            _example("sign", str(path), "--key", str(key), "--kid", "card-key-1",
                     "--out", str(out))
            signed = json.loads(out.read_text())
            r = api.post("/api/v1/agents", json={"agent_id": agent_id, "card": signed})
            assert r.status_code == 201, r.text
            assert r.json()["card_signature"] == "valid"
            tampered = {**signed, "description": "Not what was signed."}
            r = api.post("/api/v1/agents", json={"agent_id": agent_id, "card": tampered})
            assert r.status_code == 400 and "card signature is invalid" in r.json()["error"]
        # Standard output, and a second key added beside the first (rotation).
        printed = _example("sign", str(tmp_path / "signed-03.json"), "--key", str(key),
                           "--kid", "card-key-1").stdout
        assert json.loads(printed)["signatures"][0]["protected"]
        _example("keygen", "--key", str(tmp_path / "k2.pem"), "--kid", "card-key-2",
                 "--jwks", str(jwks))
        assert [k["kid"] for k in json.loads(jwks.read_text())["keys"]] == \
            ["card-key-1", "card-key-2"]
