"""An agent whose card lists only a gRPC interface, called through the gateway on JSON-RPC and
HTTP+JSON: the calls are translated to its gRPC server
(gateway/grpc_binding/outbound_translate.py), with real SDK peers.

The agent is the SDK's own gRPC server (``GrpcHandler``, tests/a2a_agents.py
``EchoAgent.serve_grpc``), registered with its card alone (no URL); callers are stock SDK
clients restricted to JSON-RPC or HTTP+JSON, and raw httpx for the 0.3 method names. The agent
serves on the node's event loop (grpcio's asyncio layer serves one loop per process), as in
tests/gateway/test_grpc_passthrough.py.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import grpc
import httpx
import orjson
import pytest
from a2a.compat.v0_3 import a2a_v0_3_pb2 as pb03
from a2a.compat.v0_3 import a2a_v0_3_pb2_grpc as grpc03
from a2a.types import GetTaskRequest, TaskNotFoundError, TaskState

from tests.a2a_agents import (
    HTTP_JSON_BINDING,
    JSONRPC_BINDING,
    echo_get_and_cancel,
    sdk_client,
    send_and_collect,
    transport_name,
)
from tests.gateway import test_grpc_binding as grpc_tests
from tests.gateway.test_grpc_binding import auth, on_node, status_of

_grpc_listener = grpc_tests._grpc_listener  # the node's gRPC listener on a free port
grpc_address = grpc_tests.grpc_address


@pytest.fixture
def grpc_only(echo_agent_factory, api, live_server_url):
    """A gRPC-only agent (with an extended card) registered with its card alone: (agent,
    agent id, gateway base)."""
    agent = echo_agent_factory(card_shape="1.0", interfaces=[("GRPC", "1.0")], extended=True)
    agent.card_document["supportedInterfaces"][0]["tenant"] = "own-tenant"
    agent_id = f"grpc-only-{os.urandom(3).hex()}"
    response = api.post("/api/v1/agents", json={"agent_id": agent_id,
                                                "card": agent.card_document})
    assert response.status_code == 201, response.text
    assert f"grpc://{agent.grpc_address}" in response.text  # its endpoint: its gRPC address
    return agent, agent_id, f"{live_server_url}/a2a/{agent_id}/"


def test_the_served_card_lists_the_gateways_three_bindings(grpc_only, grpc_address, caller):
    agent, agent_id, base = grpc_only
    card = httpx.get(f"{base}.well-known/agent-card.json",
                     headers=auth(caller), timeout=10).json()
    assert [(i["protocolBinding"], i["url"]) for i in card["supportedInterfaces"]] == [
        ("GRPC", grpc_address), ("JSONRPC", base), ("HTTP+JSON", base)]
    assert card["supportedInterfaces"][0]["tenant"] == agent_id
    assert agent.grpc_address not in str(card)  # the agent's own address never shows


@pytest.mark.parametrize("binding", [JSONRPC_BINDING, HTTP_JSON_BINDING])
async def test_sdk_client_sends_streams_gets_and_cancels(grpc_only, grpc_address, caller,
                                                        binding):
    agent, agent_id, base = grpc_only
    token = auth(caller)

    async def calls():
        server = await agent.serve_grpc()
        try:
            async with sdk_client(base, bindings=[binding], streaming=False, polling=True,
                                  headers={**token, "x-trace": "t-1"}) as client:
                assert transport_name(client) in ("JsonRpcTransport", "RestTransport")
                # The agent's A2A error status reaches the SDK client as the same error.
                task_id = await echo_get_and_cancel(client)
            async with sdk_client(base, bindings=[binding], streaming=True,
                                  headers=token) as client:
                events = await send_and_collect(client, "task streamed")
        finally:
            await server.stop(None)
        return task_id, events

    task_id, events = await on_node(calls())
    assert [a.kind for a in events] == \
        ["task", "status_update"] + ["artifact_update"] * 4 + ["status_update"]
    assert events[-1].event.status_update.status.state == TaskState.TASK_STATE_COMPLETED
    assert events[-1].at - events[2].at > 0.3  # relayed as they come, not at the end
    assert agent.executor.cancelled == [task_id]
    assert agent.requests == []  # nothing over HTTP
    service = "/lf.a2a.v1.A2AService/"
    assert [path for path, _ in agent.grpc_calls] == [service + m for m in (
        "SendMessage", "SendMessage", "GetTask", "CancelTask", "GetTask",
        "SendStreamingMessage")]
    assert set(agent.executor.tenants) == {"own-tenant"}  # the card's, not the gateway's
    metadata = agent.grpc_calls[0][1]
    assert "authorization" not in metadata
    assert metadata["x-trace"] == "t-1"
    assert metadata["x-kubemq-caller-id"] == caller.client_id


async def test_03_method_names_over_raw_jsonrpc(grpc_only, grpc_address, caller):
    agent, agent_id, base = grpc_only

    async def calls():
        server = await agent.serve_grpc()
        try:
            async with httpx.AsyncClient(headers=auth(caller), timeout=20) as http:
                sent = await http.post(base, json={
                    "jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {
                        "message": {"kind": "message", "messageId": "m-1", "role": "user",
                                    "parts": [{"kind": "text", "text": "wait for cancel"}]},
                        "configuration": {"blocking": False}}})
                task = sent.json()["result"]
                got = await http.post(base, json={"jsonrpc": "2.0", "id": "g", "method":
                                                   "tasks/get", "params": {"id": task["id"]}})
                cancelled = await http.post(base, json={
                    "jsonrpc": "2.0", "id": 3, "method": "tasks/cancel",
                    "params": {"id": task["id"]}})
                missing = await http.post(base, json={"jsonrpc": "2.0", "id": 4, "method":
                                                       "tasks/get", "params": {"id": "nope"}})
                unknown = await http.post(base, json={"jsonrpc": "2.0", "id": 5,
                                                       "method": "tasks/nothing"})
        finally:
            await server.stop(None)
        return sent, task, got, cancelled, missing, unknown

    sent, task, got, cancelled, missing, unknown = await on_node(calls())
    assert sent.headers["x-a2a-executed"] == "true"
    assert task["kind"] == "task"  # the 0.3 shapes
    assert task["status"]["state"] in ("submitted", "working")
    assert got.json() == {"jsonrpc": "2.0", "id": "g", "result": got.json()["result"]}
    assert got.json()["result"]["id"] == task["id"]
    assert cancelled.json()["result"]["status"]["state"] == "canceled"
    assert missing.json()["error"]["code"] == -32001  # TaskNotFoundError
    assert missing.headers["x-a2a-executed"] == "true"
    assert unknown.json()["error"]["code"] == -32601
    assert unknown.headers["x-a2a-executed"] == "false"


async def test_an_agent_nobody_answers_for_is_unreachable_and_not_executed(
        grpc_only, grpc_address, caller):
    """Nothing serves the card's gRPC address: ``unreachable`` at once, executed false, on
    either binding."""
    agent, agent_id, base = grpc_only
    async with httpx.AsyncClient(headers=auth(caller), timeout=20) as http:
        rpc = await http.post(base, json={"jsonrpc": "2.0", "id": 1, "method": "SendMessage",
                                          "params": {"message": {
                                              "messageId": "m", "role": "ROLE_USER",
                                              "parts": [{"text": "hi"}]}}})
        rest = await http.post(f"{base}message:send", json={"message": {
            "messageId": "m", "role": "ROLE_USER", "parts": [{"text": "hi"}]}})
    assert rpc.headers["x-a2a-executed"] == "false"
    assert rpc.json()["error"]["data"]["kind"] == "unreachable"
    assert rest.headers["x-a2a-executed"] == "false"
    assert rest.status_code == 502  # the binding's status of unreachable
    assert rest.json()["error"]["details"][0]["metadata"]["kind"] == "unreachable"


def test_registration_with_a_grpc_address(echo_agent_factory, api):
    """A gRPC address is an agent's URL only with its card (nothing can be fetched from it);
    an update keeps it; the host rules apply to it as to any URL."""
    agent = echo_agent_factory(card_shape="1.0", interfaces=[("GRPC", "1.0")])
    url = f"grpc://{agent.grpc_address}"
    refused = api.post("/api/v1/agents", json={"agent_id": "g-nocard", "url": url})
    assert refused.status_code == 400 and "http or https" in refused.text
    metadata = api.post("/api/v1/agents", json={
        "agent_id": "g-meta", "url": "grpc://169.254.169.254:50051",
        "card": agent.card_document})
    assert metadata.status_code == 400, metadata.text
    created = api.post("/api/v1/agents", json={"agent_id": "g-url", "url": url,
                                               "card": agent.card_document})
    assert created.status_code == 201, created.text
    updated = api.patch("/api/v1/agents/g-url", json={"card": agent.card_document})
    assert updated.status_code == 200, updated.text
    assert url in updated.text


async def test_a_03_grpc_caller_is_translated_to_the_agents_10_service(
        grpc_only, grpc_address, caller):
    """A 0.3 gRPC caller (``a2a.v1.A2AService``, the agent named in the ``tenant`` metadata
    entry) of an agent serving the 1.0 service only: translated to it (1.0 callers are passed
    through, as in tests/gateway/test_grpc_passthrough.py); its A2A errors come back as the
    0.3 service's."""
    agent, agent_id, base = grpc_only
    metadata = (*auth(caller).items(), ("tenant", agent_id))

    async def calls():
        server = await agent.serve_grpc()
        try:
            async with grpc.aio.insecure_channel(grpc_address) as channel:
                stub = grpc03.A2AServiceStub(channel)
                reply = await stub.SendMessage(pb03.SendMessageRequest(request=pb03.Message(
                    message_id="m-1", role=pb03.ROLE_USER, content=[pb03.Part(text="old")])),
                    metadata=metadata, timeout=20)
                events = [event async for event in stub.SendStreamingMessage(
                    pb03.SendMessageRequest(request=pb03.Message(
                        message_id="m-2", role=pb03.ROLE_USER,
                        content=[pb03.Part(text="task streamed")])),
                    metadata=metadata, timeout=20)]
                with pytest.raises(grpc.aio.AioRpcError) as missing:
                    await stub.GetTask(pb03.GetTaskRequest(name="tasks/nope"),
                                       metadata=metadata, timeout=20)
                card = await stub.GetAgentCard(pb03.GetAgentCardRequest(), metadata=metadata,
                                               timeout=20)
        finally:
            await server.stop(None)
        return reply, events, missing.value, card

    reply, events, missing, card = await on_node(calls())
    assert reply.msg.content[0].text == "echo: old"
    assert [e.WhichOneof("payload") for e in events][-1] == "status_update"
    assert events[-1].status_update.status.state == pb03.TASK_STATE_COMPLETED
    assert missing.code() == grpc.StatusCode.NOT_FOUND
    assert missing.details().startswith("TaskNotFoundError")
    assert status_of(missing)[1] == "true"
    assert card.url.endswith(f"/a2a/{agent_id}/") and agent.grpc_address not in str(card)
    service = "/lf.a2a.v1.A2AService/"
    assert [path for path, _ in agent.grpc_calls] == [service + m for m in (
        "SendMessage", "SendStreamingMessage", "GetTask", "GetExtendedAgentCard")]
    assert set(agent.executor.tenants) == {"own-tenant"}


