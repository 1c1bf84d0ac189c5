"""A tenant's rate and stream quotas (docs/tenants.md "Quotas") on a live node with real a2a-sdk
agents: registrations per minute on /api/v1 and the KubeMQ surface,
calls per second on JSON-RPC, HTTP+JSON and gRPC, concurrent streams on the three bindings --
each refused with 429 (gRPC ``RESOURCE_EXHAUSTED``) naming the quota, the tenant and the limit,
the agent not called; allowed again after the window or the stream's end; tenant beta and the
default tenant go on meanwhile. Windows are short here (settings), and the node re-reads the
quotas on demand (:func:`_refresh`) instead of waiting for its background refresh."""

from __future__ import annotations

import asyncio
import re
import time

import grpc
import httpx
import pytest
from a2a.types import a2a_pb2
from a2a.types import a2a_pb2_grpc as grpc10

from core import lifecycle as node_config
from gateway import runtime
from registry import quotas, services
from registry.models import Tenant
from tests.a2a_agents import user_message

WINDOW = 2.0


def _msg(text: str, number: int = 1) -> dict:
    return {"role": "user", "messageId": f"m{number}-{time.monotonic_ns()}",
            "parts": [{"kind": "text", "text": text}]}


def _rpc(method: str, text: str = "hi") -> dict:
    return {"jsonrpc": "2.0", "id": 7, "method": method, "params": {"message": _msg(text)}}


def _rest(text: str = "hi") -> dict:
    return {"message": {"messageId": f"r-{time.monotonic_ns()}", "role": "ROLE_USER",
                        "parts": [{"text": text}]}}


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _posts(agent) -> int:
    return len([r for r in agent.requests if r.http_method == "POST"])


@pytest.fixture(autouse=True)
def _quota_settings(settings):
    """Set before the live node starts: short registration windows, a gRPC listener."""
    settings.A2A_TENANT_REGISTRATION_WINDOW_SECONDS = WINDOW
    settings.A2A_GRPC_PORT = 0


def _on_node(coro):
    node = runtime.current_node()
    assert node is not None
    return asyncio.run_coroutine_threadsafe(coro, node.loop).result(30)


def _refresh() -> None:
    """The node re-reads the tenants' quotas now (its background job does every
    A2A_TENANT_QUOTAS_REFRESH_SECONDS); the registry forgets the ones it read."""
    quotas.forget_tenant_limits()
    _on_node(runtime.current_node()._refresh_quotas())


def _set(slug: str, **limits) -> None:
    Tenant.objects.filter(slug=slug).update(**{f: limits.get(f) for f in quotas.LIMIT_FIELDS})
    _refresh()


@pytest.fixture
def world(live_server_url, echo_agent_factory):
    """Tenants acme and beta, each a register+call client and its own SDK agent ``echo``.
    The quotas the registry remembers are forgotten before and after (a later test's tenant
    of the same slug starts without them)."""
    quotas.forget_tenant_limits()
    world = {"url": live_server_url, "agents": {}}
    for slug in ("acme", "beta"):
        services.tenant_create(slug=slug)
        token = services.api_client_create(name=f"{slug}-rc", scopes=["register", "call"],
                                           tenant=slug)[1]
        world[slug] = token
        agent = echo_agent_factory(card_shape="both")
        r = httpx.post(f"{live_server_url}/api/v1/agents", headers=_auth(token),
                       json={"agent_id": "echo", "url": agent.url, "card": agent.card_document})
        assert r.status_code == 201, r.text
        world["agents"][slug] = agent
    world["admin"] = services.api_client_create(name="admin-q", scopes=["admin"])[1]
    yield world
    quotas.forget_tenant_limits()


def _assert_429(r: httpx.Response, quota: str, limit: int) -> str:
    assert r.status_code == 429, r.text
    assert int(r.headers["retry-after"]) >= 1
    message = r.text
    assert "tenant acme" in message and quota in message and f"at most {limit}" in message
    return message


