"""``/mcp`` across two nodes sharing Redis and PostgreSQL: stateless, so any node lists and
calls any agent, whichever node owns its subscriber, and a session's notification stream may be
held by another node than the one that began it. Distributed mode only (node B is a
``manage.py serve`` process; see tests/gateway/test_cluster.py)."""

from __future__ import annotations

import asyncio

import httpx
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from gateway import runtime
from tests.a2a_agents import running_echo_agent
from tests.conftest import make_client
from tests.gateway.test_cluster import node_b  # noqa: F401  (pytest fixture)
from tests.gateway.test_streaming import wait_until
from tests.mcp_bridge.clients import all_tools, run
from tests.mcp_bridge.test_notifications import Heard


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


class GetsToNodeB(httpx2.AsyncBaseTransport):
    """A load balancer without affinity, made deterministic: a session's POSTs reach node A,
    its GET stream node B."""

    def __init__(self, node_b_port: int) -> None:
        self.port = node_b_port
        self.inner = httpx2.AsyncHTTPTransport()
        self.stream_open = asyncio.Event()

    async def handle_async_request(self, request):
        if request.method == "GET":
            request.url = request.url.copy_with(port=self.port)
        response = await self.inner.handle_async_request(request)
        if request.method == "GET" and response.status_code == 200:
            self.stream_open.set()
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


def test_a_session_begun_on_one_node_hears_changes_on_another(live_server_url, node_b):  # noqa: F811
    _, admin = make_client(["admin"], name="mcp-heard-admin")
    _, token = make_client(["call"], name="mcp-heard-caller")
    heard = Heard()
    transport = GetsToNodeB(int(node_b.url.rsplit(":", 1)[1]))

    async def session() -> tuple[set[str], int]:
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"},
                                      transport=transport, timeout=60) as http, \
                Client(streamable_http_client(f"{live_server_url}/mcp", http_client=http),
                       mode="legacy", message_handler=heard) as client:
            await asyncio.wait_for(transport.stream_open.wait(), 10)
            with running_echo_agent() as agent:
                async with httpx2.AsyncClient() as api:
                    r = await api.post(f"{live_server_url}/api/v1/agents",
                                       headers={"Authorization": f"Bearer {admin}"},
                                       json={"agent_id": "mcp-heard-on-b", "url": agent.url,
                                             "card": agent.card_document})
                    assert r.status_code == 201, r.text
                await heard.next()  # sent by node B, which holds the stream
                tools = {tool.name for tool in await all_tools(client)}  # answered by node A
            return tools, heard.count

    tools, count = asyncio.run(asyncio.wait_for(session(), 60))

    assert tools == {"mcp-heard-on-b", "get_task"}
    assert count == 1