async def test_an_agent_that_never_answers_ends_at_the_deadline(grpc_only, grpc_address, caller,
                                                                settings, api):
    """The agent takes the call and never answers: ``timeout`` (executed true) when the
    gateway's deadline passes (``A2A_MAX_TIMEOUT_SECONDS``), the agent's one concurrency slot
    held meanwhile (a second call is ``busy``, never sent); a stream the agent never writes to
    ends after ``A2A_SSE_IDLE_TIMEOUT_SECONDS`` the same way."""
    settings.A2A_MAX_TIMEOUT_SECONDS = 1
    settings.A2A_SSE_IDLE_TIMEOUT_SECONDS = 0.5
    agent, agent_id, base = grpc_only
    assert api.patch(f"/api/v1/agents/{agent_id}", json={"max_concurrency": 1}).status_code \
        == 200
    taken = []

    async def never(request: bytes, context) -> bytes:
        taken.append(request)
        await asyncio.sleep(30)
        return b""

    async def silent(request: bytes, context):
        await asyncio.sleep(30)
        yield b""

    message = {"message": {"messageId": "m", "role": "ROLE_USER", "parts": [{"text": "hi"}]}}

    async def calls():
        server = await _a2a_server(agent.grpc_address, {
            "SendMessage": grpc.unary_unary_rpc_method_handler(never),
            "SendStreamingMessage": grpc.unary_stream_rpc_method_handler(silent)})
        try:
            async with httpx.AsyncClient(headers=auth(caller), timeout=20) as http:
                started = asyncio.get_running_loop().time()
                first = asyncio.ensure_future(http.post(base, json={
                    "jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": message}))
                while not taken:
                    await asyncio.sleep(0.01)
                busy = await http.post(f"{base}message:send", json=message)
                late = await first
                seconds = asyncio.get_running_loop().time() - started
                stream = await http.post(base, json={
                    "jsonrpc": "2.0", "id": 2, "method": "SendStreamingMessage",
                    "params": message})
        finally:
            await server.stop(None)
        return busy, late, seconds, stream

    await asyncio.sleep(0.5)  # the route's new cap reaches the node
    busy, late, seconds, stream = await on_node(calls())
    assert (busy.status_code, busy.headers["x-a2a-executed"]) == (429, "false")
    assert busy.json()["error"]["details"][0]["metadata"]["kind"] == "busy"
    assert 0.9 < seconds < 5
    assert late.headers["x-a2a-executed"] == "true"
    assert late.json()["error"]["data"]["kind"] == "timeout"
    # No event came: the error is the whole answer (a stream already answering would end with
    # a terminal ``event: error``).
    assert stream.headers["x-a2a-executed"] == "true", stream.text  # not busy: slot given back
    assert orjson.loads(stream.content)["error"]["data"]["kind"] == "timeout"


