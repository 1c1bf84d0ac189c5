"""The A2A gRPC binding through the gateway, with real SDK peers.

The agents are the SDK's own JSON-RPC servers (tests/a2a_agents.py); callers are stock SDK
clients restricted to gRPC, pointed at the gateway's base ``/a2a/{agent_id}/``: they read the
gateway's card, find its gRPC interface (this node's listener, ``tenant`` = the agent id) and
call it; the gateway translates each call to the agent's JSON-RPC (1.0 or 0.3) and back. Each
test asserts what the caller got and what arrived at the agent.

grpcio's asyncio layer serves one event loop per process well (a node has one); a client on the
test's own loop beside the live server's would share its completion queue across loops, so the
gRPC callers here run on the node's loop (:func:`on_node`).
"""

from __future__ import annotations

import asyncio
import time

import grpc
import httpx
import pytest
from a2a.compat.v0_3 import a2a_v0_3_pb2 as pb03
from a2a.compat.v0_3 import a2a_v0_3_pb2_grpc as grpc03
from a2a.helpers import get_message_text
from a2a.types import TaskState, a2a_pb2
from a2a.types import a2a_pb2_grpc as grpc10
from google.rpc import error_details_pb2, status_pb2

from core import lifecycle as node_config
from gateway import runtime
from tests.a2a_agents import (
    GRPC_BINDING,
    JSONRPC_BINDING,
    echo_get_and_cancel,
    sdk_client,
    send_and_collect,
    transport_name,
    user_message,
)
from tests.gateway import test_cluster

node_b = test_cluster.node_b  # node B: `manage.py serve` sharing this run's Redis and database

# the agent's card shape -> the JSON-RPC methods it receives for send, stream, get, cancel
AGENTS = {
    "1.0": ("both", ["SendMessage", "SendStreamingMessage", "GetTask", "CancelTask"]),
    "0.3": ("0.3", ["message/send", "message/stream", "tasks/get", "tasks/cancel"]),
}


@pytest.fixture(autouse=True)
def _grpc_listener(settings):
    """The node's gRPC listener on a free port (set before the live server starts)."""
    settings.A2A_GRPC_PORT = 0


@pytest.fixture
def grpc_address(live_server_url) -> str:
    port = node_config.grpc_port()
    assert port, "the node's gRPC listener did not start"
    return f"127.0.0.1:{port}"


async def on_node(coro):
    """Run ``coro`` on the live node's event loop (where its gRPC listener runs)."""
    loop = runtime.current_node().loop
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, loop))


def auth(caller) -> dict[str, str]:
    return {"authorization": f"Bearer {caller.token}"}


def metadata_dict(metadata) -> dict:
    return {key: value for key, value in metadata or ()}


def status_of(error: grpc.aio.AioRpcError) -> tuple[grpc.StatusCode, str, dict[str, str]]:
    """(code, executed flag, gateway ErrorInfo metadata) of a refused call."""
    trailers = metadata_dict(error.trailing_metadata())
    info: dict[str, str] = {}
    details = trailers.get("grpc-status-details-bin")
    if details:
        status = status_pb2.Status.FromString(details)
        assert status.code == error.code().value[0] and status.message == error.details()
        for detail in status.details:
            parsed = error_details_pb2.ErrorInfo()
            if detail.Unpack(parsed):
                info = dict(parsed.metadata)
    return error.code(), trailers.get("x-a2a-executed", ""), info


