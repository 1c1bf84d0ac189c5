"""End-to-end tracing (docs/tracing.md): the gateway continues the caller's W3C trace, the
owning node's span is a child of the entry node's, and the agent receives a ``traceparent``
whose parent is the gateway's outbound span.

The node in this process exports to the OpenTelemetry SDK's in-memory exporter. The second
node (distributed mode) is ``manage.py serve`` in a subprocess exporting with the real OTLP/HTTP
exporter to a collector stub this test runs on loopback (it decodes the OTLP protobuf). The
agents are real a2a-sdk agents that record the headers they receive.
"""

from __future__ import annotations

import gzip
import os
import subprocess
import threading

import httpx
import pytest
from django.conf import settings
from django.db import connection
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from core import tracing
from discovery.config_file import config_file_sync
from discovery.loop import run_cycle
from gateway import tracing as gateway_tracing
from registry import services
from registry.permissions import SYSTEM
from tests.discovery.servers import CardServer, make_card, skill
from tests.gateway.test_streaming import wait_until
from tests.servers import free_port, read_body, serve_app, start_node

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CALLER_SPAN}-01"


def rpc(text: str, **message) -> dict:
    return {
        "jsonrpc": "2.0",
        "id": "t1",
        "method": "message/send",
        "params": {
            "message": {
                "role": "user",
                "messageId": f"m-{os.urandom(3).hex()}",
                "kind": "message",
                "parts": [{"kind": "text", "text": text}],
                **message,
            }
        },
    }


@pytest.fixture
def spans():
    """Tracing on in this process, spans kept in memory."""
    exporter = InMemorySpanExporter()
    tracing.setup(exporter=exporter)
    yield exporter
    tracing.shutdown()


def _hex(value: int, width: int) -> str:
    return format(value, f"0{width}x")


def the_pair(exporter, method: str):
    """The call's entry (SERVER) and agent call (CLIENT) spans, once both ended; the entry
    continues the caller's trace and the agent call is its child."""
    wait_until(lambda: by_name(exporter, f"a2a {method}")
               and by_name(exporter, f"a2a.agent {method}"), timeout=5)
    (entry,) = by_name(exporter, f"a2a {method}")
    (client,) = by_name(exporter, f"a2a.agent {method}")
    assert entry.kind == SpanKind.SERVER and client.kind == SpanKind.CLIENT
    assert _hex(entry.context.trace_id, 32) == TRACE_ID
    assert _hex(entry.parent.span_id, 16) == CALLER_SPAN and entry.parent.is_remote
    assert entry.context.trace_state.get("k") == "v"
    assert client.context.trace_id == entry.context.trace_id
    assert client.parent.span_id == entry.context.span_id
    return entry, client


def by_name(exporter: InMemorySpanExporter, name: str) -> list:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def _traceparent_parts(value: str) -> tuple[str, str]:
    version, trace_id, parent_id, flags = value.split("-")
    assert version == "00" and flags == "01"
    return trace_id, parent_id


@pytest.mark.parametrize("path_mode", ["local", "broker"])
def test_call_continues_the_callers_trace_to_the_agent(
    spans, settings, path_mode, echo_agent, register_agent, make_caller, live_server_url
):
    settings.A2A_LOCAL_FAST_PATH = path_mode == "local"
    registered = register_agent(echo_agent)
    caller = make_caller()
    body = rpc("task trace me", contextId="ctx-42")
    r = httpx.post(
        f"{live_server_url}/a2a/{registered.agent_id}",
        json=body,
        timeout=30,
        headers={**caller.auth, "traceparent": TRACEPARENT, "tracestate": "k=v"},
    )
    assert r.status_code == 200 and r.headers["x-a2a-executed"] == "true", r.text
    # The entry span continues the caller's trace, the subscriber's span is its child ...
    entry, outbound = the_pair(spans, "message/send")
    # ... and the agent got a traceparent whose parent is the subscriber's span.
    arrived = echo_agent.recorder.rpc("message/send")[-1]
    trace_id, parent_id = _traceparent_parts(arrived.header("traceparent"))
    assert trace_id == TRACE_ID and parent_id == _hex(outbound.context.span_id, 16)
    assert arrived.header("tracestate") == "k=v"

    attrs = dict(entry.attributes)
    assert attrs["a2a.agent_id"] == registered.agent_id
    assert attrs["rpc.method"] == "message/send" and attrs["a2a.context_id"] == "ctx-42"
    assert attrs["a2a.outcome"] == "ok" and attrs["a2a.executed"] is True
    assert attrs["a2a.request_bytes"] > 0 and attrs["a2a.response_bytes"] == len(r.content)
    assert attrs["a2a.node"] == settings.NODE_ID and attrs["http.response.status_code"] == 200
    out = dict(outbound.attributes)
    assert out["a2a.local"] is (path_mode == "local")
    task = r.json()["result"]
    assert out["a2a.task_id"] == task["id"] and out["a2a.context_id"] == task["contextId"]


