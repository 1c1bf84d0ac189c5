"""What a client can read from a running node: /metrics behind a token, agents limited to what
the client may use (callers see the gateway's URL, never the internal one), per-client agent
quotas and a maximum page size, on /api/v1 and the KubeMQ surface alike."""

from __future__ import annotations

import httpx
import pytest

from registry import selectors, services
from registry.models import Agent
from registry.permissions import SYSTEM
from tests.conftest import make_client
from tests.registry.cards import card_03

INTERNAL = "http://10.1.2.3:7000/internal-agent"


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_metrics_need_the_metrics_token_or_an_admin_token(live_server_url, settings):
    services.agent_register(actor=SYSTEM, agent_id="secret-name", card=card_03(INTERNAL))
    settings.A2A_METRICS_REQUIRE_TOKEN = True
    settings.A2A_METRICS_TOKEN = "scrape-secret"
    url = live_server_url + "/metrics"
    _, admin = make_client(["admin"])
    _, caller = make_client(["call"])
    refused = [
        httpx.get(url),
        httpx.get(url, headers=_auth("wrong-secret")),
        httpx.get(url, headers=_auth(caller)),
        httpx.get(url, headers={"Authorization": "Basic c2NyYXBlLXNlY3JldA=="}),
    ]
    for r in refused:
        assert r.status_code == 401 and "secret-name" not in r.text
        assert r.headers["www-authenticate"].startswith("Bearer")
    for token in ("scrape-secret", admin):
        r = httpx.get(url, headers=_auth(token))
        assert r.status_code == 200 and "kubemq_a2a_requests" in r.text
    # Off (the embedded default): open.
    settings.A2A_METRICS_REQUIRE_TOKEN = False
    assert httpx.get(url).status_code == 200


@pytest.fixture
def agents(db):
    """Two agents at internal addresses, owned by two different register clients."""
    owner_a, token_a = make_client(["register"])
    owner_b, token_b = make_client(["register"])
    for agent_id, token in (("agent-a", token_a), ("agent-b", token_b)):
        actor = selectors.actor_from_token(token=token)
        services.agent_register(
            actor=actor, agent_id=agent_id, card=card_03(f"{INTERNAL}/{agent_id}")
        )
    return {"agent-a": token_a, "agent-b": token_b}


def _ids(response: httpx.Response) -> list[str]:
    body = response.json()
    rows = body["results"] if isinstance(body, dict) else body
    return sorted(row["agent_id"] for row in rows)


def test_callers_see_only_agents_they_may_call_at_the_gateway(live_server_url, agents):
    base = live_server_url
    _, caller = make_client(["call"])
    _, limited = make_client(["call"], agents=["agent-a"])
    _, registrar = make_client(["register"])
    _, admin = make_client(["admin"])
    # A caller: every agent, but as the gateway shows it.
    for path in ("/api/v1/agents", "/agents"):
        r = httpx.get(base + path, headers=_auth(caller))
        assert r.status_code == 200 and _ids(r) == ["agent-a", "agent-b"]
        assert "10.1.2.3" not in r.text
    detail = httpx.get(base + "/api/v1/agents/agent-a", headers=_auth(caller)).json()
    assert detail["url"] == f"{base}/a2a/agent-a/" == detail["card"]["url"]
    card = httpx.get(base + "/api/v1/agents/agent-a/card", headers=_auth(caller))
    assert card.status_code == 200 and card.json()["url"] == f"{base}/a2a/agent-a/"
    kubemq = httpx.get(base + "/agents/agent-b", headers=_auth(caller)).json()
    assert kubemq["url"] == f"{base}/a2a/agent-b/"
    # Limited with --agents: the other agent does not exist for it.
    for path in ("/api/v1/agents", "/agents"):
        assert _ids(httpx.get(base + path, headers=_auth(limited))) == ["agent-a"]
    for path in ("/api/v1/agents/agent-b", "/api/v1/agents/agent-b/card", "/agents/agent-b"):
        r = httpx.get(base + path, headers=_auth(limited))
        assert r.status_code == 404 and "10.1.2.3" not in r.text
    # Register only, owning nothing: sees nothing.
    assert _ids(httpx.get(base + "/api/v1/agents", headers=_auth(registrar))) == []
    assert _ids(httpx.get(base + "/agents", headers=_auth(registrar))) == []
    # The owner sees its own agent as registered, and only that one.
    own = httpx.get(base + "/api/v1/agents", headers=_auth(agents["agent-a"]))
    assert _ids(own) == ["agent-a"]
    assert own.json()["results"][0]["url"] == f"{INTERNAL}/agent-a"
    raw = httpx.get(base + "/api/v1/agents/agent-a/card", headers=_auth(agents["agent-a"]))
    assert raw.json()["url"] == f"{INTERNAL}/agent-a"
    # An admin sees everything as registered.
    everything = httpx.get(base + "/api/v1/agents", headers=_auth(admin)).json()["results"]
    assert {row["url"] for row in everything} == {f"{INTERNAL}/agent-a", f"{INTERNAL}/agent-b"}


def test_per_client_agent_quota(live_server_url, settings):
    settings.A2A_MAX_AGENTS_PER_CLIENT = 3
    _, token = make_client(["register"])
    for i in range(3):
        r = httpx.post(
            live_server_url + "/api/v1/agents",
            headers=_auth(token),
            json={"agent_id": f"q-{i}", "card": card_03()},
        )
        assert r.status_code == 201, r.text
    r = httpx.post(
        live_server_url + "/api/v1/agents",
        headers=_auth(token),
        json={"agent_id": "q-3", "card": card_03()},
    )
    assert r.status_code == 403 and "agent quota reached" in r.json()["error"]
    r = httpx.post(
        live_server_url + "/agents/register",
        headers=_auth(token),
        json={**card_03(), "agent_id": "q-4", "url": "http://127.0.0.1:9/"},
    )
    assert r.status_code == 403 and "agent quota reached" in r.json()["error"]
    # Re-registering an agent it owns is not a new agent.
    r = httpx.post(
        live_server_url + "/api/v1/agents",
        headers=_auth(token),
        json={"agent_id": "q-0", "card": card_03()},
    )
    assert r.status_code == 200
    assert Agent.objects.filter(agent_id__startswith="q-").count() == 3
    # Admin clients are exempt.
    _, admin = make_client(["admin"])
    for i in range(4):
        r = httpx.post(
            live_server_url + "/api/v1/agents",
            headers=_auth(admin),
            json={"agent_id": f"adm-{i}", "card": card_03()},
        )
        assert r.status_code == 201


def test_maximum_page_size_on_both_surfaces(live_server_url, settings):
    for i in range(8):
        services.agent_register(actor=SYSTEM, agent_id=f"page-{i}", card=card_03())
    settings.A2A_MAX_PAGE_SIZE = 5
    _, admin = make_client(["admin"])
    r = httpx.get(live_server_url + "/api/v1/agents?limit=100000", headers=_auth(admin))
    body = r.json()
    assert len(body["results"]) == 5 and body["count"] == 8 and body["next"]
    rest = httpx.get(body["next"], headers=_auth(admin)).json()
    assert len(rest["results"]) == 3
    for query in ("?limit=100000", "?limit=0", ""):
        r = httpx.get(live_server_url + "/agents" + query, headers=_auth(admin))
        assert r.status_code == 200 and len(r.json()) == 5
