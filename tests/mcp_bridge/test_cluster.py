"""``/mcp`` across two nodes sharing Redis and PostgreSQL: stateless, so any node lists and
calls any agent, whichever node owns its subscriber. Distributed mode only (node B is a
``manage.py serve`` process; see tests/gateway/test_cluster.py)."""

from __future__ import annotations

import httpx

from gateway import runtime
from tests.a2a_agents import running_echo_agent
from tests.conftest import make_client
from tests.gateway.test_cluster import node_b  # noqa: F401  (pytest fixture)
from tests.gateway.test_streaming import wait_until
from tests.mcp_bridge.clients import all_tools, run


def test_any_node_lists_and_calls_an_agent_another_node_owns(live_server_url, node_b):  # noqa: F811
    node_a = runtime.current_node()
    _, admin = make_client(["admin"], name="mcp-cluster-admin")
    caller, token = make_client(["call"], name="mcp-cluster-caller")
    with running_echo_agent() as agent:
        r = httpx.post(f"{node_b.url}/api/v1/agents", headers={"Authorization": f"Bearer {admin}"},
                       json={"agent_id": "mcp-on-b", "url": agent.url,
                             "card": agent.card_document})
        assert r.status_code == 201, r.text
        wait_until(lambda: node_a.table.get("mcp-on-b") is not None, timeout=5)
        assert node_a.table.get("mcp-on-b").node_id == node_b.node_id

        listed_on_b = run(node_b.url, token, all_tools)

        async def call(client):
            return await client.call_tool("mcp-on-b", {"message": "across nodes"})

        result = run(live_server_url, token, call)  # entering node A, owned by node B

    assert {tool.name for tool in listed_on_b} == {"mcp-on-b", "get_task"}
    assert not result.is_error and result.content[0].text == "echo: across nodes"
    arrived = [r for r in agent.requests if r.http_method == "POST"]
    assert len(arrived) == 1 and arrived[0].header("x-kubemq-caller-id") == caller.client_id
