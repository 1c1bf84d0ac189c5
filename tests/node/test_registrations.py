"""Registrations are answered by a lean ASGI handler (node.registrations) under the server and
by the DRF views under Django's test client: the same requests must get the same status and
body from both, valid or not."""

from __future__ import annotations

import orjson
import pytest
from django.test import Client as DjangoClient

from gateway import runtime
from node import registrations
from registry import services
from registry.models import Agent, CardVersion
from tests.conftest import make_client
from tests.registry.cards import card_03, card_10, card_kubemq
from tests.services_helpers import actor_of, eventually

V1 = "/api/v1/agents"
KUBEMQ = "/agents/register"
TIMES = ("registered_at", "last_seen", "expires_at")


def _v1(agent_id="fresh-1", card=None, **fields) -> bytes:
    return orjson.dumps({"agent_id": agent_id, "card": card or card_03(), **fields})


def _big_card() -> dict:
    card = card_03()
    card["skills"] = [{"id": f"s{i}", "name": f"Skill {i}", "description": "x" * 400,
                       "tags": ["t"]} for i in range(200)]  # ~90 KiB: over the card cap
    return card


CASES = [
    # (id, path, body, who, status)
    ("v1-0.3", V1, _v1(), "owner", 201),
    ("v1-1.0", V1, _v1(card=card_10()), "owner", 201),
    ("v1-url-only-ttl", V1, _v1(ttl_seconds=120, max_concurrency=4, public=True), "owner", 201),
    ("v1-reregister", V1, _v1("existing", ttl_seconds=300), "owner", 200),
    ("v1-reregister-other-owner", V1, _v1("existing"), "other", 403),
    ("v1-card-invalid", V1, _v1(card={"name": "no url"}), "owner", 400),
    ("v1-card-not-object", V1, _v1(card=["a"]), "owner", 400),
    ("v1-card-too-big", V1, _v1(card=_big_card()), "owner", 400),
    ("v1-bad-json", V1, b'{"agent_id": "x", nope', "owner", 400),
    ("v1-not-object", V1, b"[1, 2]", "owner", 400),
    ("v1-empty", V1, b"", "owner", 400),
    ("v1-unknown-field", V1, _v1(colour="blue"), "owner", 400),
    ("v1-ttl-string", V1, _v1(ttl_seconds="10"), "owner", 400),
    ("v1-ttl-too-long", V1, _v1(ttl_seconds=10**9), "owner", 400),
    ("v1-public-string", V1, _v1(public="yes"), "owner", 400),
    ("v1-id-number", V1, orjson.dumps({"agent_id": 5, "card": card_03()}), "owner", 400),
    ("v1-id-invalid", V1, _v1("Bad Id!"), "owner", 400),
    ("v1-metadata-url", V1, _v1(card=card_03("http://169.254.169.254/")), "owner", 400),
    ("v1-file-url", V1, _v1(url="file:///etc/passwd"), "owner", 400),
    ("v1-credentials-url", V1, _v1(url="http://u:p@127.0.0.1:9/"), "owner", 400),
    ("v1-nothing", V1, orjson.dumps({"agent_id": "fresh-1"}), "owner", 400),
    ("v1-no-auth", V1, _v1(), None, 401),
    ("v1-bad-token", V1, _v1(), "bad", 401),
    ("v1-no-register-scope", V1, _v1(), "caller", 403),
    ("v1-not-allowed-agent", V1, _v1(), "limited", 403),
    ("v1-quota", V1, _v1(), "full", 403),
    ("v1-quota-reregister", V1, _v1("full-own"), "full", 200),
    ("kubemq", KUBEMQ, orjson.dumps(card_kubemq("kube-new")), "owner", 200),
    ("kubemq-reregister", KUBEMQ, orjson.dumps(card_kubemq("kube-1")), "owner", 200),
    ("kubemq-no-name", KUBEMQ, orjson.dumps({"agent_id": "kube-k", "url": "http://127.0.0.1:9/"}),
     "owner", 400),
    ("kubemq-url-type", KUBEMQ, orjson.dumps({**card_kubemq("kube-k"), "url": 5}), "owner", 400),
    ("kubemq-metadata-url", KUBEMQ, orjson.dumps(card_kubemq("kube-k", "http://169.254.169.254/")),
     "owner", 400),
    ("kubemq-bad-json", KUBEMQ, b"{nope", "owner", 400),
    ("kubemq-not-object", KUBEMQ, b'"card"', "owner", 400),
    ("kubemq-nul", KUBEMQ, orjson.dumps({**card_kubemq("kube-k"), "name": "a\x00b"}), "owner", 400),
    ("kubemq-passthrough-type", KUBEMQ,
     orjson.dumps({**card_kubemq("kube-k"), "credential_passthrough": "on"}), "owner", 400),
    ("kubemq-huge", KUBEMQ, orjson.dumps({**card_kubemq("kube-k"), "pad": "a" * 70_000}), "owner",
     413),
    ("kubemq-no-auth", KUBEMQ, orjson.dumps(card_kubemq("kube-k")), None, 401),
    ("kubemq-no-scope", KUBEMQ, orjson.dumps(card_kubemq("kube-k")), "caller", 403),
    ("kubemq-quota", KUBEMQ, orjson.dumps(card_kubemq("kube-k")), "full", 403),
]