def test_rest_calls_are_traced_like_json_rpc_calls(spans, echo_agent_factory, register_agent,
                                                   make_caller, live_server_url):
    """An HTTP+JSON call: the same entry and subscriber spans, named by the A2A method, with
    its binding; the agent's HTTP+JSON interface gets the subscriber span's context."""
    agent = echo_agent_factory(interfaces=[("HTTP+JSON", "1.0"), ("JSONRPC", "1.0")])
    registered = register_agent(agent)
    caller = make_caller()
    r = httpx.post(
        f"{live_server_url}/a2a/{registered.agent_id}/message:send", timeout=30,
        json={"message": {"messageId": "m-rest", "role": "ROLE_USER",
                          "parts": [{"text": "traced"}]}},
        headers={**caller.auth, "A2A-Version": "1.0", "traceparent": TRACEPARENT})
    assert r.status_code == 200 and r.headers["x-a2a-executed"] == "true", r.text
    wait_until(lambda: by_name(spans, "a2a SendMessage"), timeout=5)
    (entry,) = by_name(spans, "a2a SendMessage")
    (outbound,) = by_name(spans, "a2a.agent SendMessage")
    assert _hex(entry.context.trace_id, 32) == TRACE_ID
    assert outbound.parent.span_id == entry.context.span_id
    attrs = dict(entry.attributes)
    assert attrs["a2a.binding"] == "HTTP+JSON" and "rpc.system" not in attrs
    assert attrs["a2a.outcome"] == "ok" and attrs["http.response.status_code"] == 200
    out = dict(outbound.attributes)
    assert out["server.address"] == f"{agent.rest_url}/message:send"
    assert out["a2a.binding"] == "HTTP+JSON" and "rpc.system" not in out
    [arrived] = [q for q in agent.requests if q.path == "/rest/message:send"]
    trace_id, parent_id = _traceparent_parts(arrived.header("traceparent"))
    assert trace_id == TRACE_ID and parent_id == _hex(outbound.context.span_id, 16)


def test_streams_are_traced_to_their_end(
    spans, echo_agent, register_agent, make_caller, live_server_url
):
    registered = register_agent(echo_agent)
    caller = make_caller()
    body = {**rpc("task stream me"), "method": "message/stream"}
    headers = {**caller.auth, "traceparent": TRACEPARENT}
    url = f"{live_server_url}/a2a/{registered.agent_id}"
    with httpx.stream("POST", url, json=body, headers=headers, timeout=30) as r:
        received = b"".join(r.iter_bytes())
    assert r.headers["content-type"].startswith("text/event-stream")
    wait_until(lambda: by_name(spans, "a2a message/stream"), timeout=5)
    (entry,) = by_name(spans, "a2a message/stream")
    (outbound,) = by_name(spans, "a2a.agent message/stream")
    assert outbound.parent.span_id == entry.context.span_id
    assert entry.attributes["a2a.outcome"] == "ok"
    assert entry.attributes["a2a.response_bytes"] == len(received) > 0
    assert outbound.attributes["a2a.outcome"] == "ok"

    # A caller leaving mid-stream: both spans still end, and say so.
    spans.clear()
    with httpx.stream(
        "POST",
        url,
        json={**body, "params": rpc("wait for me")["params"]},
        headers=headers,
        timeout=30,
    ) as r:
        next(r.iter_bytes())
    wait_until(lambda: by_name(spans, "a2a.agent message/stream"), timeout=10)
    (entry,) = by_name(spans, "a2a message/stream")
    (outbound,) = by_name(spans, "a2a.agent message/stream")
    assert entry.attributes["a2a.outcome"] == "client_disconnect"
    assert outbound.attributes["a2a.outcome"] == "cancelled"