@pytest.mark.parametrize("version", list(AGENTS))
async def test_sdk_grpc_client_sends_streams_gets_and_cancels_through_the_gateway(
        grpc_address, echo_agent_factory, register_agent, caller, version):
    shape, methods = AGENTS[version]
    agent = echo_agent_factory(card_shape=shape)
    target = register_agent(agent)

    card = httpx.get(f"{target.gateway_base}.well-known/agent-card.json").json()
    grpc_interface = {"url": grpc_address, "protocolBinding": "GRPC", "protocolVersion": "1.0",
                      "tenant": target.agent_id}
    assert card["supportedInterfaces"][-1] == grpc_interface
    assert card["supportedInterfaces"][0]["protocolBinding"] == JSONRPC_BINDING

    async def calls():
        async with sdk_client(target.gateway_base, bindings=[GRPC_BINDING], streaming=False,
                              polling=True, headers=auth(caller), grpc_metadata=auth(caller)) \
                as client:
            assert transport_name(client) == "TenantTransportDecorator"
            # The agent's TaskNotFound reaches the caller as the SDK's gRPC server answers it
            # (whatever the agent's version: the caller speaks 1.0).
            task_id = await echo_get_and_cancel(client)
        async with sdk_client(target.gateway_base, bindings=[GRPC_BINDING], streaming=True,
                              headers=auth(caller), grpc_metadata=auth(caller)) as client:
            events = await send_and_collect(client, "task streamed")
        return task_id, events

    task_id, events = await on_node(calls())
    assert [a.kind for a in events] == \
        ["task", "status_update"] + ["artifact_update"] * 4 + ["status_update"]
    assert [a.event.artifact_update.artifact.parts[0].text for a in events[2:-1]] == \
        [f"chunk {i}: task streamed" for i in range(4)]
    assert events[-1].event.status_update.status.state == TaskState.TASK_STATE_COMPLETED
    # Events reach the caller as the agent sends them (0.15 s apart), not at the end.
    assert events[-1].at - events[2].at > 0.3
    assert agent.executor.cancelled == [task_id]
    send, stream, get, cancel = methods
    assert [r.rpc_method for r in agent.recorder.rpc()] == [send, send, get, cancel, get, stream]
    # The gateway names the agent's version; the bearer token and the tenant stay behind.
    first_call = agent.recorder.rpc()[0]
    assert first_call.header("a2a-version") == version
    assert first_call.header("authorization") is None and first_call.header("tenant") is None
    assert b'"tenant"' not in first_call.body


@pytest.fixture
def stranger(make_caller):
    """A caller allowed to call another agent only."""
    return make_caller(agents=["someone-else"])


async def test_refusals_are_grpc_statuses_with_the_executed_flag(
        grpc_address, echo_agent_factory, register_agent, caller, stranger, settings):
    target = register_agent(echo_agent_factory(card_shape="both"))
    request = a2a_pb2.SendMessageRequest(tenant=target.agent_id,
                                         message=user_message("hello").message)
    token = tuple(auth(caller).items())
    big = a2a_pb2.SendMessageRequest(tenant=target.agent_id)
    big.message.CopyFrom(user_message("x" * (settings.A2A_MAX_REQUEST_BYTES + 1)).message)

    async def calls():
        async with grpc.aio.insecure_channel(grpc_address) as channel:
            stub = grpc10.A2AServiceStub(channel)
            # No token, a bad one, a caller not allowed to call this agent.
            for metadata, code in [((), grpc.StatusCode.UNAUTHENTICATED),
                                   ((("authorization", "Bearer nope.nope"),),
                                    grpc.StatusCode.UNAUTHENTICATED),
                                   (tuple(auth(stranger).items()),
                                    grpc.StatusCode.PERMISSION_DENIED)]:
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await stub.SendMessage(request, metadata=metadata)
                assert status_of(refused.value)[:2] == (code, "false")
            # An unknown agent, and no tenant at all.
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.SendMessage(a2a_pb2.SendMessageRequest(
                    tenant="no-such-agent", message=request.message), metadata=token)
            code, executed, info = status_of(refused.value)
            assert (code, executed, info["kind"]) == \
                (grpc.StatusCode.NOT_FOUND, "false", "agent_not_found")
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.SendMessage(a2a_pb2.SendMessageRequest(message=request.message),
                                       metadata=token)
            assert status_of(refused.value)[:2] == (grpc.StatusCode.INVALID_ARGUMENT, "false")
            # A message above A2A_MAX_REQUEST_BYTES is refused by gRPC itself, unread.
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.SendMessage(big, metadata=token)
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            # A call that went through says so.
            call = stub.SendMessage(request, metadata=token)
            reply = await call
            assert get_message_text(reply.message) == "echo: hello"
            assert metadata_dict(await call.trailing_metadata())["x-a2a-executed"] == "true"

    await on_node(calls())
    assert [r.rpc_method for r in target.agent.recorder.rpc()] == ["SendMessage"]


