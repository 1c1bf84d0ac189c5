"""``/mcp`` with the official MCP Python SDK client against the live platform and real a2a-sdk
agents: tools listed per caller, calls through the gateway, errors as tool errors, auth."""

from __future__ import annotations

import asyncio
import contextlib
import time

import httpx
import orjson
import pytest
from mcp.shared.exceptions import MCPError

from discovery.snapshots import SelectedAgent, snapshot_publish
from tests.gateway.test_proxy import _metric
from tests.mcp_bridge.clients import all_tools, run
from tests.servers import free_port

MODES = ["auto", "legacy"]  # the 2026 per-request protocol, and the initialize handshake


@pytest.mark.parametrize("mode", MODES)
def test_tools_list_shows_the_callable_agents_with_their_cards(
        live_server_url, register_agent, echo_agent_factory, caller, mode):
    both = register_agent(echo_agent_factory(card_shape="both", name="Echo Both"))
    v10 = register_agent(echo_agent_factory(card_shape="1.0", name="Echo Ten"))

    tools = run(live_server_url, caller.token, all_tools, mode=mode)

    by_name = {tool.name: tool for tool in tools}
    assert set(by_name) == {both.agent_id, v10.agent_id, "get_task"}
    assert by_name[both.agent_id].title == "Echo Both"
    assert by_name[v10.agent_id].title == "Echo Ten"
    description = by_name[both.agent_id].description
    assert "Echoes messages" in description and "Echo -- Echoes the input." in description
    schema = by_name[both.agent_id].input_schema
    assert schema["required"] == ["message"]
    assert set(schema["properties"]) == {"message", "context_id", "task_id"}
    assert by_name["get_task"].input_schema["required"] == ["agent_id", "task_id"]


@pytest.mark.parametrize("mode", MODES)
def test_a_call_goes_through_the_gateway_and_continues_the_conversation(
        live_server_url, register_agent, echo_agent_factory, caller, mode):
    v03 = register_agent(echo_agent_factory(card_shape="0.3"))
    v10 = register_agent(echo_agent_factory(card_shape="1.0"))

    async def use(client):
        first = await client.call_tool(v03.agent_id, {"message": "hello"})
        again = await client.call_tool(v03.agent_id, {
            "message": "more", "context_id": first.structured_content["context_id"]})
        ten = await client.call_tool(v10.agent_id, {"message": "hi ten"})
        return first, again, ten

    first, again, ten = run(live_server_url, caller.token, use, mode=mode)

    assert not first.is_error and first.content[0].text == "echo: hello"
    assert not again.is_error and again.content[0].text == "echo: more"
    assert again.structured_content["context_id"] == first.structured_content["context_id"]
    assert not ten.is_error and ten.content[0].text == "echo: hi ten"
    # Each agent got its own protocol's (streaming: the cards say so) method, with the caller's
    # identity from the gateway.
    posts = [r for r in v03.agent.requests if r.http_method == "POST"]
    assert [r.rpc_method for r in posts] == ["message/stream", "message/stream"]
    assert posts[0].header("x-kubemq-caller-id") == caller.client_id
    second = orjson.loads(posts[1].body)["params"]["message"]
    assert second["contextId"] == first.structured_content["context_id"]
    assert [r.rpc_method for r in v10.agent.requests if r.http_method == "POST"] \
        == ["SendStreamingMessage"]
    # The gateway's metrics counted the calls, as for any caller.
    metrics = httpx.get(f"{live_server_url}/metrics").text
    assert _metric(metrics, "kubemq_a2a_requests_total", agent_id=v03.agent_id,
                   method="message/stream") == 2
    assert _metric(metrics, "kubemq_a2a_request_duration_seconds_count",
                   agent_id=v10.agent_id, outcome="ok") == 1


@pytest.mark.parametrize("card_shape", ["0.3", "1.0"])
def test_an_agent_that_does_not_stream_gets_the_blocking_send(
        live_server_url, register_agent, echo_agent_factory, caller, card_shape):
    echo = echo_agent_factory(card_shape=card_shape)
    echo.card_document = {**echo.card_document, "capabilities": {"streaming": False}}
    agent = register_agent(echo)

    async def use(client):
        return await client.call_tool(agent.agent_id, {"message": "blocking"})

    result = run(live_server_url, caller.token, use)

    assert not result.is_error and result.content[0].text == "echo: blocking"
    assert [r.rpc_method for r in echo.requests if r.http_method == "POST"] \
        == ["message/send" if card_shape == "0.3" else "SendMessage"]


