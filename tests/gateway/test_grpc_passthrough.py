"""gRPC pass-through: an agent serving its own gRPC interface gets a gRPC caller's calls as
they came (gateway/grpc_binding/passthrough.py), with real SDK peers.

The agent is the SDK's own gRPC server (``GrpcHandler``, tests/a2a_agents.py
``EchoAgent.serve_grpc``) whose card lists its gRPC interface first; callers are stock SDK
clients restricted to gRPC (or the generated stubs), through the gateway's listener. Both run on
the node's event loop, as in tests/gateway/test_grpc_binding.py (grpcio's asyncio layer serves
one loop per process). Each test asserts what the caller got and what reached the agent.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
from a2a.helpers import get_message_text
from a2a.types import TaskState, a2a_pb2
from a2a.types import a2a_pb2_grpc as grpc10

from gateway.grpc_binding import passthrough
from tests.a2a_agents import (
    GRPC_BINDING,
    echo_get_and_cancel,
    sdk_client,
    send_and_collect,
    user_message,
)
from tests.gateway import test_grpc_binding as grpc_tests
from tests.gateway.test_grpc_binding import auth, metadata_dict, on_node, status_of

_grpc_listener = grpc_tests._grpc_listener  # the node's gRPC listener on a free port
grpc_address = grpc_tests.grpc_address

#: gRPC first: a client following the card (directly or through the gateway) picks it.
INTERFACES = [("GRPC", "1.0"), ("JSONRPC", "1.0")]


async def test_sdk_grpc_client_reaches_the_agents_own_grpc_server(
        grpc_address, echo_agent_factory, register_agent, caller):
    agent = echo_agent_factory(card_shape="1.0", interfaces=INTERFACES)
    agent.card_document["supportedInterfaces"][0]["tenant"] = "own-tenant"
    target = register_agent(agent)
    token = auth(caller)

    async def calls():
        server = await agent.serve_grpc()
        try:
            async with sdk_client(target.gateway_base, bindings=[GRPC_BINDING], streaming=False,
                                  polling=True, headers=token, grpc_metadata={
                                      **token, "x-trace": "t-1", "cookie": "c=1"}) as client:
                # The agent's own A2A error status (its ErrorInfo) reaches the SDK client.
                task_id = await echo_get_and_cancel(client)
            async with sdk_client(target.gateway_base, bindings=[GRPC_BINDING], streaming=True,
                                  headers=token, grpc_metadata=token) as client:
                events = await send_and_collect(client, "task streamed")
            # The executed flag, on a generated stub's call.
            async with grpc.aio.insecure_channel(grpc_address) as channel:
                stub = grpc10.A2AServiceStub(channel)
                call = stub.SendMessage(a2a_pb2.SendMessageRequest(
                    tenant=target.agent_id, message=user_message("flag").message),
                    metadata=tuple(token.items()))
                await call
                assert metadata_dict(await call.trailing_metadata())["x-a2a-executed"] == "true"
        finally:
            await server.stop(None)
        return task_id, events

    task_id, events = await on_node(calls())
    assert [a.kind for a in events] == \
        ["task", "status_update"] + ["artifact_update"] * 4 + ["status_update"]
    assert events[-1].event.status_update.status.state == TaskState.TASK_STATE_COMPLETED
    assert events[-1].at - events[2].at > 0.3  # relayed as they come, not at the end
    assert agent.executor.cancelled == [task_id]
    # Everything went to the agent's gRPC server, nothing to its JSON-RPC.
    assert agent.recorder.rpc() == []
    service = "/lf.a2a.v1.A2AService/"
    assert [path for path, _ in agent.grpc_calls] == [service + m for m in (
        "SendMessage", "SendMessage", "GetTask", "CancelTask", "GetTask",
        "SendStreamingMessage", "SendMessage")]
    # The agent got the tenant its card names, not the gateway's (the agent id).
    assert set(agent.executor.tenants) == {"own-tenant"}
    # Metadata under the header rules: the caller's token and cookie stay behind, its other
    # metadata travels, the gateway names the caller.
    metadata = agent.grpc_calls[0][1]
    assert "authorization" not in metadata and "cookie" not in metadata
    assert metadata["x-trace"] == "t-1"
    assert metadata["x-kubemq-caller-id"] == caller.client_id


async def test_a_03_caller_reaches_the_agents_own_03_grpc_server(
        grpc_address, echo_agent_factory, register_agent, caller):
    """A 0.3 caller (``a2a.v1.A2AService``, the agent named in the ``tenant`` metadata entry)
    and an agent whose 0.3 card's main interface is its own 0.3 gRPC server: passed through,
    the ``tenant`` entry left behind."""
    agent = echo_agent_factory(card_shape="0.3", interfaces=[("GRPC", "0.3"),
                                                             ("JSONRPC", "0.3")])
    assert agent.card_document["preferredTransport"] == "GRPC"
    target = register_agent(agent)
    metadata = (*auth(caller).items(), ("tenant", target.agent_id))

    async def calls():
        server = await agent.serve_grpc("0.3")
        try:
            missing = await grpc_tests.echo_and_miss_03(grpc_address, metadata)
            assert metadata_dict(missing.trailing_metadata())["x-a2a-executed"] == "true"
        finally:
            await server.stop(None)

    await on_node(calls())
    assert agent.recorder.rpc() == []
    assert [path for path, _ in agent.grpc_calls] == [
        "/a2a.v1.A2AService/SendMessage", "/a2a.v1.A2AService/GetTask"]
    assert all("tenant" not in seen and "authorization" not in seen
               for _, seen in agent.grpc_calls)


async def test_an_agent_nobody_answers_for_is_unavailable_and_not_executed(
        grpc_address, echo_agent_factory, register_agent, caller):
    """The card's gRPC address refuses connections: ``unreachable`` at once, executed false;
    the gateway's next call connects again (the agent came up)."""
    agent = echo_agent_factory(card_shape="1.0", interfaces=INTERFACES)
    target = register_agent(agent)
    request = a2a_pb2.SendMessageRequest(tenant=target.agent_id,
                                         message=user_message("hello").message)
    token = tuple(auth(caller).items())

    async def calls():
        async with grpc.aio.insecure_channel(grpc_address) as channel:
            stub = grpc10.A2AServiceStub(channel)
            started = asyncio.get_running_loop().time()
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.SendMessage(request, metadata=token, timeout=20)
            assert asyncio.get_running_loop().time() - started < 5
            code, executed, info = status_of(refused.value)
            assert (code, executed, info["kind"]) == \
                (grpc.StatusCode.UNAVAILABLE, "false", "unreachable")
            server = await agent.serve_grpc()
            try:
                reply = await stub.SendMessage(request, metadata=token, timeout=20)
                assert get_message_text(reply.message) == "echo: hello"
            finally:
                await server.stop(None)

    await on_node(calls())
    assert agent.recorder.rpc() == []