def test_registrations_per_minute_on_every_surface(world):
    base, acme, beta = world["url"], _auth(world["acme"]), _auth(world["beta"])
    agent = world["agents"]["acme"]
    _set("acme", max_registrations_per_minute=2)
    counted_before = quotas.refused_counts().get(("acme", "max_registrations_per_minute"), 0)
    v1 = {"agent_id": "echo", "url": agent.url, "card": agent.card_document}
    kubemq = {**agent.card_document, "agent_id": "echo", "name": "Echo", "url": agent.url}
    # Two registrations (a re-registration counts) go through, the third is refused.
    assert httpx.post(f"{base}/api/v1/agents", headers=acme, json=v1).status_code == 200
    assert httpx.post(f"{base}/agents/register", headers=acme, json=kubemq).status_code == 200
    started = time.monotonic()
    refused = httpx.post(f"{base}/api/v1/agents", headers=acme, json=v1)
    _assert_429(refused, "max_registrations_per_minute", 2)
    body = refused.json()
    assert set(body) == {"error", "retry_after"}
    assert body["retry_after"] == int(refused.headers["retry-after"]) <= WINDOW + 1
    # The KubeMQ surface alike, in its own shape.
    refused = httpx.post(f"{base}/agents/register", headers=acme, json=kubemq)
    _assert_429(refused, "max_registrations_per_minute", 2)
    assert set(refused.json()) == {"error", "retry_after"}
    # A heartbeat is no registration; beta and the default tenant register meanwhile.
    assert httpx.post(f"{base}/api/v1/agents/echo/heartbeat", headers=acme).status_code == 200
    beta_agent = world["agents"]["beta"]
    for _ in range(3):
        assert httpx.post(f"{base}/api/v1/agents", headers=beta, json={
            "agent_id": "echo", "url": beta_agent.url,
            "card": beta_agent.card_document}).status_code == 200
        assert httpx.post(f"{base}/api/v1/agents", headers=_auth(world["admin"]), json={
            "agent_id": "plain", "url": beta_agent.url,
            "card": beta_agent.card_document}).status_code in (200, 201)
    # Once Retry-After has passed, acme registers again.
    time.sleep(max(0.0, body["retry_after"] - (time.monotonic() - started)) + 0.1)
    again = httpx.post(f"{base}/api/v1/agents", headers=acme, json=v1)
    assert again.status_code == 200, again.text
    # The refusals are counted on /metrics.
    metrics = httpx.get(f"{base}/metrics", headers=_auth(world["admin"])).text
    counted = re.search(r'kubemq_a2a_tenant_quota_refused_total\{quota="max_registrations_per_'
                        r'minute",tenant="acme"\} (\d+)', metrics)
    assert counted is not None and int(counted.group(1)) == counted_before + 2, metrics


def _until_refused(call, tries: int = 12):
    """Call until refused: (the refusal, the calls admitted before it)."""
    for admitted in range(tries):
        answer = call()
        if answer.status_code == 429:
            return answer, admitted
        assert answer.status_code == 200, answer.text
    raise AssertionError(f"no refusal in {tries} calls")


def test_calls_per_second_on_every_binding(world):
    base, acme, beta = world["url"], _auth(world["acme"]), _auth(world["beta"])
    agent = world["agents"]["acme"]
    _set("acme", max_calls_per_second=2)
    with httpx.Client(timeout=10) as client:
        # JSON-RPC: the bucket holds at most the limit; the refusal is the per-client rate
        # limit's answer, naming the tenant's quota, and the agent is not called.
        before = _posts(agent)
        refused, admitted = _until_refused(
            lambda: client.post(f"{base}/a2a/t/acme/echo", headers=acme,
                                json=_rpc("message/send")))
        assert 1 <= admitted <= 2 + 1  # the bucket refills meanwhile by at most one call
        message = _assert_429(refused, "max_calls_per_second", 2)
        error = refused.json()["error"]
        assert error["data"]["kind"] == "rate_limited" and error["code"] == -32058
        assert refused.headers["x-a2a-executed"] == "false"
        assert _posts(agent) == before + admitted
        assert "calls per second" in message
        # Tenant beta, and the default tenant (no quota), call on while acme is throttled.
        admin = _auth(world["admin"])
        beta_agent = world["agents"]["beta"]
        assert client.post(f"{base}/api/v1/agents", headers=admin, json={
            "agent_id": "plain", "url": beta_agent.url,
            "card": beta_agent.card_document}).status_code == 201
        for _ in range(5):
            ok = client.post(f"{base}/a2a/t/beta/echo", headers=beta, json=_rpc("message/send"))
            assert ok.status_code == 200, ok.text
            ok = client.post(f"{base}/a2a/plain", headers=admin, json=_rpc("message/send"))
            assert ok.status_code == 200, ok.text
        # HTTP+JSON: that binding's error shape.
        refused, _ = _until_refused(lambda: client.post(
            f"{base}/a2a/t/acme/echo/message:send", headers=acme, json=_rest()))
        _assert_429(refused, "max_calls_per_second", 2)
        assert refused.json()["error"]["status"] == "RESOURCE_EXHAUSTED"
        assert refused.headers["x-a2a-executed"] == "false"
        # A stream is a call too.
        refused, _ = _until_refused(lambda: client.post(
            f"{base}/a2a/t/acme/echo", headers=acme, json=_rpc("message/stream")))
        _assert_429(refused, "max_calls_per_second", 2)
    # gRPC (translated to the agent's JSON-RPC): RESOURCE_EXHAUSTED with the message.
    port = node_config.grpc_port()

    async def grpc_calls() -> tuple[grpc.StatusCode, str, str]:
        request = a2a_pb2.SendMessageRequest(tenant="acme.echo",
                                             message=user_message("hello").message)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = grpc10.A2AServiceStub(channel)
            for _ in range(12):
                try:
                    await stub.SendMessage(request, metadata=(
                        ("authorization", f"Bearer {world['acme']}"),))
                except grpc.aio.AioRpcError as exc:
                    trailers = {k: v for k, v in exc.trailing_metadata() or ()}
                    return exc.code(), exc.details() or "", str(trailers.get("x-a2a-executed"))
        raise AssertionError("no refusal over gRPC")

    code, details, executed = _on_node(grpc_calls())
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and executed == "false"
    assert "tenant acme" in details and "max_calls_per_second" in details
    # A second later the bucket has refilled.
    time.sleep(1.1)
    ok = httpx.post(f"{base}/a2a/t/acme/echo", headers=acme, json=_rpc("message/send"))
    assert ok.status_code == 200, ok.text
    # No quota: no refusal (the default tenant's, and acme's once it is removed).
    _set("acme")
    with httpx.Client(timeout=10) as client:
        for _ in range(8):
            assert client.post(f"{base}/a2a/t/acme/echo", headers=acme,
                               json=_rpc("message/send")).status_code == 200