def test_a_task_returns_its_artifacts_and_can_be_read_again_with_get_task(
        live_server_url, register_agent, echo_agent_factory, caller):
    agent = register_agent(echo_agent_factory(card_shape="both", steps=2, step_delay=0.01))

    async def use(client):
        done = await client.call_tool(agent.agent_id, {"message": "task one"})
        task_id = done.structured_content["task_id"]
        read = await client.call_tool("get_task", {"agent_id": agent.agent_id,
                                                   "task_id": task_id})
        unknown = await client.call_tool("get_task", {"agent_id": agent.agent_id,
                                                      "task_id": "no-such-task"})
        return done, read, unknown

    done, read, unknown = run(live_server_url, caller.token, use)

    texts = [block.text for block in done.content]
    assert not done.is_error and done.structured_content["state"] == "completed"
    assert "chunk 1: task one" in texts and "done: task one" in texts
    assert not read.is_error and read.structured_content["state"] == "completed"
    assert read.structured_content["task_id"] == done.structured_content["task_id"]
    # The agent's own JSON-RPC error (TaskNotFound) is a tool error naming it.
    assert unknown.is_error and unknown.content[0].text.startswith("agent error -32001")


def test_an_agent_taking_json_gets_a_data_part(
        live_server_url, register_agent, echo_agent_factory, caller):
    echo = echo_agent_factory(card_shape="0.3")
    echo.card_document = {**echo.card_document,
                          "defaultInputModes": ["text/plain", "application/json"]}
    agent = register_agent(echo)

    async def use(client):
        tools = {tool.name: tool for tool in await all_tools(client)}
        result = await client.call_tool(agent.agent_id, {"message": "with data",
                                                         "data": {"invoice": 42}})
        return tools[agent.agent_id], result

    tool, result = run(live_server_url, caller.token, use)

    assert tool.input_schema["properties"]["data"]["type"] == "object"
    assert not result.is_error and result.content[0].text == "echo: with data"
    sent = orjson.loads(echo.requests[-1].body)["params"]["message"]["parts"]
    assert sent == [{"kind": "text", "text": "with data"},
                    {"kind": "data", "data": {"invoice": 42}}]


@pytest.mark.parametrize(("mode", "card_shape"),
                         [("auto", "both"), ("legacy", "both"), ("auto", "1.0")])
def test_a_streaming_agent_reports_progress_while_its_task_runs(
        live_server_url, register_agent, echo_agent_factory, caller, mode, card_shape):
    agent = register_agent(echo_agent_factory(steps=3, step_delay=0.05, card_shape=card_shape))
    seen: list[tuple[float, str | None]] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        seen.append((value, message))

    async def use(client):
        return await client.call_tool(agent.agent_id, {"message": "task many"},
                                      progress_callback=progress)

    result = run(live_server_url, caller.token, use, mode=mode)

    assert not result.is_error and result.structured_content["state"] == "completed"
    texts = [block.text for block in result.content]
    assert texts[:3] == ["chunk 0: task many", "chunk 1: task many", "chunk 2: task many"]
    assert "done: task many" in texts
    messages = [message for _, message in seen]
    assert any(m and m.startswith("working") for m in messages), messages
    assert messages.count("artifact echo") == 3, messages
    assert [value for value, _ in seen] == sorted(value for value, _ in seen)


