"""Failover: calls to a dead owner end at once; a surviving node adopts a dead
node's agents; a node stopping cleanly hands its agents over; KubeMQ's expire-and-re-register
behaviour stays available (``A2A_FAILOVER=expire``).

Real ``manage.py serve`` nodes on a private PostgreSQL and Redis (tests/faults.py), real a2a-sdk
agents; each test counts at the agent which request ids it received, to assert that no call was
lost or run twice. Times are bounded loosely (the liveness TTL is 3 s; what is asserted is that
calls end far sooner than the timeouts that would otherwise end them).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter

import httpx
import pytest

from tests.a2a_agents import EchoAgent
from tests.faults import sse_events as _events
from tests.reliability.conftest import register, rpc_ids_received
from tests.reliability.test_agent_faults import ScriptedAgent
from tests.servers import serve_app

# Private services: CI runs the module in its distributed pass, the lighter one (tests/passes.py).
pytestmark = [pytest.mark.timeout(240), pytest.mark.one_pass("distributed")]


def _send(rpc_id, text: str = "hi", method: str = "message/send", timeout: float | None = None):
    params: dict = {"message": {"role": "user", "messageId": os.urandom(4).hex(),
                                "parts": [{"kind": "text", "text": text}]}}
    if timeout is not None:
        params["configuration"] = {"timeout": timeout}
    return {"jsonrpc": "2.0", "id": rpc_id, "method": method, "params": params}




def _owner(node, token: str, agent_id: str) -> str:
    response = httpx.get(f"{node.url}/api/v1/agents/{agent_id}", timeout=10,
                         headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 200, response.text
    return response.json()["node_id"]


def _wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def start_sync_and_stream(caller: httpx.Client, slow_id: str, echo_id: str,
                          results: dict) -> list[threading.Thread]:
    """A sync call ("sync-1", 60 s timeout) to ``slow_id`` and a long stream ("stream-1") from
    ``echo_id``, each in a thread of its own, started; each ends with ``results["sync"]`` =
    (time it ended, the response) and ``results["stream"]`` = (time it ended, its events)."""

    def sync_call() -> None:
        response = caller.post(f"/a2a/{slow_id}", json=_send("sync-1", timeout=60))
        results["sync"] = (time.monotonic(), response)

    def stream_call() -> None:
        events = []
        with caller.stream("POST", f"/a2a/{echo_id}",
                           json=_send("stream-1", "task long", "message/stream")) as response:
            for event in _events(response):
                events.append(event)
        results["stream"] = (time.monotonic(), events)

    threads = [threading.Thread(target=sync_call), threading.Thread(target=stream_call)]
    for thread in threads:
        thread.start()
    return threads


def test_calls_in_flight_on_a_killed_owner_end_at_once(tokens, start_node):
    """kill -9 of the owning node mid-stream and mid-sync-call: both calls, made through the
    other node, end with ``owner_lost`` (executed true: the agent had them) within a few
    seconds, not after the 300 s stream idle timeout or the 60 s call timeout."""
    owner = start_node()
    entry = start_node()
    slow = ScriptedAgent("slow", delay=90)
    with serve_app(slow, lifespan="off") as slow_server, EchoAgent(steps=600,
                                                                   step_delay=0.1) as echo:
        slow_id = register(owner.url, tokens["admin"], slow_server.url)
        echo_id = register(owner.url, tokens["admin"], echo.url)
        caller = httpx.Client(base_url=entry.url, timeout=120,
                              headers={"Authorization": f"Bearer {tokens['caller']}"})
        results: dict = {}
        threads = start_sync_and_stream(caller, slow_id, echo_id, results)
        _wait(lambda: slow.ids == ["sync-1"] and "stream-1" in rpc_ids_received(echo), 30,
              "both calls to reach their agents")
        time.sleep(1.0)  # a few stream events relayed
        killed = time.monotonic()
        owner.kill()
        for thread in threads:
            thread.join(timeout=60)
        assert not any(t.is_alive() for t in threads), "a call to the dead owner still hangs"

        ended, response = results["sync"]
        assert killed < ended < killed + 20  # the call timeout (60 s) did not end it
        error = response.json()["error"]
        assert error["data"]["kind"] == "owner_lost", response.text
        assert error["data"]["executed"] is True
        assert response.headers["x-a2a-executed"] == "true"

        ended, events = results["stream"]
        assert killed < ended < killed + 20  # the idle timeout (300 s) did not end it
        assert len(events) >= 2 and "result" in events[0]
        assert events[-1]["error"]["data"]["kind"] == "owner_lost", events[-1]
        assert events[-1]["error"]["data"]["executed"] is True
        assert slow.ids == ["sync-1"] and rpc_ids_received(echo) == ["stream-1"]
        caller.close()


def test_stream_ends_after_two_missed_keepalives(tokens, start_node):
    """The owner frozen (SIGSTOP) with a liveness key that outlives the test: the stream ends
    on the keepalive rule alone, with ``owner_lost``."""
    owner = start_node(A2A_SSE_KEEPALIVE_SECONDS="0.5", A2A_NODE_LIVENESS_TTL_SECONDS="600")
    entry = start_node(A2A_SSE_KEEPALIVE_SECONDS="0.5", A2A_GATEWAY_TIMEOUT_BUFFER_SECONDS="1")
    with EchoAgent(steps=20, step_delay=3) as echo:
        agent_id = register(owner.url, tokens["admin"], echo.url)
        events = []
        try:
            with httpx.stream("POST", f"{entry.url}/a2a/{agent_id}", timeout=120,
                              json=_send("ka-1", "task slow", "message/stream"),
                              headers={"Authorization": f"Bearer {tokens['caller']}"}) as response:
                for event in _events(response):
                    events.append(event)
                    if len(events) == 1:
                        owner.pause()
        finally:
            owner.resume()
    assert events[-1]["error"]["data"]["kind"] == "owner_lost", events[-1]
    assert "keepalive" in events[-1]["error"]["message"]
    assert len(events) < 10  # ended long before the agent's 20 steps


def _call_loop(nodes, token: str, agent_ids: list[str], prefix: str, stop: threading.Event,
               log: list, *, stream_every: int = 0, retry_refused: bool = False) -> None:
    """Call the agents in turn through the nodes in turn until ``stop``; log one record per
    call: (rpc id, outcome, executed, when). ``retry_refused``: a connection the node refused
    (a node restarting; the request never left the caller) is retried on the next node."""
    client = httpx.Client(timeout=60, headers={"Authorization": f"Bearer {token}"})
    i = 0
    try:
        while not stop.is_set():
            rpc_id = f"{prefix}-{i}"
            agent_id = agent_ids[i % len(agent_ids)]
            streaming = bool(stream_every) and i % stream_every == 0
            attempt = 0
            while True:
                node = nodes[(i + attempt) % len(nodes)]
                try:
                    record = _one_call(client, node.url, agent_id, rpc_id, streaming)
                    break
                except (httpx.ConnectError, httpx.RemoteProtocolError) as exc:
                    # Refused, or a kept-alive connection closed with no answer at all by the
                    # node shutting down: the request never reached it.
                    no_answer = isinstance(exc, httpx.ConnectError) or \
                        "without sending a response" in str(exc)
                    if not retry_refused or not no_answer or attempt > 50:
                        record = (rpc_id, "refused", False, time.monotonic())
                        break
                    attempt += 1
                    time.sleep(0.05)
            log.append(record)
            i += 1
    finally:
        client.close()


def _one_call(client: httpx.Client, url: str, agent_id: str, rpc_id: str, streaming: bool):
    if streaming:
        with client.stream("POST", f"{url}/a2a/{agent_id}",
                           json=_send(rpc_id, "task short", "message/stream")) as response:
            if not response.headers.get("content-type", "").startswith("text/event-stream"):
                response.read()
                error = response.json()["error"]
                return (rpc_id, error["data"]["kind"], error["data"]["executed"],
                        time.monotonic())
            events = list(_events(response))
        last = events[-1] if events else {}
        if "error" in last:
            return (rpc_id, last["error"]["data"]["kind"], last["error"]["data"]["executed"],
                    time.monotonic())
        final = last.get("result", {})
        ok = final.get("status", {}).get("state") == "completed" or final.get("final")
        return (rpc_id, "ok" if ok else f"incomplete:{json.dumps(last)[:80]}", True,
                time.monotonic())
    response = client.post(f"{url}/a2a/{agent_id}", json=_send(rpc_id))
    body = response.json()
    if "error" in body:
        return (rpc_id, body["error"]["data"]["kind"], body["error"]["data"]["executed"],
                time.monotonic())
    return (rpc_id, "ok", True, time.monotonic())


def _received(*agents) -> Counter:
    return Counter(i for agent in agents for i in rpc_ids_received(agent))


def test_survivors_adopt_a_killed_nodes_agents(tokens, start_node):
    """Three nodes; the owner of four agents killed -9. Calls through both survivors fail only
    for about the detection window, then succeed with no action by the agents; the agents end
    up on the survivors, and each request id reached its agent at most once (exactly once for
    every call answered ok; never for one answered executed false)."""
    owner = start_node()
    survivors = [start_node(), start_node()]
    with EchoAgent() as a1, EchoAgent() as a2, EchoAgent() as a3, EchoAgent() as a4:
        agents = [a1, a2, a3, a4]
        ids = [register(owner.url, tokens["admin"], a.url) for a in agents]
        stop = threading.Event()
        logs: list[list] = [[], []]
        threads = [
            threading.Thread(target=_call_loop, args=([node], tokens["caller"], ids, f"c{n}",
                                                      stop, logs[n]))
            for n, node in enumerate(survivors)
        ]
        for thread in threads:
            thread.start()
        _wait(lambda: all(sum(1 for r in log if r[1] == "ok") >= 8 for log in logs), 30,
              "calls through both survivors")
        killed = time.monotonic()
        owner.kill()
        _wait(lambda: all(sum(1 for r in log if r[1] == "ok" and r[3] > killed + 0.5) >= 12
                          for log in logs), 60, "calls to succeed again after the kill")
        stop.set()
        for thread in threads:
            thread.join(timeout=60)

    records = logs[0] + logs[1]
    failures = [r for r in records if r[1] != "ok"]
    # Failures only around the kill: none before it, none once calls succeed again.
    assert all(r[3] > killed for r in failures), failures
    last_failure = max((r[3] for r in failures), default=killed)
    assert last_failure < killed + 20, failures
    assert {r[1] for r in failures} <= {"unreachable", "owner_lost"}, failures
    received = _received(*agents)
    assert max(received.values()) == 1, [k for k, v in received.items() if v > 1]
    for rpc_id, outcome, executed, _ in records:
        if outcome == "ok":
            assert received[rpc_id] == 1, rpc_id
        elif not executed:
            assert received[rpc_id] == 0, f"{rpc_id} answered executed false but ran"
    survivor_ids = {f"fault-node-{node.port}" for node in survivors}
    owners = [_owner(survivors[0], tokens["admin"], agent_id) for agent_id in ids]
    assert set(owners) <= survivor_ids, owners


def test_expire_mode_keeps_the_seed_behaviour(tokens, start_node):
    """``A2A_FAILOVER=expire``: nobody adopts a dead node's agents; calls through a survivor
    are answered ``unreachable`` (executed false) at once until the agent re-registers, then
    succeed."""
    owner = start_node(A2A_FAILOVER="expire")
    survivor = start_node(A2A_FAILOVER="expire")
    with EchoAgent() as agent:
        agent_id = register(owner.url, tokens["admin"], agent.url)
        caller = httpx.Client(base_url=survivor.url, timeout=30,
                              headers={"Authorization": f"Bearer {tokens['caller']}"})
        assert "result" in caller.post(f"/a2a/{agent_id}", json=_send("e-0")).json()
        owner.kill()
        time.sleep(6)  # well past the liveness TTL
        response = caller.post(f"/a2a/{agent_id}", json=_send("e-1"))
        error = response.json()["error"]
        assert error["data"]["kind"] == "unreachable" and error["data"]["executed"] is False
        assert _owner(survivor, tokens["admin"], agent_id) == f"fault-node-{owner.port}"
        again = httpx.post(f"{survivor.url}/api/v1/agents", timeout=10,
                           headers={"Authorization": f"Bearer {tokens['admin']}"},
                           json={"agent_id": agent_id, "url": agent.url,
                                 "card": {"name": "Fault agent", "url": agent.url}})
        assert again.status_code in (200, 201), again.text
        assert again.json()["node_id"] == f"fault-node-{survivor.port}"
        _wait(lambda: "result" in caller.post(f"/a2a/{agent_id}", json=_send("e-2")).json(),
              10, "the re-registered agent to answer")
        caller.close()
        assert rpc_ids_received(agent)[0] == "e-0" and "e-1" not in rpc_ids_received(agent)


def test_rolling_restart_under_load_loses_no_call(tokens, start_node):
    """Two nodes, each owning an agent, restarted one after the other (SIGTERM, then started
    again) under steady load through both, sync and streaming: every call is answered ok and
    every request id reached its agent exactly once. A connection refused by the node being
    restarted (or closed with no answer while it shuts down) is retried on the other node, as
    a load balancer does: the agent-side counts prove no such request had run."""
    env = {"A2A_HANDOVER_TIMEOUT_SECONDS": "10",
           "LOG_LEVEL": os.environ.get("LOG_LEVEL", "WARNING")}
    nodes = [start_node(**env), start_node(**env)]
    with EchoAgent(steps=3, step_delay=0.05) as a1, EchoAgent(steps=3, step_delay=0.05) as a2:
        ids = [register(nodes[0].url, tokens["admin"], a1.url),
               register(nodes[1].url, tokens["admin"], a2.url)]
        stop = threading.Event()
        logs: list[list] = [[] for _ in range(4)]
        threads = [
            threading.Thread(target=_call_loop, args=(nodes[n % 2:] + nodes[:n % 2],
                                                      tokens["caller"], ids, f"r{n}", stop,
                                                      logs[n]),
                             kwargs={"stream_every": 3, "retry_refused": True})
            for n in range(4)
        ]
        for thread in threads:
            thread.start()
        try:
            time.sleep(2)
            for node in nodes:
                before = sum(len(log) for log in logs)
                node.terminate(timeout=40)
                node.start()
                _wait(lambda b=before: sum(len(log) for log in logs) > b + 40, 60,
                      "calls to flow after the restart")
            time.sleep(1)
        finally:
            stop.set()
            for thread in threads:
                thread.join(timeout=60)
        records = [r for log in logs for r in log]
        received = _received(a1, a2)
    failures = [r for r in records if r[1] != "ok"]
    assert not failures, failures
    assert len(records) > 100
    duplicated = [k for k, v in received.items() if v > 1]
    assert not duplicated, duplicated[:10]
    assert all(received[r[0]] == 1 for r in records), "an answered call never reached its agent"
    owners = {_owner(nodes[0], tokens["admin"], agent_id) for agent_id in ids}
    assert owners <= {f"fault-node-{node.port}" for node in nodes}