def test_gateway_errors_are_spans_with_their_outcome(
    spans, register_agent, make_caller, live_server_url, api
):
    r = api.post(
        "/api/v1/agents",
        json={
            "agent_id": "gone-agent",
            "url": f"http://127.0.0.1:{free_port()}/",
            "card": {"name": "gone", "url": "http://127.0.0.1:9/"},
        },
    )
    assert r.status_code == 201, r.text
    caller = make_caller()
    r = httpx.post(
        f"{live_server_url}/a2a/gone-agent", json=rpc("hi"), timeout=30, headers=caller.auth
    )
    assert r.json()["error"]["data"]["kind"] == "unreachable"
    wait_until(lambda: by_name(spans, "a2a message/send"), timeout=5)
    (entry,) = by_name(spans, "a2a message/send")
    attrs = dict(entry.attributes)
    assert attrs["a2a.outcome"] == "unreachable" and attrs["a2a.executed"] is False
    assert entry.status.status_code.name == "ERROR"
    assert entry.parent is None
    # the subscriber's span says the same: the connection was refused, nothing was sent
    wait_until(lambda: by_name(spans, "a2a.agent message/send"), timeout=5)
    (outbound,) = by_name(spans, "a2a.agent message/send")
    assert outbound.attributes["a2a.outcome"] == "unreachable"
    assert outbound.attributes["a2a.executed"] is False


def test_tracing_off_changes_nothing(echo_agent, register_agent, make_caller, live_server_url):
    assert not gateway_tracing.ENABLED
    registered = register_agent(echo_agent)
    caller = make_caller()
    r = httpx.post(
        f"{live_server_url}/a2a/{registered.agent_id}",
        json=rpc("hi"),
        timeout=30,
        headers={**caller.auth, "traceparent": TRACEPARENT},
    )
    assert r.status_code == 200
    # The caller's own context reaches the agent untouched: the gateway is transparent.
    assert echo_agent.recorder.rpc("message/send")[-1].header("traceparent") == TRACEPARENT


@pytest.mark.django_db(transaction=True)
def test_registry_and_discovery_spans(spans, tmp_path, settings):
    services.agent_register(
        actor=SYSTEM, agent_id="traced-1", card={"name": "t", "url": "http://127.0.0.1:9/"}
    )
    services.agent_heartbeat(actor=SYSTEM, agent_id="traced-1")
    (register,) = by_name(spans, "registry.register")
    (beat,) = by_name(spans, "registry.heartbeat")
    assert register.attributes["a2a.agent_id"] == beat.attributes["a2a.agent_id"] == "traced-1"

    app = CardServer()
    with serve_app(app, lifespan="off") as server:
        app.url = server.url
        app.set_card("/a/w", make_card("W", app.base("/a/w"), [skill("claims", "warranty")]))
        path = tmp_path / "discovery.json"
        path.write_text(
            '{"allowlist": [{"host": "127.0.0.1", "allow_http": true}], '
            f'"probe": [{{"local_name": "warranty_agent", "base_url": "{app.base("/a/w")}"}}], '
            '"needs": [{"tag": "warranty", "description": "Warranty."}]}'
        )
        settings.DISCOVERY_FETCH_TIMEOUT_SECONDS = 5.0
        config_file_sync(path=str(path), force=True)
        report = run_cycle()
    assert report.selected == 1, report.summary()
    (cycle,) = by_name(spans, "discovery.cycle")
    (fetch,) = by_name(spans, "discovery.card_fetch")
    assert fetch.parent.span_id == cycle.context.span_id
    assert fetch.attributes["http.response.status_code"] == 200
    assert cycle.attributes["discovery.selected"] == 1
    # The registration discovery made is part of the cycle's trace.
    nested = [
        s
        for s in by_name(spans, "registry.register")
        if s.attributes["a2a.agent_id"] == "warranty-agent"
    ]
    assert nested and nested[0].context.trace_id == cycle.context.trace_id


# --- two nodes -------------------------------------------------------------------------------


