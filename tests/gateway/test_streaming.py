"""SSE relay through the gateway: incremental delivery, keepalives, idle timeout, caller
disconnect, size caps, the GET stream endpoint, and the subscriber's lifecycle.

Over the local fast path and through the Channels layer (``path_mode``), against the scripted
agent of test_proxy, which records when its side of a stream is closed.
"""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import orjson
import pytest

from gateway import runtime
from registry import services
from registry.permissions import SYSTEM
from tests.gateway import test_proxy as proxy
from tests.gateway.test_proxy import _metric, register, rpc
from tests.servers import wire_name

# Every test runs with both outbound clients (tests/gateway/conftest.py).
pytestmark = pytest.mark.usefixtures("outbound_client")

# The scripted agent and the gateway client fixtures of test_proxy.
agent, gw, path_mode, token = proxy.agent, proxy.gw, proxy.path_mode, proxy.token


def read_events(response: httpx.Response, limit: int | None = None):
    """(arrival time, raw event bytes) for each SSE block as it arrives. With ``limit``, stops
    after that many events and leaves the stream open (abandoning httpx's iterator would close
    the connection)."""
    chunks = getattr(response, "_test_chunks", None)
    if chunks is None:
        chunks = response._test_chunks = response.iter_raw()  # type: ignore[attr-defined]  # kept across calls
    buffer = b""
    out = []
    while True:
        while b"\n\n" in buffer:
            block, buffer = buffer.split(b"\n\n", 1)
            out.append((time.monotonic(), block))
            if limit is not None and len(out) >= limit:
                return out
        try:
            buffer += next(chunks)
        except StopIteration:
            return out


def data_of(block: bytes) -> dict:
    for line in block.split(b"\n"):
        if line.startswith(b"data: "):
            return orjson.loads(line[6:])
    raise AssertionError(f"no data line in {block!r}")


def wait_until(predicate, timeout: float = 2.0) -> float:
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout:
            raise AssertionError("condition not reached in time")
        time.sleep(0.02)
    return time.monotonic() - started


def test_events_relayed_in_order_as_they_arrive(gw: httpx.Client, agent, path_mode):
    register("sse-agent", agent.url)
    accept = "text/event-stream, application/json"
    with gw.stream("POST", "/a2a/sse-agent", headers={"Accept": accept},
                   json=rpc("message/stream", rpc_id="s1", mode="sse", events=5, delay=0,
                            gated=True)) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["x-a2a-executed"] == "true" and r.headers["x-a2a-agent-status"] == "200"
        seqs = []
        for i in range(5):
            [(_, block)] = read_events(r, limit=1)
            assert data_of(block)["id"] == "s1"
            seqs.append(data_of(block)["result"]["seq"])
            # The agent sends event i + 1 only after the caller holds event i: each event was
            # relayed when the agent sent it, not buffered.
            assert agent.sent_events == i + 1
            agent.released = i + 1
        assert read_events(r) == []  # then the stream ends
    assert seqs == [0, 1, 2, 3, 4]
    assert agent.arrived[-1].header("accept") == accept  # the caller's Accept, unchanged
    wait_until(lambda: agent.streams_open == 0)
    assert agent.stream_ends == ["complete"]


@pytest.mark.parametrize("method", ["SendStreamingMessage", "tasks/resubscribe",
                                    "SubscribeToTask"])
def test_every_streaming_method_streams(gw: httpx.Client, agent, method):
    register("sse-methods", agent.url)
    with gw.stream("POST", "/a2a/sse-methods", json=rpc(method, mode="sse", events=2,
                                                          delay=0.01)) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        assert len(read_events(r)) == 2


def test_keepalive_then_idle_timeout(gw: httpx.Client, agent, settings, path_mode):
    settings.A2A_SSE_KEEPALIVE_SECONDS = 0.2
    settings.A2A_SSE_IDLE_TIMEOUT_SECONDS = 1.0
    register("idle-agent", agent.url)
    with gw.stream("POST", "/a2a/idle-agent",
                   json=rpc("message/stream", rpc_id=4, mode="sse_silent", delay=30)) as r:
        events = read_events(r)
    # Keepalives while idle, then the terminal error: the idle timeout (1 s, five keepalive
    # periods) ended the stream long before the agent's 30 s silence did.
    keepalives = [b for _, b in events[:-1] if b == b": keepalive"]
    assert keepalives == [b for _, b in events[:-1]] and 1 <= len(keepalives) <= 5, events
    terminal = events[-1][1]
    assert terminal.startswith(b"event: error\n")
    error = data_of(terminal)
    assert error["id"] == 4 and error["error"]["data"]["kind"] == "timeout"
    wait_until(lambda: agent.streams_open == 0)  # upstream connection closed


