"""``examples/echo_agent.py``, the agent the README's "Using it" registers, run as a user runs
it (a subprocess) and called through a running node: registered by URL (its card fetched),
answered through the gateway, streamed event by event."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import orjson
import pytest

from tests.servers import free_port

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def echo_agent():
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "examples/echo_agent.py", "--port", str(port)], cwd=ROOT,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        line = process.stdout.readline()  # printed once it listens (bounded by its exit)
        assert line.startswith(f"Echo agent listening at http://127.0.0.1:{port}/"), \
            line + process.stdout.read() if process.poll() is not None else line
        yield f"http://127.0.0.1:{port}/"
    finally:
        process.terminate()
        process.wait(timeout=10)


def _rpc(method: str, text: str) -> dict:
    return {"jsonrpc": "2.0", "id": 1, "method": method,
            "params": {"message": {"role": "user", "messageId": "m1",
                                   "parts": [{"kind": "text", "text": text}]}}}


def test_the_example_agent_through_the_gateway(api: httpx.Client, echo_agent: str):
    r = api.post("/api/v1/agents", json={"agent_id": "echo", "url": echo_agent})
    assert r.status_code == 201, r.text
    assert r.json()["name"] == "Echo Agent" and r.json()["url"] == echo_agent

    r = api.post("/a2a/echo", json=_rpc("message/send", "hi"))
    assert r.status_code == 200 and r.headers["x-a2a-executed"] == "true"
    assert r.json()["result"]["parts"] == [{"kind": "text", "text": "echo: hi"}]

    events = []
    with api.stream("POST", "/a2a/echo", json=_rpc("message/stream", "stream one two")) as s:
        assert s.headers["content-type"].startswith("text/event-stream")
        for line in s.iter_lines():
            if line.startswith("data:"):
                events.append(orjson.loads(line[5:])["result"])
    kinds = [e["kind"] for e in events]
    assert kinds[0] == "task" and kinds[-1] == "status-update" and events[-1]["final"]
    words = [e["artifact"]["parts"][0]["text"] for e in events if e["kind"] == "artifact-update"]
    assert words == ["one ", "two "]
