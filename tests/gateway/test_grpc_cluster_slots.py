"""The agent's concurrency cap across nodes for the calls nodes make to its gRPC server
themselves (gateway/grpc_binding/slots.py): a slot taken through one node's listener is busy
on another's, given back at the call's end, and freed within the lease's TTL when the node
holding it is killed.

Two nodes on this run's PostgreSQL and Redis: node A (the live server in this process, whose
gRPC listener the callers reach on its own event loop) and node B (``manage.py serve`` with a
gRPC listener and a short liveness TTL, killed -9 by the last test). The agent serves its own
gRPC interface (the node passes calls through), with a stream it holds open while its caller
stays (tests/gateway/test_grpc_hostile.py ``OwnGrpcAgent``), registered with a cap of one.
"""

from __future__ import annotations

import asyncio
import os
import time

import grpc
import httpx
import pytest
from a2a.types import a2a_pb2
from a2a.types import a2a_pb2_grpc as grpc10

from tests.gateway import test_cluster
from tests.gateway import test_grpc_binding as grpc_tests
from tests.gateway.test_grpc_binding import auth, on_node, status_of
from tests.gateway.test_grpc_hostile import OwnGrpcAgent

pytestmark = pytest.mark.one_pass("distributed")

_grpc_listener = grpc_tests._grpc_listener  # node A's gRPC listener on a free port
grpc_address = grpc_tests.grpc_address
node_b = test_cluster.node_b

#: Node B's leases last this long after its last renewal.
B_TTL_SECONDS = 2.0
NODE_B = {"A2A_GRPC_PORT": "0", "A2A_NODE_LIVENESS_TTL_SECONDS": str(B_TTL_SECONDS),
          "A2A_NODE_LIVENESS_REFRESH_SECONDS": "0.4"}


@pytest.fixture
def own_grpc_agent():
    with OwnGrpcAgent() as agent:
        yield agent


def request(agent_id: str, text: str) -> a2a_pb2.SendMessageRequest:
    message = a2a_pb2.SendMessageRequest(tenant=agent_id)
    message.message.message_id = f"m-{os.urandom(3).hex()}"
    message.message.role = a2a_pb2.ROLE_USER
    message.message.parts.add().text = text
    return message


def b_listener(node_b, agent_id: str) -> str:
    """Node B's gRPC listener, from the card node B serves for the agent (once it knows it)."""
    deadline = time.monotonic() + 10
    while True:
        response = httpx.get(f"{node_b.url}/a2a/{agent_id}/.well-known/agent-card.json")
        if response.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert response.status_code == 200, response.text
    [address] = [i["url"] for i in response.json()["supportedInterfaces"]
                 if i["protocolBinding"] == "GRPC"]
    return address


async def send(address: str, agent_id: str, metadata) -> str:
    """One SendMessage through the listener at ``address``: "ok", or the gateway error's kind."""
    async with grpc.aio.insecure_channel(address) as channel:
        try:
            reply = await grpc10.A2AServiceStub(channel).SendMessage(
                request(agent_id, "hello"), metadata=metadata, timeout=10)
        except grpc.aio.AioRpcError as exc:
            code, executed, info = status_of(exc)
            assert (code, executed) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "false"), exc
            return info["kind"]
    assert reply.message.parts[0].text == "echo: hello"
    return "ok"


async def until_ok(address: str, agent_id: str, metadata, seconds: float) -> float:
    """Seconds until a call through ``address`` goes through (fails past ``seconds``)."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    while (kind := await send(address, agent_id, metadata)) != "ok":
        assert kind == "busy"
        assert loop.time() - started < seconds, "the slot was never given back"
        await asyncio.sleep(0.1)
    return loop.time() - started


@pytest.mark.parametrize("node_b", [NODE_B], indirect=True)
def test_a_slot_held_through_one_node_is_busy_on_the_other_and_freed_by_a_crash(
        node_b, grpc_address, own_grpc_agent, api, caller):
    agent_id = f"capped-grpc-{os.urandom(3).hex()}"
    response = api.post("/api/v1/agents", json={
        "agent_id": agent_id, "url": f"http://{own_grpc_agent.address}/rpc",
        "max_concurrency": 1, "card": own_grpc_agent.card_document})
    assert response.status_code == 201, response.text
    address_b = b_listener(node_b, agent_id)
    assert address_b != grpc_address
    metadata = tuple(auth(caller).items())

    async def held_through_a():
        async with grpc.aio.insecure_channel(grpc_address) as channel:
            stream = grpc10.A2AServiceStub(channel).SendStreamingMessage(
                request(agent_id, "hold"), metadata=metadata, timeout=30)
            first = await stream.read()
            assert first.HasField("task")
            # The one slot is node A's: node B's listener answers busy, as does A's own.
            assert await send(address_b, agent_id, metadata) == "busy"
            assert await send(grpc_address, agent_id, metadata) == "busy"
            stream.cancel()
        # Given back at the call's end: node B's next call goes through.
        return await until_ok(address_b, agent_id, metadata, 5)

    assert on_node_sync(held_through_a()) < 5
    assert own_grpc_agent.wait_closed(10)

    # Node B holds the slot, and is killed: its lease is not given back, and expires.
    async def held_through_b():
        channel = grpc.aio.insecure_channel(address_b)
        stream = grpc10.A2AServiceStub(channel).SendStreamingMessage(
            request(agent_id, "hold"), metadata=metadata, timeout=30)
        first = await stream.read()
        assert first.HasField("task")
        assert await send(grpc_address, agent_id, metadata) == "busy"
        return channel, stream  # kept: a call object collected cancels its call

    channel, stream = on_node_sync(held_through_b())
    node_b.process.kill()
    node_b.process.wait()

    async def after_the_kill():
        # Node B never gave its slot back: node A's calls are busy until its lease expires.
        assert await send(grpc_address, agent_id, metadata) == "busy"
        return await until_ok(grpc_address, agent_id, metadata, B_TTL_SECONDS + 5)

    try:
        waited = on_node_sync(after_the_kill())
    finally:
        on_node_sync(channel.close(None))
    del stream
    # Busy until node B's lease ran out (renewed at most a refresh, 0.4 s, before the kill),
    # then free: the slot of a crashed node does not leak.
    assert B_TTL_SECONDS - 1.0 < waited < B_TTL_SECONDS + 3


def on_node_sync(coro):
    """Run ``coro`` on node A's event loop from this (synchronous) test."""
    return asyncio.run(on_node(coro))