def test_client_disconnect_closes_upstream_and_frees_the_slot(
    live_server_url, agent, token, path_mode
):
    register("dc-agent", agent.url, max_concurrency=1)
    url = f"{live_server_url}/a2a/dc-agent"
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(timeout=10) as client:
        with client.stream("POST", url, headers=headers,
                           json=rpc("message/stream", mode="sse", events=100, delay=0.1)) as r:
            assert len(read_events(r, limit=2)) == 2
            assert agent.streams_open == 1
            # the slot is taken: a second call is busy
            busy = client.post(url, headers=headers, json=rpc(rpc_id="b"))
            assert busy.json()["error"]["data"]["kind"] == "busy"
            r.close()  # the caller goes away mid-stream
    # The gateway closed the agent's stream (it did not run out: 100 events, 10 s).
    wait_until(lambda: agent.streams_open == 0, timeout=5)
    assert agent.stream_ends == ["disconnect"]
    metrics = httpx.get(f"{live_server_url}/metrics").text
    assert _metric(metrics, "kubemq_a2a_sse_streams_active", agent_id="dc-agent") == 0
    wait_until(lambda: _metric(httpx.get(f"{live_server_url}/metrics").text,
                               "kubemq_a2a_in_flight", agent_id="dc-agent") == 0, timeout=5)
    r = httpx.post(url, headers=headers, json=rpc(rpc_id="after"))
    assert "result" in r.json()  # the slot is free again


def test_kubemq_profile_sends_stream_cancel(live_server_url, agent, token, settings, path_mode):
    settings.A2A_ERROR_PROFILE = "kubemq"
    register("kq-stream", agent.url)
    with httpx.Client(timeout=10) as client:
        with client.stream("POST", f"{live_server_url}/a2a/kq-stream",
                           headers={"Authorization": f"Bearer {token}"},
                           json=rpc("message/stream", rpc_id="st-1", mode="sse", events=100,
                                    delay=0.1)) as r:
            read_events(r, limit=1)
            r.close()
    wait_until(lambda: any(a.payload.get("method") == "stream_cancel" for a in agent.arrived))
    cancel = next(a for a in agent.arrived if a.payload.get("method") == "stream_cancel")
    assert cancel.payload["params"]["id"] == "st-1"
    assert cancel.header("x-kubemq-caller-id")


def test_upfront_errors_on_streaming_methods_are_json(gw: httpx.Client, agent, path_mode):
    register("sse-err", agent.url)
    body = '{"jsonrpc":"2.0","id":1,"error":{"code":-32001,"message":"task not found"}}'
    r = gw.post("/a2a/sse-err", json=rpc("message/stream", mode="status", status=200,
                                         body=body))
    assert r.headers["content-type"] == "application/json" and r.text == body
    assert r.headers["x-a2a-executed"] == "true"
    r = gw.post("/a2a/sse-err", json=rpc("message/stream", rpc_id=2, mode="status", status=503))
    assert r.json()["error"]["data"]["kind"] == "upstream_unavailable"
    assert r.json()["id"] == 2
    from tests.servers import free_port

    register("sse-down", f"http://127.0.0.1:{free_port()}/")
    r = gw.post("/a2a/sse-down", json=rpc("message/stream"))
    assert r.json()["error"]["data"]["kind"] == "unreachable"


