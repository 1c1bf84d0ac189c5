"""Fault matrix, Redis row: Redis killed -9 under a node and restarted; calls to agents owned by
the receiving node keep working throughout (local fast path), each reaching the agent once, and
/readyz names the broker while it is down."""

from __future__ import annotations

import os
import time

import httpx
import pytest

from tests.a2a_agents import EchoAgent
from tests.faults import sse_events as _events
from tests.reliability.conftest import register, rpc_ids_received

# Private services only: CI runs it in its distributed pass (tests/passes.py), beside the soak.
pytestmark = [pytest.mark.timeout(120), pytest.mark.one_pass("distributed")]


def _send(rpc_id, text: str = "hi", method: str = "message/send") -> dict:
    return {"jsonrpc": "2.0", "id": rpc_id, "method": method,
            "params": {"message": {"role": "user", "messageId": os.urandom(4).hex(),
                                   "parts": [{"kind": "text", "text": text}]}}}


def _call(client: httpx.Client, url: str, rpc_id: str) -> httpx.Response:
    return client.post(
        url,
        json={
            "jsonrpc": "2.0",
            "id": rpc_id,
            "method": "message/send",
            "params": {
                "message": {
                    "role": "user",
                    "messageId": rpc_id,
                    "parts": [{"kind": "text", "text": "hi"}],
                }
            },
        },
    )


def test_same_node_calls_survive_a_redis_restart(services, tokens, start_node, agent):
    node = start_node()
    agent_id = register(node.url, tokens["admin"], agent.url)
    url = f"{node.url}/a2a/{agent_id}"
    ids = []
    with httpx.Client(timeout=30, headers={"Authorization": f"Bearer {tokens['caller']}"}) as c:
        for phase in ("before", "down", "after"):
            if phase == "down":
                services["redis"].kill()
                time.sleep(0.5)
                ready = httpx.get(node.url + "/readyz", timeout=10)
                assert ready.status_code == 503
                assert ready.json()["checks"]["broker"].startswith("unreachable")
                assert ready.json()["checks"]["database"] == "ok"
            if phase == "after":
                services["redis"].start()
            for n in range(20):
                rpc_id = f"{phase}-{n}"
                response = _call(c, url, rpc_id)
                assert response.status_code == 200, response.text
                assert response.json()["id"] == rpc_id and "result" in response.json()
                ids.append(rpc_id)
    assert sorted(i for i in rpc_ids_received(agent) if i in ids) == sorted(ids)




def test_cross_node_stream_ends_with_broker_lost_when_redis_goes(services, tokens, start_node):
    """Redis killed while a stream crosses it (agent owned by node A, caller entering node B):
    the stream ends at once with ``broker_lost`` naming Redis (executed true) -- well within
    the 15 s keepalive window, not after two missed keepalives as ``owner_lost``, since the
    owner never died -- and B serves again once Redis is back."""
    owner = start_node()
    entry = start_node()
    auth = {"Authorization": f"Bearer {tokens['caller']}"}
    with EchoAgent(steps=60, step_delay=0.5) as echo:
        agent_id = register(owner.url, tokens["admin"], echo.url)
        deadline = time.monotonic() + 15
        while True:  # node B learns the route
            ok = httpx.post(f"{entry.url}/a2a/{agent_id}", headers=auth, timeout=10,
                            json=_send("probe", "hi"))
            if ok.status_code == 200 and "result" in ok.json():
                break
            assert time.monotonic() < deadline, ok.text
            time.sleep(0.2)
        events: list = []
        killed_at = ended_at = 0.0
        try:
            with httpx.stream("POST", f"{entry.url}/a2a/{agent_id}", timeout=120, headers=auth,
                              json=_send("bl-1", "task slow", "message/stream")) as response:
                assert response.status_code == 200
                for event in _events(response):
                    events.append(event)
                    if len(events) == 2:
                        services["redis"].kill()
                        killed_at = time.monotonic()
                ended_at = time.monotonic()
        finally:
            services["redis"].start()
        # Redis back: the entry node reaches the owner again.
        deadline = time.monotonic() + 20
        while True:
            again = httpx.post(f"{entry.url}/a2a/{agent_id}", headers=auth, timeout=10,
                               json=_send("after", "hi"))
            if again.status_code == 200 and "result" in again.json():
                break
            assert time.monotonic() < deadline, again.text
            time.sleep(0.3)
    error = events[-1].get("error")
    assert error is not None, events[-1]
    assert error["data"]["kind"] == "broker_lost", error
    assert error["data"]["executed"] is True and error["data"]["retryable"] is True
    assert error["message"].startswith("broker lost: Redis at 127.0.0.1:"), error
    assert error["code"] == -32066
    assert ended_at - killed_at < 15, ended_at - killed_at
    assert len(events) < 40  # ended long before the agent's 60 steps
    assert "never retrieved" not in entry.log_path.read_text(errors="replace")