async def test_the_extended_card_is_translated_and_rewritten(grpc_only, grpc_address, caller):
    """The agent's extended card (its gRPC ``GetExtendedAgentCard``) reaches a JSON-RPC caller
    (1.0 and 0.3 names) and an HTTP+JSON caller pointed at the gateway, like the public card."""
    agent, agent_id, base = grpc_only

    async def calls():
        server = await agent.serve_grpc()
        try:
            async with httpx.AsyncClient(headers=auth(caller), timeout=20) as http:
                v10 = await http.post(base, json={"jsonrpc": "2.0", "id": 1,
                                                  "method": "GetExtendedAgentCard"})
                v03 = await http.post(base, json={"jsonrpc": "2.0", "id": 2,
                                                  "method": "agent/getAuthenticatedExtendedCard"})
                rest = await http.get(f"{base}extendedAgentCard")
                rest03 = await http.get(f"{base}v1/card")
        finally:
            await server.stop(None)
        return v10.json()["result"], v03.json()["result"], rest.json(), rest03.json()

    v10, v03, rest, rest03 = await on_node(calls())
    assert (rest03["url"], rest03["preferredTransport"]) == (base, "JSONRPC")
    assert "secret" in [skill["id"] for skill in rest03["skills"]]
    for card in (v10, rest):
        assert "secret" in [skill["id"] for skill in card["skills"]]
        assert [i["protocolBinding"] for i in card["supportedInterfaces"]] == \
            ["GRPC", "JSONRPC", "HTTP+JSON"]
        assert agent.grpc_address not in orjson.dumps(card).decode()
    assert "secret" in [skill["id"] for skill in v03["skills"]]
    assert (v03["url"], v03["preferredTransport"]) == (base, "JSONRPC")
    assert agent.grpc_address not in orjson.dumps(v03).decode()


