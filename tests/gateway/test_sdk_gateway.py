"""The gateway driven by the official a2a-sdk client, end to end on loopback.

A stock SDK client is pointed at ``http://127.0.0.1:PORT/a2a/{agent_id}/``: it resolves the
gateway's *rewritten* card, picks its transport from it (A2A 1.0 ``JsonRpcTransport`` or the 0.3
``CompatJsonRpcTransport``) and then talks only to the gateway. The agent is the SDK's own
server (tests/a2a_agents.py), which records every request it receives, so each test asserts
what the caller got *and* what arrived at the agent.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from a2a.helpers import get_message_text
from a2a.types import CancelTaskRequest, GetTaskRequest, TaskNotFoundError, TaskState

from tests.a2a_agents import sdk_client, send_and_collect, transport_name, user_message

# card shape -> (SDK transport the client picks, JSON-RPC method names the agent receives)
PROTOCOLS = {
    "1.0": ("JsonRpcTransport",
            {"send": "SendMessage", "stream": "SendStreamingMessage", "get": "GetTask",
             "cancel": "CancelTask"}),
    "0.3": ("CompatJsonRpcTransport",
            {"send": "message/send", "stream": "message/stream", "get": "tasks/get",
             "cancel": "tasks/cancel"}),
}
VERSIONS = ["1.0", "0.3"]


def card_urls(card: dict) -> list[str]:
    urls = [card["url"]] if "url" in card else []
    for key in ("supportedInterfaces", "additionalInterfaces"):
        urls += [iface["url"] for iface in card.get(key) or []]
    return urls


def without_urls(card: dict) -> dict:
    stripped = {k: v for k, v in card.items() if k != "url"}
    for key in ("supportedInterfaces", "additionalInterfaces"):
        if key in stripped:
            stripped[key] = [{k: v for k, v in i.items() if k != "url"} for i in stripped[key]]
    return stripped


def assert_executed(response: httpx.Response) -> None:
    assert response.headers.get("x-a2a-executed") == "true", dict(response.headers)
    assert response.headers.get("x-a2a-agent-status") == "200", dict(response.headers)


# --- the rewritten card ------------------------------------------------------------------------


@pytest.mark.parametrize("shape", ["1.0", "0.3", "both"])
def test_card_endpoints_rewritten_to_the_gateway(echo_agent_factory, register_agent,
                                                 live_server_url, shape):
    agent = echo_agent_factory(card_shape=shape)
    target = register_agent(agent)
    gateway_endpoint = f"{live_server_url}/a2a/{target.agent_id}"

    # No token: cards are public by default, and stock SDK clients send none.
    response = httpx.get(f"{target.gateway_base}.well-known/agent-card.json")
    assert response.status_code == 200, response.text
    card = response.json()
    urls = card_urls(card)
    assert all(url.rstrip("/") == gateway_endpoint for url in urls), urls
    assert f"127.0.0.1:{agent.port}" not in response.text
    # Nothing else changed, but for the gateway's HTTP+JSON (translated: the agent lists none)
    # after the agent's own interfaces, in each view of the card it has.
    expected = without_urls(agent.card_document)
    if "supportedInterfaces" in expected:
        expected["supportedInterfaces"] = [*expected["supportedInterfaces"], *(
            {"protocolBinding": "HTTP+JSON", "protocolVersion": i["protocolVersion"]}
            for i in expected["supportedInterfaces"])]
    if "url" in agent.card_document:
        expected["additionalInterfaces"] = [{"transport": "HTTP+JSON"}]
    assert without_urls(card) == expected
    assert len(urls) == len(card_urls(agent.card_document)) + (
        len(expected.get("supportedInterfaces", [])) // 2 + ("url" in agent.card_document))

    etag = response.headers.get("etag")
    assert etag and response.headers.get("cache-control")
    agent_etag = httpx.get(f"{agent.base_url}/.well-known/agent-card.json").headers.get("etag")
    assert etag != agent_etag  # computed over the rewritten bytes, not copied from the agent
    again = httpx.get(f"{target.gateway_base}.well-known/agent-card.json",
                      headers={"If-None-Match": etag})
    assert again.status_code == 304


# --- message/send ------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", VERSIONS)
async def test_send_through_gateway(gateway_path, echo_agent_factory, register_agent, caller,
                                    live_server_url, shape):
    agent = echo_agent_factory(card_shape=shape, steps=3, step_delay=0.05)
    target = register_agent(agent)
    transport, names = PROTOCOLS[shape]
    responses: list[httpx.Response] = []

    async with sdk_client(target.gateway_base, streaming=False, headers=caller.auth,
                          responses=responses) as client:
        assert transport_name(client) == transport
        [reply] = await send_and_collect(client, "hello")
        [done] = await send_and_collect(client, "task one")

    assert reply.kind == "message"
    assert get_message_text(reply.event.message) == "echo: hello"
    assert done.kind == "task"
    assert done.event.task.status.state == TaskState.TASK_STATE_COMPLETED
    assert [a.parts[0].text for a in done.event.task.artifacts] == \
        [f"chunk {i}: task one" for i in range(3)]

    # The client talked only to the gateway; the agent saw the calls, with the 0.3 or 1.0 names.
    assert all(str(r.url).startswith(live_server_url) for r in responses)
    assert [r.rpc_method for r in agent.recorder.rpc()] == [names["send"], names["send"]]
    posts = [r for r in responses if r.request.method == "POST"]
    assert len(posts) == 2
    for response in posts:
        assert_executed(response)


@pytest.mark.parametrize("shape", VERSIONS)
async def test_sync_reply_relayed_byte_for_byte(gateway_path, echo_agent_factory, register_agent,
                                                caller, shape):
    """Sync replies come back unchanged, agent errors included, and a method the gateway does
    not know is still forwarded (the agent answers it)."""
    agent = echo_agent_factory(card_shape=shape, steps=1, step_delay=0.01)
    target = register_agent(agent)
    _, names = PROTOCOLS[shape]
    async with sdk_client(target.gateway_base, streaming=False, headers=caller.auth) as client:
        [done] = await send_and_collect(client, "task for get")
    task_id = done.event.task.id

    version = {"A2A-Version": shape, "Content-Type": "application/json"}
    cases = [  # (request, what the agent answers)
        ({"jsonrpc": "2.0", "id": "get-1", "method": names["get"], "params": {"id": task_id}},
         "result"),
        ({"jsonrpc": "2.0", "id": 42, "method": names["get"], "params": {"id": "no-such-task"}},
         -32001),
        ({"jsonrpc": "2.0", "id": "x", "method": "tasks/noSuchMethod", "params": {}}, -32601),
    ]
    with httpx.Client(timeout=30) as http:
        for body, expected in cases:
            direct = http.post(agent.url, json=body, headers=version)
            via = http.post(target.gateway_base, json=body, headers={**version, **caller.auth})
            assert via.status_code == direct.status_code == 200
            assert via.content == direct.content, (via.text, direct.text)
            assert via.headers["content-type"].startswith("application/json")
            assert_executed(via)
            answer = json.loads(via.content)
            assert answer["id"] == body["id"]
            if expected == "result":
                assert answer["result"]["id"] == task_id
            else:
                assert answer["error"]["code"] == expected


async def test_registered_without_card_uses_the_agents_own(echo_agent_factory, register_agent,
                                                            caller, live_server_url):
    """No card in the registration: the registry fetches the SDK agent's card, and the gateway
    serves it rewritten, so a stock client still ends up going through the gateway."""
    agent = echo_agent_factory(card_shape="both")
    target = register_agent(agent, with_card=False)
    responses: list[httpx.Response] = []
    async with sdk_client(target.gateway_base, streaming=False, headers=caller.auth,
                          responses=responses) as client:
        assert transport_name(client) == "JsonRpcTransport"
        [reply] = await send_and_collect(client, "fetched")
    assert get_message_text(reply.event.message) == "echo: fetched"
    assert all(str(r.url).startswith(live_server_url) for r in responses)
    assert [r.rpc_method for r in agent.recorder.rpc()] == ["SendMessage"]


# --- message/stream ----------------------------------------------------------------------------


@pytest.mark.parametrize("shape", VERSIONS)
async def test_stream_through_gateway_arrives_incrementally(gateway_path, echo_agent_factory,
                                                            register_agent, caller, shape):
    steps, delay = 4, 0.2
    agent = echo_agent_factory(card_shape=shape, steps=steps, step_delay=delay)
    target = register_agent(agent)
    transport, names = PROTOCOLS[shape]
    responses: list[httpx.Response] = []

    async with sdk_client(target.gateway_base, streaming=True, headers=caller.auth,
                          responses=responses) as client:
        assert transport_name(client) == transport
        arrivals = await send_and_collect(client, "task streamed")

    # Every event, in order.
    assert [a.kind for a in arrivals] == \
        ["task", "status_update"] + ["artifact_update"] * steps + ["status_update"]
    assert arrivals[1].event.status_update.status.state == TaskState.TASK_STATE_WORKING
    assert [a.event.artifact_update.artifact.parts[0].text for a in arrivals[2:-1]] == \
        [f"chunk {i}: task streamed" for i in range(steps)]
    assert arrivals[-1].event.status_update.status.state == TaskState.TASK_STATE_COMPLETED
    assert len({a.event.artifact_update.task_id for a in arrivals[2:-1]}) == 1

    # As they happen: each artifact about step_delay after the previous event, not in a burst.
    gaps = [b.at - a.at for a, b in zip(arrivals[1:-2], arrivals[2:-1], strict=True)]
    assert all(gap > delay * 0.5 for gap in gaps), gaps
    assert arrivals[-1].at - arrivals[0].at > steps * delay * 0.75

    [post] = [r for r in responses if r.request.method == "POST"]
    assert post.headers["content-type"].startswith("text/event-stream")
    assert_executed(post)
    assert [r.rpc_method for r in agent.recorder.rpc()] == [names["stream"]]


# --- tasks/get, tasks/cancel -------------------------------------------------------------------


@pytest.mark.parametrize("shape", VERSIONS)
async def test_get_and_cancel_through_gateway(gateway_path, echo_agent_factory, register_agent,
                                              caller, shape):
    agent = echo_agent_factory(card_shape=shape)
    target = register_agent(agent)
    _, names = PROTOCOLS[shape]

    async with sdk_client(target.gateway_base, streaming=False, polling=True,
                          headers=caller.auth) as client:
        [first] = await send_and_collect(client, "wait for cancel")
        task_id = first.event.task.id
        assert first.event.task.status.state in (TaskState.TASK_STATE_SUBMITTED,
                                                 TaskState.TASK_STATE_WORKING)
        got = await client.get_task(GetTaskRequest(id=task_id))
        assert (got.id, got.status.state) == (task_id, TaskState.TASK_STATE_WORKING)
        cancelled = await client.cancel_task(CancelTaskRequest(id=task_id))
        assert cancelled.status.state == TaskState.TASK_STATE_CANCELED
        after = await client.get_task(GetTaskRequest(id=task_id))
        assert after.status.state == TaskState.TASK_STATE_CANCELED
        # The agent's TaskNotFound (-32001) reaches the SDK as such: the gateway keeps its own
        # codes out of A2A's range in the default profile.
        with pytest.raises(TaskNotFoundError):
            await client.get_task(GetTaskRequest(id="no-such-task"))

    assert agent.executor.cancelled == [task_id]
    assert [r.rpc_method for r in agent.recorder.rpc()] == \
        [names["send"], names["get"], names["cancel"], names["get"], names["get"]]


@pytest.mark.parametrize("shape", VERSIONS)
async def test_cancel_while_streaming(gateway_path, echo_agent_factory, register_agent, caller,
                                      shape):
    """A stream through the gateway stays open while a cancel goes through the gateway too;
    the stream then delivers the cancellation and ends."""
    agent = echo_agent_factory(card_shape=shape)
    target = register_agent(agent)
    events = []
    async with sdk_client(target.gateway_base, streaming=True, headers=caller.auth) as streamer, \
            sdk_client(target.gateway_base, streaming=False, headers=caller.auth) as other:
        async def consume() -> None:
            async for event in streamer.send_message(user_message("wait on stream")):
                events.append(event)
                if event.WhichOneof("payload") == "status_update" and \
                        event.status_update.status.state == TaskState.TASK_STATE_WORKING:
                    cancelled = await other.cancel_task(
                        CancelTaskRequest(id=event.status_update.task_id))
                    assert cancelled.status.state == TaskState.TASK_STATE_CANCELED

        await asyncio.wait_for(consume(), timeout=15)
    assert events[0].WhichOneof("payload") == "task"
    assert events[-1].status_update.status.state == TaskState.TASK_STATE_CANCELED


# --- headers -----------------------------------------------------------------------------------

SPOOFED_IP = "203.0.113.9"


@pytest.mark.parametrize("streaming", [False, True], ids=["send", "stream"])
@pytest.mark.parametrize("shape", VERSIONS)
async def test_headers_forwarded_and_stripped(gateway_path, echo_agent_factory, register_agent,
                                              caller, shape, streaming):
    agent = echo_agent_factory(card_shape=shape, steps=1, step_delay=0.01)
    target = register_agent(agent)
    sent = {
        **caller.auth,
        "X-Trace-Id": "trace-123",
        "X-Tenant": "acme",
        "A2A-Extensions": "https://ext.example/a",
        "X-A2A-Extensions": "https://ext.example/a",
        "Cookie": "session=secret-cookie",
        "Proxy-Authorization": "Basic c2VjcmV0",
        "X-Forwarded-For": SPOOFED_IP,
        "X-Real-Ip": SPOOFED_IP,
        "X-KubeMQ-Caller-ID": "someone-else",
    }
    async with sdk_client(target.gateway_base, streaming=streaming, headers=sent) as client:
        arrivals = await send_and_collect(client, "task headers")
    assert arrivals[-1].event.WhichOneof("payload") in ("task", "status_update")

    [request] = agent.recorder.rpc()
    assert request.rpc_method == PROTOCOLS[shape][1]["stream" if streaming else "send"]
    # Forwarded: custom X- headers and the A2A headers.
    assert request.header("x-trace-id") == "trace-123"
    assert request.header("x-tenant") == "acme"
    assert request.header("a2a-version") == shape
    assert request.header("a2a-extensions") == "https://ext.example/a"
    assert request.header("x-a2a-extensions") == "https://ext.example/a"
    # The caller's identity, set by the gateway; the spoofed value is discarded.
    assert request.header_values("x-kubemq-caller-id") == [caller.client_id]
    # Never forwarded.
    for name in ("authorization", "cookie", "proxy-authorization", "x-real-ip"):
        assert request.header(name) is None, name
    assert SPOOFED_IP not in " ".join(request.header_values("x-forwarded-for"))
    everything = " ".join(value for _, value in request.headers)
    assert caller.token not in everything and "secret-cookie" not in everything
    assert request.header("host") == f"127.0.0.1:{agent.port}"


async def test_caller_id_is_each_callers_own(gateway_path, echo_agent, register_agent, caller,
                                             other_caller):
    target = register_agent(echo_agent)
    alice, bob = caller, other_caller
    for who in (alice, bob, alice):
        async with sdk_client(target.gateway_base, streaming=False, headers=who.auth) as client:
            [reply] = await send_and_collect(client, f"hi from {who.client_id}")
        assert get_message_text(reply.event.message) == f"echo: hi from {who.client_id}"
    assert [r.header_values("x-kubemq-caller-id") for r in echo_agent.recorder.rpc()] == \
        [[alice.client_id], [bob.client_id], [alice.client_id]]
