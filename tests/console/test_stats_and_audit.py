"""Per-agent statistics and the call audit log, checked against the calls actually made
through the real gateway (uvicorn, real a2a-sdk agent, a raw failing agent, a dead port)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import orjson
import pytest
from django.db import connections
from django.db.models import Count, Sum

from console import flusher
from console.models import AgentMinute, CallRecord, ClientUsage
from console.selectors import agent_stats, dashboard
from gateway import recorder
from gateway.histogram import BUCKETS, bucket_of, percentile_ms
from tests.servers import flush_console_now, free_port, serve_app

pytestmark = pytest.mark.django_db(transaction=True)


def rpc(text: str, method: str = "message/send") -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": {
        "message": {"kind": "message", "role": "user", "messageId": "m1",
                    "parts": [{"kind": "text", "text": text}]}}})


async def failing_agent(scope, receive, send) -> None:
    """Answers every POST with a plain-text 500 (an application error: executed)."""
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 500,
                "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"boom"})


def db(fn):
    """ORM work in a worker thread (its own connection), like the server's."""
    def run():
        try:
            return fn()
        finally:
            connections.close_all()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(run).result()


def wait_for(predicate, timeout: float = 15.0):
    deadline = time.monotonic() + timeout
    while True:
        value = db(predicate)
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.1)


@pytest.fixture
def fast_flush(settings):
    settings.A2A_STATS_FLUSH_SECONDS = 0.2
    recorder.reset()
    yield settings
    recorder.reset()


@pytest.fixture
def flush_on_demand(settings):
    """No timed flush during the test (it calls ``flush_console_now``): refused calls are
    aggregated per flush, so a timed flush between two of them would make two rows."""
    settings.A2A_STATS_FLUSH_SECONDS = 3600
    recorder.reset()
    yield settings
    recorder.reset()


def test_statistics_and_audit_match_the_calls_made(fast_flush, live_server_url, echo_agent,
                                                   register_agent, api, caller):
    # The defaults: statistics on, A2A_AUDIT=errors.
    ok = register_agent(echo_agent)
    with serve_app(failing_agent, lifespan="off") as bad:
        card = dict(echo_agent.card_document, url=f"{bad.url}/")
        r = api.post("/api/v1/agents", json={"agent_id": "failing-agent", "url": f"{bad.url}/",
                                             "card": card})
        assert r.status_code == 201, r.text
        dead_url = f"http://127.0.0.1:{free_port()}/"
        r = api.post("/api/v1/agents", json={"agent_id": "dead-agent", "url": dead_url,
                                             "card": dict(card, url=dead_url)})
        assert r.status_code == 201, r.text

        sent_ok, got_ok = 0, 0
        with httpx.Client(base_url=live_server_url, headers=caller.auth, timeout=30) as http:
            for i in range(7):
                body = rpc(f"hello {i}")
                response = http.post(f"/a2a/{ok.agent_id}", content=body,
                                     headers={"Content-Type": "application/json"})
                assert response.status_code == 200 and response.headers["x-a2a-executed"] == "true"
                sent_ok += len(body)
                got_ok += len(response.content)
            for _ in range(3):
                response = http.post("/a2a/failing-agent", content=rpc("x"),
                                     headers={"Content-Type": "application/json"})
                assert response.status_code == 500
                assert response.headers["x-a2a-executed"] == "true"
            for _ in range(2):
                response = http.post("/a2a/dead-agent", content=rpc("x"),
                                     headers={"Content-Type": "application/json"})
                assert response.json()["error"]["data"]["kind"] == "unreachable"
                assert response.headers["x-a2a-executed"] == "false"

    def totals(agent_id):
        return AgentMinute.objects.filter(agent_id=agent_id).aggregate(
            requests=Sum("requests"), exec_=Sum("errors_executed"),
            noexec=Sum("errors_not_executed"), agent=Sum("errors_agent"), bytes_in=Sum("bytes_in"),
            bytes_out=Sum("bytes_out"))

    assert wait_for(lambda: totals("dead-agent")["requests"] == 2
                    and CallRecord.objects.count() == 5)
    ok_totals = db(lambda: totals(ok.agent_id))
    assert ok_totals == {"requests": 7, "exec_": 0, "noexec": 0, "agent": 0, "bytes_in": sent_ok,
                         "bytes_out": got_ok}
    # The agent's own 500s are agent errors, not the gateway's.
    assert db(lambda: totals("failing-agent"))["requests"] == 3
    assert db(lambda: totals("failing-agent"))["agent"] == 3
    assert db(lambda: totals("failing-agent"))["exec_"] == 0
    assert db(lambda: totals("dead-agent"))["noexec"] == 2

    # Audit "errors": exactly the five failed calls, metadata only, with the caller's id.
    rows = db(lambda: list(CallRecord.objects.order_by("at").values(
        "caller", "agent_id", "method", "outcome", "executed", "http_status", "request_bytes",
        "response_bytes", "latency_ms")))
    assert [(r["agent_id"], r["outcome"], r["executed"], r["http_status"]) for r in rows] == (
        [("failing-agent", "agent_error", True, 500)] * 3
        + [("dead-agent", "unreachable", False, 200)] * 2)
    assert {r["caller"] for r in rows} == {caller.client_id}
    assert {r["method"] for r in rows} == {"message/send"}
    assert all(r["request_bytes"] == len(rpc("x")) and r["latency_ms"] > 0 for r in rows)
    assert rows[0]["response_bytes"] == len(b"boom")

    # The selectors the admin shows: p50/p95 from the summed histogram, last outcome.
    stats = db(lambda: agent_stats(agent_id=ok.agent_id, since=_minutes_ago(30)))
    assert stats.requests == 7 and stats.p50_ms is not None and stats.p95_ms >= stats.p50_ms
    dead = db(lambda: agent_stats(agent_id="dead-agent", since=_minutes_ago(30)))
    assert dead.last_outcome == "unreachable"
    dash = db(dashboard)
    assert dash["series"].total_requests == 12 and dash["series"].total_errors == 5
    assert dash["series"].total_agent_errors == 3 and dash["series"].total_gateway_errors == 2
    assert [row["agent_id"] for row in dash["top_traffic"]][0] == ok.agent_id
    assert [row["agent_id"] for row in dash["top_errors"]] == ["failing-agent", "dead-agent"]
    assert db(lambda: ClientUsage.objects.filter(client_id=caller.client_id).exists())


