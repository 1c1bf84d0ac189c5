"""An agent's own JSON-RPC errors count as their own outcome, ``agent_error``, apart from the
gateway's: in ``/metrics``, the per-agent statistics, the API's agent detail (``calls``), the
dashboard and the agent list. Real a2a-sdk agent and a plain JSON-RPC agent on loopback,
through the live node; the agent's answer is relayed unchanged either way."""

from __future__ import annotations

import os
import re

import httpx
import orjson
import pytest
from django.urls import reverse

from console.models import AgentMinute
from tests.console.test_stats_and_audit import db, fast_flush, wait_for  # noqa: F401
from tests.gateway.conftest import gateway_path  # noqa: F401  (fixture)
from tests.servers import read_body, serve_app

pytestmark = pytest.mark.django_db(transaction=True)

BIG = 300 * 1024  # above the subscriber's whole-body read: relayed in pieces


def _reply(rpc_id, **member) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", "id": rpc_id, **member})


async def plain_agent(scope, receive, send) -> None:
    """A plain JSON-RPC agent: the method names what it answers."""
    if scope["type"] != "http":
        return
    request = orjson.loads(await read_body(receive))
    method, rpc_id = request["method"], request.get("id")
    content_type = b"application/json"
    if method == "big/error":  # a large error: the error key in the head of the first piece
        body = _reply(rpc_id, error={"code": -32000, "message": "big",
                                     "data": "x" * BIG})
    elif method == "big/ok":  # a large result mentioning "error" early, nested
        body = _reply(rpc_id, result={"status": {"error": "not the agent's"}, "pad": "x" * BIG})
    elif method == "nested/ok":
        body = _reply(rpc_id, result={"error": {"code": 1}, "text": '"error": 2'})
    elif method.startswith("stream/"):
        content_type = b"text/event-stream"
        events = [_reply(rpc_id, result={"seq": 0, "note": {"error": "nested"}})]
        if method == "stream/error":
            events.append(_reply(rpc_id, error={"code": -32603, "message": "stream failed"}))
        body = b"".join(b"event: message\ndata: " + e + b"\n\n" for e in events)
    else:
        body = _reply(rpc_id, result={"ok": True})
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", content_type)]})
    await send({"type": "http.response.body", "body": body})