class OtlpCollector:
    """An OTLP/HTTP trace receiver on loopback: decodes each export request (protobuf)."""

    def __init__(self) -> None:
        self.spans: list[dict] = []
        self._lock = threading.Lock()

    async def __call__(self, scope, receive, send) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
            ExportTraceServiceResponse,
        )

        body = await read_body(receive)
        if dict(scope["headers"]).get(b"content-encoding") == b"gzip":
            body = gzip.decompress(body)
        request = ExportTraceServiceRequest.FromString(body)
        found = []
        for resource in request.resource_spans:
            for scoped in resource.scope_spans:
                for span in scoped.spans:
                    attrs = {}
                    for kv in span.attributes:
                        value = kv.value
                        attrs[kv.key] = getattr(value, value.WhichOneof("value"))
                    found.append(
                        {
                            "name": span.name,
                            "trace_id": span.trace_id.hex(),
                            "span_id": span.span_id.hex(),
                            "parent_span_id": span.parent_span_id.hex(),
                            "attrs": attrs,
                        }
                    )
        with self._lock:
            self.spans.extend(found)
        reply = ExportTraceServiceResponse().SerializeToString()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/x-protobuf")],
            }
        )
        await send({"type": "http.response.body", "body": reply})

    def named(self, name: str) -> list[dict]:
        with self._lock:
            return [s for s in self.spans if s["name"] == name]


def test_parentage_across_two_nodes(
    spans, live_server_url, redis_url, postgres_url, echo_agent, make_caller
):
    if settings.EMBEDDED or connection.vendor != "postgresql":
        pytest.skip("two nodes need the distributed mode (REDIS_URL, DATABASE_URL)")
    from gateway import runtime
    from tests.conftest import make_client
    from tests.gateway.test_cluster import _database_url

    collector = OtlpCollector()
    with serve_app(collector, lifespan="off") as otlp:
        node_b_id = f"node-b-trace-{os.getpid()}"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "OTEL_"))}
        env.update(
            NODE_ID=node_b_id,
            DATABASE_URL=_database_url(),
            REDIS_URL=settings.REDIS_URL,
            SECRET_KEY="trace-test",
            LOG_LEVEL="WARNING",
            A2A_TRACING="on",
            OTEL_TRACES_EXPORTER="otlp",
            OTEL_BSP_SCHEDULE_DELAY="100",
            OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=f"{otlp.url}/v1/traces",
        )
        process, port = start_node(env, what="node B")
        node_b = f"http://127.0.0.1:{port}"
        try:
            _, admin = make_client(["admin"], name="trace-admin")
            r = httpx.post(
                f"{node_b}/api/v1/agents",
                headers={"Authorization": f"Bearer {admin}"},
                json={
                    "agent_id": "traced-on-b",
                    "url": echo_agent.url,
                    "card": echo_agent.card_document,
                },
            )
            assert r.status_code == 201, r.text
            node_a = runtime.current_node()
            wait_until(lambda: node_a.table.get("traced-on-b") is not None, timeout=5)
            assert node_a.table.get("traced-on-b").node_id == node_b_id

            caller = make_caller()
            r = httpx.post(
                f"{live_server_url}/a2a/traced-on-b",
                json=rpc("hello"),
                headers={**caller.auth, "traceparent": TRACEPARENT},
                timeout=30,
            )
            assert r.status_code == 200 and "result" in r.json(), r.text
            wait_until(lambda: collector.named("a2a.agent message/send"), timeout=10)
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    (entry,) = by_name(spans, "a2a message/send")  # node A, in memory
    (remote,) = collector.named("a2a.agent message/send")  # node B, through OTLP
    assert _hex(entry.context.trace_id, 32) == TRACE_ID
    assert _hex(entry.parent.span_id, 16) == CALLER_SPAN
    assert entry.attributes["a2a.node"] == settings.NODE_ID
    assert remote["trace_id"] == TRACE_ID
    assert remote["parent_span_id"] == _hex(entry.context.span_id, 16)
    assert remote["attrs"]["a2a.node"] == node_b_id and remote["attrs"]["a2a.local"] is False
    arrived = echo_agent.recorder.rpc("message/send")[-1]
    assert _traceparent_parts(arrived.header("traceparent")) == (TRACE_ID, remote["span_id"])
    # Node B's registration span went out through the same exporter.
    assert any(
        s["attrs"].get("a2a.agent_id") == "traced-on-b"
        for s in collector.named("registry.register")
    )
