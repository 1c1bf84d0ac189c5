"""Every answer of the node's HTTP surfaces is JSON, never one of Django's HTML pages: a Host
outside ``ALLOWED_HOSTS`` (400, naming the setting), an unknown path (404), a method a view does
not take (405), over a running node."""

from __future__ import annotations

import httpx
import pytest

from registry import services
from registry.permissions import SYSTEM
from tests.registry.cards import card_03

# Every path of the API and the node's other JSON surfaces (the fast paths for registrations
# and heartbeats included: they take the request only for a Host Django would take).
PATHS = [
    "/api/v1/agents", "/api/v1/agents/known", "/api/v1/agents/known/heartbeat",
    "/api/v1/agents/known/card", "/api/v1/snapshots/current", "/api/v1/sessions",
    "/api/v1/sessions/s1", "/api/schema/", "/api/docs/", "/api/redoc/", "/healthz", "/readyz",
    "/agents", "/agents/register", "/agents/deregister", "/agents/heartbeat", "/agents/known",
    "/.well-known/agent-card.json", "/.well-known/ai-catalog.json", "/ard/v1/",
    "/ard/v1/search", "/ard/v1/agents", "/ard/v1/explore", "/api/v1/nope", "/nope", "/a2a",
]
METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]


@pytest.fixture
def node(live_server_url, admin_token):
    services.agent_register(actor=SYSTEM, agent_id="known", card=card_03())
    with httpx.Client(base_url=live_server_url, timeout=30,
                      headers={"Authorization": f"Bearer {admin_token}"}) as client:
        yield client


def test_a_host_outside_allowed_hosts_gets_json_naming_the_setting(node: httpx.Client):
    for method in METHODS:
        for path in PATHS:
            r = node.request(method, path, json={"agent_id": "known"},
                             headers={"Host": "evil.example"})
            assert r.status_code == 400, (method, path, r.status_code, r.text[:200])
            assert r.headers["content-type"] == "application/json", (method, path)
            error = r.json()["error"]
            assert "'evil.example'" in error and "ALLOWED_HOSTS" in error, (method, path)
    # The same requests by an accepted name are answered (the refusal is the Host's alone).
    assert node.post("/api/v1/agents/known/heartbeat").status_code == 200
    assert node.get("/api/v1/agents/known").json()["agent_id"] == "known"


def test_no_error_answer_is_an_html_page(node: httpx.Client):
    seen: set[int] = set()
    for method in METHODS:
        for path in PATHS:
            r = node.request(method, path, json={})
            if r.status_code >= 400:
                seen.add(r.status_code)
                assert r.headers["content-type"].startswith("application/json"), \
                    (method, path, r.status_code, r.headers["content-type"], r.text[:200])
                assert isinstance(r.json(), dict), (method, path)  # each surface's own shape
    assert {400, 404, 405} <= seen


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/api/schema/", "/api/docs/",
                                  "/api/redoc/"])
def test_read_only_views_answer_405_json_with_allow(node: httpx.Client, path):
    r = node.post(path, json={})
    assert r.status_code == 405 and r.headers["allow"] == "GET, HEAD"
    assert r.json() == {"error": "method POST not allowed: use GET or HEAD"}
    assert node.get(path).status_code == 200


def test_unknown_paths_answer_404_json(node: httpx.Client):
    for path in ("/nope", "/api/v1/nope", "/api/v2/agents", "/a2a"):
        r = node.get(path)
        assert r.status_code == 404 and r.json()["error"] == "not found", path
