"""The card served through the gateway lists only the interfaces the gateway answers.

The agent is the SDK's own server (tests/a2a_agents.py) listing all three A2A bindings, gRPC
first: it serves JSON-RPC and HTTP+JSON for real and lists a gRPC address nothing serves. The
gateway answers JSON-RPC, and HTTP+JSON for an agent that offers it, but not gRPC, so its card
must list the agent's JSON-RPC and HTTP+JSON interfaces alone, at the gateway: a stock SDK
client that accepts every binding and follows the card then works through the gateway
(directly, the same client picks gRPC), and a client that speaks only HTTP+JSON works through
the gateway too (tests/gateway/test_rest_binding.py covers that binding).
"""

from __future__ import annotations

import hashlib

import httpx
import pytest
from a2a.client import client_factory as client_factory_module
from a2a.helpers import get_message_text
from a2a.types import TaskState

from tests.a2a_agents import (
    ALL_BINDINGS,
    GRPC_BINDING,
    HTTP_JSON_BINDING,
    JSONRPC_BINDING,
    sdk_client,
    send_and_collect,
    transport_name,
)

ORDER = [GRPC_BINDING, JSONRPC_BINDING, HTTP_JSON_BINDING]
# card shape -> (the agent's interfaces, the SDK transport a client picks through the gateway,
# the JSON-RPC method names the agent then receives for a send and a stream)
SHAPES = {
    "1.0": ([(b, "1.0") for b in ORDER], "JsonRpcTransport",
            ["SendMessage", "SendStreamingMessage"]),
    "0.3": ([(b, "0.3") for b in ORDER], "CompatJsonRpcTransport",
            ["message/send", "message/stream"]),
    "both": ([(b, "1.0") for b in ORDER] + [(b, "0.3") for b in ORDER], "JsonRpcTransport",
             ["SendMessage", "SendStreamingMessage"]),
}


def gateway_card(target) -> httpx.Response:
    response = httpx.get(f"{target.gateway_base}.well-known/agent-card.json")
    assert response.status_code == 200, response.text
    return response


def test_served_card_lists_only_the_bindings_the_gateway_answers(echo_agent_factory,
                                                                 register_agent,
                                                                 live_server_url, caller):
    agent = echo_agent_factory(interfaces=SHAPES["both"][0])
    target = register_agent(agent)
    gw = target.gateway_base
    own = agent.card_document
    assert [i["protocolBinding"] for i in own["supportedInterfaces"]] == ORDER * 2
    assert own["preferredTransport"] == GRPC_BINDING

    response = gateway_card(target)
    card = response.json()
    assert card["supportedInterfaces"] == [
        {"url": gw, "protocolBinding": "JSONRPC", "protocolVersion": "1.0"},
        {"url": gw, "protocolBinding": "HTTP+JSON", "protocolVersion": "1.0"},
        {"url": gw, "protocolBinding": "JSONRPC", "protocolVersion": "0.3"},
        {"url": gw, "protocolBinding": "HTTP+JSON", "protocolVersion": "0.3"},
    ]
    # The 0.3 view agrees with it: JSON-RPC at the gateway, not the agent's gRPC address.
    assert (card["url"], card["preferredTransport"]) == (gw, "JSONRPC")
    assert card["additionalInterfaces"] == [{"transport": "JSONRPC", "url": gw},
                                            {"transport": "HTTP+JSON", "url": gw}]
    assert agent.grpc_address not in response.text and agent.base_url not in response.text
    # ETag over the bytes served.
    digest = hashlib.sha256(response.content).hexdigest()[:32]
    assert response.headers["etag"] == f'"{digest}"'

    # A caller reading the agent through the API or the KubeMQ surface sees the same card.
    seen = httpx.get(f"{live_server_url}/api/v1/agents/{target.agent_id}", headers=caller.auth)
    assert seen.status_code == 200, seen.text
    kubemq = httpx.get(f"{live_server_url}/agents/{target.agent_id}", headers=caller.auth)
    assert kubemq.status_code == 200, kubemq.text
    for view in (seen.json()["card"], kubemq.json()):
        assert view["supportedInterfaces"] == card["supportedInterfaces"]
        assert view["additionalInterfaces"] == card["additionalInterfaces"]
        assert (view["url"], view["preferredTransport"]) == (gw, "JSONRPC")


@pytest.mark.parametrize("shape", list(SHAPES))
async def test_client_accepting_every_binding_follows_the_card_through_the_gateway(
        echo_agent_factory, register_agent, caller, shape):
    interfaces, transport, methods = SHAPES[shape]
    agent = echo_agent_factory(card_shape="0.3" if shape == "0.3" else "both",
                               interfaces=interfaces)
    target = register_agent(agent)

    # Directly, the agent's own card sends this client to gRPC, listed first.
    with pytest.raises(Exception) as direct:
        async with sdk_client(agent.base_url, bindings=ALL_BINDINGS, streaming=False) as client:
            await send_and_collect(client, "hello")
    if client_factory_module.GrpcTransport is None:
        assert agent.grpc_address in str(direct.value)

    # Through the gateway the card drops gRPC (JSON-RPC comes first), and the same client works.
    async with sdk_client(target.gateway_base, bindings=ALL_BINDINGS, headers=caller.auth,
                          streaming=False) as client:
        assert transport_name(client) == transport
        [reply] = await send_and_collect(client, "hello")
    async with sdk_client(target.gateway_base, bindings=ALL_BINDINGS,
                          headers=caller.auth) as client:
        events = await send_and_collect(client, "task streamed")
    assert reply.kind == "message"
    assert get_message_text(reply.event.message) == "echo: hello"
    assert events[-1].event.status_update.status.state == TaskState.TASK_STATE_COMPLETED
    assert [a.event.artifact_update.artifact.parts[0].text for a in events
            if a.kind == "artifact_update"][0] == "chunk 0: task streamed"
    assert [r.rpc_method for r in agent.recorder.rpc()] == methods


async def test_rest_only_client_works_through_the_gateway(
        echo_agent_factory, register_agent, caller):
    agent = echo_agent_factory(interfaces=SHAPES["both"][0])
    target = register_agent(agent)

    # The agent serves HTTP+JSON: directly, a client speaking only that works.
    async with sdk_client(agent.base_url, bindings=[HTTP_JSON_BINDING],
                          streaming=False) as client:
        assert transport_name(client) == "RestTransport"
        [reply] = await send_and_collect(client, "hello")
    assert get_message_text(reply.event.message) == "echo: hello"
    assert [r.path for r in agent.requests if r.http_method == "POST"] == [
        "/rest/message:send"]

    # Through the gateway, the same client finds HTTP+JSON in the gateway's card and works.
    async with sdk_client(target.gateway_base, bindings=[HTTP_JSON_BINDING],
                          headers=caller.auth, streaming=False) as client:
        assert transport_name(client) == "RestTransport"
        [reply] = await send_and_collect(client, "again")
    assert get_message_text(reply.event.message) == "echo: again"
    assert [r.path for r in agent.requests if r.http_method == "POST"][-1] == \
        "/rest/message:send"
    # A client preferring JSON-RPC but able to take HTTP+JSON takes the gateway's JSON-RPC.
    async with sdk_client(target.gateway_base, bindings=[JSONRPC_BINDING, HTTP_JSON_BINDING],
                          client_preference=True, headers=caller.auth,
                          streaming=False) as client:
        assert transport_name(client) == "JsonRpcTransport"
        [reply] = await send_and_collect(client, "once more")
    assert get_message_text(reply.event.message) == "echo: once more"
    assert [r.path for r in agent.requests if r.http_method == "POST"][-1] == "/"
