"""Discovery per tenant (docs/tenants.md, "Discovery"): one cycle serves every tenant with
discovery rows; each tenant's agents land in that tenant, its snapshots are numbered on their
own, and the snapshot and session API answers each tenant's callers with its own only."""

from __future__ import annotations

import json

import httpx
import pytest
from prometheus_client import REGISTRY

from discovery.loop import TENANT_LINE, run_cycle
from discovery.models import Alert, ConfiguredAgent, Snapshot
from registry import services
from registry.models import Agent
from tests.discovery.servers import make_card, skill
from tests.servers import read_body, serve_app


def _client(base: str, tenant: str, scopes: list[str]) -> httpx.Client:
    _, token = services.api_client_create(name=f"{tenant}-{'-'.join(scopes)}", scopes=scopes,
                                          tenant=tenant)
    return httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=30)


@pytest.fixture
def two_tenants(card_server, configure, cache):
    """The default tenant finds ``agent_one`` through the configuration file; tenant acme
    finds its own ``agent_one`` (another card) through a row of its own."""
    services.tenant_create(slug="acme")
    card_server.set_card("/d/one", make_card("One", card_server.base("/d/one"),
                                             [skill("s", "x")]))
    card_server.set_card("/a/one", make_card("Acme One", card_server.base("/a/one"),
                                             [skill("s", "y")]))
    configure(static=[{"local_name": "agent_one", "url": card_server.base("/d/one"),
                       "description": "The default tenant's."}])
    ConfiguredAgent.objects.create(tenant_id="acme", local_name="agent_one",
                                   url=card_server.base("/a/one"), description="Acme's.")
    return run_cycle(cache=cache)


@pytest.mark.django_db
def test_one_cycle_serves_each_tenant_into_its_own_namespace(two_tenants, card_server, cache,
                                                             clock):
    report = two_tenants
    assert [r.tenant for r in report.tenants] == ["default", "acme"]
    lines = report.summary().splitlines()
    assert lines[0] == f"{TENANT_LINE}default" and f"{TENANT_LINE}acme" in lines
    assert [line for line in lines if line.startswith("snapshot published")] == [
        f"snapshot published: v1 {r.digest}" for r in report.tenants]

    agents = {(a.tenant_id, a.agent_id): a for a in Agent.objects.filter(agent_id="agent-one")}
    assert set(agents) == {("default", "agent-one"), ("acme", "agent-one")}
    assert agents["acme", "agent-one"].source == Agent.Source.DISCOVERY
    assert agents["acme", "agent-one"].card["name"] == "Acme One"
    assert agents["default", "agent-one"].card["name"] == "One"

    # acme's card changes: acme's snapshot goes to v2, the default tenant's stays v1.
    card_server.set_card("/a/one", make_card("Acme One", card_server.base("/a/one"),
                                             [skill("s", "y"), skill("t", "z")]))
    clock.advance(301)
    again = run_cycle(cache=cache)
    by_tenant = {r.tenant: r for r in again.tenants}
    assert (by_tenant["default"].version, by_tenant["default"].published) == (1, False)
    assert (by_tenant["acme"].version, by_tenant["acme"].published) == (2, True)
    assert Snapshot.objects.current("acme").version == 2
    # /metrics has each tenant's snapshot; the unlabelled gauges stay the default tenant's.
    gauge = REGISTRY.get_sample_value
    assert gauge("a2a_discovery_tenant_snapshot_version", {"tenant": "acme"}) == 2
    assert gauge("a2a_discovery_tenant_snapshot_version", {"tenant": "default"}) == 1
    assert gauge("a2a_discovery_tenant_snapshot_agents", {"tenant": "acme"}) == 1
    assert gauge("a2a_discovery_snapshot_version") == 1


class _Hook:
    """A loopback alert webhook: the JSON bodies POSTed to it."""

    def __init__(self) -> None:
        self.posted: list[dict] = []

    async def __call__(self, scope, receive, send) -> None:
        self.posted.append(json.loads(await read_body(receive)))
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})


@pytest.mark.django_db
def test_a_tenants_alerts_are_its_own_and_raised_once(card_server, configure, cache, clock,
                                                      settings,
                                                      django_capture_on_commit_callbacks):
    """Each tenant's cap bites: one alert each, in its tenant (its admins see it; the webhook
    is told whose), not raised again by the next cycle while the condition stays -- two
    tenants' alerts of one kind and subject no longer take each other for a change."""
    hook = _Hook()
    with serve_app(hook, lifespan="off") as server:
        settings.DISCOVERY_ALERT_WEBHOOK_URL = f"{server.url}/alerts"
        _two_capped_tenants(card_server, configure, cache, clock,
                            django_capture_on_commit_callbacks)
    caps = Alert.objects.filter(kind=Alert.Kind.CAP_REACHED)
    assert sorted((a.tenant_id, a.details["left_out"]) for a in caps) == [
        ("acme", ["acme_1"]), ("default", ["agent_1"])]
    assert sorted((p["kind"], p["tenant"], p["details"]["left_out"]) for p in hook.posted) == [
        ("cap_reached", "acme", ["acme_1"]), ("cap_reached", "default", ["agent_1"])]


