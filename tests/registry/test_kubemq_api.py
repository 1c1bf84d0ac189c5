"""The KubeMQ-compatible registry surface over a real ASGI server.

Shapes, field names and status codes are KubeMQ's (kubemq-io/kubemq-a2a docs/patterns/registry.md,
docs/reference/endpoints.md, and the burn-in suite's R01-R21 expectations).
"""

from __future__ import annotations

import re
import time
from datetime import timedelta

import httpx
import orjson
import pytest
from django.utils import timezone

from registry import events, services
from registry.cards import parse_card
from registry.models import Agent, CardVersion
from registry.permissions import SYSTEM
from tests.conftest import make_client
from tests.registry.cards import card_03, card_10, card_kubemq

TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


def kcard(agent_id: str = "echo-agent-01", *, tags=("test", "echo"), port: int = 18080) -> dict:
    card = card_kubemq(agent_id, url=f"http://127.0.0.1:{port}/")
    card["skills"][0]["tags"] = list(tags)
    return card


def register(api: httpx.Client, card: dict) -> httpx.Response:
    return api.post("/agents/register", json=card)


def assert_nothing_written() -> None:
    assert Agent.objects.count() == 0
    assert CardVersion.objects.count() == 0


# --- register ----------------------------------------------------------------------------------


def test_register_answers_the_enriched_card(api: httpx.Client):
    card = kcard()
    seen: list[events.AgentEvent] = []
    unsubscribe = events.subscribe(seen.append)
    try:
        r = register(api, card)
    finally:
        unsubscribe()
    assert r.status_code == 200, r.text
    body = r.json()
    assert {k: v for k, v in body.items() if k not in ("registered_at", "last_seen")} == card
    assert list(body)[: len(card)] == list(card)  # the card's own key order is kept
    assert TIMESTAMP.match(body["registered_at"]) and TIMESTAMP.match(body["last_seen"])
    assert body["registered_at"] == body["last_seen"]

    agent = Agent.objects.get(agent_id="echo-agent-01")
    assert agent.source == Agent.Source.KUBEMQ
    assert agent.url == "http://127.0.0.1:18080/" and agent.name == "Echo Agent"
    assert agent.tags == ["test", "echo"] and agent.is_routable
    assert orjson.loads(agent.card_raw) == card  # the stored card is the body, nothing added
    assert [(e.kind, e.agent_id) for e in seen] == [("registered", "echo-agent-01")]


def test_register_stores_the_body_byte_exact(api: httpx.Client):
    raw = (b'{"agent_id": "signed-agent",  "name": "Signed", "url": "http://127.0.0.1:9/",\n'
           b' "signatures": [{"protected": "eyJhbGciOiJFUzI1NiJ9", "signature": "c2ln"}]}')
    r = api.post("/agents/register", content=raw, headers={"Content-Type": "application/json"})
    assert r.status_code == 200, r.text
    assert Agent.objects.get(agent_id="signed-agent").card_raw.encode() == raw
    assert api.get("/api/v1/agents/signed-agent/card").content == raw


def test_reregistration_keeps_registered_at_and_updates_last_seen(api: httpx.Client):
    first = register(api, kcard()).json()
    time.sleep(0.01)
    changed = kcard(tags=("echo", "nlp"))
    r = register(api, changed)
    assert r.status_code == 200  # KubeMQ answers 200 for a re-registration too, never 201
    second = r.json()
    assert second["registered_at"] == first["registered_at"]
    assert second["last_seen"] > first["last_seen"]
    assert api.get("/agents/echo-agent-01").json()["registered_at"] == first["registered_at"]
    assert Agent.objects.get().tags == ["echo", "nlp"]
    assert CardVersion.objects.count() == 2  # both cards are in the history