def _metric(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_agent_jsonrpc_errors_counted_apart_from_gateway_errors(
        fast_flush, gateway_path, live_server_url, echo_agent, register_agent, api, caller,  # noqa: F811
        admin_client):
    sdk = register_agent(echo_agent)
    plain_id = f"plain-{os.urandom(3).hex()}"  # /metrics outlives a test: a name of its own
    with serve_app(plain_agent, lifespan="off") as plain:
        card = dict(echo_agent.card_document, url=f"{plain.url}/")
        r = api.post("/api/v1/agents", json={"agent_id": plain_id, "url": f"{plain.url}/",
                                             "card": card})
        assert r.status_code == 201, r.text
        with httpx.Client(base_url=live_server_url, headers=caller.auth, timeout=30) as http:
            def call(agent_id: str, method: str, params: dict | None = None) -> httpx.Response:
                return http.post(f"/a2a/{agent_id}", json={
                    "jsonrpc": "2.0", "id": 7, "method": method, "params": params or {}})

            # The SDK agent: a method it does not know is its own -32601 at HTTP 200.
            r = call(sdk.agent_id, "tasks/noSuchMethod")
            assert r.status_code == 200 and r.headers["x-a2a-executed"] == "true"
            assert r.json()["error"]["code"] == -32601  # relayed unchanged: not the gateway's
            assert "kind" not in (r.json()["error"].get("data") or {})
            r = call(sdk.agent_id, "message/send", {"message": {
                "kind": "message", "role": "user", "messageId": "m1",
                "parts": [{"kind": "text", "text": "hi"}]}})
            assert r.status_code == 200 and "result" in r.json()

            r = call(plain_id, "big/error")
            assert len(r.content) > BIG and r.json()["error"]["message"] == "big"
            r = call(plain_id, "big/ok")
            assert r.json()["result"]["status"] == {"error": "not the agent's"}
            assert call(plain_id, "nested/ok").json()["result"]["error"] == {"code": 1}
            r = call(plain_id, "stream/error")
            assert r.headers["content-type"].startswith("text/event-stream")
            assert b"stream failed" in r.content
            assert b"seq" in call(plain_id, "stream/ok").content
            # The gateway's own error (no such agent is not the agent's): not an agent error.
            assert call(f"{plain_id}-gone", "x").json()["error"]["data"]["kind"] == \
                "agent_not_found"

    # /metrics: the outcome label says whose error it was.
    text = api.get("/metrics").text
    count = "kubemq_a2a_request_duration_seconds_count"
    assert _metric(text, count, agent_id=sdk.agent_id, outcome="agent_error") == 1
    assert _metric(text, count, agent_id=sdk.agent_id, outcome="ok") == 1
    assert _metric(text, count, agent_id=plain_id, outcome="agent_error") == 2
    assert _metric(text, count, agent_id=plain_id, outcome="ok") == 3

    # The statistics (written by the node's flusher): agent errors apart from gateway errors.
    def totals(agent_id: str) -> tuple:
        rows = AgentMinute.objects.filter(agent_id=agent_id)
        return (sum(r.requests for r in rows), sum(r.errors_agent for r in rows),
                sum(r.errors_executed + r.errors_not_executed for r in rows))

    assert wait_for(lambda: totals(plain_id) == (5, 2, 0)), db(lambda: totals(plain_id))
    assert wait_for(lambda: totals(sdk.agent_id) == (2, 1, 0)), db(lambda: totals(sdk.agent_id))

    # The API's agent detail: the calls of the last 15 minutes.
    detail = api.get(f"/api/v1/agents/{sdk.agent_id}").json()
    assert detail["calls"]["requests"] == 2 and detail["calls"]["agent_errors"] == 1
    assert detail["calls"]["gateway_errors_executed"] == 0
    assert detail["calls"]["gateway_errors_not_executed"] == 0
    assert detail["calls"]["window_minutes"] == 15
    assert api.get(f"/api/v1/agents/{plain_id}").json()["calls"]["agent_errors"] == 2
    # Another caller sees no traffic figures of an agent it does not own.
    other = httpx.get(f"{live_server_url}/api/v1/agents/{sdk.agent_id}", headers=caller.auth)
    assert other.status_code == 200 and other.json()["calls"] is None

    # The dashboard: 3 errors of 7 requests, all the agents' own.
    html = admin_client.get(reverse("admin:index")).content.decode()
    tile = re.search(r'id="tile-error-rate">(.*?)</div>', html, re.S).group(1)
    assert '<span class="value">42.9 %</span>' in tile
    assert "3 errors" in tile and ">3 agent</span>" in tile and ">0 gateway</span>" in tile
    top = re.search(r'id="console-top-errors"[^>]*>(.*?)</table>', html, re.S).group(1)
    assert re.search(rf'{plain_id}</a></td><td class="errors">2</td>'
                     r'<td class="agent-errors">2</td>', top)
    # The agent list's error column names the agent's own errors.
    listing = admin_client.get(reverse("admin:registry_agent_changelist")).content.decode()
    assert re.search(r'<td class="field-errors_15m">2 <span class="agent-errors"[^>]*>'
                     r'\(2 agent\)</span></td>', listing)


def test_openapi_documents_the_calls_field(api):
    schema = api.get("/api/schema/", params={"format": "json"}).json()
    calls = schema["components"]["schemas"]["AgentDetailOutput"]["properties"]["calls"]
    assert calls["nullable"] is True and calls["allOf"][0]["$ref"].endswith("/AgentCallsOutput")
    fields = schema["components"]["schemas"]["AgentCallsOutput"]["properties"]
    assert {"requests", "agent_errors", "gateway_errors_executed",
            "gateway_errors_not_executed", "window_minutes"} <= set(fields)
    assert "JSON-RPC error" in fields["agent_errors"]["description"]
    detail = schema["paths"]["/api/v1/agents/{agent_id}/"]["get"]["responses"]["200"]
    assert detail["content"]["application/json"]["schema"]["$ref"].endswith(
        "/AgentDetailOutput")