@pytest.mark.parametrize("mode", MODES)
def test_cancelling_a_call_cancels_the_a2a_task(
        live_server_url, register_agent, echo_agent, caller, mode):
    """The 2026-07-28 client cancels by closing the call's response; the handshake-era client
    sends ``notifications/cancelled`` (which a stateless server cannot relate to the call) and
    closes the response when it disconnects: the A2A task is cancelled then."""
    agent = register_agent(echo_agent)
    working = asyncio.Event()

    async def progress(value: float, total: float | None, message: str | None) -> None:
        if message and message.startswith("working"):
            working.set()

    async def use(client):
        call = asyncio.create_task(client.call_tool(
            agent.agent_id, {"message": "wait for me"}, progress_callback=progress))
        await asyncio.wait_for(working.wait(), 30)
        call.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await call

    run(live_server_url, caller.token, use, mode=mode)
    # Bounded wait for the agent to be told (the bridge cancels in the background).
    deadline = time.monotonic() + 15
    while not echo_agent.executor.cancelled and time.monotonic() < deadline:
        time.sleep(0.05)

    assert len(echo_agent.executor.cancelled) == 1
    methods = [r.rpc_method for r in echo_agent.requests if r.http_method == "POST"]
    assert methods == ["message/stream", "tasks/cancel"]


def test_gateway_errors_are_tool_errors_that_say_what_happened(
        live_server_url, api, caller):
    dead = f"http://127.0.0.1:{free_port()}/"  # nothing listens there
    response = api.post("/api/v1/agents", json={
        "agent_id": "gone-agent", "url": dead, "card": {"name": "Gone", "url": dead}})
    assert response.status_code == 201, response.text

    async def use(client):
        return await client.call_tool("gone-agent", {"message": "anyone?"})

    result = run(live_server_url, caller.token, use)

    assert result.is_error
    text = result.content[0].text
    assert text.startswith("gateway error (unreachable): agent unreachable"), text
    assert "never received the request" in text
    assert result.structured_content == {"agent_id": "gone-agent", "kind": "unreachable",
                                         "executed": False, "retryable": True}


def test_bad_arguments_and_unknown_tools_are_refused_clearly(
        live_server_url, register_agent, echo_agent, caller):
    agent = register_agent(echo_agent)

    async def use(client):
        missing = await client.call_tool(agent.agent_id, {"text": "wrong name"})
        try:
            await client.call_tool("no-such-agent", {"message": "x"})
        except MCPError as exc:
            return missing, exc
        raise AssertionError("an unknown tool was called")

    missing, unknown = run(live_server_url, caller.token, use)

    assert missing.is_error and "invalid arguments" in missing.content[0].text
    assert agent.agent.requests == []  # nothing reached the agent
    assert unknown.code == -32602 and "unknown tool: no-such-agent" in unknown.message


def test_a_scoped_client_sees_and_calls_only_its_agents(
        live_server_url, register_agent, echo_agent_factory, make_caller):
    mine = register_agent(echo_agent_factory())
    other = register_agent(echo_agent_factory())
    scoped = make_caller(agents=[mine.agent_id])

    async def use(client):
        tools = await all_tools(client)
        ok = await client.call_tool(mine.agent_id, {"message": "mine"})
        task = await client.call_tool("get_task", {"agent_id": other.agent_id, "task_id": "t"})
        try:
            await client.call_tool(other.agent_id, {"message": "not mine"})
        except MCPError as exc:
            return tools, ok, task, exc
        raise AssertionError("a scoped client called an agent outside its list")

    tools, ok, task, refused = run(live_server_url, scoped.token, use)

    assert {tool.name for tool in tools} == {mine.agent_id, "get_task"}
    assert not ok.is_error and ok.content[0].text == "echo: mine"
    assert task.is_error and task.content[0].text == f"unknown agent: {other.agent_id}"
    assert refused.code == -32602 and other.agent_id in refused.message
    assert other.agent.requests == []


def test_without_a_valid_token_mcp_answers_401_naming_the_resource_metadata(
        live_server_url, caller):
    ping = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    headers = {"Accept": "application/json, text/event-stream"}
    missing = httpx.post(f"{live_server_url}/mcp", json=ping, headers=headers)
    wrong = httpx.post(f"{live_server_url}/mcp", json=ping,
                       headers={**headers, "Authorization": "Bearer abcdefgh.not-a-real-token"})
    metadata = httpx.get(f"{live_server_url}/.well-known/oauth-protected-resource/mcp")

    for response in (missing, wrong):
        assert response.status_code == 401, response.text
        challenge = response.headers["www-authenticate"]
        assert challenge.startswith("Bearer ")
        assert f'resource_metadata="{live_server_url}/.well-known/oauth-protected-resource/mcp"' \
            in challenge
        assert response.json()["error"]
    assert metadata.status_code == 200
    assert metadata.json()["resource"] == f"{live_server_url}/mcp"
    assert metadata.json()["bearer_methods_supported"] == ["header"]

    # The SDK client gets no tools without a token, and says why.
    with pytest.raises(Exception) as refused:
        run(live_server_url, None, all_tools)
    assert "authentication required: send Authorization: Bearer <token>" in repr(refused.value)
    # A valid token passes.
    assert run(live_server_url, caller.token, all_tools) == []


