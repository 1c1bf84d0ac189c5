"""GatewayNode is explicit: built with its own settings, it owns its collaborators, and two of
them run in one process -- here sharing one in-memory channel layer as two nodes of a cluster
share Redis. A call entering node A for an agent node B owns crosses the layer to B's virtual
subscriber and back, with the real /a2a handler in front (through the ASGI router)."""

from __future__ import annotations

import asyncio
import gc

import httpx
import orjson
import pytest
from asgiref.sync import sync_to_async

from gateway.conf import NodeSettings
from gateway.layers import InMemoryChannelLayer
from gateway.runtime import GatewayNode, NodeHost
from node.router import http_application
from registry import services
from registry.permissions import SYSTEM
from tests.conftest import make_client
from tests.registry.cards import card_03
from tests.servers import read_body, serve_app


class RecordingAgent:
    """A raw ASGI JSON-RPC agent that answers every request with its method and records it."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        body = await read_body(receive)
        self.bodies.append(body)
        request = orjson.loads(body)
        answer = orjson.dumps(
            {"jsonrpc": "2.0", "id": request.get("id"), "result": {"method": request.get("method")}}
        )
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(answer)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": answer})


async def _django_unused(scope, receive, send) -> None:  # only /a2a is called here
    raise AssertionError(f"unexpected request to Django: {scope['path']}")


async def _until(condition, what: str) -> None:
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.django_db(transaction=True)
async def test_two_nodes_in_one_process_route_across_a_shared_layer():
    agent = RecordingAgent()
    layer = InMemoryChannelLayer()
    base = NodeSettings.from_django()
    hosts = {
        name: NodeHost(
            lambda name=name: GatewayNode(
                base.but(NODE_ID=name, A2A_LOCAL_FAST_PATH=True), layer=layer, broadcast=True
            )
        )
        for name in ("node-a", "node-b")
    }
    for host in hosts.values():
        await host.start()
    node_a, node_b = hosts["node-a"].node, hosts["node-b"].node
    assert node_a is not node_b and node_a.table is not node_b.table
    try:
        with serve_app(agent, lifespan="off") as agent_server:
            url = f"{agent_server.url}/"
            await sync_to_async(services.agent_register, thread_sensitive=False)(
                actor=SYSTEM, agent_id="owned-by-b", url=url, card=card_03(url), node_id="node-b"
            )
            # The registry event reached both nodes: both route, only B subscribes.
            await _until(lambda: "owned-by-b" in node_b.manager.subscribers, "B's subscriber")
            await _until(lambda: node_a.table.get("owned-by-b") is not None, "A's route")
            assert "owned-by-b" not in node_a.manager.subscribers

            _, token = await sync_to_async(make_client, thread_sensitive=False)(["call"])
            app_a = http_application(_django_unused, host=hosts["node-a"])
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app_a), base_url="http://node-a"
            ) as client:
                body = b'{"jsonrpc":"2.0","id":"x1","method":"message/send","params":{}}'
                r = await client.post(
                    "/a2a/owned-by-b",
                    content=body,
                    headers={
                        "Authorization": f"Bearer {token}",
                        "Content-Type": "application/json",
                    },
                )
            assert r.status_code == 200 and r.headers["x-a2a-executed"] == "true"
            assert r.json() == {"jsonrpc": "2.0", "id": "x1", "result": {"method": "message/send"}}
            assert agent.bodies == [body]  # exactly once, unchanged, through B's subscriber
    finally:
        for host in hosts.values():
            await host.stop()
    assert hosts["node-a"].node is None and hosts["node-b"].node is None


@pytest.mark.django_db(transaction=True)
async def test_a_node_keeps_its_own_settings():
    """A node built with explicit settings keeps them; Django's settings are not consulted."""
    node_settings = NodeSettings.from_django().but(
        NODE_ID="explicit-node", A2A_MAX_REQUEST_BYTES=1234
    )
    host = NodeHost(lambda: GatewayNode(node_settings))
    node = await host.ensure()
    try:
        assert node.settings is node_settings
        assert node.manager.settings is node_settings and node.table.settings is node_settings
        with pytest.raises(AttributeError):
            node.settings.A2A_MAX_REQUEST_BYTES = 1  # frozen
        app = http_application(_django_unused, host=host)
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://n"
        ) as client:
            r = await client.post("/a2a/some-agent", content=b"x" * 2000)
        assert r.status_code == 413 and "1234 bytes" in r.json()["error"]["message"]
    finally:
        await host.stop()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("threshold", [12345, 0])
async def test_a_serving_node_tunes_the_cyclic_gc_at_start(threshold):
    """A2A_GC_FREEZE: everything loaded at start is frozen, and the young generation's
    threshold becomes A2A_GC_GEN0_THRESHOLD (0: Python's own is left alone)."""
    saved = gc.get_threshold()
    gc.set_threshold(700, *saved[1:])
    node_settings = NodeSettings.from_django().but(
        NODE_ID="gc-node", A2A_GC_FREEZE=True, A2A_GC_GEN0_THRESHOLD=threshold
    )
    host = NodeHost(lambda: GatewayNode(node_settings))
    try:
        await host.ensure()
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold() == ((threshold or 700), *saved[1:])
    finally:
        await host.stop()
        gc.unfreeze()
        gc.set_threshold(*saved)
