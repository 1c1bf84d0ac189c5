"""``/mcp`` on a node served by ``manage.py serve`` under both servers (Daphne, which has no
lifespan, and uvicorn): the SDK's session manager runs in the node's lifecycle either way, and
a session's notification stream works on both."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from tests.a2a_agents import running_echo_agent
from tests.gateway.test_backpressure import running_node
from tests.mcp_bridge.clients import all_tools, run
from tests.mcp_bridge.test_notifications import Heard

# What this checks does not depend on the pass's database or channel layer.
pytestmark = pytest.mark.one_pass("distributed")


def _register(node, agent_id: str, agent) -> None:
    response = httpx.post(f"{node.url}/api/v1/agents",
                          headers={"Authorization": f"Bearer {node.token}"},
                          json={"agent_id": agent_id, "url": agent.url,
                                "card": agent.card_document})
    assert response.status_code == 201, response.text


@pytest.mark.parametrize("server", ["daphne", "uvicorn"])
def test_tools_are_listed_called_and_changes_notified_under_both_servers(server):
    heard = Heard()
    with running_echo_agent() as agent, running_node(server) as node:
        _register(node, "served-echo", agent)

        async def use(client):
            tools = await all_tools(client)
            called = await client.call_tool("served-echo", {"message": f"via {server}"})
            # The session's GET stream (opened by the client after initializing) hears of a
            # new agent; registering until it does covers the stream opening meanwhile.
            for attempt in range(50):
                await asyncio.to_thread(_register, node, f"served-later-{attempt}", agent)
                try:
                    await heard.next(0.2)
                    break
                except TimeoutError:
                    pass
            return tools, called, {tool.name for tool in await all_tools(client)}

        tools, result, later = run(node.url, node.token, use, mode="legacy",
                                   message_handler=heard)

    assert {tool.name for tool in tools} == {"served-echo", "get_task"}
    assert not result.is_error and result.content[0].text == f"echo: via {server}"
    assert heard.count >= 1 and "served-later-0" in later


def test_mcp_can_be_turned_off():
    with running_node("uvicorn", A2A_MCP_ENABLED="false") as node:
        response = httpx.post(f"{node.url}/mcp", json={"jsonrpc": "2.0", "id": 1,
                                                       "method": "tools/list"},
                              headers={"Authorization": f"Bearer {node.token}"})
        metadata = httpx.get(f"{node.url}/.well-known/oauth-protected-resource")
    assert response.status_code == 404
    assert metadata.status_code == 404


@pytest.mark.parametrize("server", ["daphne", "uvicorn"])
def test_a_stopping_node_ends_its_notification_streams_at_once(server):
    """SIGTERM drains for up to A2A_SHUTDOWN_DRAIN_SECONDS: the open GET streams end at once
    (their clients reconnect to another node) instead of holding the stop for the drain."""
    with running_node(server, A2A_SHUTDOWN_DRAIN_SECONDS="30") as node:
        auth = {"Authorization": f"Bearer {node.token}"}
        session_id = httpx.post(f"{node.url}/mcp", headers={
            **auth, "Accept": "application/json, text/event-stream"}, json={
            "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": "raw", "version": "1"}}}).headers["mcp-session-id"]
        with httpx.stream("GET", f"{node.url}/mcp", timeout=30, headers={
                **auth, "Accept": "text/event-stream", "Mcp-Session-Id": session_id}) as stream:
            assert stream.status_code == 200
            lines = stream.iter_lines()
            assert next(lines) == "retry: 1000"
            node.process.terminate()
            started = time.monotonic()
            for _ in lines:
                pass
            ended = time.monotonic() - started
        node.process.wait(timeout=20)
        stopped = time.monotonic() - started

    assert ended < 5, ended
    assert stopped < 10, stopped