def test_register_accepts_the_public_flag_as_api_v1_does(api: httpx.Client,
                                                         live_server_url: str):
    """``"public": true`` in the card body lists the agent to anonymous ARD discovery; a
    re-registration without it keeps the flag; anything but a boolean is a 400."""
    def anonymous_catalog() -> set[str]:
        with httpx.Client(base_url=live_server_url, timeout=30) as http:
            r = http.get("/.well-known/ai-catalog.json")
        assert r.status_code == 200, r.text
        return {agent_id for agent_id in ("echo-agent-01", "hidden-agent")
                if f"/a2a/{agent_id}/" in r.text}

    assert register(api, {**kcard("hidden-agent"), "public": False}).status_code == 200
    assert register(api, {**kcard(), "public": True}).status_code == 200
    assert Agent.objects.get(agent_id="echo-agent-01").public is True
    assert Agent.objects.get(agent_id="hidden-agent").public is False
    assert anonymous_catalog() == {"echo-agent-01"}
    assert register(api, kcard(tags=("echo", "v2"))).status_code == 200  # flag omitted
    assert Agent.objects.get(agent_id="echo-agent-01").public is True
    r = register(api, {**kcard(), "public": "yes"})
    assert r.status_code == 400 and r.json() == {"error": "public must be true or false"}
    assert register(api, {**kcard(), "public": False}).status_code == 200
    assert Agent.objects.get(agent_id="echo-agent-01").public is False
    assert anonymous_catalog() == set()


def test_register_accepts_a_body_sent_without_json_content_type(api: httpx.Client):
    r = api.post("/agents/register", content=orjson.dumps(kcard()),
                 headers={"Content-Type": "text/plain"})
    assert r.status_code == 200, r.text
    assert Agent.objects.filter(agent_id="echo-agent-01").exists()


OVERSIZED = {**kcard("big-agent"), "description": "x" * (64 * 1024)}


# Each case list runs in one test: a test per case would start a server per case.
BAD_BODIES = [
    (b"{invalid json!!!}", 400, "invalid JSON"),
    (b"", 400, "JSON object"),
    (b"   ", 400, "JSON object"),
    (b'{"agent_id": "a1", "name": "x", "url": "http://127.0.0.1:9/"', 400, "invalid JSON"),
    (b"\xff\xfe{}", 400, "invalid JSON"),
    (b'{"a": NaN}', 400, "invalid JSON"),
    (b"[" * 5000 + b"]" * 5000, 400, "invalid JSON"),
    (b"[]", 400, "JSON object"),
    (b'"agent"', 400, "JSON object"),
    (b"42", 400, "JSON object"),
    (b"null", 400, "JSON object"),
    (orjson.dumps(OVERSIZED), 413, "too large"),
    (b" " * (2 * 1024 * 1024) + b"{}", 413, "too large"),
]


def test_register_refuses_bodies_that_are_not_one_small_json_object(api: httpx.Client):
    for content, status, message in BAD_BODIES:
        case = content[:40]
        r = api.post("/agents/register", content=content,
                     headers={"Content-Type": "application/json"})
        assert r.status_code == status, (case, r.text)
        assert r.headers["content-type"] == "application/json", case
        assert message in r.json()["error"], (case, r.text)
    assert_nothing_written()


def _without(key: str) -> dict:
    card = kcard("test-agent")
    del card[key]
    return card


BAD_CARDS = [
    (_without("agent_id"), "agent_id is required"),
    (_without("name"), "name is required"),
    (_without("url"), "url is required"),
    ({**kcard(), "agent_id": ""}, "agent_id is required"),
    ({**kcard(), "name": "   "}, "name is required"),
    ({**kcard(), "agent_id": 123}, "agent_id must be a string"),
    ({**kcard(), "name": 5}, "name must be a string"),
    ({**kcard(), "url": ["http://127.0.0.1:9/"]}, "url must be a string"),
    ({**kcard(), "skills": "echo"}, "skills must be a list"),
    ({**kcard(), "skills": ["echo"]}, "skills[0] must be an object"),
    ({**kcard(), "defaultInputModes": "text"}, "defaultInputModes must be a list"),
    ({**kcard(), "capabilities": {"streaming": "yes"}}, "streaming must be a boolean"),
    ({**kcard(), "agent_id": "INVALID_UPPERCASE"}, "invalid agent_id"),
    ({**kcard(), "agent_id": "x"}, "invalid agent_id"),
    ({**kcard(), "agent_id": "agent@invalid!"}, "invalid agent_id"),
    ({**kcard(), "agent_id": "-leading-hyphen"}, "invalid agent_id"),
    ({**kcard(), "agent_id": "a" * 64}, "invalid agent_id"),
    ({**kcard(), "agent_id": "_AGENTS_.discovery"}, "reserved prefix"),
    ({**kcard(), "url": "/relative/path"}, "absolute http or https"),
    ({**kcard(), "url": "file:///etc/passwd"}, "absolute http or https"),
    ({**kcard(), "url": "ftp://127.0.0.1/"}, "absolute http or https"),
    ({**kcard(), "url": "http://169.254.169.254/latest/meta-data/"}, "metadata"),
    ({**kcard(), "url": "http://metadata.google.internal/"}, "metadata"),
    ({**kcard(), "url": "http://[fe80::1]:8080/"}, "link-local"),
    ({**kcard(), "url": "http://user:pw@127.0.0.1:9/"}, "credentials"),
    ({**kcard(), "description": "a\u0000b"}, "NUL"),
    ({**kcard(), "url": "http://127.0.0.1:9/\u0000"}, "NUL"),
    ({**kcard(), "extensions": [{"k\u0000": 1}]}, "NUL"),
]


