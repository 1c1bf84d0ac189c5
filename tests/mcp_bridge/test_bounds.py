"""A tool call on a streaming agent is bounded like a response: it ends after the gateway's
default timeout, and when its stream outgrows the response cap; either way the agent's stream
is closed and its task cancelled."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import orjson
import pytest

from tests.mcp_bridge.clients import run
from tests.servers import answer_lifespan, read_body, serve_agent, watch_disconnect

CHUNK = 32 * 1024
#: The agent stops on its own after this much (an unbounded bridge would read it all).
AGENT_LIMIT = 256 * 1024 * 1024


@dataclass
class EndlessArtifacts:
    """A streaming A2A 0.3 agent: ``message/stream`` answers a task, then appends 32 KiB
    artifact chunks until the caller's side closes; ``tasks/cancel`` is recorded."""

    url: str = ""
    sent: int = 0
    open: int = 0
    cancelled: list[str] = field(default_factory=list)

    def card(self) -> dict:
        return {"name": "Endless", "description": "Appends to one artifact forever.",
                "url": self.url, "protocolVersion": "0.3.0", "version": "1",
                "capabilities": {"streaming": True}, "skills": []}

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            await answer_lifespan(receive, send)
            return
        payload = orjson.loads(await read_body(receive))
        rpc_id = payload.get("id")
        if payload.get("method") != "message/stream":
            if payload.get("method") == "tasks/cancel":
                self.cancelled.append(payload["params"]["id"])
            answer = orjson.dumps({"jsonrpc": "2.0", "id": rpc_id, "result": {
                "kind": "task", "id": "t-endless", "contextId": "c-1",
                "status": {"state": "canceled"}}})
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": answer})
            return
        self.open += 1
        gone, watcher = watch_disconnect(receive)
        try:
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream")]})
            await send({"type": "http.response.body", "more_body": True, "body": _event(
                rpc_id, {"kind": "task", "id": "t-endless", "contextId": "c-1",
                         "status": {"state": "working"}})})
            while not gone.is_set() and self.sent < AGENT_LIMIT:
                event = _event(rpc_id, {
                    "kind": "artifact-update", "taskId": "t-endless", "contextId": "c-1",
                    "append": True, "artifact": {"artifactId": "a-1", "parts": [
                        {"kind": "text", "text": "x" * CHUNK}]}})
                await send({"type": "http.response.body", "body": event, "more_body": True})
                self.sent += len(event)
                await asyncio.sleep(0)
            await send({"type": "http.response.body", "body": b""})
        finally:
            watcher.cancel()
            self.open -= 1


def _event(rpc_id, result: dict) -> bytes:
    return b"data: " + orjson.dumps({"jsonrpc": "2.0", "id": rpc_id, "result": result}) + b"\n\n"


@pytest.fixture
def small_caps(settings) -> None:
    """Set before the live server starts its node (the node's settings are read then)."""
    settings.A2A_MAX_RESPONSE_BYTES = 256 * 1024
    settings.A2A_DEFAULT_TIMEOUT_SECONDS = 3.0


def _wait(condition, seconds: float = 15.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)


def test_a_stream_outgrowing_the_response_cap_ends_the_call(small_caps, live_server_url, api,
                                                            caller):
    with serve_agent(EndlessArtifacts()) as agent:
        r = api.post("/api/v1/agents", json={"agent_id": "endless", "url": agent.url,
                                             "card": agent.card()})
        assert r.status_code == 201, r.text

        async def use(client):
            return await client.call_tool("endless", {"message": "go"})

        result = run(live_server_url, caller.token, use)
        _wait(lambda: agent.open == 0 and agent.cancelled)

        assert result.is_error
        assert result.content[0].text.startswith(
            "gateway error (response_too_large): the stream of endless outgrew")
        assert result.structured_content["task_id"] == "t-endless"
        assert agent.open == 0 and agent.cancelled == ["t-endless"]
        assert agent.sent < 64 * 1024 * 1024  # stopped long before the agent's own limit


def test_a_stream_that_does_not_finish_ends_at_the_default_timeout(
        small_caps, live_server_url, register_agent, echo_agent, caller):
    agent = register_agent(echo_agent)

    async def use(client):
        return await client.call_tool(agent.agent_id, {"message": "wait forever"})

    result = run(live_server_url, caller.token, use)
    _wait(lambda: bool(echo_agent.executor.cancelled))

    assert result.is_error
    assert result.content[0].text.startswith(
        f"gateway error (timeout): {agent.agent_id} did not finish within 3 s")
    assert result.structured_content["task_id"] == echo_agent.executor.cancelled[0]