@pytest.fixture
def clients(transactional_db, settings):
    settings.A2A_MAX_AGENTS_PER_CLIENT = 3
    owner, owner_token = make_client(["register"], name="owner")
    _, other_token = make_client(["register"], name="other")
    _, caller_token = make_client(["call"], name="caller")
    _, limited_token = make_client(["register"], agents=["only-this"], name="limited")
    full, full_token = make_client(["register"], name="full")
    services.agent_register(actor=actor_of(owner), agent_id="existing", card=card_03())
    services.agent_register(actor=actor_of(owner), agent_id="kube-1", card=card_kubemq("kube-1"))
    for index in range(3):
        services.agent_register(actor=actor_of(full), agent_id="full-own" if index == 0
                                else f"full-{index}", card=card_03())
    return {"owner": owner_token, "other": other_token, "caller": caller_token,
            "limited": limited_token, "full": full_token, "bad": "xx.yy", None: None}


def _state() -> list:
    return [(a.agent_id, a.card_sha256, a.ttl_seconds, a.url, a.public, a.owner_id)
            for a in Agent.objects.order_by("agent_id")]


def _restore(before: set[str]) -> None:
    """Undo what a request created, so both paths start from the same registry."""
    Agent.objects.exclude(agent_id__in=before).delete()


def _shape(body):
    if isinstance(body, dict):
        return {k: (bool(v) if k in TIMES else v) for k, v in body.items()}
    return body


@pytest.mark.parametrize("path, body, who, status", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_fast_path_and_views_agree(live_server_url, clients, path, body, who, status):
    import httpx

    token = clients[who]
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    before_ids = set(Agent.objects.values_list("agent_id", flat=True))
    fast = httpx.post(live_server_url + path, content=body, headers=headers, timeout=30)
    fast_state = _state()
    _restore(before_ids)
    django_headers = {"HTTP_AUTHORIZATION": headers["Authorization"]} if token else {}
    view = DjangoClient().post(path, data=body, content_type="application/json",
                               **django_headers)
    assert fast.status_code == view.status_code == status, (fast.text, view.content)
    assert _shape(fast.json()) == _shape(view.json())
    assert "x-frame-options" not in fast.headers  # the fast path answered, not Django
    assert "X-Frame-Options" in view.headers
    # The registry ends the same way too (fields, card bytes' hash, owner).
    assert fast_state == _state()
    if status == 401:
        assert fast.headers["www-authenticate"] == view.headers["WWW-Authenticate"]


def test_fast_registration_stores_the_card_byte_exact_and_routes(live_server_url, clients):
    import httpx

    card = b'{ "name":"Echo Agent",  "url":"http://127.0.0.1:9/", "version":"1.0.0",' \
           b'"protocolVersion":"0.3.0", "skills":[] }'
    body = b'{"agent_id": "exact-1", "card": ' + card + b"}"
    r = httpx.post(live_server_url + V1, content=body, headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {clients['owner']}"})
    assert r.status_code == 201, r.text
    agent = Agent.objects.get(agent_id="exact-1")
    assert agent.card_raw.encode() == card
    assert CardVersion.objects.filter(agent=agent, sha256=agent.card_sha256).exists()
    # The registered event reached the node: the route is in its table.
    node = runtime.current_node()
    assert node is not None
    assert eventually(lambda: "exact-1" in node.table)




def test_routing_leaves_sessions_other_bodies_and_methods_to_django():
    def scope(method, path, headers):
        return {"method": method, "path": path, "headers": headers}

    json_body = [(b"content-type", b"application/json"), (b"content-length", b"2")]
    assert registrations.route(scope("POST", "/api/v1/agents", json_body)) is not None
    assert registrations.route(scope("POST", "/api/v1/agents/", json_body)) is not None
    assert registrations.route(scope("POST", "/agents/register", [])) is not None
    assert registrations.route(scope("GET", "/api/v1/agents", json_body)) is None
    assert registrations.route(scope("POST", "/api/v1/agents/x", json_body)) is None
    assert registrations.route(scope("POST", "/api/v1/agents",
                                     [(b"content-type", b"text/plain"),
                                      (b"content-length", b"2")])) is None
    assert registrations.route(scope("POST", "/api/v1/agents",
                                     [(b"content-type", b"application/json")])) is None
    assert registrations.route(scope("POST", "/agents/register",
                                     [(b"cookie", b"sessionid=1")])) is None
    assert registrations.route(scope("POST", "/agents/register",
                                     [(b"cookie", b"s=1"), (b"authorization", b"Bearer t")]))


def test_passed_on_requests_still_get_the_views_answers(live_server_url, clients):
    """A body without a Content-Type goes to the DRF view: its 415."""
    import httpx

    r = httpx.post(live_server_url + V1, content=_v1(),
                   headers={"Authorization": f"Bearer {clients['owner']}"})
    assert r.status_code == 415 and "Content-Type" in r.json()["error"]