def _minutes_ago(minutes: int):
    from datetime import timedelta

    from django.utils import timezone

    return timezone.now() - timedelta(minutes=minutes)


def test_audit_all_keeps_every_call_and_off_keeps_none(fast_flush, live_server_url,
                                                       echo_agent, register_agent, caller):
    recorder.configure(stats_on=True, audit="all", cap=100)  # A2A_AUDIT=all, read at start
    ok = register_agent(echo_agent)
    with httpx.Client(base_url=live_server_url, headers=caller.auth, timeout=30) as http:
        for i in range(4):
            assert http.post(f"/a2a/{ok.agent_id}", content=rpc(f"hi {i}"),
                             headers={"Content-Type": "application/json"}).status_code == 200
    assert wait_for(lambda: CallRecord.objects.filter(outcome="ok").count() == 4)
    recorder.configure(stats_on=False, audit="off", cap=10)  # what the settings select
    with httpx.Client(base_url=live_server_url, headers=caller.auth, timeout=30) as http:
        http.post(f"/a2a/{ok.agent_id}", content=rpc("quiet"),
                  headers={"Content-Type": "application/json"})
    time.sleep(0.6)
    assert db(lambda: CallRecord.objects.count()) == 4
    assert db(lambda: AgentMinute.objects.aggregate(n=Sum("requests"))["n"]) == 4
    assert not recorder.stats or all(c[0] <= 4 for c in recorder.stats.values())


def test_pending_audit_rows_are_capped_and_drops_counted(settings, live_server_url,
                                                         register_agent, echo_agent, caller):
    """The bound on memory, against a running node: with the flush held off, the node keeps at
    most A2A_AUDIT_MAX_PENDING audit rows and counts the rest as dropped."""
    settings.A2A_STATS_FLUSH_SECONDS = 3600  # no flush during the test
    settings.A2A_AUDIT_MAX_PENDING = 3
    recorder.reset()
    recorder.configure(stats_on=True, audit="all", cap=3)
    ok = register_agent(echo_agent)
    with httpx.Client(base_url=live_server_url, headers=caller.auth, timeout=30) as http:
        for i in range(7):
            http.post(f"/a2a/{ok.agent_id}", content=rpc(f"hi {i}"),
                      headers={"Content-Type": "application/json"})
    # The handler records a request just after its last byte went out: the caller may see the
    # 7th reply before the 7th record lands (a busy machine), so wait for all 7 to be counted.
    wait_for(lambda: sum(c[0] for c in list(recorder.stats.values())) == 7)
    assert len(recorder.audit) == 3 and recorder.dropped["audit"] == 4
    assert recorder.stats and sum(c[0] for c in recorder.stats.values()) == 7
    db(lambda: flusher.write_batch(flusher.take_batch(), "test-node"))
    assert db(lambda: CallRecord.objects.count()) == 3
    assert db(lambda: AgentMinute.objects.get(agent_id=ok.agent_id).requests) == 7
    recorder.reset()


def test_flush_is_idempotent_and_sums_across_nodes(db):
    """Each node upserts its own absolute row; the admin sums the nodes."""
    class Done:
        outcome, started, status, nbytes = "ok", True, 200, 10

    recorder.reset()
    recorder.configure(stats_on=True, audit="off", cap=10)
    for _ in range(5):
        recorder.record("agent-a", "c1", "message/send", Done, 100, 0.004)
    batch = flusher.take_batch()
    flusher.write_batch(batch, "node-1")
    flusher.write_batch(batch, "node-1")  # a repeated flush changes nothing
    flusher.write_batch(batch, "node-2")
    assert AgentMinute.objects.count() == 2
    stats = agent_stats(agent_id="agent-a", since=_minutes_ago(5))
    assert (stats.requests, stats.bytes_in, stats.bytes_out) == (10, 1000, 100)
    assert 2.8 < stats.p50_ms < 5.7  # 4 ms falls in the (2.8, 5.7] ms buckets' middle
    recorder.reset()


