"""Self-test of the SDK echo agents (tests/a2a_agents.py), called directly with the SDK's own
client: no gateway. Proves the fixtures the gateway tests rely on do what they claim."""

from __future__ import annotations

import httpx
import pytest
from a2a.helpers import get_message_text
from a2a.types import CancelTaskRequest, GetTaskRequest, TaskNotFoundError, TaskState

from tests import a2a_agents
from tests.a2a_agents import sdk_client, send_and_collect, transport_name

# The agents' fixtures live in tests/a2a_agents.py; bind them here (tests/gateway/conftest.py
# does the same for the gateway tests).
echo_agent_factory = a2a_agents.echo_agent_factory
echo_agent = a2a_agents.echo_agent

# card shape -> (SDK transport the client picks, JSON-RPC method names the agent receives)
PROTOCOLS = {
    "1.0": ("JsonRpcTransport",
            {"send": "SendMessage", "stream": "SendStreamingMessage", "get": "GetTask",
             "cancel": "CancelTask"}),
    "0.3": ("CompatJsonRpcTransport",
            {"send": "message/send", "stream": "message/stream", "get": "tasks/get",
             "cancel": "tasks/cancel"}),
}


def test_card_shapes(echo_agent_factory):
    one = httpx.get(f"{echo_agent_factory(card_shape='1.0').base_url}"
                    "/.well-known/agent-card.json").json()
    assert "url" not in one
    assert [(i["protocolBinding"], i["protocolVersion"]) for i in one["supportedInterfaces"]] \
        == [("JSONRPC", "1.0")]

    old = httpx.get(f"{echo_agent_factory(card_shape='0.3').base_url}"
                    "/.well-known/agent-card.json").json()
    assert "supportedInterfaces" not in old
    assert old["url"].startswith("http://127.0.0.1:")
    assert (old["protocolVersion"], old["preferredTransport"]) == ("0.3", "JSONRPC")

    both_agent = echo_agent_factory(card_shape="both")
    both = httpx.get(f"{both_agent.base_url}/.well-known/agent-card.json").json()
    assert both["url"] == both_agent.url
    assert [i["protocolVersion"] for i in both["supportedInterfaces"]] == ["1.0", "0.3"]


@pytest.mark.parametrize("shape", ["1.0", "0.3"])
async def test_send_stream_get_cancel(echo_agent_factory, shape):
    agent = echo_agent_factory(card_shape=shape, steps=4, step_delay=0.15)
    transport, names = PROTOCOLS[shape]

    async with sdk_client(agent.base_url, streaming=False,
                          headers={"X-Trace-Token": "abc"}) as client:
        assert transport_name(client) == transport
        [reply] = await send_and_collect(client, "hello")
        assert reply.kind == "message"
        assert get_message_text(reply.event.message) == "echo: hello"

        [done] = await send_and_collect(client, "task one")
        assert done.kind == "task"
        assert done.event.task.status.state == TaskState.TASK_STATE_COMPLETED
        assert len(done.event.task.artifacts) == 4

    async with sdk_client(agent.base_url, streaming=True) as client:
        arrivals = await send_and_collect(client, "task streamed")
    kinds = [a.kind for a in arrivals]
    assert kinds == ["task", "status_update"] + ["artifact_update"] * 4 + ["status_update"]
    chunks = [a.event.artifact_update.artifact.parts[0].text for a in arrivals[2:6]]
    assert chunks == [f"chunk {i}: task streamed" for i in range(4)]
    assert arrivals[-1].event.status_update.status.state == TaskState.TASK_STATE_COMPLETED
    # Incremental: the artifacts arrive step_delay apart, not all at the end.
    gaps = [b.at - a.at for a, b in zip(arrivals[1:5], arrivals[2:6], strict=True)]
    assert all(gap > 0.08 for gap in gaps), gaps

    async with sdk_client(agent.base_url, streaming=False, polling=True) as client:
        [first] = await send_and_collect(client, "wait for cancel")
        task_id = first.event.task.id
        assert first.event.task.status.state in (TaskState.TASK_STATE_SUBMITTED,
                                                 TaskState.TASK_STATE_WORKING)
        got = await client.get_task(GetTaskRequest(id=task_id))
        assert got.id == task_id
        assert got.status.state == TaskState.TASK_STATE_WORKING
        cancelled = await client.cancel_task(CancelTaskRequest(id=task_id))
        assert cancelled.status.state == TaskState.TASK_STATE_CANCELED
        assert agent.executor.cancelled == [task_id]
        with pytest.raises(TaskNotFoundError):  # the agent's own -32001, mapped by the SDK
            await client.get_task(GetTaskRequest(id="no-such-task"))

    rpc = [r.rpc_method for r in agent.recorder.rpc()]
    assert rpc == [names["send"], names["send"], names["stream"], names["send"], names["get"],
                   names["cancel"], names["get"]]
    first_call = agent.recorder.rpc()[0]
    assert first_call.header("x-trace-token") == "abc"
    assert first_call.header("a2a-version") == shape


async def test_version_header_decides(echo_agent):
    """The SDK agent refuses 1.0 method names without ``A2A-Version: 1.0`` -- so a proxy that
    drops that header breaks every A2A 1.0 client."""
    body = {"jsonrpc": "2.0", "id": 7, "method": "SendMessage",
            "params": {"message": {"messageId": "m1", "role": "ROLE_USER",
                                   "parts": [{"text": "hi"}]}}}
    async with httpx.AsyncClient() as http:
        without = (await http.post(echo_agent.url, json=body)).json()
        with_header = (await http.post(echo_agent.url, json=body,
                                       headers={"A2A-Version": "1.0"})).json()
    assert without["id"] == 7 and "error" in without
    assert with_header["result"]["message"]["parts"][0]["text"] == "echo: hi"
