"""``notifications/tools/list_changed`` with the official MCP Python SDK client: an open session
hears of registry changes it may see (a new a2a-sdk agent registered, one deregistered), in both
protocol eras -- the handshake era's ``GET /mcp`` stream named by the signed ``Mcp-Session-Id``,
and 2026-07-28's ``subscriptions/listen`` -- and the streams are bounded."""

from __future__ import annotations

import asyncio
import contextlib
import time

import httpx
import mcp_types as types
import pytest

from discovery.snapshots import SelectedAgent, snapshot_publish
from mcp_bridge import notify
from registry import services
from tests.mcp_bridge.clients import all_tools, with_client

LIST_CHANGED = "notifications/tools/list_changed"


async def _until(condition, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


class Heard:
    """The list_changed notifications a handshake-era client's message handler received."""

    def __init__(self) -> None:
        self.count = 0
        self.event = asyncio.Event()

    async def __call__(self, message) -> None:
        if getattr(message, "method", None) == LIST_CHANGED:
            self.count += 1
            self.event.set()

    async def next(self, seconds: float = 10.0) -> None:
        await asyncio.wait_for(self.event.wait(), seconds)
        self.event.clear()


def _streams(client_id: str) -> int:
    return sum(1 for listener in notify.notifier.listeners
               if listener.actor.client_id == client_id)


def test_a_handshake_era_session_hears_of_an_agent_registered_and_deregistered(
        live_server_url, api, register_agent, echo_agent_factory, caller):
    first = register_agent(echo_agent_factory())
    heard = Heard()

    async def use(client):
        # The client opens its GET stream with the session id initialize answered.
        await _until(lambda: _streams(caller.client_id) == 1)
        before = {tool.name for tool in await all_tools(client)}
        second = await asyncio.to_thread(register_agent, echo_agent_factory())
        await heard.next()
        after = {tool.name for tool in await all_tools(client)}
        response = await asyncio.to_thread(api.delete, f"/api/v1/agents/{first.agent_id}")
        assert response.status_code == 204, response.text
        await heard.next()
        last = {tool.name for tool in await all_tools(client)}
        return before, second, after, last

    before, second, after, last = asyncio.run(asyncio.wait_for(with_client(
        live_server_url, caller.token, use, mode="legacy", message_handler=heard), 60))

    assert before == {first.agent_id, "get_task"}
    assert after == {first.agent_id, second.agent_id, "get_task"}
    assert last == {second.agent_id, "get_task"}
    assert heard.count == 2


def test_a_2026_listen_stream_hears_of_a_new_agent(
        live_server_url, register_agent, echo_agent_factory, caller):
    async def use(client):
        assert client.session.server_capabilities.tools.list_changed
        async with client.listen(tools_list_changed=True) as subscription:
            agent = await asyncio.to_thread(register_agent, echo_agent_factory())
            event = await asyncio.wait_for(anext(subscription), 10)
            tools = {tool.name for tool in await all_tools(client)}
        return agent, event, tools

    agent, event, tools = asyncio.run(asyncio.wait_for(
        with_client(live_server_url, caller.token, use), 60))

    assert type(event).__name__ == "ToolsListChanged"
    assert agent.agent_id in tools


def test_only_changes_the_caller_may_see_are_notified(
        live_server_url, register_agent, echo_agent_factory, make_caller):
    mine = "echo-mine-" + str(time.monotonic_ns())[-6:]
    scoped = make_caller(agents=[mine])
    heard = Heard()

    async def use(client):
        await _until(lambda: _streams(scoped.client_id) == 1)
        await asyncio.to_thread(register_agent, echo_agent_factory())  # not callable by it
        with contextlib.suppress(TimeoutError):
            await heard.next(1.0)
        quiet = heard.count
        await asyncio.to_thread(register_agent, echo_agent_factory(), mine)
        await heard.next()
        return quiet, {tool.name for tool in await all_tools(client)}

    quiet, tools = asyncio.run(asyncio.wait_for(with_client(
        live_server_url, scoped.token, use, mode="legacy", message_handler=heard), 60))

    assert quiet == 0
    assert tools == {mine, "get_task"}


def test_a_pinned_session_hears_only_of_its_snapshots_agents(
        live_server_url, register_agent, echo_agent_factory, caller):
    pinned = register_agent(echo_agent_factory())
    snapshot = snapshot_publish(agents=[SelectedAgent(
        local_name="pinned", description="Reviewed.", agent_id=pinned.agent_id,
        card_sha256="0" * 64, card_url="", source="static")])[0]
    heard = Heard()

    async def use(client):
        await _until(lambda: _streams(caller.client_id) == 1)
        await asyncio.to_thread(register_agent, echo_agent_factory())  # outside the snapshot
        with contextlib.suppress(TimeoutError):
            await heard.next(1.0)
        return heard.count, {tool.name for tool in await all_tools(client)}

    count, tools = asyncio.run(asyncio.wait_for(with_client(
        live_server_url, caller.token, use, mode="legacy", message_handler=heard,
        path=f"/mcp?snapshot={snapshot.digest}"), 60))

    assert count == 0
    assert tools == {pinned.agent_id, "get_task"}


def _session_id(base_url: str, token: str) -> str:
    response = httpx.post(f"{base_url}/mcp", headers={
        "Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream"},
        json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "1"}}})
    assert response.status_code == 200, response.text
    return response.headers["mcp-session-id"]