def test_grpc_statuses_become_jsonrpc_errors():
    from a2a.types import TaskNotFoundError
    from google.protobuf import any_pb2
    from google.rpc import error_details_pb2, status_pb2

    from gateway.grpc_binding.outbound_messages import status_error

    detail = any_pb2.Any()
    detail.Pack(error_details_pb2.ErrorInfo(reason="TASK_NOT_FOUND", domain="a2a-protocol.org",
                                            metadata={"taskId": "t-1"}))
    details = status_pb2.Status(code=5, message="no task", details=[detail])
    error = status_error(grpc.StatusCode.NOT_FOUND, "no task",
                         [("grpc-status-details-bin", details.SerializeToString())])
    assert (error["code"], error["message"], error["data"][0]["metadata"]) == \
        (-32001, "no task", {"taskId": "t-1"})
    assert TaskNotFoundError  # the A2A error the reason names
    assert status_error(grpc.StatusCode.INVALID_ARGUMENT, "bad", ())["code"] == -32602
    assert status_error(grpc.StatusCode.UNIMPLEMENTED, "", None)["code"] == -32601
    other = status_error(grpc.StatusCode.PERMISSION_DENIED, "no", [("x", "y")])
    assert other == {"code": -32603, "message": "gRPC PERMISSION_DENIED: no"}
    foreign = any_pb2.Any()
    foreign.Pack(error_details_pb2.ErrorInfo(reason="TASK_NOT_FOUND", domain="elsewhere"))
    assert status_error(grpc.StatusCode.NOT_FOUND, "x", [(
        "grpc-status-details-bin", status_pb2.Status(details=[foreign]).SerializeToString())]
    )["code"] == -32603