def _two_capped_tenants(card_server, configure, cache, clock, on_commit) -> None:
    """The default tenant and acme each find two agents under a cap of one; three cycles."""
    services.tenant_create(slug="acme")
    static = []
    for i in range(2):
        card_server.set_card(f"/d/{i}", make_card(f"D{i}", card_server.base(f"/d/{i}"),
                                                  [skill("s", "x")]))
        card_server.set_card(f"/a/{i}", make_card(f"A{i}", card_server.base(f"/a/{i}"),
                                                  [skill("s", "y")]))
        static.append({"local_name": f"agent_{i}", "url": card_server.base(f"/d/{i}")})
        ConfiguredAgent.objects.create(tenant_id="acme", local_name=f"acme_{i}",
                                       url=card_server.base(f"/a/{i}"))
    configure(static=static, max_agents=1)
    for _ in range(3):
        with on_commit(execute=True):
            run_cycle(cache=cache)
        clock.advance(301)


def test_snapshots_and_sessions_answer_each_tenant_its_own(live_server_url, api, two_tenants):
    by_tenant = {r.tenant: r for r in two_tenants.tenants}
    mine, theirs = by_tenant["acme"].digest, by_tenant["default"].digest
    with _client(live_server_url, "acme", ["call"]) as acme, \
            _client(live_server_url, "default", ["call"]) as plain:
        current = acme.get("/api/v1/snapshots/current").json()
        assert (current["tenant"], current["version"], current["digest"]) == ("acme", 1, mine)
        assert [a["description"] for a in current["agents"]] == ["Acme's."]
        assert plain.get("/api/v1/snapshots/current").json()["digest"] == theirs

        # Another tenant's snapshot is answered as one that does not exist.
        other = acme.get(f"/api/v1/snapshots/{theirs}")
        nowhere = acme.get(f"/api/v1/snapshots/{'0' * 64}")
        assert other.status_code == nowhere.status_code == 404
        assert other.json() == {**nowhere.json(), "error": nowhere.json()["error"].replace(
            "0" * 64, theirs)}
        assert plain.get(f"/api/v1/snapshots/{mine}").status_code == 404
        # ?tenant= is a platform admin's: anyone else reads its own tenant's.
        assert acme.get("/api/v1/snapshots/current?tenant=default").json()["digest"] == mine

        # The same session id in two tenants is two sessions, each pinned to its tenant's.
        pinned = acme.post("/api/v1/sessions", json={"session_id": "chat-1"})
        assert pinned.status_code == 201, pinned.text
        (agent,) = pinned.json()["agents"]
        assert agent["gateway_url"] == f"{live_server_url}/a2a/t/acme/agent-one/"
        assert agent["card"]["url"] == agent["gateway_url"]
        assert plain.post("/api/v1/sessions", json={"session_id": "chat-1"}).status_code == 201
        assert plain.get("/api/v1/sessions/chat-1").json()["digest"] == theirs
        assert plain.delete("/api/v1/sessions/chat-1").status_code == 204
        assert plain.get("/api/v1/sessions/chat-1").status_code == 404
        kept = acme.get("/api/v1/sessions/chat-1").json()
        assert (kept["tenant"], kept["digest"]) == ("acme", mine)
        assert plain.delete("/api/v1/sessions/chat-1").status_code == 404

        # The agent acme's snapshot names is acme's, routable at its tenant's address.
        assert acme.get("/api/v1/agents/agent-one").json()["tenant"] == "acme"

    # A platform admin sees every tenant's, each answer naming its tenant.
    seen = api.get(f"/api/v1/snapshots/{mine}").json()
    assert (seen["tenant"], seen["digest"]) == ("acme", mine)
    assert api.get("/api/v1/snapshots/current?tenant=acme").json()["digest"] == mine
    assert api.get("/api/v1/snapshots/current").json()["digest"] == theirs
    assert api.get("/api/v1/sessions/chat-1?tenant=acme").json()["digest"] == mine
    assert api.get("/api/v1/snapshots/current?tenant=Bad!").status_code == 400