def _open_streams(slug: str) -> int:
    return runtime.current_node().quotas.streams.get(slug, 0)


def _wait_streams(slug: str, count: int) -> None:
    deadline = time.monotonic() + 10
    while _open_streams(slug) != count:
        assert time.monotonic() < deadline, f"{slug} still has {_open_streams(slug)} streams"
        time.sleep(0.05)


def test_concurrent_streams_released_when_streams_end(world):
    base, acme, beta = world["url"], _auth(world["acme"]), _auth(world["beta"])
    _set("acme", max_concurrent_streams=1)
    with httpx.Client(timeout=30) as holder, holder.stream(
            "POST", f"{base}/a2a/t/acme/echo", headers=acme,
            json=_rpc("message/stream", "wait for me")) as held:
        assert held.status_code == 200
        lines = held.iter_lines()  # kept: closing it would close the stream
        next(line for line in lines if line.startswith("data:"))
        assert _open_streams("acme") == 1
        # A second stream of acme on each binding: refused, the agent not called.
        before = _posts(world["agents"]["acme"])
        refused = httpx.post(f"{base}/a2a/t/acme/echo", headers=acme,
                             json=_rpc("message/stream"))
        _assert_429(refused, "max_concurrent_streams", 1)
        assert refused.json()["error"]["data"]["kind"] == "rate_limited"
        assert refused.headers["x-a2a-executed"] == "false"
        refused = httpx.post(f"{base}/a2a/t/acme/echo/message:stream", headers=acme,
                             json=_rest())
        _assert_429(refused, "max_concurrent_streams", 1)
        assert refused.json()["error"]["status"] == "RESOURCE_EXHAUSTED"
        resubscribe = {"jsonrpc": "2.0", "id": 9, "method": "tasks/resubscribe",
                       "params": {"id": "no-such-task"}}
        refused = httpx.post(f"{base}/a2a/t/acme/echo", headers=acme, json=resubscribe)
        _assert_429(refused, "max_concurrent_streams", 1)
        port = node_config.grpc_port()

        async def grpc_stream() -> tuple[grpc.StatusCode, str]:
            request = a2a_pb2.SendMessageRequest(tenant="acme.echo",
                                                 message=user_message("hi").message)
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                call = grpc10.A2AServiceStub(channel).SendStreamingMessage(
                    request, metadata=(("authorization", f"Bearer {world['acme']}"),))
                try:
                    async for _ in call:
                        pass
                except grpc.aio.AioRpcError as exc:
                    return exc.code(), exc.details() or ""
            raise AssertionError("the stream was not refused")

        code, details = _on_node(grpc_stream())
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "max_concurrent_streams" in details
        assert _posts(world["agents"]["acme"]) == before
        # A plain call is no stream, and beta streams meanwhile.
        assert httpx.post(f"{base}/a2a/t/acme/echo", headers=acme,
                          json=_rpc("message/send")).status_code == 200
        streamed = httpx.post(f"{base}/a2a/t/beta/echo", headers=beta,
                              json=_rpc("message/stream"))
        assert streamed.status_code == 200 and "echo: hi" in streamed.text
    # The caller left: its slot is given back, and a new stream goes through; that one ends
    # by the agent's own end, and gives its slot back too.
    _wait_streams("acme", 0)
    streamed = httpx.post(f"{base}/a2a/t/acme/echo", headers=acme, json=_rpc("message/stream"))
    assert streamed.status_code == 200 and "echo: hi" in streamed.text
    _wait_streams("acme", 0)
    streamed = httpx.post(f"{base}/a2a/t/acme/echo/message:stream", headers=acme, json=_rest())
    assert streamed.status_code == 200, streamed.text
    _wait_streams("acme", 0)