async def test_an_agent_serving_the_03_grpc_service_only(echo_agent_factory, api,
                                                         live_server_url, grpc_address, caller):
    """A 0.3 card whose one interface is the agent's 0.3 gRPC service: JSON-RPC and HTTP+JSON
    calls reach it through the SDK's 0.3 conversions; ``ListTasks``, which 0.3 has not, is
    ``binding_unavailable``, never sent."""
    agent = echo_agent_factory(card_shape="0.3", interfaces=[("GRPC", "0.3")])
    assert agent.card_document["preferredTransport"] == "GRPC"
    agent_id = f"grpc03-{os.urandom(3).hex()}"
    response = api.post("/api/v1/agents", json={"agent_id": agent_id,
                                                "card": agent.card_document})
    assert response.status_code == 201, response.text
    base = f"{live_server_url}/a2a/{agent_id}/"
    token = auth(caller)

    async def calls():
        server = await agent.serve_grpc("0.3")
        try:
            async with sdk_client(base, bindings=[JSONRPC_BINDING], streaming=True,
                                  headers=token) as client:
                events = await send_and_collect(client, "task streamed")
                with pytest.raises(TaskNotFoundError):
                    await client.get_task(GetTaskRequest(id="no-such-task"))
            async with httpx.AsyncClient(headers=token, timeout=20) as http:
                rest = await http.post(f"{base}message:send", json={"message": {
                    "messageId": "m", "role": "ROLE_USER", "parts": [{"text": "hi"}]}})
                listed = await http.get(f"{base}tasks")
        finally:
            await server.stop(None)
        return events, rest, listed

    events, rest, listed = await on_node(calls())
    assert events[-1].event.status_update.status.state == TaskState.TASK_STATE_COMPLETED
    assert rest.json()["message"]["parts"][0]["text"] == "echo: hi"
    assert (listed.status_code, listed.headers["x-a2a-executed"]) == (501, "false")
    assert listed.json()["error"]["details"][0]["metadata"]["kind"] == "binding_unavailable"
    service = "/a2a.v1.A2AService/"
    assert [path for path, _ in agent.grpc_calls] == [service + m for m in (
        "SendStreamingMessage", "GetTask", "SendMessage")]


