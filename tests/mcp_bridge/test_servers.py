"""``/mcp`` on a node served by ``manage.py serve`` under both servers (Daphne, which has no
lifespan, and uvicorn): the SDK's session manager runs in the node's lifecycle either way."""

from __future__ import annotations

import httpx
import pytest

from tests.a2a_agents import running_echo_agent
from tests.gateway.test_backpressure import running_node
from tests.mcp_bridge.clients import all_tools, run


def _register(node, agent_id: str, agent) -> None:
    response = httpx.post(f"{node.url}/api/v1/agents",
                          headers={"Authorization": f"Bearer {node.token}"},
                          json={"agent_id": agent_id, "url": agent.url,
                                "card": agent.card_document})
    assert response.status_code == 201, response.text


@pytest.mark.parametrize("server", ["daphne", "uvicorn"])
def test_tools_are_listed_and_called_under_both_servers(server):
    with running_echo_agent() as agent, running_node(server) as node:
        _register(node, "served-echo", agent)

        async def use(client):
            tools = await all_tools(client)
            return tools, await client.call_tool("served-echo", {"message": f"via {server}"})

        tools, result = run(node.url, node.token, use)

    assert {tool.name for tool in tools} == {"served-echo", "get_task"}
    assert not result.is_error and result.content[0].text == f"echo: via {server}"


def test_mcp_can_be_turned_off():
    with running_node("uvicorn", A2A_MCP_ENABLED="false") as node:
        response = httpx.post(f"{node.url}/mcp", json={"jsonrpc": "2.0", "id": 1,
                                                       "method": "tools/list"},
                              headers={"Authorization": f"Bearer {node.token}"})
        metadata = httpx.get(f"{node.url}/.well-known/oauth-protected-resource")
    assert response.status_code == 404
    assert metadata.status_code == 404
