"""Heartbeats are answered by a lean ASGI handler (node.heartbeats) under the server and by
the DRF views under Django's test client: both must give the same answers."""

from __future__ import annotations

import httpx
import pytest
from django.contrib.auth.models import User
from django.test import Client as DjangoClient

from node import heartbeats
from registry import services
from registry.models import Agent
from tests.conftest import make_client
from tests.registry.cards import card_03, card_kubemq
from tests.services_helpers import actor_of


@pytest.fixture
def setup_agents(transactional_db):
    owner, owner_token = make_client(["register"], name="owner")
    _, other_token = make_client(["register"], name="other")
    services.agent_register(actor=actor_of(owner), agent_id="beater", card=card_03())
    services.agent_register(actor=actor_of(owner), agent_id="kube-1", card=card_kubemq("kube-1"))
    return owner_token, other_token


CASES = [
    # (path, body, which token, expected status)
    ("/api/v1/agents/beater/heartbeat", b"", "owner", 200),
    ("/api/v1/agents/beater/heartbeat/", b"", "owner", 200),
    ("/api/v1/agents/ghost/heartbeat", b"", "owner", 404),
    ("/api/v1/agents/beater/heartbeat", b"", "other", 403),
    ("/api/v1/agents/beater/heartbeat", b"", "bad", 401),
    ("/api/v1/agents/beater/heartbeat", b"", None, 401),
    ("/agents/heartbeat", b'{"agent_id": "kube-1"}', "owner", 200),
    ("/agents/heartbeat", b'{"agent_id": "ghost"}', "owner", 400),
    ("/agents/heartbeat", b'{"agent_id": "Bad!"}', "owner", 400),
    ("/agents/heartbeat", b"{nope", "owner", 400),
    ("/agents/heartbeat", b"[]", "owner", 400),
    ("/agents/heartbeat", b"{}", "owner", 400),
    ("/agents/heartbeat", b'{"agent_id": "kube-1"}', "other", 403),
    ("/agents/heartbeat", b'{"agent_id": "kube-1"}', None, 401),
    ("/agents/heartbeat", b'{"agent_id": "' + b"a" * 70000 + b'"}', "owner", 413),
]


def _shape(body: dict) -> dict:
    """The answer with timestamps reduced to their presence (they differ between calls)."""
    return {k: (bool(v) if k in ("last_seen", "expires_at") else v) for k, v in body.items()}


@pytest.mark.parametrize("path, body, who, status", CASES)
def test_fast_path_and_views_agree(live_server_url, setup_agents, path, body, who, status):
    owner_token, other_token = setup_agents
    token = {"owner": owner_token, "other": other_token, "bad": "xx.yy", None: None}[who]
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    fast = httpx.post(live_server_url + path, content=body, headers=headers)
    django_headers = {"HTTP_AUTHORIZATION": headers["Authorization"]} if token else {}
    view = DjangoClient().post(path, data=body, content_type="application/json",
                               **django_headers)
    assert fast.status_code == view.status_code == status, (fast.text, view.content)
    assert _shape(fast.json()) == _shape(view.json())
    if status == 401:
        assert fast.headers["www-authenticate"] == view.headers["WWW-Authenticate"]


def test_fast_path_renews_the_lease(live_server_url, setup_agents):
    owner_token, _ = setup_agents
    before = Agent.objects.get(agent_id="beater").expires_at
    r = httpx.post(live_server_url + "/api/v1/agents/beater/heartbeat",
                   headers={"Authorization": f"Bearer {owner_token}"})
    body = r.json()
    assert r.status_code == 200 and body["ttl_seconds"] == 90
    after = Agent.objects.get(agent_id="beater").expires_at
    assert after > before
    assert body["expires_at"].startswith(after.strftime("%Y-%m-%dT%H:%M:%S"))


def test_routing_sends_sessions_and_other_methods_to_django():
    def scope(method, path, headers):
        return {"method": method, "path": path, "headers": headers}

    assert heartbeats.route(scope("POST", "/agents/heartbeat", [])) is not None
    assert heartbeats.route(scope("GET", "/agents/heartbeat", [])) is None
    assert heartbeats.route(scope("POST", "/api/v1/agents/x/heartbeats", [])) is None
    assert heartbeats.route(scope("POST", "/api/v1/agents/x/heartbeat",
                                  [(b"cookie", b"sessionid=1")])) is None
    assert heartbeats.route(scope("POST", "/api/v1/agents/x/heartbeat",
                                  [(b"cookie", b"s=1"), (b"authorization", b"Bearer t")]))


def test_staff_session_heartbeat_goes_through_django(live_server_url, setup_agents):
    User.objects.create_superuser("ops", "ops@example.com", "pw-long-enough-1")
    with httpx.Client(base_url=live_server_url) as http:
        page = http.get("/admin/login/")
        csrf = page.cookies["csrftoken"]
        http.post("/admin/login/", data={"username": "ops", "password": "pw-long-enough-1",
                                         "csrfmiddlewaretoken": csrf, "next": "/admin/"})
        r = http.post("/api/v1/agents/beater/heartbeat",
                      headers={"X-CSRFToken": http.cookies["csrftoken"]})
    assert r.status_code == 200 and r.json()["agent_id"] == "beater"


def test_one_token_cache_so_revocation_lands_everywhere_alike(live_server_url):
    """DRF, the heartbeat fast path and the gateway resolve tokens through the process's one
    cache: right after a revocation all three still accept the token (within the cache's
    lifetime, A2A_AUTH_CACHE_SECONDS), and once the cache forgets it all three refuse it --
    never one surface refusing while another still lets the token in."""
    from gateway import runtime
    from registry.token_cache import shared_token_cache

    client, token = make_client(["register", "call"], name="soon-revoked")
    auth = {"Authorization": f"Bearer {token}"}

    def statuses() -> dict[str, object]:
        api = httpx.get(f"{live_server_url}/api/v1/agents", headers=auth)
        beat = httpx.post(f"{live_server_url}/api/v1/agents/ghost/heartbeat", headers=auth)
        call = httpx.post(f"{live_server_url}/a2a/ghost", headers=auth,
                          json={"jsonrpc": "2.0", "id": 1, "method": "message/send"})
        kind = call.json()["error"]["data"]["kind"]
        return {"api": api.status_code, "heartbeat": beat.status_code, "gateway": kind}

    accepted = {"api": 200, "heartbeat": 404, "gateway": "agent_not_found"}
    assert statuses() == accepted
    assert runtime.current_node().tokens is shared_token_cache()
    services.api_client_update(client_id=client.client_id, revoked=True)
    assert statuses() == accepted  # cached on every surface: the same delay everywhere
    shared_token_cache().clear()  # the lifetime has passed
    assert statuses() == {"api": 401, "heartbeat": 401, "gateway": "unauthenticated"}


def test_heartbeat_bodies_are_capped_on_both_surfaces(live_server_url, setup_agents, settings):
    """The one body reader stops at the cap: an oversize heartbeat body, sent in chunks
    without a Content-Length, is refused with 413 on both paths."""
    owner_token, _ = setup_agents
    limit = settings.A2A_MAX_CARD_BYTES

    def chunks():
        for _ in range(limit // 1000 + 10):
            yield b" " * 1000

    for path in ("/api/v1/agents/beater/heartbeat", "/agents/heartbeat"):
        r = httpx.post(live_server_url + path, content=chunks(),
                       headers={"Authorization": f"Bearer {owner_token}"})
        assert r.status_code == 413, path
        assert r.json() == {"error": f"request body too large: the limit is {limit} bytes"}
