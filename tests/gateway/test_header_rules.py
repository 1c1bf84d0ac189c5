"""Header rules against a running node: protected request headers under ``_`` aliases (10.7),
agent response headers that would act on the gateway's origin (10.8), and per-agent credential
passthrough (10.17).

The agent is a raw ASGI server on loopback that records every header exactly as it arrived
(names, duplicates) and answers with the headers each request asks for, as JSON or as SSE.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import httpx
import orjson
import pytest

from gateway import conf, runtime
from gateway.headers import relayed_response_headers
from registry.models import Agent
from tests.conftest import make_client
from tests.gateway import test_proxy as proxy
from tests.gateway.test_proxy import register, rpc
from tests.registry.test_kubemq_api import kcard
from tests.servers import answer_lifespan, read_body, serve_app

# Every test runs with both outbound clients (tests/gateway/conftest.py).
pytestmark = pytest.mark.usefixtures("outbound_client")

# fixtures of test_proxy: a caller token, and the local fast path / broker path switch
path_mode, token = proxy.path_mode, proxy.token


@dataclass
class HeaderAgent:
    """Answers ``params.status`` (200) with ``params.headers`` ([[name, value], ...]); as SSE
    (two events) when ``params.sse``. Records the raw request headers of every call."""

    arrived: list[list[tuple[str, str]]] = field(default_factory=list)
    url: str = ""

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            await answer_lifespan(receive, send)
            return
        body = await read_body(receive)
        self.arrived.append(
            [(n.decode("latin-1"), v.decode("latin-1")) for n, v in scope["headers"]]
        )
        payload = orjson.loads(body)
        params = payload.get("params") or {}
        extra = [(n.encode(), v.encode()) for n, v in params.get("headers", [])]
        status = int(params.get("status", 200))
        if params.get("sse"):
            await send(
                {
                    "type": "http.response.start",
                    "status": status,
                    "headers": [(b"content-type", b"text/event-stream"), *extra],
                }
            )
            for seq in range(2):
                data = orjson.dumps(
                    {"jsonrpc": "2.0", "id": payload.get("id"), "result": {"seq": seq}}
                )
                await send(
                    {
                        "type": "http.response.body",
                        "body": b"data: " + data + b"\n\n",
                        "more_body": True,
                    }
                )
            await send({"type": "http.response.body", "body": b""})
            return
        answer = orjson.dumps({"jsonrpc": "2.0", "id": payload.get("id"), "result": "ok"})
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json"), *extra],
            }
        )
        await send({"type": "http.response.body", "body": answer})

    def last(self, name: str) -> list[str]:
        """Every value of header ``name`` (exact, lowercase) in the last request."""
        return [v for n, v in self.arrived[-1] if n == name]

    def names(self) -> set[str]:
        return {n for n, _ in self.arrived[-1]}


@pytest.fixture
def hagent():
    agent = HeaderAgent()
    with serve_app(agent) as server:
        agent.url = server.url + "/rpc"
        yield agent


def new_id(prefix: str) -> str:
    return f"{prefix}-{os.urandom(3).hex()}"


ORIGIN_HEADERS = [
    ["Clear-Site-Data", '"*"'],
    ["Strict-Transport-Security", "max-age=31536000; includeSubDomains"],
    ["Access-Control-Allow-Origin", "https://evil.example"],
    ["Access-Control-Allow-Credentials", "true"],
    ["Access-Control-Allow-Methods", "POST, DELETE"],
    ["Access-Control-Expose-Headers", "X-Secret"],
    ["Refresh", "0; url=https://evil.example/"],
    ["WWW-Authenticate", 'Basic realm="gateway"'],
    ["Set-Cookie", "sessionid=stolen; Path=/admin"],
    ["Set-Cookie2", "sessionid=stolen; Version=1; Path=/admin"],
    ["Content-Security-Policy", "default-src 'none'; report-uri https://evil.example/r"],
    ["Content-Security-Policy-Report-Only", "default-src 'none'"],
    ["Location", "http://10.0.0.7:8080/internal/tasks/1"],
    ["Content-Location", "http://10.0.0.7:8080/internal/rpc"],
    ["X-Agent-Kept", "yes"],
]
DROPPED = {
    "clear-site-data",
    "strict-transport-security",
    "access-control-allow-origin",
    "access-control-allow-credentials",
    "access-control-allow-methods",
    "access-control-expose-headers",
    "refresh",
    "www-authenticate",
    "set-cookie",
    "set-cookie2",
    "content-security-policy",
    "content-security-policy-report-only",
    "location",
    "content-location",
}


# --- 10.7: protected request headers under "_" aliases -------------------------------------


def test_underscore_aliases_of_protected_headers_never_reach_the_agent(
    live_server_url,
    hagent,
    token,
    path_mode,
):
    agent_id = new_id("us")
    register(agent_id, hagent.url)
    client, caller_token = make_client(["call"])
    # httpx sends header names as given; the agent's uvicorn keeps "_" (many servers read it
    # as "-", so "X_KubeMQ_Caller_ID" would shadow the real identity header there).
    headers = [
        ("Authorization", f"Bearer {caller_token}"),
        ("Content-Type", "application/json"),
        ("X_KubeMQ_Caller_ID", "spoofed-admin"),
        ("x_kubemq_caller_id", "spoofed-again"),
        ("X-KubeMQ_Caller-ID", "spoofed-mixed"),
        ("Proxy_Authorization", "Basic Zm9vOmJhcg=="),
        ("X_Forwarded_For", "10.6.6.6"),
        ("X_Real_IP", "10.6.6.6"),
        ("Transfer_Encoding", "chunked"),
        ("Content_Length", "5"),
        ("X_Gateway_Authorization", "Bearer leaked"),
        ("X_Custom_Ok", "kept"),
    ]
    r = httpx.post(
        f"{live_server_url}/a2a/{agent_id}", content=orjson.dumps(rpc()), headers=headers
    )
    assert r.status_code == 200 and r.json()["result"] == "ok", r.text
    names = hagent.names()
    folded = {n.replace("_", "-") for n in names}
    assert hagent.last("x-kubemq-caller-id") == [client.client_id]
    assert [n for n in names if n.replace("_", "-") == "x-kubemq-caller-id"] == [
        "x-kubemq-caller-id"
    ]
    for protected in (
        "proxy-authorization",
        "x-forwarded-for",
        "x-real-ip",
        "transfer-encoding",
        "x-gateway-authorization",
        "authorization",
    ):
        assert protected not in folded, protected
    assert hagent.last("content-length") == [str(len(orjson.dumps(rpc())))]
    assert hagent.last("x_custom_ok") == ["kept"]  # unprotected names still travel as sent


def test_underscore_alias_of_a_configured_caller_header(live_server_url, hagent, settings):
    settings.A2A_CALLER_ID_HEADER = "X-Caller"
    agent_id = new_id("uc")
    register(agent_id, hagent.url)
    client, caller_token = make_client(["call"])
    r = httpx.post(
        f"{live_server_url}/a2a/{agent_id}",
        json=rpc(),
        headers={"Authorization": f"Bearer {caller_token}", "X_CALLER": "root"},
    )
    assert r.json()["result"] == "ok"
    assert {n for n in hagent.names() if n.replace("_", "-") == "x-caller"} == {"x-caller"}
    assert hagent.last("x-caller") == [client.client_id]


# --- 10.8: response headers acting on the gateway's origin ---------------------------------


@pytest.mark.parametrize("sse", [False, True], ids=["json", "sse"])
def test_origin_acting_response_headers_are_dropped(
    live_server_url,
    hagent,
    token,
    path_mode,
    sse,
):
    agent_id = new_id("rh")
    register(agent_id, hagent.url)
    method = "message/stream" if sse else "message/send"
    with httpx.Client(timeout=10, headers={"Authorization": f"Bearer {token}"}) as http:
        r = http.post(
            f"{live_server_url}/a2a/{agent_id}", json=rpc(method, headers=ORIGIN_HEADERS, sse=sse)
        )
    assert r.status_code == 200
    assert r.headers["x-agent-kept"] == "yes"
    assert not DROPPED & set(r.headers.keys()), r.headers
    assert "10.0.0.7" not in str(r.headers)
    if sse:
        assert r.text.count("data: ") == 2
    else:
        assert r.json()["result"] == "ok"


@pytest.mark.parametrize("status", [201, 302])
def test_an_agents_location_never_reaches_the_caller(live_server_url, hagent, token, status):
    """An agent's Location (a redirect, a created resource) names its own, often internal,
    address: dropped; the status and body are relayed as they are."""
    agent_id = new_id("rl")
    register(agent_id, hagent.url)
    r = httpx.post(
        f"{live_server_url}/a2a/{agent_id}",
        headers={"Authorization": f"Bearer {token}"},
        json=rpc(status=status, headers=[["Location", "http://10.0.0.7:8080/internal/x"]]),
        follow_redirects=False,
    )
    assert r.status_code == status and r.headers["x-a2a-executed"] == "true"
    assert "location" not in r.headers and "10.0.0.7" not in str(r.headers)
    assert r.json()["result"] == "ok"


def test_the_dropped_list_is_extended_by_a_setting(live_server_url, hagent, token, settings):
    settings.A2A_DROP_RESPONSE_HEADERS = ["X-Powered-By", "X-Debug-*"]
    agent_id = new_id("rx")
    register(agent_id, hagent.url)
    r = httpx.post(
        f"{live_server_url}/a2a/{agent_id}",
        headers={"Authorization": f"Bearer {token}"},
        json=rpc(
            headers=[
                ["X-Powered-By", "php"],
                ["X-Debug-Token", "t"],
                ["X-Debug-Link", "l"],
                ["X-Agent-Kept", "yes"],
            ]
        ),
    )
    assert r.json()["result"] == "ok"
    assert r.headers["x-agent-kept"] == "yes"
    assert {"x-powered-by", "x-debug-token", "x-debug-link"}.isdisjoint(r.headers.keys())
    settings.A2A_DROP_RESPONSE_HEADERS = []
    r = httpx.post(
        f"{live_server_url}/a2a/{agent_id}",
        headers={"Authorization": f"Bearer {token}"},
        json=rpc(headers=[["X-Powered-By", "php"]]),
    )
    assert r.headers["x-powered-by"] == "php"


def test_the_dropped_list_follows_the_started_nodes_settings():
    """A node started with its own settings object (no Django setting changed) brings its
    A2A_DROP_RESPONSE_HEADERS to the response rules, like every other gateway setting."""
    previous = conf.active
    node_settings = previous.but(A2A_DROP_RESPONSE_HEADERS=["X-Internal", "X-Trace-*"])
    assert node_settings.A2A_DROP_RESPONSE_HEADERS == ("X-Internal", "X-Trace-*")
    raw = [(b"X-Internal", b"1"), (b"X-Trace-Id", b"2"), (b"X-Kept", b"3")]
    try:
        conf.activate(node_settings)
        assert relayed_response_headers(raw) == [(b"x-kept", b"3")]
    finally:
        conf.activate(previous)
    assert relayed_response_headers(raw) == [
        (b"x-internal", b"1"),
        (b"x-trace-id", b"2"),
        (b"x-kept", b"3"),
    ]


# --- 10.17: credential passthrough ------------------------------------------------------------


def test_credential_passthrough(live_server_url, hagent, api, path_mode):
    agent_id = new_id("pt")
    r = api.post(
        "/api/v1/agents",
        json={
            "agent_id": agent_id,
            "url": hagent.url,
            "credential_passthrough": True,
            "card": {"name": agent_id, "url": hagent.url},
        },
    )
    assert r.status_code == 201, r.text
    assert r.json()["credential_passthrough"] is True
    client, caller_token = make_client(["call"])
    url = f"{live_server_url}/a2a/{agent_id}"

    # The agent's own credential reaches it unchanged; the gateway's never does.
    r = httpx.post(
        url,
        json=rpc(status=401, headers=[["WWW-Authenticate", 'Bearer realm="agent"']]),
        headers={
            "Authorization": "Bearer agent-own-secret",
            "X-Gateway-Authorization": f"Bearer {caller_token}",
        },
    )
    assert r.status_code == 401 and r.headers["x-a2a-executed"] == "true"
    assert r.headers["www-authenticate"] == 'Bearer realm="agent"'  # relayed for passthrough
    assert hagent.last("authorization") == ["Bearer agent-own-secret"]
    assert "x-gateway-authorization" not in hagent.names()
    assert hagent.last("x-kubemq-caller-id") == [client.client_id]

    # Without the gateway header the caller is not authenticated (Authorization is the agent's).
    calls = len(hagent.arrived)
    r = httpx.post(url, json=rpc(), headers={"Authorization": f"Bearer {caller_token}"})
    assert r.status_code == 401 and r.json()["error"]["data"]["kind"] == "unauthenticated"
    assert len(hagent.arrived) == calls

    # Streams too.
    with httpx.Client(timeout=10) as http:
        r = http.post(
            url,
            json=rpc("message/stream", sse=True),
            headers={
                "Authorization": "Basic YWdlbnQ6cGFzcw==",
                "X-Gateway-Authorization": f"Bearer {caller_token}",
            },
        )
    assert r.text.count("data: ") == 2
    assert hagent.last("authorization") == ["Basic YWdlbnQ6cGFzcw=="]

    # A chunked body (authenticated before it is read) too.
    def chunks():
        yield orjson.dumps(rpc(rpc_id="chunked"))

    r = httpx.post(url, content=chunks(), headers={
        "Authorization": "Bearer agent-own-secret", "Content-Type": "application/json",
        "X-Gateway-Authorization": f"Bearer {caller_token}"})
    assert r.status_code == 200 and r.json()["id"] == "chunked", r.text
    assert hagent.last("authorization") == ["Bearer agent-own-secret"]

    # Turned off by PATCH: the ordinary rules again.
    r = api.patch(f"/api/v1/agents/{agent_id}", json={"credential_passthrough": False})
    assert r.status_code == 200 and r.json()["credential_passthrough"] is False
    r = httpx.post(
        url,
        json=rpc(status=401, headers=[["WWW-Authenticate", "Basic"]]),
        headers={
            "Authorization": f"Bearer {caller_token}",
            "X-Gateway-Authorization": "Bearer something-else",
        },
    )
    assert r.status_code == 401 and "www-authenticate" not in r.headers
    assert "authorization" not in hagent.names()
    assert "x-gateway-authorization" not in hagent.names()


def test_passthrough_field_on_both_registration_surfaces(live_server_url, api):
    agent_id = new_id("pf")
    for bad in ("yes", 1, None, {"x": 1}):
        r = api.post(
            "/api/v1/agents",
            json={
                "agent_id": agent_id,
                "url": "http://127.0.0.1:9/",
                "credential_passthrough": bad,
                "card": {"name": "x", "url": "http://127.0.0.1:9/"},
            },
        )
        assert r.status_code == 400, bad
    card = kcard(agent_id)
    card["credential_passthrough"] = True
    r = api.post("/agents/register", json=card)
    assert r.status_code == 200, r.text
    assert Agent.objects.get(agent_id=agent_id).credential_passthrough is True
    route = runtime.current_node().table.get(agent_id)
    assert route is not None and route.credential_passthrough is True
    card["credential_passthrough"] = "true"
    r = api.post("/agents/register", json=card)
    assert r.status_code == 400 and "credential_passthrough" in r.text
    # re-registering without the field keeps the agent's choice
    del card["credential_passthrough"]
    assert api.post("/agents/register", json=card).status_code == 200
    assert runtime.current_node().table.get(agent_id).credential_passthrough is True