def test_histogram_percentiles():
    hist = [0] * BUCKETS
    for seconds in [0.001] * 90 + [0.100] * 10:
        hist[bucket_of(seconds)] += 1
    assert 0.7 < percentile_ms(hist, 0.5) < 1.45
    assert 0.7 < percentile_ms(hist, 0.9) < 1.45
    assert 70 < percentile_ms(hist, 0.95) < 145
    assert percentile_ms([0] * BUCKETS, 0.5) is None
    assert bucket_of(10_000) == BUCKETS - 1


def test_open_streams_are_counted_per_minute(fast_flush, live_server_url, echo_agent_factory,
                                             register_agent, caller):
    """A stream held open across a flush shows as the minute's stream high-water mark."""
    slow = echo_agent_factory(step_delay=0.6)  # 4 steps: the stream stays open ~2.4 s
    agent = register_agent(slow)
    body = rpc("task: stream please", method="message/stream")  # "task" streams 4 steps
    with httpx.Client(base_url=live_server_url, headers=caller.auth, timeout=30) as http:
        with http.stream("POST", f"/a2a/{agent.agent_id}", content=body,
                         headers={"Content-Type": "application/json",
                                  "Accept": "text/event-stream"}) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            assert wait_for(lambda: AgentMinute.objects.filter(
                agent_id=agent.agent_id, streams_max__gte=1).exists(), timeout=5)
            events = sum(1 for line in response.iter_lines() if line.startswith("data:"))
    assert events >= 2
    assert wait_for(lambda: AgentMinute.objects.filter(agent_id=agent.agent_id)
                    .aggregate(n=Sum("requests"))["n"] == 1)


def test_refused_calls_are_audited_aggregated(flush_on_demand, live_server_url, echo_agent,
                                               register_agent, caller, make_caller, settings):
    """401, 403, 429 and agent_not_found reach the call audit: one row per caller, agent and
    outcome (per flush) with the number of calls it stands for, the caller named by its address
    when it did not authenticate."""
    from gateway import runtime

    ok = register_agent(echo_agent)
    other = make_caller(agents=["someone-else"])
    headers = {"Content-Type": "application/json"}
    with httpx.Client(base_url=live_server_url, timeout=30) as http:
        for _ in range(3):
            r = http.post(f"/a2a/{ok.agent_id}", content=rpc("x"), headers=headers)
            assert r.status_code == 401
        r = http.post(f"/a2a/{ok.agent_id}", content=rpc("x"),
                      headers={**headers, **other.auth})
        assert r.status_code == 403
        for _ in range(2):
            r = http.post("/a2a/no-such-agent", content=rpc("x"),
                          headers={**headers, **caller.auth})
            assert r.json()["error"]["data"]["kind"] == "agent_not_found"
        settings.A2A_RATE_LIMIT_PER_SECOND = 1
        settings.A2A_RATE_LIMIT_BURST = 1
        runtime.current_node().limiter.clock = lambda: 1000.0  # nothing refills
        statuses = [http.post(f"/a2a/{ok.agent_id}", content=rpc("x"),
                              headers={**headers, **caller.auth}).status_code for _ in range(3)]
        assert statuses == [200, 429, 429]

    def refused_rows():
        return list(CallRecord.objects.exclude(outcome="ok").order_by("outcome").values_list(
            "caller", "agent_id", "method", "outcome", "executed", "http_status", "count"))

    flush_console_now()
    assert db(refused_rows) == [
        (caller.client_id, "no-such-agent", "message/send", "agent_not_found", False, 200, 2),
        (other.client_id, ok.agent_id, "message/send", "forbidden", False, 403, 1),
        (caller.client_id, ok.agent_id, "message/send", "rate_limited", False, 429, 2),
        ("address:127.0.0.1", ok.agent_id, "message/send", "unauthenticated", False, 401, 3),
    ]


def test_a_flood_of_refused_calls_adds_a_bounded_number_of_rows(fast_flush, live_server_url,
                                                                caller):
    """Refusals to ever-new agent ids (a row each) stop making rows at the per-minute cap;
    the rest are counted as dropped, and every refusal is either in a row's count or there."""
    recorder.configure(stats_on=True, audit="errors", cap=100, refused_per_minute=3)
    flood = 40
    with httpx.Client(base_url=live_server_url, headers=caller.auth, timeout=30) as http:
        for i in range(flood):
            r = http.post(f"/a2a/missing-{i}", content=rpc("x"),
                          headers={"Content-Type": "application/json"})
            assert r.json()["error"]["data"]["kind"] == "agent_not_found"

    def written():
        return CallRecord.objects.aggregate(rows=Count("id"), calls=Sum("count"))

    assert wait_for(lambda: (written()["calls"] or 0) + recorder.dropped["refused"] == flood)
    figures = db(written)
    # Three rows per minute; a minute boundary during the flood allows three more.
    assert 3 <= figures["rows"] <= 6
    assert recorder.dropped["refused"] >= flood - 6
