"""Signed agent cards: verification against configured keys, the three policies, the API and
admin, jku handling and key rotation (docs/signatures.md)."""

from __future__ import annotations

import json

import httpx
import pytest

from registry import services, signatures
from registry.models import Agent, CardVersion
from registry.permissions import SYSTEM
from tests.registry.cards import card_03, card_10
from tests.servers import serve_app
from tests.trust.signing import JwksServer, TestKey, jwks, sign_10, sign_raw


@pytest.fixture(scope="module")
def rsa_key() -> TestKey:
    return TestKey("RS256", "rsa-1")


@pytest.fixture(scope="module")
def ec_key() -> TestKey:
    return TestKey("ES256", "ec-1")


@pytest.fixture
def jwks_file(tmp_path, settings, rsa_key, ec_key):
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps(jwks(rsa_key, ec_key)))
    settings.A2A_CARD_JWKS_FILE = str(path)
    return path


def register(card: dict, agent_id: str = "signed-1") -> Agent:
    agent, _ = services.agent_register(actor=SYSTEM, agent_id=agent_id, card=card)
    return agent


def version(agent: Agent) -> CardVersion:
    return CardVersion.objects.get(agent=agent, sha256=agent.card_sha256)


@pytest.mark.django_db
def test_sdk_signed_10_card_rs256_is_valid(jwks_file, rsa_key):
    agent = register(sign_10(card_10(), rsa_key))
    assert agent.card_signature == "valid"
    v = version(agent)
    assert (v.signature_status, v.signature_kid) == ("valid", "rsa-1")


@pytest.mark.django_db
def test_03_card_es256_signed_over_its_jcs_form_is_valid(jwks_file, ec_key):
    agent = register(sign_raw(card_03(), ec_key))
    assert version(agent).signature_status == "valid"
    assert version(agent).signature_kid == "ec-1"


@pytest.mark.django_db
def test_tampered_card_is_invalid(jwks_file, rsa_key, ec_key):
    tampered = sign_10(card_10(), rsa_key)
    tampered["description"] = "Now also wires money."
    assert register(tampered, "tampered-10").card_signature == "invalid"
    tampered03 = sign_raw(card_03(), ec_key)
    tampered03["skills"][0]["tags"].append("payments")
    assert register(tampered03, "tampered-03").card_signature == "invalid"


@pytest.mark.django_db
def test_unsigned_field_added_to_a_signed_10_card_is_invalid(jwks_file, rsa_key):
    """The SDK's 1.0 view ignores a top-level ``url``, but the registry would route to it: a
    field outside the signature makes the card invalid rather than valid."""
    card = sign_10(card_10(), rsa_key)
    card["url"] = "http://127.0.0.1:6666/evil"
    assert register(card).card_signature == "invalid"


@pytest.mark.django_db
def test_unsigned_and_unknown_key(jwks_file):
    assert register(card_03(), "plain").card_signature == "unsigned"
    stranger = TestKey("ES256", "stranger")
    agent = register(sign_raw(card_03(), stranger), "stranger")
    assert agent.card_signature == "unknown_key"
    assert "stranger" in version(agent).signature_detail


@pytest.mark.django_db
def test_untrusted_jku_is_never_fetched(jwks_file, settings):
    attacker = TestKey("ES256", "attacker")
    server = JwksServer(attacker)
    with serve_app(server) as srv:
        jku = f"{srv.url}/jwks.json"
        agent = register(sign_raw(card_03(), attacker, jku=jku))
        assert agent.card_signature == "unknown_key"
        assert "not a trusted JWKS URL" in version(agent).signature_detail
        # Even with a kid the file holds, the card's own jku is not trusted.
        agent = register(sign_10(card_10(), attacker, jku=jku), "attacker-10")
        assert agent.card_signature == "unknown_key"
    assert sum(server.requests.values()) == 0


@pytest.mark.django_db
def test_off_does_not_check(jwks_file, rsa_key, settings):
    settings.A2A_CARD_SIGNATURES = "off"
    agent = register(sign_10(card_10(), rsa_key))
    assert agent.card_signature == "" and version(agent).signature_status == ""


@pytest.mark.django_db
def test_require_refuses_unsigned_invalid_and_unknown(jwks_file, rsa_key, settings):
    settings.A2A_CARD_SIGNATURES = "require"
    with pytest.raises(services.InvalidInput, match="card signature is unsigned"):
        register(card_03(), "plain")
    tampered = sign_10(card_10(), rsa_key)
    tampered["name"] = "Other"
    with pytest.raises(services.InvalidInput, match="card signature is invalid"):
        register(tampered, "tampered")
    with pytest.raises(services.InvalidInput, match="unknown key"):
        register(sign_raw(card_03(), TestKey("ES256", "nope")), "unknown")
    assert not Agent.objects.exists()
    assert register(sign_10(card_10(), rsa_key)).card_signature == "valid"


