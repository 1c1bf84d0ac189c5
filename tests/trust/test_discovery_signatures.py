"""Discovery under the card signature policy: a card whose signature turns invalid on refresh
keeps its last valid version (and alerts); needs may require signed cards; ``require`` leaves
unsigned cards out. Real card servers on loopback, the real loop."""

from __future__ import annotations

import json

import pytest

from discovery.loop import run_cycle
from discovery.models import Alert, Snapshot
from registry.models import Agent
from tests.discovery.servers import make_card, skill
from tests.trust.signing import TestKey, jwks, sign_raw

pytestmark = pytest.mark.django_db

TEXT = {"input_modes": ["text/plain"], "output_modes": ["text/plain"]}


@pytest.fixture(scope="module")
def key() -> TestKey:
    return TestKey("ES256", "disc-1")


@pytest.fixture(autouse=True)
def trusted(tmp_path, settings, key, _fresh_trees):
    # A first fetch on a loaded 2-core machine can take over discovery tests' 1 s.
    settings.DISCOVERY_FETCH_TIMEOUT_SECONDS = 5.0
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps(jwks(key)))
    settings.A2A_CARD_JWKS_FILE = str(path)


def _probe(server, name: str, prefix: str) -> dict:
    return {"local_name": name, "base_url": server.base(prefix), "description": f"{name} desc"}


def _agents(snapshot: Snapshot) -> dict[str, dict]:
    return {a["local_name"]: a for a in snapshot.agents}


def test_card_turning_invalid_on_refresh_keeps_last_valid_version(
    card_server, configure, cache, clock, key
):
    good = make_card("Claims", card_server.base("/a/claims"), [skill("claims", "warranty")])
    valid_raw = card_server.set_card("/a/claims", sign_raw(good, key))
    configure(
        probe=[_probe(card_server, "claims_agent", "/a/claims")],
        needs=[{"tag": "warranty", **TEXT, "description": "Warranty claims."}],
    )
    report = run_cycle(cache=cache)
    assert "claims_agent" in _agents(Snapshot.objects.current()), (
        report.summary(),
        list(Alert.objects.values_list("message", flat=True)),
    )
    first = _agents(Snapshot.objects.current())["claims_agent"]
    agent = Agent.objects.get(agent_id="claims-agent")
    assert agent.card_signature == "valid"
    assert agent.card_raw.encode() == valid_raw

    # The card changes but keeps its old signature: no longer valid.
    tampered = sign_raw(good, key)
    tampered["url"] = "http://127.0.0.1:6666/elsewhere/"
    card_server.set_card("/a/claims", tampered)
    clock.advance(400)
    report = run_cycle(cache=cache)
    assert report.fetched == 1
    alert = Alert.objects.get(kind=Alert.Kind.SIGNATURE_INVALID)
    assert "invalid" in alert.message and "keeping the last valid version" in alert.message
    after = _agents(Snapshot.objects.current())["claims_agent"]
    assert after["card_sha256"] == first["card_sha256"]
    agent.refresh_from_db()
    assert agent.card_raw.encode() == valid_raw and agent.url == good["url"]

    # Dropping the signatures altogether is no better.
    card_server.set_card("/a/claims", {**good, "description": "unsigned now"})
    clock.advance(400)
    run_cycle(cache=cache)
    assert (
        _agents(Snapshot.objects.current())["claims_agent"]["card_sha256"] == first["card_sha256"]
    )
    assert Alert.objects.filter(kind=Alert.Kind.SIGNATURE_INVALID).count() == 2


def test_need_may_require_signed_cards(card_server, configure, cache, key):
    signed = make_card("S", card_server.base("/a/s"), [skill("claims", "warranty", "quotes")])
    card_server.set_card("/a/s", sign_raw(signed, key))
    card_server.set_card(
        "/a/p", make_card("P", card_server.base("/a/p"), [skill("claims", "warranty", "quotes")])
    )
    configure(
        probe=[
            _probe(card_server, "signed_agent", "/a/s"),
            _probe(card_server, "plain_agent", "/a/p"),
        ],
        needs=[{"tag": "warranty", **TEXT, "description": "Warranty.", "require_signed": True}],
    )
    run_cycle(cache=cache)
    assert sorted(_agents(Snapshot.objects.current())) == ["signed_agent"]

    configure(
        probe=[
            _probe(card_server, "signed_agent", "/a/s"),
            _probe(card_server, "plain_agent", "/a/p"),
        ],
        needs=[
            {"tag": "warranty", **TEXT, "description": "Warranty.", "require_signed": True},
            {"tag": "quotes", **TEXT, "description": "Quotes."},
        ],
    )
    run_cycle(cache=cache)
    snap = _agents(Snapshot.objects.current())
    assert sorted(snap) == ["plain_agent", "signed_agent"]
    assert snap["plain_agent"]["description"] == "plain_agent desc"


def test_require_leaves_unsigned_cards_out(card_server, configure, cache, key, settings):
    settings.A2A_CARD_SIGNATURES = "require"
    card_server.set_card(
        "/a/s", sign_raw(make_card("S", card_server.base("/a/s"), [skill("c", "warranty")]), key)
    )
    card_server.set_card("/a/p", make_card("P", card_server.base("/a/p"), [skill("c", "warranty")]))
    configure(
        probe=[
            _probe(card_server, "signed_agent", "/a/s"),
            _probe(card_server, "plain_agent", "/a/p"),
        ],
        needs=[{"tag": "warranty", **TEXT, "description": "Warranty."}],
    )
    run_cycle(cache=cache)
    assert sorted(_agents(Snapshot.objects.current())) == ["signed_agent"]
    assert not Agent.objects.filter(agent_id="plain-agent").exists()
    alert = Alert.objects.get(kind=Alert.Kind.SIGNATURE_INVALID)
    assert "plain_agent" in alert.message and "unsigned" in alert.message
