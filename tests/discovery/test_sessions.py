"""Session pinning, eviction, the tree factory, and the snapshot/session API over the live
server."""

from __future__ import annotations

import httpx
import pytest

from discovery import sessions, tree_factory
from discovery.loop import run_cycle
from discovery.models import CardBlob, Snapshot
from registry.models import Agent
from tests.conftest import make_client
from tests.discovery.conftest import require_extra
from tests.discovery.servers import make_card, skill


def _publish_two_versions(card_server, configure, cache, clock):
    card_server.set_card("/a/one", make_card("One", card_server.base("/a/one"),
                                             [skill("s", "x")]))
    configure(static=[{"local_name": "agent_one", "url": card_server.base("/a/one"),
                       "description": "The reviewed one."}])
    first = run_cycle(cache=cache)
    return first


@pytest.mark.django_db
def test_pinned_session_keeps_its_digest_then_is_evicted(card_server, configure, cache, clock):
    first = _publish_two_versions(card_server, configure, cache, clock)
    old, created = sessions.session_pin(session_id="old")
    assert created and old.snapshot.digest == first.digest
    assert sessions.session_pin(session_id="old")[1] is False  # idempotent
    tree_a = tree_factory.tree_for(old.snapshot, base_url="http://gw")
    card_server.set_card("/a/one", make_card("One", card_server.base("/a/one"),
                                             [skill("s", "x"), skill("t", "y")]))
    clock.advance(301)
    second = run_cycle(cache=cache)
    assert second.published and second.digest != first.digest
    new, _ = sessions.session_pin(session_id="new")
    assert new.snapshot.digest == second.digest
    assert sessions.session_get(session_id="old").snapshot.digest == first.digest
    assert tree_factory.tree_for(sessions.session_get(session_id="old").snapshot,
                                 base_url="http://gw") is tree_a
    assert CardBlob.objects.count() == 2
    sessions.session_unpin(session_id="old")
    assert list(Snapshot.objects.values_list("digest", flat=True)) == [second.digest]
    assert CardBlob.objects.count() == 1  # the old card bytes went with it
    assert first.digest not in tree_factory.cached_digests()
    with pytest.raises(sessions.SessionNotFound):
        sessions.session_get(session_id="old")


@pytest.mark.django_db
def test_idle_sessions_expire(card_server, configure, cache, clock):
    _publish_two_versions(card_server, configure, cache, clock)
    sessions.session_pin(session_id="idle")
    assert sessions.sessions_expire(idle_seconds=3600) == 0
    assert sessions.sessions_expire(idle_seconds=0) == 1


@pytest.mark.django_db
def test_tree_builds_without_network(card_server, configure, cache, clock):
    _publish_two_versions(card_server, configure, cache, clock)
    pin, _ = sessions.session_pin(session_id="s")
    before = sum(card_server.counts.values())
    tree = tree_factory.tree_for(pin.snapshot, base_url="https://gw.example")
    assert sum(card_server.counts.values()) == before
    (agent,) = tree.agents
    assert agent.local_name == "agent_one" and agent.description == "The reviewed one."
    assert agent.card["name"] == "One"  # the card as cached, endpoints rewritten
    assert agent.card["url"] == "https://gw.example/a2a/agent-one/"


@pytest.mark.django_db
def test_tree_cards_list_only_the_gateways_interfaces(card_server, configure, cache, clock):
    """An agent offering gRPC first, then JSON-RPC and HTTP+JSON: the tree's card offers the
    gateway's JSON-RPC and HTTP+JSON (in the agent's order) and no gRPC, so a remote agent built
    from it calls through the gateway whichever binding it picks."""
    base = card_server.base("/a/one")
    card_server.set_card("/a/one", make_card(
        "One", base + "grpc", [skill("s", "x")], preferredTransport="GRPC",
        additionalInterfaces=[{"url": base, "transport": "JSONRPC"},
                              {"url": base + "rest", "transport": "HTTP+JSON"}]))
    configure(static=[{"local_name": "agent_one", "url": base,
                       "description": "The reviewed one."}])
    run_cycle(cache=cache)
    pin, _ = sessions.session_pin(session_id="s")
    (agent,) = tree_factory.tree_for(pin.snapshot, base_url="https://gw.example").agents
    gw = "https://gw.example/a2a/agent-one/"
    assert (agent.card["url"], agent.card["preferredTransport"]) == (gw, "JSONRPC")
    assert agent.card["additionalInterfaces"] == [{"url": gw, "transport": "JSONRPC"},
                                                  {"url": gw, "transport": "HTTP+JSON"}]
    # and the gateway forwards JSON-RPC to the agent's JSON-RPC interface, not its gRPC one
    assert Agent.objects.get(agent_id="agent-one").url == base