@pytest.fixture
def few_streams(settings) -> None:
    settings.A2A_MCP_MAX_STREAMS_PER_CLIENT = 2
    settings.A2A_MCP_KEEPALIVE_SECONDS = 0.3


def test_streams_are_bounded_per_client_kept_alive_and_bound_to_their_client(
        few_streams, live_server_url, caller, make_caller):
    session_id = _session_id(live_server_url, caller.token)
    other = make_caller()
    sse = {"Accept": "text/event-stream", "Mcp-Session-Id": session_id}

    def headers(token: str, **extra: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}", **sse, **extra}

    with httpx.Client(base_url=live_server_url, timeout=10) as http:
        # Another client's token cannot open this session's stream; a forged id is unknown.
        stolen = http.get("/mcp", headers=headers(other.token))
        forged = http.get("/mcp", headers=headers(caller.token,
                                                  **{"Mcp-Session-Id": session_id + "x"}))
        missing = http.get("/mcp", headers={"Authorization": f"Bearer {caller.token}",
                                            "Accept": "text/event-stream"})
        unauthenticated = http.get("/mcp", headers=sse)
        with http.stream("GET", "/mcp", headers=headers(caller.token)) as one, \
                http.stream("GET", "/mcp", headers=headers(caller.token)) as two:
            assert one.status_code == two.status_code == 200
            third = http.get("/mcp", headers=headers(caller.token))
            lines = one.iter_lines()
            frames = [next(lines) for _ in range(5)]
        # Both slots are free again once their clients left.
        asyncio.run(_until(lambda: _streams(caller.client_id) == 0, 5))
        with http.stream("GET", "/mcp", headers=headers(caller.token)) as again:
            again_status = again.status_code

    assert stolen.status_code == 404 and forged.status_code == 404
    assert missing.status_code == 400
    assert unauthenticated.status_code == 401
    assert third.status_code == 429 and "A2A_MCP_MAX_STREAMS_PER_CLIENT" in third.text
    assert frames[0] == "retry: 1000" and ": keepalive" in frames
    assert again_status == 200


def test_a_revoked_token_ends_its_stream(settings, live_server_url, caller):
    settings.A2A_MCP_KEEPALIVE_SECONDS = 0.3
    settings.A2A_AUTH_CACHE_SECONDS = 0.2
    session_id = _session_id(live_server_url, caller.token)
    with httpx.Client(base_url=live_server_url, timeout=10) as http, http.stream(
            "GET", "/mcp", headers={"Authorization": f"Bearer {caller.token}",
                                    "Accept": "text/event-stream",
                                    "Mcp-Session-Id": session_id}) as stream:
        assert stream.status_code == 200
        services.api_client_update(client_id=caller.client_id, revoked=True)
        started = time.monotonic()
        for _ in stream.iter_lines():  # ends when the server ends the stream
            assert time.monotonic() - started < 8
    # The listener is dropped as its stream's response ends, which the caller may see first.
    deadline = time.monotonic() + 3
    while _streams(caller.client_id) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _streams(caller.client_id) == 0


def test_the_2026_capability_and_the_handshake_capability_say_list_changed(
        live_server_url, caller):
    async def capabilities(client):
        return client.session.server_capabilities

    for mode in ("auto", "legacy"):
        caps = asyncio.run(with_client(live_server_url, caller.token, capabilities, mode=mode))
        assert isinstance(caps, types.ServerCapabilities) and caps.tools.list_changed
