"""The A2A HTTP+JSON binding translated to an agent's JSON-RPC, with real SDK peers.

The agents are the SDK's own JSON-RPC servers (tests/a2a_agents.py) listing no HTTP+JSON
interface: a 1.0 one (its card lists JSON-RPC 1.0 and 0.3) and a pure 0.3 one. Callers are stock
SDK clients restricted to HTTP+JSON, pointed at the gateway's base ``/a2a/{agent_id}/``: they
find the gateway's HTTP+JSON interface in its card (after the agent's own), and the gateway
translates each REST call to the agent's JSON-RPC (1.0 method names, or 0.3 ones) and the
answer back. Each test asserts what the caller got and what arrived at the agent.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from a2a.types import (
    ListTasksRequest,
    TaskNotFoundError,
    TaskState,
)
from a2a.utils.errors import MethodNotFoundError

from tests.a2a_agents import (
    HTTP_JSON_BINDING,
    JSONRPC_BINDING,
    echo_get_and_cancel,
    sdk_client,
    send_and_collect,
    transport_name,
)

# the agent's protocol version -> (its card shape, the SDK transport a REST-only client picks
# from the gateway's card, the JSON-RPC methods the agent gets for send, get, cancel, stream)
AGENTS = {
    "1.0": ("both", "RestTransport",
            ["SendMessage", "GetTask", "CancelTask", "SendStreamingMessage"]),
    "0.3": ("0.3", "CompatRestTransport",
            ["message/send", "tasks/get", "tasks/cancel", "message/stream"]),
}
SEND = {"message": {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "hi"}]}}


def rest_error(response: httpx.Response) -> tuple[int, str, str, str]:
    """(HTTP status, google.rpc status, ErrorInfo reason, its domain) of a REST error."""
    error = response.json()["error"]
    assert error["code"] == response.status_code, error
    info = error["details"][0]
    assert info["@type"] == "type.googleapis.com/google.rpc.ErrorInfo"
    return response.status_code, error["status"], info["reason"], info["domain"]


@pytest.mark.parametrize("version", list(AGENTS))
async def test_rest_client_sends_streams_gets_and_cancels_a_json_rpc_agent(
        gateway_path, echo_agent_factory, register_agent, caller, version):
    shape, transport, methods = AGENTS[version]
    agent = echo_agent_factory(card_shape=shape)
    target = register_agent(agent)
    responses: list[httpx.Response] = []

    card = httpx.get(f"{target.gateway_base}.well-known/agent-card.json").json()
    # The agent's own preference first; the gateway's HTTP+JSON after it.
    if version == "1.0":
        assert [(i["protocolBinding"], i["protocolVersion"])
                for i in card["supportedInterfaces"]] == [
            (JSONRPC_BINDING, "1.0"), (JSONRPC_BINDING, "0.3"),
            (HTTP_JSON_BINDING, "1.0"), (HTTP_JSON_BINDING, "0.3")]
    else:
        assert card["preferredTransport"] == JSONRPC_BINDING
        assert card["additionalInterfaces"] == [{"url": target.gateway_base,
                                                 "transport": HTTP_JSON_BINDING}]

    async with sdk_client(target.gateway_base, bindings=[HTTP_JSON_BINDING], streaming=False,
                          polling=True, headers=caller.auth, responses=responses) as client:
        assert transport_name(client) == transport
        # The agent's TaskNotFound reaches the caller as the SDK's REST server answers it
        # (404, its ErrorInfo); the 0.3 REST transport reads any 404 as MethodNotFound.
        task_id = await echo_get_and_cancel(
            client, TaskNotFoundError if version == "1.0" else MethodNotFoundError)
    async with sdk_client(target.gateway_base, bindings=[HTTP_JSON_BINDING], streaming=True,
                          headers=caller.auth, responses=responses) as client:
        events = await send_and_collect(client, "task streamed")

    assert [a.kind for a in events] == \
        ["task", "status_update"] + ["artifact_update"] * 4 + ["status_update"]
    assert [a.event.artifact_update.artifact.parts[0].text for a in events[2:-1]] == \
        [f"chunk {i}: task streamed" for i in range(4)]
    assert events[-1].event.status_update.status.state == TaskState.TASK_STATE_COMPLETED
    # Events reach the caller as the agent sends them (0.15 s apart), not at the end.
    assert events[-1].at - events[2].at > 0.3
    assert agent.executor.cancelled == [task_id]
    send, get, cancel, stream = methods
    assert [r.rpc_method for r in agent.recorder.rpc()] == [send, send, get, cancel, get, stream]
    assert all(r.path == "/" for r in agent.requests if r.http_method == "POST")
    first_call = dict(agent.recorder.rpc()[0].headers)
    assert first_call.get("a2a-version", "0.3") == version
    assert "authorization" not in first_call
    calls = [r for r in responses if ".well-known" not in r.request.url.path]
    assert len(calls) == 6 and all(r.headers["x-a2a-executed"] == "true" for r in calls)
    [streamed] = [r for r in calls if r.request.url.path.endswith("message:stream")]
    assert streamed.headers["content-type"].startswith("text/event-stream")
    # The media types the SDK's REST server answers with (A2A's for the 1.0 routes).
    assert calls[0].headers["content-type"] == (
        "application/a2a+json" if version == "1.0" else "application/json")


async def test_list_tasks_and_errors_in_rest_form(echo_agent_factory, register_agent, caller):
    agent_10 = echo_agent_factory(card_shape="both")
    agent_03 = echo_agent_factory(card_shape="0.3")
    t10, t03 = register_agent(agent_10), register_agent(agent_03)
    async with sdk_client(t10.gateway_base, bindings=[HTTP_JSON_BINDING], streaming=False,
                          headers=caller.auth) as client:
        [first] = await send_and_collect(client, "task listed")
        listed = await client.list_tasks(ListTasksRequest())
        assert first.event.task.id in [t.id for t in listed.tasks]
    assert agent_10.recorder.rpc()[-1].rpc_method == "ListTasks"

    async with httpx.AsyncClient(timeout=30, headers=caller.auth) as http:
        # The agent's JSON-RPC error, in the form the SDK's REST server gives it.
        missing = await http.get(f"{t10.gateway_base}tasks/nope", headers={"A2A-Version": "1.0"})
        assert rest_error(missing) == (404, "NOT_FOUND", "TASK_NOT_FOUND", "a2a-protocol.org")
        assert missing.headers["x-a2a-executed"] == "true"
        # 0.3 routes under v1/, to a 1.0 agent (translated to its 1.0 methods) and a 0.3 one.
        for target, agent, method in ((t10, agent_10, "SendMessage"),
                                      (t03, agent_03, "message/send")):
            sent = await http.post(f"{target.gateway_base}v1/message:send", json={
                "request": {"messageId": "m9", "role": "ROLE_USER",
                            "content": [{"text": "old"}]}})
            assert sent.status_code == 200, sent.text
            assert sent.json()["message"]["content"] == [{"text": "echo: old"}]
            assert agent.recorder.rpc()[-1].rpc_method == method
        # A tenant in the path reaches a 1.0 agent as the request's tenant.
        tenant = await http.post(f"{t10.gateway_base}team-a/message:send", json=SEND)
        assert tenant.status_code == 200, tenant.text
        assert b'"tenant":"team-a"' in agent_10.recorder.rpc()[-1].body
        # A 0.3 agent has no ListTasks: the one call that cannot reach it, never sent.
        seen = len(agent_03.requests)
        unlisted = await http.get(f"{t03.gateway_base}tasks")
        assert unlisted.status_code == 501
        assert unlisted.json()["error"]["details"][0]["reason"] == "BINDING_UNAVAILABLE"
        assert "0.3" in unlisted.json()["error"]["message"]
        assert unlisted.headers["x-a2a-executed"] == "false"
        # A body that is not the route's request message: 400, never sent.
        bad = await http.post(f"{t03.gateway_base}message:send",
                              json={"message": {"parts": "not a list"}})
        assert bad.status_code == 400 and bad.headers["x-a2a-executed"] == "false"
        assert bad.json()["error"]["details"][0]["reason"] == "INVALID_REQUEST"
        assert len(agent_03.requests) == seen
        # The agent answers an HTTP error of its own (not JSON-RPC): relayed as a REST error.
        agent_03.stop()
        gone = await http.post(f"{t03.gateway_base}message:send", json=SEND)
        assert gone.status_code == 502 and gone.headers["x-a2a-executed"] == "false"


async def test_translated_stream_bounds_as_for_every_stream(gateway_path, echo_agent_factory,
                                                            register_agent, caller, settings):
    """A translated stream is the gateway's stream: the caller leaving frees the agent's slot
    (the agent's JSON-RPC stream is closed), and an agent gone quiet past the idle timeout ends
    it with a terminal ``event: error`` in the binding's form."""
    agent = echo_agent_factory(card_shape="both")
    target = register_agent(agent, max_concurrency=1)
    hold = {"message": {"messageId": "h1", "role": "ROLE_USER", "parts": [{"text": "wait"}]}}
    async with httpx.AsyncClient(timeout=30, headers=caller.auth) as http:
        async with http.stream("POST", f"{target.gateway_base}message:stream",
                               json=hold) as held:
            async for piece in held.aiter_bytes():
                if b"data:" in piece:
                    break  # the stream is running at the agent
            busy = await http.post(f"{target.gateway_base}message:send", json=SEND)
            assert busy.status_code == 429 and busy.headers["x-a2a-executed"] == "false"
        for _ in range(100):  # bounded: 10 s
            answer = await http.post(f"{target.gateway_base}message:send", json=SEND)
            if answer.status_code == 200:
                break
            await asyncio.sleep(0.1)
        assert answer.status_code == 200, answer.text

        settings.A2A_SSE_IDLE_TIMEOUT_SECONDS = 1
        async with http.stream("POST", f"{target.gateway_base}message:stream",
                               json=hold) as response:
            assert response.status_code == 200
            body = b"".join([piece async for piece in response.aiter_bytes()])
    events = body.replace(b"\r\n", b"\n").strip().split(b"\n\n")
    assert events[0].startswith(b"data: ")
    assert "task" in json.loads(events[0][6:])  # the agent's first event, translated
    assert events[-1].startswith(b"event: error\ndata: "), body[-500:]
    error = json.loads(events[-1].split(b"data: ", 1)[1])["error"]
    assert (error["code"], error["status"]) == (504, "DEADLINE_EXCEEDED")
    assert error["details"][0]["metadata"]["kind"] == "timeout"


async def test_push_config_routes_reach_the_agent_translated(echo_agent_factory, register_agent,
                                                             caller, settings):
    """The push-notification-config routes become the agent's JSON-RPC methods (the webhook
    checked first, as on every binding); this agent has no push support, and its A2A error
    comes back in the SDK REST server's form. (The push relay off: the config as sent;
    relayed: tests/push/.)"""
    settings.A2A_PUSH_RELAY = False
    agent = echo_agent_factory(card_shape="both")
    target = register_agent(agent)
    config = {"url": "http://127.0.0.1:9/hook", "id": "c1"}
    async with httpx.AsyncClient(timeout=30, headers=caller.auth) as http:
        created = await http.post(f"{target.gateway_base}tasks/t1/pushNotificationConfigs",
                                  json=config)
        listed = await http.get(f"{target.gateway_base}tasks/t1/pushNotificationConfigs")
        got = await http.get(f"{target.gateway_base}tasks/t1/pushNotificationConfigs/c1")
        deleted = await http.delete(f"{target.gateway_base}tasks/t1/pushNotificationConfigs/c1")
        refused = await http.post(f"{target.gateway_base}tasks/t1/pushNotificationConfigs",
                                  json={"url": "http://169.254.169.254/latest", "id": "c2"})
    for response in (created, listed, got, deleted):
        error = response.json()["error"]
        assert response.status_code == error["code"] >= 400, response.text
        assert error["details"][0]["domain"] == "a2a-protocol.org"
        assert response.headers["x-a2a-executed"] == "true"
    assert [r.rpc_method for r in agent.recorder.rpc()] == [
        "CreateTaskPushNotificationConfig", "ListTaskPushNotificationConfigs",
        "GetTaskPushNotificationConfig", "DeleteTaskPushNotificationConfig"]
    params = json.loads(agent.recorder.rpc()[0].body)["params"]
    assert (params["taskId"], params["url"], params["id"]) == ("t1", config["url"], "c1")
    # A webhook the outbound rules refuse never reaches the agent.
    assert refused.status_code == 400 and refused.headers["x-a2a-executed"] == "false"
    assert refused.json()["error"]["details"][0]["reason"] == "WEBHOOK_REFUSED"
