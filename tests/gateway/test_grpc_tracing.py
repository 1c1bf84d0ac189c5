"""Tracing of the calls the gRPC binding serves and makes (docs/tracing.md), on every binding:
a gRPC caller translated to a JSON-RPC agent, a gRPC caller passed through to the agent's own
gRPC server, and JSON-RPC, HTTP+JSON and gRPC callers translated to a gRPC-only agent. Each
call is a SERVER span continuing the caller's ``traceparent`` and a CLIENT span under it, and
the agent receives a ``traceparent`` whose parent is that CLIENT span.

The node in this process exports to the OpenTelemetry SDK's in-memory exporter (as
tests/gateway/test_tracing.py does); the agents are the SDK's own JSON-RPC and gRPC servers
(tests/a2a_agents.py), which record the headers and metadata they receive; callers are the
generated gRPC stubs and httpx, on the node's event loop (grpcio's asyncio layer serves one
loop per process).
"""

from __future__ import annotations

import os

import grpc
import httpx
import pytest
from a2a.compat.v0_3 import a2a_v0_3_pb2 as pb03
from a2a.compat.v0_3 import a2a_v0_3_pb2_grpc as grpc03
from a2a.types import a2a_pb2
from a2a.types import a2a_pb2_grpc as grpc10

from gateway import tracing as gateway_tracing
from tests.a2a_agents import user_message
from tests.gateway import test_grpc_binding as grpc_tests
from tests.gateway import test_tracing as tracing_tests
from tests.gateway.test_grpc_binding import auth, on_node, status_of
from tests.gateway.test_tracing import (
    TRACE_ID,
    TRACEPARENT,
    _hex,
    _traceparent_parts,
    the_pair,
)

# Node-local paths (the pass-through and the gRPC-only agent's calls run on the node taking
# them); the broker's part of a translated call is the JSON-RPC path's, traced in both passes
# by tests/gateway/test_tracing.py.
pytestmark = pytest.mark.one_pass("embedded")

_grpc_listener = grpc_tests._grpc_listener  # the node's gRPC listener on a free port
grpc_address = grpc_tests.grpc_address
spans = tracing_tests.spans  # tracing on in this process, spans kept in memory

#: gRPC first: the agent serves its own gRPC interface (calls are passed through).
OWN_GRPC = [("GRPC", "1.0"), ("JSONRPC", "1.0")]


def traced(caller) -> tuple[tuple[str, str], ...]:
    return (*auth(caller).items(), ("traceparent", TRACEPARENT), ("tracestate", "k=v"))



def assert_agent_got(traceparent: str | None, tracestate: str | None, client) -> None:
    """The agent's ``traceparent`` names the gateway's CLIENT span, in the caller's trace."""
    assert traceparent is not None
    trace_id, parent_id = _traceparent_parts(traceparent)
    assert (trace_id, parent_id) == (TRACE_ID, _hex(client.context.span_id, 16))
    assert tracestate == "k=v"


async def test_a_grpc_caller_translated_to_a_jsonrpc_agent(
        spans, grpc_address, echo_agent_factory, register_agent, caller):
    agent = echo_agent_factory(card_shape="1.0")
    target = register_agent(agent)

    async def calls():
        async with grpc.aio.insecure_channel(grpc_address) as channel:
            stub = grpc10.A2AServiceStub(channel)
            request = user_message("hello")
            request.tenant = target.agent_id
            reply = await stub.SendMessage(request, metadata=traced(caller), timeout=20)
            assert reply.message.parts[0].text == "echo: hello"

    await on_node(calls())
    entry, client = the_pair(spans, "SendMessage")
    attrs = dict(entry.attributes)
    assert attrs["a2a.binding"] == "GRPC" and "rpc.system" not in attrs
    assert attrs["a2a.agent_id"] == target.agent_id and attrs["a2a.outcome"] == "ok"
    assert attrs["a2a.executed"] is True and attrs["a2a.caller_id"] == caller.client_id
    assert dict(client.attributes)["a2a.outcome"] == "ok"
    arrived = agent.recorder.rpc("SendMessage")[-1]
    assert_agent_got(arrived.header("traceparent"), arrived.header("tracestate"), client)