async def test_an_agent_error_inside_a_stream_ends_it(grpc_only, grpc_address, caller):
    """The agent writes one event, then ends its stream with an A2A error status: the caller
    gets the event, then the error -- a last JSON-RPC error event, or the HTTP+JSON binding's
    terminal ``event: error`` -- executed true."""
    from a2a.types import a2a_pb2
    from google.protobuf import any_pb2
    from google.rpc import error_details_pb2, status_pb2

    agent, agent_id, base = grpc_only
    info = any_pb2.Any()
    info.Pack(error_details_pb2.ErrorInfo(reason="TASK_NOT_FOUND", domain="a2a-protocol.org"))
    details = status_pb2.Status(code=5, message="gone", details=[info]).SerializeToString()

    async def one_then_error(request: bytes, context):
        yield a2a_pb2.StreamResponse(task=a2a_pb2.Task(
            id="t-1", context_id="c-1", status=a2a_pb2.TaskStatus(
                state=a2a_pb2.TaskState.TASK_STATE_SUBMITTED))).SerializeToString()
        await context.abort(grpc.StatusCode.NOT_FOUND, "gone",
                            trailing_metadata=(("grpc-status-details-bin", details),))

    message = {"message": {"messageId": "m", "role": "ROLE_USER", "parts": [{"text": "hi"}]}}

    async def calls():
        server = await _a2a_server(agent.grpc_address, {
            "SendStreamingMessage": grpc.unary_stream_rpc_method_handler(one_then_error)})
        try:
            async with httpx.AsyncClient(headers=auth(caller), timeout=20) as http:
                rpc = await http.post(base, json={"jsonrpc": "2.0", "id": 7, "method":
                                                  "SendStreamingMessage", "params": message})
                rest = await http.post(f"{base}message:stream", json=message)
        finally:
            await server.stop(None)
        return rpc, rest

    rpc, rest = await on_node(calls())
    assert rpc.headers["x-a2a-executed"] == "true"
    events = [orjson.loads(line[6:]) for line in rpc.text.splitlines()
              if line.startswith("data: ")]
    assert [event["result"]["task"]["id"] for event in events[:1]] == ["t-1"]
    assert events[1] == {"jsonrpc": "2.0", "id": 7, "error": {
        "code": -32001, "message": "gone", "data": [{
            "@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "TASK_NOT_FOUND",
            "domain": "a2a-protocol.org", "metadata": {}}]}}
    assert len(events) == 2
    assert rest.headers["content-type"].startswith("text/event-stream")
    chunks = rest.text.strip().split("\n\n")
    assert orjson.loads(chunks[0].removeprefix("data: "))["task"]["id"] == "t-1"
    assert chunks[1].startswith("event: error\ndata: ")
    assert orjson.loads(chunks[1].split("data: ", 1)[1])["error"]["status"] == "NOT_FOUND"


async def test_a_stream_whose_caller_leaves_cancels_the_agents_call(grpc_only, grpc_address,
                                                                    caller):
    """A JSON-RPC stream's caller disconnects after the first event: the agent's gRPC call is
    cancelled at once (not left to run until the agent ends it)."""
    from a2a.types import a2a_pb2

    agent, agent_id, base = grpc_only
    cancelled = asyncio.Event()

    async def one_then_wait(request: bytes, context):
        yield a2a_pb2.StreamResponse(task=a2a_pb2.Task(
            id="t-1", context_id="c-1", status=a2a_pb2.TaskStatus(
                state=a2a_pb2.TaskState.TASK_STATE_WORKING))).SerializeToString()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    message = {"message": {"messageId": "m", "role": "ROLE_USER", "parts": [{"text": "hi"}]}}

    async def calls():
        server = await _a2a_server(agent.grpc_address, {
            "SendStreamingMessage": grpc.unary_stream_rpc_method_handler(one_then_wait)})
        try:
            async with httpx.AsyncClient(headers=auth(caller), timeout=20) as http:
                async with http.stream("POST", base, json={
                        "jsonrpc": "2.0", "id": 1, "method": "SendStreamingMessage",
                        "params": message}) as response:
                    async for line in response.aiter_lines():
                        if line.startswith("data: "):
                            break
            left = asyncio.get_running_loop().time()
            await asyncio.wait_for(cancelled.wait(), 10)
            return asyncio.get_running_loop().time() - left
        finally:
            await server.stop(None)

    assert await on_node(calls()) < 3


async def _a2a_server(address: str, handlers: dict[str, Any]) -> grpc.aio.Server:
    """A bare gRPC server at ``address`` answering these methods of the 1.0 A2A service
    (its handlers scripted by the test), started."""
    server = grpc.aio.server()
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
        "lf.a2a.v1.A2AService", handlers)])
    server.add_insecure_port(address)
    await server.start()
    return server
