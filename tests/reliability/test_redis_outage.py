"""Fault matrix, Redis row: Redis killed -9 under a node and restarted; calls to agents owned by
the receiving node keep working throughout (local fast path), each reaching the agent once, and
/readyz names the broker while it is down."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.reliability.conftest import register, rpc_ids_received

pytestmark = pytest.mark.timeout(120)


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
