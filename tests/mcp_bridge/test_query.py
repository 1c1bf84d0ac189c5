"""``/mcp?q=<text>``: the tool list narrowed to the agents ARD's ranker matches, best first, with
the official MCP SDK client against the live platform (on the database the run uses)."""

from __future__ import annotations

import os
from urllib.parse import quote

import pytest

from tests.discovery.servers import EVERYDAY_AGENTS, everyday_card
from tests.mcp_bridge.clients import all_tools, run

MODES = ["auto", "legacy"]  # the 2026 per-request protocol, and the initialize handshake


@pytest.fixture
def everyday(api, echo_agent) -> dict[str, str]:
    """The everyday agents registered (each answered by the echo agent): name -> agent id."""
    ids = {}
    suffix = os.urandom(2).hex()
    for name in EVERYDAY_AGENTS:
        agent_id = f"{name}-{suffix}"
        response = api.post("/api/v1/agents", json={
            "agent_id": agent_id, "url": echo_agent.url,
            "card": everyday_card(name, echo_agent.url)})
        assert response.status_code == 201, response.text
        ids[name] = agent_id
    return ids


def _names(base: str, token: str, query: str | None, mode: str, ours: dict[str, str],
           path: str | None = None) -> list[str]:
    path = path or ("/mcp" if query is None else f"/mcp?q={quote(query)}")
    names = {agent_id: name for name, agent_id in ours.items()}
    tools = run(base, token, all_tools, mode=mode, path=path)
    # Agents another test left in the node's table are not ours to judge.
    return [names.get(t.name, t.name) for t in tools
            if t.name in names or t.name == "get_task"]


@pytest.mark.parametrize("mode", MODES)
def test_a_text_lists_the_agents_it_means_best_first(live_server_url, everyday, caller, mode):
    listed = _names(live_server_url, caller.token, None, mode, everyday)
    assert sorted(listed) == sorted([*EVERYDAY_AGENTS, "get_task"])
    # A card that never says "euro" or "yen": found by meaning.
    assert _names(live_server_url, caller.token, "convert euros to yen", mode, everyday) == [
        "money", "get_task"]
    # Both above the threshold, in the ranker's order (not by name).
    assert _names(live_server_url, caller.token, "pay for my travel abroad", mode,
                  everyday) == ["trips", "money", "get_task"]
    # Nothing meant: no agent, and get_task stays for the tasks already started.
    assert _names(live_server_url, caller.token, "xyzzy plugh", mode, everyday) == ["get_task"]


def test_the_threshold_is_a_setting(live_server_url, everyday, caller, settings):
    settings.A2A_MCP_QUERY_MIN_SCORE = 95
    assert _names(live_server_url, caller.token, "pay for my travel abroad", "auto",
                  everyday) == ["trips", "get_task"]


def test_a_filtered_list_is_still_what_the_caller_may_call(live_server_url, everyday,
                                                          make_caller):
    scoped = make_caller(agents=[everyday["money"]])
    assert _names(live_server_url, scoped.token, "pay for my travel abroad", "auto",
                  everyday) == ["money", "get_task"]

    async def call(client):
        return await client.call_tool(everyday["money"], {"message": "100 EUR in JPY?"})

    result = run(live_server_url, scoped.token, call,
                 path=f"/mcp?q={quote('convert euros to yen')}")
    assert not result.is_error and result.content[0].text == "echo: 100 EUR in JPY?"


def test_a_text_within_a_pinned_snapshot(live_server_url, everyday, caller):
    """``?snapshot=`` and ``?q=`` together: the snapshot's agents, ranked by the text."""
    from discovery.snapshots import SelectedAgent, snapshot_publish

    pinned = ["money", "sky", "words"]
    snapshot, _ = snapshot_publish(agents=[SelectedAgent(
        local_name=f"{name}_agent", description=f"Reviewed {name}.", agent_id=everyday[name],
        card_sha256="0" * 64, card_url="", source="static") for name in pinned])
    query = f"snapshot={snapshot.digest}&q={quote('pay for my travel abroad')}"
    # The fare hunter would come first, but it is not in the snapshot.
    assert _names(live_server_url, caller.token, None, "auto", everyday,
                  path=f"/mcp?{query}") == ["money", "get_task"]