def test_register_refuses_bad_cards_with_400_and_writes_nothing(api: httpx.Client):
    for card, message in BAD_CARDS:
        r = register(api, card)
        assert r.status_code == 400, (message, r.text)
        assert message in r.json()["error"], (message, r.text)
    assert_nothing_written()


# --- list and get ------------------------------------------------------------------------------


@pytest.fixture
def three_agents(api: httpx.Client) -> None:
    assert register(api, kcard("echo-agent", tags=("test", "echo"))).status_code == 200
    assert register(api, kcard("nlp-agent", tags=("nlp",))).status_code == 200
    assert register(api, kcard("stream-agent", tags=("stream", "test"))).status_code == 200


def ids(api: httpx.Client, **params) -> list[str]:
    r = api.get("/agents", params=params)
    assert r.status_code == 200, r.text
    assert isinstance(r.json(), list)
    return [a["agent_id"] for a in r.json()]


def test_list_filters_by_any_skill_tag_and_limits(api: httpx.Client, three_agents):
    assert ids(api) == ["echo-agent", "nlp-agent", "stream-agent"]
    assert ids(api, skill_tags="echo") == ["echo-agent"]
    assert ids(api, skill_tags="test,echo") == ["echo-agent", "stream-agent"]
    assert ids(api, skill_tags=" nlp , echo ") == ["echo-agent", "nlp-agent"]
    assert ids(api, skill_tags="nothing-has-this") == []
    assert ids(api, skill_tags="") == ["echo-agent", "nlp-agent", "stream-agent"]
    assert ids(api, limit=2) == ["echo-agent", "nlp-agent"]
    assert ids(api, skill_tags="test", limit=1) == ["echo-agent"]
    assert ids(api, limit=0) == ["echo-agent", "nlp-agent", "stream-agent"]
    listed = api.get("/agents", params={"skill_tags": "nlp"}).json()[0]
    assert listed == api.get("/agents/nlp-agent").json()  # the same enriched card


def test_list_refuses_a_bad_limit(api: httpx.Client):
    for limit in ["two", "-1", "1.5", "9" * 5000]:
        r = api.get("/agents", params={"limit": limit})
        assert r.status_code == 400 and "limit" in r.json()["error"], limit


def test_list_survives_extreme_queries(api: httpx.Client, three_agents):
    assert len(ids(api, limit=str(10**20))) == 3  # beyond any database's LIMIT: no limit
    many = ",".join(f"t{i}" for i in range(99)) + ",nlp"
    assert ids(api, skill_tags=many) == ["nlp-agent"]
    r = api.get("/agents", params={"skill_tags": ",".join(f"t{i}" for i in range(3000))})
    assert r.status_code == 400 and "at most 100" in r.json()["error"]


def test_agents_registered_through_api_v1_are_listed_kubemq_style(api: httpx.Client):
    r = api.post("/api/v1/agents", json={"agent_id": "warranty-1", "card": card_10()})
    assert r.status_code == 201, r.text
    [agent] = api.get("/agents", params={"skill_tags": "warranty"}).json()
    assert agent["agent_id"] == "warranty-1"
    assert agent["url"] == "http://127.0.0.1:9/a2a"  # from supportedInterfaces
    assert agent["skills"][0]["tags"] == ["warranty"]
    assert TIMESTAMP.match(agent["registered_at"]) and TIMESTAMP.match(agent["last_seen"])


def test_get_agent(api: httpx.Client):
    registered = register(api, kcard()).json()
    r = api.get("/agents/echo-agent-01")
    assert r.status_code == 200 and r.json() == registered
    assert api.get("/agents/echo-agent-01/").json() == registered