def test_reviewed_descriptions_win_over_card_text(
        live_server_url, register_agent, echo_agent_factory, caller, settings):
    reviewed = register_agent(echo_agent_factory())
    plain = register_agent(echo_agent_factory())
    snapshot_publish(agents=[SelectedAgent(
        local_name="reviewed_echo", description="Operator-reviewed: echoes text back.",
        agent_id=reviewed.agent_id, card_sha256="0" * 64, card_url="", source="static")])

    with_cards = {t.name: t.description for t in run(live_server_url, caller.token, all_tools)}
    settings.A2A_MCP_CARD_DESCRIPTIONS = False
    without = {t.name: t.description for t in run(live_server_url, caller.token, all_tools)}

    assert with_cards[reviewed.agent_id] == "Operator-reviewed: echoes text back."
    assert "Echoes messages" in with_cards[plain.agent_id]
    assert without[reviewed.agent_id] == "Operator-reviewed: echoes text back."
    assert without[plain.agent_id] == f"The A2A agent {plain.agent_id} (Echo Agent)."


@pytest.fixture
def small_request_cap(settings) -> int:
    """A 64 KiB request cap, set before the live server starts its node and bridge."""
    settings.A2A_MAX_REQUEST_BYTES = 64 * 1024
    return settings.A2A_MAX_REQUEST_BYTES