async def test_a_passed_through_call_and_stream(
        spans, grpc_address, echo_agent_factory, register_agent, caller):
    agent = echo_agent_factory(card_shape="1.0", interfaces=OWN_GRPC)
    target = register_agent(agent)
    request = user_message("hello")
    request.tenant = target.agent_id
    streamed = a2a_pb2.SendMessageRequest()
    streamed.CopyFrom(request)
    streamed.message.parts[0].text = "task streamed"

    async def send():
        async with grpc.aio.insecure_channel(grpc_address) as channel:
            reply = await grpc10.A2AServiceStub(channel).SendMessage(
                request, metadata=traced(caller), timeout=20)
            assert reply.message.parts[0].text == "echo: hello"

    async def stream():
        async with grpc.aio.insecure_channel(grpc_address) as channel:
            return [event async for event in grpc10.A2AServiceStub(channel)
                    .SendStreamingMessage(streamed, metadata=traced(caller), timeout=20)]

    server = await on_node(agent.serve_grpc())
    try:
        await on_node(send())
        entry, client = the_pair(spans, "SendMessage")
        spans.clear()
        events = await on_node(stream())
    finally:
        await on_node(server.stop(None))
    assert agent.recorder.rpc() == []  # passed through: nothing over JSON-RPC
    (unary_path, unary_metadata), (stream_path, stream_metadata) = agent.grpc_calls
    assert unary_path.endswith("/SendMessage") and stream_path.endswith("/SendStreamingMessage")
    assert entry.attributes["a2a.outcome"] == client.attributes["a2a.outcome"] == "ok"
    assert_agent_got(unary_metadata.get("traceparent"), unary_metadata.get("tracestate"),
                     client)

    entry, client = the_pair(spans, "SendStreamingMessage")
    attrs, out = dict(entry.attributes), dict(client.attributes)
    assert attrs["a2a.binding"] == "GRPC" and attrs["a2a.agent_id"] == target.agent_id
    assert attrs["a2a.outcome"] == out["a2a.outcome"] == "ok"
    assert attrs["a2a.executed"] is True and attrs["a2a.caller_id"] == caller.client_id
    assert out["rpc.system"] == "grpc" and out["server.address"] == agent.grpc_address
    assert len(events) > 2
    assert out["a2a.response_bytes"] == sum(e.ByteSize() for e in events)
    assert_agent_got(stream_metadata.get("traceparent"), stream_metadata.get("tracestate"),
                     client)


async def test_a_passed_through_call_the_agent_never_took(
        spans, grpc_address, echo_agent_factory, register_agent, caller):
    """Nothing serves the agent's gRPC address: both spans end ``unreachable``, not
    executed, with an error status."""
    agent = echo_agent_factory(card_shape="1.0", interfaces=OWN_GRPC)
    target = register_agent(agent)
    request = user_message("hello")
    request.tenant = target.agent_id

    async def calls():
        async with grpc.aio.insecure_channel(grpc_address) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await grpc10.A2AServiceStub(channel).SendMessage(
                    request, metadata=traced(caller), timeout=20)
            return refused.value

    refused = await on_node(calls())
    assert status_of(refused)[2]["kind"] == "unreachable"
    entry, client = the_pair(spans, "SendMessage")
    for span in (entry, client):
        assert span.attributes["a2a.outcome"] == "unreachable"
        assert span.attributes["a2a.executed"] is False
        assert span.status.status_code.name == "ERROR"