@pytest.mark.django_db
def test_adk_adapter(card_server, configure, cache, clock):
    require_extra("google.adk", "pip install google-adk")
    from discovery.adk import agent_card, build_remote_agents

    _publish_two_versions(card_server, configure, cache, clock)
    pin, _ = sessions.session_pin(session_id="s")
    tree = tree_factory.tree_for(pin.snapshot, base_url="http://gw")
    (remote,) = build_remote_agents(tree)
    assert remote.name == "agent_one" and remote.description == "The reviewed one."
    # The cached A2A 0.3 card becomes an a2a-sdk 1.x card whose interfaces are the gateway's:
    # JSON-RPC (the agent's), then HTTP+JSON (translated to it).
    (spec,) = tree.agents
    interfaces = agent_card(spec.card).supported_interfaces
    assert [i.protocol_binding for i in interfaces] == ["JSONRPC", "HTTP+JSON"]
    assert {i.url for i in interfaces} == {spec.card["url"]}
    assert spec.card["url"].startswith("http://gw/")


def test_session_and_snapshot_api(live_server_url, api: httpx.Client, card_server, configure,
                                  cache, clock):
    first = _publish_two_versions(card_server, configure, cache, clock)
    r = api.get("/api/v1/snapshots/current")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["version"] == 1 and body["digest"] == first.digest and body["created_at"]
    assert body["agents"] == [{
        "local_name": "agent_one", "description": "The reviewed one.",
        "agent_id": "agent-one", "card_sha256": body["agents"][0]["card_sha256"],
    }]
    assert api.get(f"/api/v1/snapshots/{first.digest}").json() == body

    r = api.post("/api/v1/sessions", json={"session_id": "chat-1"})
    assert r.status_code == 201, r.text
    pinned = r.json()
    assert pinned["digest"] == first.digest and pinned["version"] == 1
    (agent,) = pinned["agents"]
    assert agent["gateway_url"] == f"{live_server_url}/a2a/agent-one/"
    assert agent["card"]["url"] == agent["gateway_url"]
    assert set(agent) == {"local_name", "description", "gateway_url", "card"}
    assert api.post("/api/v1/sessions", json={"session_id": "chat-1"}).status_code == 200

    card_server.set_card("/a/one", make_card("One", card_server.base("/a/one"),
                                             [skill("s", "x"), skill("t", "y")]))
    clock.advance(301)
    second = run_cycle(cache=cache)
    assert api.get("/api/v1/sessions/chat-1").json()["digest"] == first.digest
    assert api.post("/api/v1/sessions", json={"session_id": "chat-2"}).json()["digest"] == \
        second.digest
    assert api.delete("/api/v1/sessions/chat-1").status_code == 204
    assert api.get("/api/v1/sessions/chat-1").status_code == 404
    assert api.get(f"/api/v1/snapshots/{first.digest}").status_code == 404  # evicted
    assert api.get("/api/v1/snapshots/current").json()["digest"] == second.digest

    bad = api.post("/api/v1/sessions", json={"session_id": "bad id!"})
    assert bad.status_code == 400 and "session_id" in bad.json()["error"]
    _, register_only = make_client(["register"])
    denied = httpx.post(f"{live_server_url}/api/v1/sessions", json={"session_id": "x"},
                        headers={"Authorization": f"Bearer {register_only}"})
    assert denied.status_code == 403
    assert httpx.get(f"{live_server_url}/api/v1/snapshots/current").status_code == 401


def test_session_before_any_snapshot_is_a_conflict(live_server_url, api: httpx.Client):
    r = api.post("/api/v1/sessions", json={"session_id": "early"})
    assert r.status_code == 409 and "no discovery snapshot" in r.json()["error"]
    assert api.get("/api/v1/snapshots/current").status_code == 404
