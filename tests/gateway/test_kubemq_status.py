"""Profile kubemq: an agent's HTTP error status that is not a JSON-RPC answer becomes HTTP 200
with a JSON-RPC error, as KubeMQ documents (kubemq-a2a docs/reference/error-codes.md); the
a2a profile relays the agent's status and body unchanged.

Against the scripted agent of test_proxy (``mode=status``), over the local fast path and the
Channels layer, for sync and streaming methods.
"""

from __future__ import annotations

import httpx
import pytest

from tests.gateway import test_proxy as proxy
from tests.gateway.test_proxy import register, rpc

# Every test runs with both outbound clients (tests/gateway/conftest.py).
pytestmark = pytest.mark.usefixtures("outbound_client")

agent, gw, path_mode, token = proxy.agent, proxy.gw, proxy.path_mode, proxy.token

HTML = "<html><body>Internal Server Error</body></html>"


@pytest.mark.parametrize("method", ["message/send", "message/stream"])
def test_kubemq_profile_maps_agent_error_statuses(
    gw: httpx.Client, agent, path_mode, settings, method
):
    settings.A2A_ERROR_PROFILE = "kubemq"
    register("km-status", agent.url)
    cases = [
        (500, -32603, "500"),
        (400, -32603, "400"),
        (404, -32603, "404"),
        (502, -32603, "unavailable"),
        (503, -32603, "unavailable"),
        (504, -32001, "timeout"),
    ]
    for status, code, needle in cases:
        r = gw.post(
            "/a2a/km-status",
            json=rpc(
                method,
                rpc_id=f"k{status}",
                mode="status",
                status=status,
                body=HTML,
                content_type="text/html",
            ),
        )
        assert r.status_code == 200, (status, r.text)
        assert r.headers["content-type"] == "application/json"
        assert r.headers["x-a2a-agent-status"] == str(status)
        body = r.json()
        assert body["jsonrpc"] == "2.0" and body["id"] == f"k{status}" and "result" not in body
        error = body["error"]
        assert error["code"] == code, (status, error)
        assert needle in error["message"].lower(), (status, error)
        assert error["data"]["agent_id"] == "km-status"
        if status not in (502, 503, 504):  # the agent itself answered: it ran
            assert r.headers["x-a2a-executed"] == "true"
            assert error["data"]["executed"] is True and error["data"]["kind"] == "agent_error"


def test_kubemq_profile_relays_json_rpc_answers_and_maps_large_bodies(
    gw: httpx.Client, agent, path_mode, settings
):
    settings.A2A_ERROR_PROFILE = "kubemq"
    register("km-rpc", agent.url)
    app_error = '{"jsonrpc":"2.0","id":5,"error":{"code":-32000,"message":"boom"}}'
    r = gw.post("/a2a/km-rpc", json=rpc(rpc_id=5, mode="status", status=500, body=app_error))
    assert r.status_code == 500 and r.text == app_error  # a JSON-RPC answer: unchanged
    assert r.headers["x-a2a-executed"] == "true"
    # Larger than the subscriber reads whole (relayed in pieces): mapped all the same.
    big = "x" * (300 * 1024)
    r = gw.post(
        "/a2a/km-rpc",
        json=rpc(rpc_id="b", mode="status", status=500, body=big, content_type="text/plain"),
    )
    assert r.status_code == 200 and r.json()["error"]["code"] == -32603
    assert "500" in r.json()["error"]["message"] and r.json()["id"] == "b"
    # The gateway keeps working after dropping the rest of that body.
    r = gw.post("/a2a/km-rpc", json=rpc(rpc_id="after"))
    assert r.json()["id"] == "after" and "result" in r.json()


def test_a2a_profile_relays_agent_status_and_body(gw: httpx.Client, agent, path_mode):
    register("a2a-status", agent.url)
    for status in (400, 404, 500):
        r = gw.post(
            "/a2a/a2a-status",
            json=rpc(mode="status", status=status, body=HTML, content_type="text/html"),
        )
        assert r.status_code == status and r.text == HTML
        assert r.headers["x-a2a-executed"] == "true"
        assert r.headers["x-a2a-agent-status"] == str(status)