async def test_with_tracing_off_the_callers_traceparent_reaches_the_agent_untouched(
        grpc_address, echo_agent_factory, register_agent, caller):
    assert not gateway_tracing.ENABLED
    agent = echo_agent_factory(card_shape="1.0", interfaces=OWN_GRPC)
    target = register_agent(agent)
    request = user_message("hello")
    request.tenant = target.agent_id

    async def calls():
        server = await agent.serve_grpc()
        try:
            async with grpc.aio.insecure_channel(grpc_address) as channel:
                await grpc10.A2AServiceStub(channel).SendMessage(
                    request, metadata=traced(caller), timeout=20)
        finally:
            await server.stop(None)

    await on_node(calls())
    [(_, metadata)] = agent.grpc_calls
    assert (metadata["traceparent"], metadata["tracestate"]) == (TRACEPARENT, "k=v")


@pytest.fixture
def grpc_only(echo_agent_factory, api, live_server_url):
    """A gRPC-only agent registered with its card alone: (agent, agent id, gateway base)."""
    agent = echo_agent_factory(card_shape="1.0", interfaces=[("GRPC", "1.0")])
    agent_id = f"grpc-only-{os.urandom(3).hex()}"
    response = api.post("/api/v1/agents", json={"agent_id": agent_id,
                                                "card": agent.card_document})
    assert response.status_code == 201, response.text
    return agent, agent_id, f"{live_server_url}/a2a/{agent_id}/"


@pytest.mark.parametrize("binding", ["JSONRPC", "HTTP+JSON", "GRPC 0.3"])
async def test_calls_translated_to_a_grpc_only_agent(spans, grpc_only, grpc_address, caller,
                                                    binding):
    agent, agent_id, base = grpc_only
    headers = {**auth(caller), "traceparent": TRACEPARENT, "tracestate": "k=v"}
    message = {"messageId": "m-1", "role": "ROLE_USER", "parts": [{"text": "hello"}],
               "contextId": "ctx-7"}

    async def calls():
        server = await agent.serve_grpc()
        try:
            if binding == "GRPC 0.3":  # a caller of the version the agent does not serve
                async with grpc.aio.insecure_channel(grpc_address) as channel:
                    reply = await grpc03.A2AServiceStub(channel).SendMessage(
                        pb03.SendMessageRequest(request=pb03.Message(
                            message_id="m-1", role=pb03.ROLE_USER,
                            content=[pb03.Part(text="hello")])),
                        metadata=(*traced(caller), ("tenant", agent_id)), timeout=20)
                    assert reply.msg.content[0].text == "echo: hello"
                return
            async with httpx.AsyncClient(headers=headers, timeout=20) as http:
                if binding == "JSONRPC":
                    answer = await http.post(base, json={
                        "jsonrpc": "2.0", "id": 1, "method": "SendMessage",
                        "params": {"message": message}})
                    assert answer.json()["result"]["message"]["parts"][0]["text"] == \
                        "echo: hello", answer.text
                else:
                    answer = await http.post(f"{base}message:send",
                                             json={"message": message})
                    assert answer.json()["message"]["parts"][0]["text"] == "echo: hello", \
                        answer.text
                assert answer.headers["x-a2a-executed"] == "true"
        finally:
            await server.stop(None)

    await on_node(calls())
    entry, client = the_pair(spans, "SendMessage")
    attrs, out = dict(entry.attributes), dict(client.attributes)
    assert attrs["a2a.binding"] == binding.split()[0]
    assert ("rpc.system" in attrs) is (binding == "JSONRPC")
    if binding == "JSONRPC":
        assert attrs["a2a.context_id"] == out["a2a.context_id"] == "ctx-7"
    assert attrs["a2a.outcome"] == out["a2a.outcome"] == "ok"
    assert attrs["a2a.executed"] is True and attrs["http.response.status_code"] == 200
    assert out["a2a.binding"] == "GRPC" and out["rpc.system"] == "grpc"
    assert out["server.address"] == f"grpc://{agent.grpc_address}"
    [(_, metadata)] = agent.grpc_calls
    assert_agent_got(metadata.get("traceparent"), metadata.get("tracestate"), client)