@pytest.mark.django_db(transaction=True)
def test_key_rotation_at_a_jwks_url(settings):
    """Keys from an allowlisted JWKS URL, revalidated with the ETag; a new kid is picked up
    without a restart, and cards signed by the retired key stop being valid."""
    old, new = TestKey("RS256", "2026-01"), TestKey("ES256", "2026-02")
    server = JwksServer(old)
    settings.A2A_CARD_JWKS_MIN_REFRESH_SECONDS = 0
    with serve_app(server) as srv:
        url = f"{srv.url}/jwks.json"
        settings.A2A_CARD_JWKS_URLS = [url]
        card_old = sign_10(card_10(), old, jku=url)
        assert register(card_old, "rot-a").card_signature == "valid"
        assert server.requests["/jwks.json"] == 1
        assert register(card_old, "rot-b").card_signature == "valid"  # cached: no new fetch
        assert server.requests["/jwks.json"] == 1

        server.set_keys(new)  # rotation: the old key is retired
        card_new = sign_raw(card_03(), new)  # no jku: any trusted key set
        assert register(card_new, "rot-c").card_signature == "valid"
        assert server.validators[-1] != ""  # revalidated with If-None-Match
        assert register(card_old, "rot-a").card_signature == "unknown_key"
        assert version(Agent.objects.get(agent_id="rot-a")).signature_status == "unknown_key"


@pytest.mark.django_db(transaction=True)
def test_api_shows_the_result_and_refuses_with_a_clear_400(
    live_server_url, admin_token, jwks_file, ec_key, settings
):
    headers = {"Authorization": f"Bearer {admin_token}"}
    with httpx.Client(base_url=live_server_url, headers=headers, timeout=30) as api:
        r = api.post(
            "/api/v1/agents", json={"agent_id": "sig-api", "card": sign_raw(card_03(), ec_key)}
        )
        assert r.status_code == 201, r.text
        assert r.json()["card_signature"] == "valid"
        listed = api.get("/api/v1/agents").json()
        rows = listed["results"] if isinstance(listed, dict) else listed
        assert [a["card_signature"] for a in rows if a["agent_id"] == "sig-api"] == ["valid"]
        settings.A2A_CARD_SIGNATURES = "require"
        r = api.post("/api/v1/agents", json={"agent_id": "sig-plain", "card": card_03()})
        assert r.status_code == 400
        assert "A2A_CARD_SIGNATURES=require" in r.text and "unsigned" in r.text


@pytest.mark.django_db
def test_admin_shows_the_signature_on_the_card_history(admin_client, jwks_file, ec_key):
    agent = register(sign_raw(card_03(), ec_key))
    page = admin_client.get(f"/admin/registry/agent/{agent.pk}/change/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "signature" in html.lower() and ">valid<" in html.replace("\n", "")


@pytest.mark.django_db(transaction=True)
def test_unknown_kids_cannot_make_the_registry_hammer_the_key_server(settings):
    """An unknown kid revalidates the JWKS at most once per A2A_CARD_JWKS_MIN_REFRESH_SECONDS."""
    trusted = TestKey("ES256", "trusted")
    server = JwksServer(trusted)
    with serve_app(server) as srv:
        settings.A2A_CARD_JWKS_URLS = [f"{srv.url}/jwks.json"]
        for i in range(5):
            card = sign_raw(card_03(), TestKey("ES256", f"random-{i}"))
            assert register(card, f"probe-{i}").card_signature == "unknown_key"
        assert register(sign_raw(card_03(), trusted), "good").card_signature == "valid"
    assert server.requests["/jwks.json"] == 1


@pytest.mark.django_db(transaction=True)
def test_oversized_or_unreachable_jwks_trusts_nothing_new(settings):
    key = TestKey("ES256", "big")
    server = JwksServer()
    server.set_keys(key, pad=300 * 1024)  # over the 256 KiB cap
    with serve_app(server) as srv:
        settings.A2A_CARD_JWKS_URLS = [f"{srv.url}/jwks.json"]
        assert register(sign_raw(card_03(), key)).card_signature == "unknown_key"
    settings.A2A_CARD_JWKS_URLS = ["http://127.0.0.1:9/jwks.json"]  # nothing listens there
    signatures.reset()
    assert register(sign_raw(card_03(), key), "other").card_signature == "unknown_key"


@pytest.mark.django_db
def test_malformed_signatures_are_clear_errors_not_crashes(jwks_file):
    card = {**card_03(), "signatures": [{"protected": 5, "signature": None}]}
    agent = register(card)
    assert agent.card_signature == "invalid"
    assert version(agent).signature_detail == "malformed signatures list"
    garbage = {**card_03(), "signatures": [{"protected": "!!not-base64!!", "signature": "x"}]}
    assert register(garbage, "garbage").card_signature == "invalid"
    with pytest.raises(services.InvalidInput, match="signatures must be a list"):
        register({**card_03(), "signatures": "signed, honest"}, "not-a-list")