async def test_a_03_caller_names_the_agent_in_metadata(grpc_address, echo_agent_factory,
                                                       register_agent, caller):
    """The 0.3 service's requests have no tenant: the ``tenant`` metadata entry names the
    agent; its messages are the 0.3 ones, whatever the agent speaks."""
    target = register_agent(echo_agent_factory(card_shape="both"))
    metadata = (*auth(caller).items(), ("tenant", target.agent_id))

    async def calls():
        missing = await echo_and_miss_03(grpc_address, metadata)
        assert missing.details().startswith("TaskNotFoundError: ")

    await on_node(calls())
    assert [r.rpc_method for r in target.agent.recorder.rpc()] == ["SendMessage", "GetTask"]


async def echo_and_miss_03(address: str, metadata) -> grpc.aio.AioRpcError:
    """Through the gateway's 0.3 gRPC service at ``address``: a message echoed, then an
    unknown task read (NOT_FOUND). That read's error."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = grpc03.A2AServiceStub(channel)
        reply = await stub.SendMessage(pb03.SendMessageRequest(request=pb03.Message(
            message_id="m-1", role=pb03.ROLE_USER, content=[pb03.Part(text="old")])),
            metadata=metadata)
        assert reply.msg.content[0].text == "echo: old"
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await stub.GetTask(pb03.GetTaskRequest(name="tasks/nope"), metadata=metadata)
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    return missing.value


@pytest.mark.parametrize("node_b", [{"A2A_GRPC_PORT": "0"}], indirect=True)
def test_a_call_entering_another_nodes_listener_reaches_the_owner(
        node_b, echo_agent_factory, register_agent, caller):
    """Node B (``manage.py serve`` with a gRPC listener) takes the call for an agent node A
    owns and routes it through the broker, as a JSON-RPC call entering B would be."""
    target = register_agent(echo_agent_factory(card_shape="both"))  # through A's API: A owns it
    deadline = time.monotonic() + 5
    while True:  # until B knows the route (its card names B's gRPC listener)
        response = httpx.get(f"{node_b.url}/a2a/{target.agent_id}/.well-known/agent-card.json")
        if response.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    [grpc_b] = [i["url"] for i in response.json()["supportedInterfaces"]
                if i["protocolBinding"] == "GRPC"]
    assert grpc_b != f"127.0.0.1:{node_config.grpc_port()}"
    metadata = tuple(auth(caller).items())
    with grpc.insecure_channel(grpc_b) as channel:  # the sync API: no second asyncio loop
        stub = grpc10.A2AServiceStub(channel)
        request = a2a_pb2.SendMessageRequest(tenant=target.agent_id,
                                             message=user_message("across").message)
        reply = stub.SendMessage(request, metadata=metadata, timeout=20)
        assert get_message_text(reply.message) == "echo: across"
        request.message.CopyFrom(user_message("task across").message)
        events = list(stub.SendStreamingMessage(request, metadata=metadata, timeout=20))
    assert [e.WhichOneof("payload") for e in events] == \
        ["task", "status_update"] + ["artifact_update"] * 4 + ["status_update"]
    assert events[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
    assert [r.rpc_method for r in target.agent.recorder.rpc()] == \
        ["SendMessage", "SendStreamingMessage"]


async def test_a_refused_webhook_is_invalid_argument_and_never_reaches_the_agent(
        grpc_address, echo_agent_factory, register_agent, caller, settings):
    """The push-notification webhook a gRPC request carries is checked as on JSON-RPC: a
    metadata address is refused before the agent (``webhook_refused``, executed false), an
    acceptable one goes through (the push relay off; relayed: tests/push/test_bindings.py)."""
    settings.A2A_PUSH_RELAY = False
    target = register_agent(echo_agent_factory(card_shape="both"))
    token = tuple(auth(caller).items())
    metadata_url = "http://169.254.169.254/latest/meta-data/"
    send = a2a_pb2.SendMessageRequest(tenant=target.agent_id,
                                      message=user_message("hello").message)
    send.configuration.task_push_notification_config.url = metadata_url
    create = a2a_pb2.TaskPushNotificationConfig(tenant=target.agent_id, task_id="t1",
                                                url=metadata_url)

    async def calls():
        async with grpc.aio.insecure_channel(grpc_address) as channel:
            stub = grpc10.A2AServiceStub(channel)
            for rpc, request in [(stub.SendMessage, send),
                                 (stub.CreateTaskPushNotificationConfig, create)]:
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await rpc(request, metadata=token)
                code, executed, info = status_of(refused.value)
                assert (code, executed, info["kind"]) == \
                    (grpc.StatusCode.INVALID_ARGUMENT, "false", "webhook_refused")
                assert "metadata" in refused.value.details()
            send.configuration.task_push_notification_config.url = "http://127.0.0.1:9/hook"
            reply = await stub.SendMessage(send, metadata=token)
            assert get_message_text(reply.message) == "echo: hello"

    await on_node(calls())
    assert [r.rpc_method for r in target.agent.recorder.rpc()] == ["SendMessage"]


async def test_many_calls_on_one_channel_all_go_through(grpc_address, echo_agent_factory,
                                                        register_agent, caller, settings):
    """More calls on one connection than its concurrent-stream limit, one after another and
    in bursts: each call's stream is released when it ends (none refused, none failing)."""
    target = register_agent(echo_agent_factory(card_shape="both"))
    token = tuple(auth(caller).items())
    request = a2a_pb2.SendMessageRequest(tenant=target.agent_id,
                                         message=user_message("hello").message)
    unknown = a2a_pb2.GetTaskRequest(tenant=target.agent_id, id="no-such-task")
    total = 3 * settings.A2A_GRPC_MAX_CONCURRENT_STREAMS

    async def calls():
        async with grpc.aio.insecure_channel(grpc_address) as channel:
            stub = grpc10.A2AServiceStub(channel)
            for _ in range(total // 2):  # one after another; every other one refused
                reply = await stub.SendMessage(request, metadata=token)
                assert get_message_text(reply.message) == "echo: hello"
            for _ in range(total // 4):
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await stub.GetTask(unknown, metadata=token)
                assert refused.value.code() == grpc.StatusCode.NOT_FOUND
            replies = await asyncio.gather(*(stub.SendMessage(request, metadata=token)
                                             for _ in range(total // 4)))
            assert {get_message_text(r.message) for r in replies} == {"echo: hello"}
            for _ in range(total // 2):  # streams, read to their end
                events = [e async for e in stub.SendStreamingMessage(request, metadata=token)]
                assert events and get_message_text(events[-1].message) == "echo: hello"

    await asyncio.wait_for(on_node(calls()), 120)


def test_a_caller_is_named_by_its_own_address_behind_the_frame_guard(
        grpc_address, echo_agent_factory, register_agent, settings):
    """grpcio sees every call from the frame guard's loopback end; the gateway still names the
    caller by its own address. A call without a token from 127.0.0.2 (raw HTTP/2 on a socket
    bound there) is refused, and its call-audit row names ``address:127.0.0.2``."""
    import socket

    import h2.config
    import h2.connection
    import h2.events

    from console.models import CallRecord
    from tests.servers import flush_console_now

    target = register_agent(echo_agent_factory(card_shape="both"))
    body = a2a_pb2.SendMessageRequest(tenant=target.agent_id,
                                      message=user_message("hello").message).SerializeToString()
    host, port = grpc_address.rsplit(":", 1)
    conn = h2.connection.H2Connection(
        h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    conn.initiate_connection()
    conn.send_headers(1, [(":method", "POST"), (":scheme", "http"),
                          (":path", "/lf.a2a.v1.A2AService/SendMessage"),
                          (":authority", grpc_address), ("content-type", "application/grpc"),
                          ("te", "trailers")])
    conn.send_data(1, b"\x00" + len(body).to_bytes(4, "big") + body, end_stream=True)
    status = None
    with socket.create_connection((host, int(port)), timeout=10,
                                  source_address=("127.0.0.2", 0)) as sock:
        sock.sendall(conn.data_to_send())
        while status is None:
            data = sock.recv(65536)
            assert data, "the node closed the connection without answering"
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.ResponseReceived | h2.events.TrailersReceived):
                    status = dict(event.headers).get("grpc-status", status)
            sock.sendall(conn.data_to_send())
    assert status == str(grpc.StatusCode.UNAUTHENTICATED.value[0])
    flush_console_now()
    rows = list(CallRecord.objects.filter(agent_id=target.agent_id)
                .values_list("caller", "outcome"))
    assert rows == [("address:127.0.0.2", "unauthenticated")]