def test_huge_arguments_are_refused_at_the_gateways_request_cap(
        small_request_cap, live_server_url, register_agent, echo_agent, caller):
    agent = register_agent(echo_agent)
    huge = "x" * (small_request_cap + 1)

    async def use(client):
        try:
            await client.call_tool(agent.agent_id, {"message": huge})
        except MCPError as exc:
            return exc, await client.call_tool(agent.agent_id, {"message": "small"})
        raise AssertionError("a body above the cap was accepted")

    refused, small = run(live_server_url, caller.token, use)
    anonymous = httpx.post(f"{live_server_url}/mcp", content=b"x" * (2 * small_request_cap),
                           headers={"Content-Type": "application/json"})

    def chunks():  # no Content-Length: the cap is found while reading
        for _ in range(4):
            yield b"x" * (small_request_cap // 2)

    chunked = httpx.post(f"{live_server_url}/mcp", content=chunks(),
                         headers={"Content-Type": "application/json",
                                  "Authorization": f"Bearer {caller.token}"})

    assert refused.message == \
        f"request body larger than {small_request_cap} bytes (A2A_MAX_REQUEST_BYTES)"
    assert not small.is_error and small.content[0].text == "echo: small"
    assert [r.rpc_method for r in agent.agent.requests if r.http_method == "POST"] \
        == ["message/stream"]  # only the small call reached the agent
    assert anonymous.status_code == 401  # refused before its body is read
    assert chunked.status_code == 413
    assert chunked.json()["error"]["message"] == refused.message


def _listed(live_server_url: str, token: str, path: str) -> dict[str, str]:
    return {tool.name: tool.description
            for tool in run(live_server_url, token, all_tools, path=path)}


def test_a_url_pinned_to_a_discovery_session_keeps_its_tool_set(
        live_server_url, register_agent, echo_agent_factory, caller):
    first = register_agent(echo_agent_factory())
    later = register_agent(echo_agent_factory())

    def publish(descriptions: dict[str, str]):
        return snapshot_publish(agents=[SelectedAgent(
            local_name=agent_id.replace("-", "_"), description=text, agent_id=agent_id,
            card_sha256="0" * 64, card_url="", source="static")
            for agent_id, text in descriptions.items()])[0]

    old = publish({first.agent_id: "Reviewed, version 1."})
    pinned_before = _listed(live_server_url, caller.token, "/mcp?session=ide-1")
    publish({first.agent_id: "Reviewed, version 2.", later.agent_id: "Reviewed later."})
    pinned_after = _listed(live_server_url, caller.token, "/mcp?session=ide-1")
    new_session = _listed(live_server_url, caller.token, "/mcp?session=ide-2")
    by_digest = _listed(live_server_url, caller.token, f"/mcp?snapshot={old.digest}")

    async def call_outside(client):
        try:
            await client.call_tool(later.agent_id, {"message": "not in my snapshot"})
        except MCPError as exc:
            return exc, await client.call_tool(first.agent_id, {"message": "pinned"})
        raise AssertionError("an agent outside the pinned snapshot was called")

    refused, ok = run(live_server_url, caller.token, call_outside, path="/mcp?session=ide-1")

    async def unknown_snapshot(client):
        try:
            await client.list_tools()
        except MCPError as exc:
            return exc
        raise AssertionError("an unknown snapshot was listed")

    missing = run(live_server_url, caller.token, unknown_snapshot, path="/mcp?snapshot=abc")

    expected_old = {first.agent_id: "Reviewed, version 1.",
                    "get_task": pinned_before["get_task"]}
    assert pinned_before == expected_old
    assert pinned_after == expected_old  # the session keeps its snapshot
    assert by_digest == expected_old
    assert {k: v for k, v in new_session.items() if k != "get_task"} == {
        first.agent_id: "Reviewed, version 2.", later.agent_id: "Reviewed later."}
    assert refused.code == -32602 and f"unknown tool: {later.agent_id}" in refused.message
    assert not ok.is_error and ok.content[0].text == "echo: pinned"
    assert later.agent.requests == []
    assert missing.message == "snapshot not found: abc (evicted, or never published)"


@pytest.fixture
def tight_rate_limit(settings) -> None:
    """Two requests, then one per 100 s (set before the live server starts its node)."""
    settings.A2A_RATE_LIMIT_PER_SECOND = 0.01
    settings.A2A_RATE_LIMIT_BURST = 2


def test_the_gateways_rate_limits_apply_to_mcp(tight_rate_limit, live_server_url, make_caller):
    caller = make_caller()
    listing = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    headers = {"Accept": "application/json, text/event-stream",
               "MCP-Protocol-Version": "2025-11-25"}

    def post(token: str) -> httpx.Response:
        return httpx.post(f"{live_server_url}/mcp", json=listing,
                          headers={**headers, "Authorization": f"Bearer {token}"})

    other = make_caller()
    first_other = post(other.token).status_code  # verified now
    own = [post(caller.token) for _ in range(3)]
    bad = [post("abcdefgh.bad-token-bad-token-bad-token").status_code for _ in range(3)]

    assert [r.status_code for r in own] == [200, 200, 429]  # per client
    assert own[2].json()["error"]["data"]["kind"] == "rate_limited"
    assert bad == [401, 401, 429]  # per address, refused before any token lookup once used up
    # A token verified recently is not refused for its address's refused calls.
    assert (first_other, post(other.token).status_code) == (200, 200)


def test_bad_requests_get_clear_answers_never_a_500(live_server_url, caller):
    auth = {"Authorization": f"Bearer {caller.token}",
            "Accept": "application/json, text/event-stream"}
    not_json = httpx.post(f"{live_server_url}/mcp", content=b"{not json",
                          headers={**auth, "Content-Type": "application/json"})
    wrong_params = httpx.post(f"{live_server_url}/mcp", headers=auth, json={
        "jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": 42}})
    get = httpx.get(f"{live_server_url}/mcp", headers=auth, timeout=30)
    delete = httpx.delete(f"{live_server_url}/mcp", headers=auth, timeout=30)

    assert not_json.status_code == 400 and not_json.json()["error"]["code"] == -32700
    assert wrong_params.status_code < 500, wrong_params.text
    assert "error" in wrong_params.text
    # A GET stream needs the session id initialize answered; no session holds state to delete.
    assert get.status_code == 400 and "Missing session ID" in get.json()["error"]["message"]
    assert delete.status_code == 405 and delete.headers["allow"] == "GET, POST"