def test_oversize_event_ends_the_stream(gw: httpx.Client, agent, settings):
    settings.A2A_MAX_RESPONSE_BYTES = 50_000
    register("big-events", agent.url)
    with gw.stream("POST", "/a2a/big-events",
                   json=rpc("message/stream", rpc_id=8, mode="sse", events=3, delay=0.05,
                            event_size=20_000)) as r:
        events = read_events(r)
    assert len(events) == 3  # each event is under the cap, their sum is not: all relayed
    with gw.stream("POST", "/a2a/big-events",
                   json=rpc("message/stream", rpc_id=9, mode="sse", events=3, delay=0.05,
                            event_size=60_000)) as r:
        events = read_events(r)
    assert len(events) == 1
    error = data_of(events[0][1])
    assert error["id"] == 9 and error["error"]["data"]["kind"] == "response_too_large"
    wait_until(lambda: agent.streams_open == 0)


def test_get_stream_endpoint(gw: httpx.Client, agent, path_mode):
    register("push-agent", agent.url)
    assert gw.post("/a2a/push-agent/stream", json=rpc()).status_code == 405
    # the agent decides what to push; the scripted one streams 3 events by default
    with gw.stream("GET", "/a2a/push-agent/stream", headers={"X-Trace": "t-1"}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = read_events(r)
    arrived = agent.arrived[-1]
    payload = arrived.payload
    assert payload["method"] == "message/stream" and payload["params"] == {}
    assert payload["jsonrpc"] == "2.0" and payload["id"]
    assert arrived.header("x-trace") == "t-1"
    assert arrived.header("content-type") == "application/json"
    assert [data_of(b)["result"]["seq"] for _, b in events] == [0, 1, 2]


def test_deregistration_tears_the_subscriber_down(gw: httpx.Client, agent, settings):
    register("life-agent", agent.url)
    node = runtime.current_node()
    wait_until(lambda: "life-agent" in node.manager.subscribers)
    subscriber = node.manager.subscribers["life-agent"]
    assert subscriber.client_id == "a2a-vsub-life-agent"
    wait_until(lambda: subscriber.running)
    result: dict = {}

    def stream() -> None:  # a live stream is ended by the teardown, not left hanging
        with gw.stream("POST", "/a2a/life-agent",
                       json=rpc("message/stream", mode="sse", events=100, delay=0.1)) as r:
            result["events"] = read_events(r)

    reader = threading.Thread(target=stream)
    reader.start()
    wait_until(lambda: agent.streams_open == 1)
    services.agent_deregister(actor=SYSTEM, agent_id="life-agent")
    wait_until(lambda: not subscriber.running and "life-agent" not in node.manager.subscribers,
               timeout=5)
    if not settings.EMBEDDED:
        import redis

        client = redis.Redis.from_url(settings.REDIS_URL)
        channel = wire_name("_AGENTS_.life-agent")
        wait_until(lambda: client.pubsub_numsub(channel)[0][1] == 0, timeout=1.0)
    reader.join(timeout=5)
    assert not reader.is_alive()
    assert data_of(result["events"][-1][1])["error"]["data"]["kind"] == "unreachable"
    wait_until(lambda: agent.streams_open == 0, timeout=1.0)
    # re-registration spawns a fresh subscriber that serves at once
    register("life-agent", agent.url)
    assert "result" in gw.post("/a2a/life-agent", json=rpc()).json()
    assert node.manager.subscribers["life-agent"] is not subscriber


def test_registration_on_another_node_is_not_subscribed_here(gw: httpx.Client, agent):
    register("moving-agent", agent.url)
    node = runtime.current_node()
    wait_until(lambda: "moving-agent" in node.manager.subscribers)
    register("moving-agent", agent.url, node_id="node-elsewhere")
    wait_until(lambda: "moving-agent" not in node.manager.subscribers, timeout=1.0)
    assert node.table.get("moving-agent").node_id == "node-elsewhere"


def test_resync_restores_a_missed_registration(gw: httpx.Client, agent, settings):
    """The periodic resync is the safety net for events a node never saw."""
    from registry import events

    node = runtime.current_node()
    unsubscribe_all = list(events._subscribers)
    events._subscribers.clear()  # this registration's event is lost on purpose
    try:
        register("missed-agent", agent.url)
    finally:
        events._subscribers.extend(unsubscribe_all)
    assert gw.post("/a2a/missed-agent", json=rpc()).json()["error"]["data"]["kind"] \
        == "agent_not_found"
    asyncio.run_coroutine_threadsafe(node.resync(), node.loop).result(timeout=10)
    assert "result" in gw.post("/a2a/missed-agent", json=rpc()).json()
