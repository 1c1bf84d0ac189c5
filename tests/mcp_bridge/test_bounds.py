"""A tool call on a streaming agent is bounded like a response: it ends after the gateway's
default timeout, and when its stream outgrows the response cap; either way the agent's stream
is closed and its task cancelled."""

from __future__ import annotations

import asyncio
import socket
import time
from dataclasses import dataclass, field

import orjson
import pytest

from tests.mcp_bridge.clients import run
from tests.servers import (
    answer_lifespan,
    kernel_buffer_bytes,
    read_body,
    serve_agent,
    watch_disconnect,
)

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


@dataclass
class EndlessStatus(EndlessArtifacts):
    """Like :class:`EndlessArtifacts`, but every event is a status update with 32 KiB of
    text: each becomes a progress notification of that size."""

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            await answer_lifespan(receive, send)
            return
        body = await read_body(receive)
        payload = orjson.loads(body)
        if payload.get("method") != "message/stream":
            replay = iter([{"type": "http.request", "body": body, "more_body": False}])

            async def again():
                return next(replay, {"type": "http.disconnect"})

            await EndlessArtifacts.__call__(self, scope, again, send)
            return
        self.open += 1
        gone, watcher = watch_disconnect(receive)
        status = {"state": "working", "message": {
            "kind": "message", "role": "agent", "messageId": "m",
            "parts": [{"kind": "text", "text": "y" * CHUNK}]}}
        try:
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream")]})
            while not gone.is_set() and self.sent < AGENT_LIMIT:
                event = _event(payload.get("id"), {
                    "kind": "status-update", "taskId": "t-endless", "contextId": "c-1",
                    "final": False, "status": status})
                await send({"type": "http.response.body", "body": event, "more_body": True})
                self.sent += len(event)
                await asyncio.sleep(0)
            await send({"type": "http.response.body", "body": b""})
        finally:
            watcher.cancel()
            self.open -= 1


@pytest.fixture
def quick_stall(settings) -> None:
    """A 2 s stall timeout and a response cap no test stream reaches first."""
    settings.A2A_SSE_STALL_TIMEOUT_SECONDS = 2.0
    settings.A2A_MAX_RESPONSE_BYTES = 512 * 1024 * 1024


def test_a_client_that_never_reads_its_progress_does_not_hold_the_agent(
        quick_stall, live_server_url, api, caller):
    with serve_agent(EndlessStatus()) as agent:
        r = api.post("/api/v1/agents", json={"agent_id": "endless-status", "url": agent.url,
                                             "card": agent.card()})
        assert r.status_code == 201, r.text
        body = orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": "endless-status", "arguments": {"message": "go"},
            "_meta": {"progressToken": "p-1"}}})
        port = int(live_server_url.rsplit(":", 1)[1])
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", port))
        try:
            sock.sendall(
                b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Authorization: Bearer " + caller.token.encode() + b"\r\n"
                b"Content-Type: application/json\r\n"
                b"Accept: application/json, text/event-stream\r\n"
                b"MCP-Protocol-Version: 2025-11-25\r\n"
                b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            _wait(lambda: agent.sent > 0)  # the stream runs, and is never read
            _wait(lambda: agent.open == 0, seconds=30)
            assert agent.open == 0  # the stream was ended at the agent
            # No more than the kernel's buffers and the bounded relay were written.
            assert agent.sent < kernel_buffer_bytes() + 32 * 1024 * 1024, agent.sent
        finally:
            sock.close()