def test_get_agent_errors(api: httpx.Client):
    for agent_id, status, error in [
        ("nonexistent-agent-xyz", 404, "agent not found"),
        ("INVALID", 400, "invalid agent_id"),
        ("x", 400, "invalid agent_id"),
        ("_AGENTS_.discovery", 400, "reserved prefix"),
    ]:
        r = api.get(f"/agents/{agent_id}")
        assert r.status_code == status, agent_id
        assert r.headers["content-type"] == "application/json"
        assert error in r.json()["error"], agent_id
    assert api.get("/agents/nonexistent-agent-xyz").json() == {"error": "agent not found"}


def test_expired_agents_are_neither_listed_nor_found(api: httpx.Client):
    services.agent_register(actor=SYSTEM, agent_id="old-agent", card=card_03())
    Agent.objects.filter(agent_id="old-agent").update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    assert ids(api) == []
    assert api.get("/agents/old-agent").status_code == 404
    services.agents_expire()
    r = api.post("/agents/heartbeat", json={"agent_id": "old-agent"})
    assert r.status_code == 400 and r.json() == {"error": "agent not found"}


# --- heartbeat ---------------------------------------------------------------------------------


def test_heartbeat_updates_last_seen_and_renews_the_lease(api: httpx.Client):
    registered = register(api, kcard()).json()
    before = Agent.objects.get().expires_at
    time.sleep(0.01)
    r = api.post("/agents/heartbeat", json={"agent_id": "echo-agent-01"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert list(body) == ["agent_id", "last_seen"] and body["agent_id"] == "echo-agent-01"
    assert TIMESTAMP.match(body["last_seen"]) and body["last_seen"] > registered["last_seen"]
    assert Agent.objects.get().expires_at > before
    agent = api.get("/agents/echo-agent-01").json()
    assert agent["last_seen"] == body["last_seen"]
    assert agent["registered_at"] == registered["registered_at"]


def test_heartbeat_errors_are_400(api: httpx.Client):
    for payload, error in [
        ({"agent_id": "nonexistent-agent-xyz"}, "agent not found"),
        ({"agent_id": "BAD"}, "invalid agent_id"),
        ({"agent_id": "_AGENTS_.x1"}, "reserved prefix"),
        ({"agent_id": 7}, "agent_id must be a string"),
        ({}, "agent_id is required"),
        ([], "JSON object"),
    ]:
        r = api.post("/agents/heartbeat", json=payload)
        assert r.status_code == 400, (payload, r.text)
        assert error in r.json()["error"], (payload, r.text)
    r = api.post("/agents/heartbeat", json={"agent_id": "nonexistent-agent-xyz"})
    assert r.json() == {"error": "agent not found"}  # KubeMQ's body, with KubeMQ's 400


# --- deregister --------------------------------------------------------------------------------


def test_deregister_by_post_and_by_delete(api: httpx.Client):
    seen: list[events.AgentEvent] = []
    register(api, kcard("dereg-post"))
    register(api, kcard("dereg-delete"))
    unsubscribe = events.subscribe(seen.append)
    try:
        r = api.post("/agents/deregister", json={"agent_id": "dereg-post"})
        assert r.status_code == 200 and r.json()["agent_id"] == "dereg-post"
        r = api.delete("/agents/dereg-delete")
        assert r.status_code == 200 and r.json()["agent_id"] == "dereg-delete"
    finally:
        unsubscribe()
    assert_nothing_written()
    assert [(e.kind, e.agent_id) for e in seen] == [
        ("deregistered", "dereg-post"), ("deregistered", "dereg-delete")
    ]
    assert api.get("/agents/dereg-post").status_code == 404
    # Unknown agents: 404 with KubeMQ's body, both ways.
    r = api.post("/agents/deregister", json={"agent_id": "dereg-post"})
    assert r.status_code == 404 and r.json() == {"error": "agent not found"}
    r = api.delete("/agents/dereg-delete")
    assert r.status_code == 404 and r.json() == {"error": "agent not found"}


def test_deregister_refuses_invalid_ids_with_400(api: httpx.Client):
    for method, path, payload, error in [
        ("POST", "/agents/deregister", {"agent_id": "Bad!"}, "invalid agent_id"),
        ("POST", "/agents/deregister", {}, "agent_id is required"),
        ("POST", "/agents/deregister", {"agent_id": "_AGENTS_.x1"}, "reserved prefix"),
        ("DELETE", "/agents/Bad", None, "invalid agent_id"),
        ("DELETE", "/agents/_AGENTS_.discovery", None, "reserved prefix"),
    ]:
        r = api.request(method, path, json=payload)
        assert r.status_code == 400 and error in r.json()["error"], (method, path, r.text)


# --- auth --------------------------------------------------------------------------------------


def test_auth_is_the_api_v1_bearer_token(live_server_url: str):
    _, register_token = make_client(["register"], name="kubemq-registrar")
    _, call_token = make_client(["call"], name="kubemq-caller")
    _, other_token = make_client(["register"], name="kubemq-other")
    with httpx.Client(base_url=live_server_url, timeout=30) as http:
        r = http.post("/agents/register", json=kcard())
        assert r.status_code == 401 and "Bearer" in r.json()["error"]
        assert r.headers["www-authenticate"].startswith("Bearer")
        assert http.get("/agents").status_code == 401
        r = http.get("/agents", headers={"Authorization": "Bearer nope.nope"})
        assert r.status_code == 401 and r.json() == {"error": "invalid or revoked token"}

        as_caller = {"Authorization": f"Bearer {call_token}"}
        r = http.post("/agents/register", json=kcard(), headers=as_caller)
        assert r.status_code == 403 and "register scope" in r.json()["error"]
        assert_nothing_written()

        as_registrar = {"Authorization": f"Bearer {register_token}"}
        assert http.post("/agents/register", json=kcard(), headers=as_registrar).status_code == 200
        assert http.get("/agents", headers=as_caller).status_code == 200

        as_other = {"Authorization": f"Bearer {other_token}"}
        for method, path, payload in [
            ("POST", "/agents/register", kcard()),
            ("POST", "/agents/heartbeat", {"agent_id": "echo-agent-01"}),
            ("POST", "/agents/deregister", {"agent_id": "echo-agent-01"}),
            ("DELETE", "/agents/echo-agent-01", None),
        ]:
            r = http.request(method, path, json=payload, headers=as_other)
            assert r.status_code == 403, (method, path, r.text)
        assert Agent.objects.get().owner.client_id == "kubemq-registrar"


def test_anonymous_access_when_the_setting_allows_it(live_server_url: str, settings):
    settings.A2A_ALLOW_ANONYMOUS = True
    with httpx.Client(base_url=live_server_url, timeout=30) as http:
        assert http.post("/agents/register", json=kcard()).status_code == 200
        assert http.post("/agents/heartbeat", json={"agent_id": "echo-agent-01"}).status_code == 200
        assert [a["agent_id"] for a in http.get("/agents").json()] == ["echo-agent-01"]
        assert http.delete("/agents/echo-agent-01").status_code == 200


# --- platform card, methods, errors are JSON -----------------------------------------------------


def test_platform_card_is_public_named_kubemq_and_a_valid_a2a_card(live_server_url: str):
    from a2a.compat.v0_3.types import AgentCard

    with httpx.Client(base_url=live_server_url, timeout=30) as http:
        r = http.get("/.well-known/agent-card.json")  # no token: cards are public
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    card = r.json()
    assert card["name"] == "kubemq"
    assert card["url"] == f"{live_server_url}/"
    assert card["skills"] == [] and card["protocolVersions"] == ["1.0"]
    AgentCard.model_validate(card)  # the A2A 0.3 schema, from the official SDK
    parse_card(card, strict=True)  # and the registry's own strict check


def test_platform_card_honours_the_token_setting(live_server_url: str, settings, admin_token):
    settings.A2A_CARDS_REQUIRE_TOKEN = True
    with httpx.Client(base_url=live_server_url, timeout=30) as http:
        assert http.get("/.well-known/agent-card.json").status_code == 401
        r = http.get("/.well-known/agent-card.json",
                     headers={"Authorization": f"Bearer {admin_token}"})
        assert r.status_code == 200


def test_wrong_methods_answer_405_in_json(api: httpx.Client):
    for method, path in [
        ("POST", "/agents"), ("PUT", "/agents/echo-agent-01"), ("POST", "/agents/echo-agent-01"),
        ("PATCH", "/agents/register"), ("POST", "/.well-known/agent-card.json"),
    ]:
        r = api.request(method, path, json={})
        assert r.status_code == 405, (method, path)
        assert r.headers["content-type"] == "application/json" and "error" in r.json()


def test_errors_are_json_even_for_a_browser(api: httpx.Client):
    r = api.get("/agents/nonexistent-agent-xyz", headers={"Accept": "text/html"})
    assert r.status_code == 404 and r.headers["content-type"] == "application/json"
    r = api.get("/agents", headers={"Accept": "text/html"})
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
