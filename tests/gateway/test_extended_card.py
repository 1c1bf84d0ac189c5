"""The extended agent card (A2A's ``GetExtendedAgentCard``) through the gateway, with real SDK
agents: answered on every binding only to authenticated callers allowed to call the agent, and
pointed at the gateway like the public card (the agent's own URLs never reach the caller)."""

from __future__ import annotations

import httpx
import pytest
from a2a.types import GetExtendedAgentCardRequest

from tests.a2a_agents import HTTP_JSON_BINDING, JSONRPC_BINDING, sdk_client


def card_urls(card: dict) -> list[str]:
    urls = [card["url"]] if "url" in card else []
    for key in ("supportedInterfaces", "additionalInterfaces"):
        urls += [i["url"] for i in card.get(key) or []]
    return urls


def assert_extended(card: dict, target, agent) -> None:
    assert "secret" in [s["id"] for s in card["skills"]]  # the extended card, not the public one
    urls = card_urls(card)
    assert urls and set(urls) == {target.gateway_base}, urls
    assert f":{agent.port}" not in str(card)


def rpc(method: str) -> dict:
    return {"jsonrpc": "2.0", "id": 7, "method": method, "params": {}}


@pytest.mark.parametrize("own_rest", [False, True], ids=["translated", "forwarded"])
async def test_extended_card_on_every_http_binding_rewritten(echo_agent_factory, register_agent,
                                                             caller, own_rest):
    interfaces = [(HTTP_JSON_BINDING, "1.0"), (JSONRPC_BINDING, "1.0"), (JSONRPC_BINDING, "0.3")] \
        if own_rest else None
    agent = echo_agent_factory(card_shape="both", extended=True, interfaces=interfaces)
    target = register_agent(agent)
    async with httpx.AsyncClient(timeout=30, headers=caller.auth) as http:
        # JSON-RPC, 1.0 and 0.3 method names: the result rewritten, the rest unchanged.
        r10 = await http.post(target.gateway_base, json=rpc("GetExtendedAgentCard"),
                              headers={"A2A-Version": "1.0"})
        assert r10.status_code == 200 and "result" in r10.json(), r10.text
        assert_extended(r10.json()["result"], target, agent)
        assert int(r10.headers["content-length"]) == len(r10.content)
        r03 = await http.post(target.gateway_base,
                              json=rpc("agent/getAuthenticatedExtendedCard"))
        assert r03.status_code == 200, r03.text
        assert "result" in r03.json(), r03.text
        assert_extended(r03.json()["result"], target, agent)
        # HTTP+JSON: 1.0 and the 0.3 route.
        rest = await http.get(f"{target.gateway_base}extendedAgentCard",
                              headers={"A2A-Version": "1.0"})
        assert rest.status_code == 200, rest.text
        assert_extended(rest.json(), target, agent)
        old = await http.get(f"{target.gateway_base}v1/card")
        assert old.status_code == 200, old.text
        assert_extended(old.json(), target, agent)
    # A stock SDK client restricted to HTTP+JSON reads it through the gateway.
    async with sdk_client(target.gateway_base, bindings=[HTTP_JSON_BINDING], streaming=False,
                          headers=caller.auth) as client:
        card = await client.get_extended_agent_card(GetExtendedAgentCardRequest())
    assert "secret" in [s.id for s in card.skills]
    assert {i.url for i in card.supported_interfaces} == {target.gateway_base}
    if own_rest:  # forwarded to the agent's own HTTP+JSON interface
        assert [r.path for r in agent.requests if r.path.startswith("/rest")] == \
            ["/rest/extendedAgentCard", "/rest/v1/card", "/rest/extendedAgentCard"]
    else:  # translated to its JSON-RPC
        assert [r.rpc_method for r in agent.recorder.rpc()] == [
            "GetExtendedAgentCard", "agent/getAuthenticatedExtendedCard",
            "GetExtendedAgentCard", "GetExtendedAgentCard", "GetExtendedAgentCard"]


@pytest.fixture
def stranger(make_caller):
    """A caller allowed to call another agent only."""
    return make_caller(agents=["someone-else"])


async def test_extended_card_only_for_authenticated_callers_allowed(
        echo_agent_factory, register_agent, stranger, settings):
    agent = echo_agent_factory(card_shape="both", extended=True)
    target = register_agent(agent)
    async with httpx.AsyncClient(timeout=30) as http:
        for method in ("GetExtendedAgentCard", "agent/getAuthenticatedExtendedCard"):
            r = await http.post(target.gateway_base, json=rpc(method),
                                headers={**stranger.auth, "A2A-Version": "1.0"})
            assert r.status_code == 403 and r.json()["error"]["data"]["kind"] == "forbidden"
        r = await http.get(f"{target.gateway_base}extendedAgentCard")
        assert r.status_code == 401 and r.json()["error"]["status"] == "UNAUTHENTICATED"

        # Anonymous access on: an anonymous caller may call the agent, but gets no extended card.
        settings.A2A_ALLOW_ANONYMOUS = True
        sent = await http.post(f"{target.gateway_base}message:send", json={
            "message": {"messageId": "a1", "role": "ROLE_USER", "parts": [{"text": "hi"}]}})
        assert sent.status_code == 200, sent.text
        seen = len(agent.requests)
        r = await http.post(target.gateway_base, json=rpc("GetExtendedAgentCard"),
                            headers={"A2A-Version": "1.0"})
        assert r.status_code == 401 and r.json()["id"] == 7
        assert r.json()["error"]["data"]["kind"] == "unauthenticated"
        assert r.headers["x-a2a-executed"] == "false"
        for path in ("extendedAgentCard", "v1/card"):
            r = await http.get(f"{target.gateway_base}{path}")
            assert r.status_code == 401 and r.json()["error"]["status"] == "UNAUTHENTICATED"
        assert len(agent.requests) == seen  # none reached the agent


@pytest.fixture
def grpc_listener(settings):
    """The node's gRPC listener on a free port (set before the live server starts)."""
    settings.A2A_GRPC_PORT = 0


async def test_extended_card_over_grpc(grpc_listener, echo_agent_factory, register_agent,
                                       caller, settings):
    import grpc
    from a2a.types import a2a_pb2
    from a2a.types import a2a_pb2_grpc as grpc10

    from core import lifecycle as node_config
    from tests.gateway.test_grpc_binding import on_node

    agent = echo_agent_factory(card_shape="both", extended=True)
    target = register_agent(agent)
    settings.A2A_PUBLIC_BASE_URL = "https://gateway.example"
    address = f"127.0.0.1:{node_config.grpc_port()}"
    request = a2a_pb2.GetExtendedAgentCardRequest(tenant=target.agent_id)

    async def call(metadata):
        async with grpc.aio.insecure_channel(address) as channel:
            return await grpc10.A2AServiceStub(channel).GetExtendedAgentCard(
                request, metadata=metadata)

    card = await on_node(call((("authorization", f"Bearer {caller.token}"),)))
    assert "secret" in [s.id for s in card.skills]
    base = f"https://gateway.example/a2a/{target.agent_id}/"
    assert [(i.url, i.protocol_binding) for i in card.supported_interfaces] == [
        (base, "JSONRPC"), (base, "JSONRPC"), (base, "HTTP+JSON"), (base, "HTTP+JSON"),
        (f"gateway.example:{node_config.grpc_port()}", "GRPC")]
    settings.A2A_ALLOW_ANONYMOUS = True
    seen = len(agent.requests)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await on_node(call(()))
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert len(agent.requests) == seen