async def test_an_agent_grpc_address_refused_by_the_outbound_rules_is_never_called(
        grpc_address, echo_agent_factory, register_agent, caller):
    """A card naming the cloud metadata address as its gRPC interface: refused when the
    gateway would connect (``unreachable``, executed false), nothing sent."""
    agent = echo_agent_factory(card_shape="1.0", interfaces=INTERFACES)
    agent.card_document["supportedInterfaces"][0]["url"] = "169.254.169.254:50051"
    target = register_agent(agent)
    request = a2a_pb2.SendMessageRequest(tenant=target.agent_id,
                                         message=user_message("hello").message)

    async def calls():
        async with grpc.aio.insecure_channel(grpc_address) as channel:
            stub = grpc10.A2AServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.SendMessage(request, metadata=tuple(auth(caller).items()),
                                       timeout=20)
            return refused.value

    refused = await on_node(calls())
    code, executed, info = status_of(refused)
    assert (code, executed, info["kind"]) == (grpc.StatusCode.UNAVAILABLE, "false", "unreachable")
    assert "169.254.169.254" in refused.details()


async def test_an_agent_that_never_answers_ends_at_the_deadline(
        grpc_address, echo_agent_factory, register_agent, caller, settings):
    """An agent that takes the call and never answers: ``timeout`` (DEADLINE_EXCEEDED,
    executed true) when the gateway's deadline -- the caller's, capped at
    ``A2A_MAX_TIMEOUT_SECONDS`` -- passes; meanwhile the call holds the agent's concurrency
    cap (one). A stream the agent never writes to ends after ``A2A_SSE_IDLE_TIMEOUT_SECONDS``
    the same way."""
    settings.A2A_MAX_TIMEOUT_SECONDS = 1
    settings.A2A_SSE_IDLE_TIMEOUT_SECONDS = 0.5
    agent = echo_agent_factory(card_shape="1.0", interfaces=INTERFACES)
    target = register_agent(agent, max_concurrency=1)
    request = a2a_pb2.SendMessageRequest(tenant=target.agent_id,
                                         message=user_message("hello").message)
    token = tuple(auth(caller).items())
    taken = []

    async def never(request: bytes, context) -> bytes:
        taken.append(request)
        await asyncio.sleep(30)
        return b""

    async def silent(request: bytes, context):
        await asyncio.sleep(30)
        yield b""

    async def calls():
        server = grpc.aio.server()
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
            "lf.a2a.v1.A2AService", {
                "SendMessage": grpc.unary_unary_rpc_method_handler(never),
                "SendStreamingMessage": grpc.unary_stream_rpc_method_handler(silent)})])
        server.add_insecure_port(agent.grpc_address)
        await server.start()
        try:
            async with grpc.aio.insecure_channel(grpc_address) as channel:
                stub = grpc10.A2AServiceStub(channel)
                started = asyncio.get_running_loop().time()
                first = stub.SendMessage(request, metadata=token, timeout=20)
                while not taken:  # the first call holds the agent's one slot ...
                    await asyncio.sleep(0.01)
                # ... so a second one is busy, never sent.
                with pytest.raises(grpc.aio.AioRpcError) as busy:
                    await stub.SendMessage(request, metadata=token, timeout=20)
                code, executed, info = status_of(busy.value)
                assert (code, executed, info["kind"]) == \
                    (grpc.StatusCode.RESOURCE_EXHAUSTED, "false", "busy")
                with pytest.raises(grpc.aio.AioRpcError) as late:
                    await first
                assert 0.9 < asyncio.get_running_loop().time() - started < 5
                code, executed, info = status_of(late.value)
                assert (code, executed, info["kind"]) == \
                    (grpc.StatusCode.DEADLINE_EXCEEDED, "true", "timeout")
                # A stream whose agent goes silent ends after the idle timeout.
                started = asyncio.get_running_loop().time()
                with pytest.raises(grpc.aio.AioRpcError) as idle:
                    async for _ in stub.SendStreamingMessage(request, metadata=token,
                                                             timeout=20):
                        pass
                assert asyncio.get_running_loop().time() - started < 5
                code, executed, info = status_of(idle.value)
                assert (code, executed, info["kind"]) == \
                    (grpc.StatusCode.DEADLINE_EXCEEDED, "true", "timeout")
        finally:
            await server.stop(None)

    await on_node(calls())
    # The request's bytes reached the agent as the caller wrote them, its tenant cleared (the
    # card names none): the last ``tenant`` field wins.
    [received] = taken
    parsed = a2a_pb2.SendMessageRequest.FromString(received)
    assert parsed.tenant == "" and parsed.message == request.message
    assert received.startswith(request.SerializeToString())


def test_a_tenant_appended_to_the_bytes_wins_and_keeps_the_rest():
    request = a2a_pb2.GetTaskRequest(tenant="gateway-tenant", id="t-1", history_length=3)
    data = passthrough.with_tenant(request.SerializeToString(), "GetTask", "agent-tenant")
    parsed = a2a_pb2.GetTaskRequest.FromString(data)
    assert (parsed.tenant, parsed.id, parsed.history_length) == ("agent-tenant", "t-1", 3)
    assert a2a_pb2.GetTaskRequest.FromString(
        passthrough.with_tenant(data, "GetTask", "")).tenant == ""


@pytest.mark.parametrize(("url", "target"), [
    ("127.0.0.1:50051", ("127.0.0.1", 50051, False)),
    ("grpc://agent.internal:9000", ("agent.internal", 9000, False)),
    ("grpcs://agent.example", ("agent.example", 443, True)),
    ("[::1]:7000", ("::1", 7000, False)),
])
def test_grpc_interface_urls(url, target):
    assert passthrough.target_of(url) == target


@pytest.mark.parametrize("url", ["ftp://x:1", "", "host:notaport"])
def test_bad_grpc_interface_urls(url):
    with pytest.raises(ValueError):
        passthrough.target_of(url)

