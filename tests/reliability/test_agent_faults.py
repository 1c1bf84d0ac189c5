"""Fault matrix, agent rows: agent killed -9 mid-stream, hang, 5xx, connection reset, cut-off
body, and the concurrency cap (100 of 150). Each test counts at the agent which request ids it
received, so it can assert 0 lost and 0 duplicated, and checks the error kind the caller got.
(``X-A2A-Executed`` after delivery is asserted where the gateway already sets it:
busy refusals and terminal stream events.)"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time

import httpx
import orjson
import pytest

from tests import faults
from tests.a2a_agents import EchoAgent
from tests.conftest import make_client
from tests.reliability.conftest import rpc_ids_received
from tests.servers import read_body, serve_app

pytestmark = pytest.mark.timeout(120)


def _send(rpc_id, text: str = "hi", method: str = "message/send", timeout: float | None = None):
    params: dict = {
        "message": {
            "role": "user",
            "messageId": os.urandom(4).hex(),
            "parts": [{"kind": "text", "text": text}],
        }
    }
    if timeout is not None:
        params["configuration"] = {"timeout": timeout}
    return {"jsonrpc": "2.0", "id": rpc_id, "method": method, "params": params}


class ScriptedAgent:
    """A raw ASGI agent: records every JSON-RPC id it receives, then ``behaviour``:
    ``"500"``/``"503"`` (a plain-text error page) or ``"slow"`` (a JSON-RPC result after
    ``delay`` seconds)."""

    def __init__(self, behaviour: str, delay: float = 0.0) -> None:
        self.behaviour = behaviour
        self.delay = delay
        self.ids: list = []
        self._lock = threading.Lock()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        body = await read_body(receive)
        rpc_id = json.loads(body).get("id")
        with self._lock:
            self.ids.append(rpc_id)
        if self.behaviour in ("500", "503"):
            await send(
                {
                    "type": "http.response.start",
                    "status": int(self.behaviour),
                    "headers": [(b"content-type", b"text/plain")],
                }
            )
            await send({"type": "http.response.body", "body": b"upstream trouble"})
            return
        await asyncio.sleep(self.delay)
        out = orjson.dumps({"jsonrpc": "2.0", "id": rpc_id, "result": {"ok": True}})
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": out})


@pytest.fixture
def platform(live_server_url, admin_token):
    """Register agents on the live node and call them: ``(register(url, **extra), call)``."""
    caller_token = make_client(["call"])[1]
    admin = httpx.Client(
        base_url=live_server_url, timeout=30, headers={"Authorization": f"Bearer {admin_token}"}
    )

    def register(url: str, **extra) -> str:
        agent_id = f"fault-{os.urandom(3).hex()}"
        response = admin.post(
            "/api/v1/agents",
            json={
                "agent_id": agent_id,
                "url": url,
                "card": {"name": "Fault agent", "url": url},
                **extra,
            },
        )
        assert response.status_code == 201, response.text
        return agent_id

    with (
        admin,
        httpx.Client(
            base_url=live_server_url,
            timeout=60,
            headers={"Authorization": f"Bearer {caller_token}"},
        ) as caller,
    ):
        yield register, caller


def _error_kind(response: httpx.Response) -> str:
    return response.json()["error"]["data"]["kind"]


def test_agent_killed_mid_stream(platform):
    register, caller = platform
    agent = faults.AgentProcess(steps=50, step_delay=0.1).start()
    try:
        agent_id = register(agent.url)
        events = []
        with caller.stream(
            "POST", f"/a2a/{agent_id}", json=_send("s-1", "task long", method="message/stream")
        ) as response:
            assert response.status_code == 200
            assert response.headers["x-a2a-executed"] == "true"
            buffer = b""
            for chunk in response.iter_raw():
                buffer += chunk.replace(b"\r\n", b"\n")
                while b"\n\n" in buffer:
                    block, buffer = buffer.split(b"\n\n", 1)
                    data = [line[6:] for line in block.split(b"\n") if line.startswith(b"data: ")]
                    if data:
                        events.append(orjson.loads(data[0]))
                if len(events) == 3 and agent.alive():
                    agent.kill()
        assert len(events) < 40  # the stream ended with the agent, not after 50 steps
        last = events[-1]
        assert "error" in last and last["id"] == "s-1"
        assert last["error"]["data"]["executed"] is True
        assert agent.received() == ["s-1"]
    finally:
        agent.kill()


def test_agent_hang_times_out_once(platform):
    register, caller = platform
    with EchoAgent() as agent:
        agent_id = register(agent.url)
        started = time.monotonic()
        response = caller.post(f"/a2a/{agent_id}", json=_send("h-1", "wait forever", timeout=1))
        assert time.monotonic() - started < 15
        assert _error_kind(response) == "timeout", response.text
        assert rpc_ids_received(agent) == ["h-1"]


@pytest.mark.parametrize("status", ["500", "503"])
def test_agent_5xx(platform, status):
    register, caller = platform
    agent = ScriptedAgent(status)
    with serve_app(agent, lifespan="off") as server:
        agent_id = register(server.url + "/")
        response = caller.post(f"/a2a/{agent_id}", json=_send("x-1"))
    assert response.headers["x-a2a-agent-status"] == status
    if status == "503":
        assert _error_kind(response) == "upstream_unavailable", response.text
    else:  # the agent answered: relayed as it is (profile a2a)
        assert response.status_code == 500 and response.text == "upstream trouble"
    assert agent.ids == ["x-1"]


def test_agent_connection_reset(platform):
    register, caller = platform
    with EchoAgent() as agent, faults.FaultProxy(agent.port, mode="reset") as proxy:
        agent_id = register(proxy.url)
        response = caller.post(f"/a2a/{agent_id}", json=_send("r-1"))
        assert _error_kind(response) == "unreachable"
        assert response.json()["error"]["data"]["retryable"] is True
        assert proxy.connections >= 1
        assert rpc_ids_received(agent) == []  # nothing reached the agent


def test_agent_body_cut_off(platform):
    register, caller = platform
    with EchoAgent() as agent, faults.FaultProxy(agent.port, mode="cut", cut_after=60) as proxy:
        agent_id = register(proxy.url)
        response = caller.post(f"/a2a/{agent_id}", json=_send("c-1"))
        # The request reached the agent; its answer was cut: a retryable transport error.
        # (Whether it says executed=true is the transport's part, not checked here.)
        assert _error_kind(response) in ("unreachable", "upstream_unavailable"), response.text
        assert rpc_ids_received(agent) == ["c-1"]


def test_concurrency_cap_100_of_150(platform):
    register, caller = platform
    agent = ScriptedAgent("slow", delay=2.0)
    with serve_app(agent, lifespan="off") as server:
        agent_id = register(server.url + "/", max_concurrency=100)
        token = caller.headers["authorization"]

        async def burst():
            limits = httpx.Limits(max_connections=200)
            async with httpx.AsyncClient(
                base_url=str(caller.base_url),
                timeout=60,
                limits=limits,
                headers={"Authorization": token},
            ) as client:
                return await asyncio.gather(
                    *(client.post(f"/a2a/{agent_id}", json=_send(f"b-{n}")) for n in range(150))
                )

        responses = asyncio.run(burst())
    ok = [r for r in responses if r.status_code == 200 and "result" in r.json()]
    busy = [r for r in responses if "error" in r.json() and _error_kind(r) == "busy"]
    assert len(ok) == 100 and len(busy) == 50
    assert all(r.headers["x-a2a-executed"] == "false" for r in busy)
    assert sorted(agent.ids) == sorted(r.json()["id"] for r in ok)  # 0 lost, 0 duplicated
