"""A node stopping (SIGTERM) drains its calls, under both servers (a rolling restart
loses no call).

The server stops accepting connections and closes its idle ones at once; the calls it is
answering get ``A2A_SHUTDOWN_DRAIN_SECONDS`` to finish and are answered as usual; a call still
running when the drain ends is answered ``node_stopping`` (a JSON-RPC error, or a terminal
``event: error`` in a stream; executed true) -- never a bare 500 or a cut connection. Before
this, Daphne (the default server) cancelled every call at once on SIGTERM and uvicorn cut them
after 5 s.

Real ``manage.py serve`` nodes on a private PostgreSQL and Redis (tests/faults.py), real agents.
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from tests import faults
from tests.a2a_agents import EchoAgent
from tests.reliability.conftest import register, rpc_ids_received
from tests.reliability.test_agent_faults import ScriptedAgent
from tests.reliability.test_failover import _send, _wait, start_sync_and_stream
from tests.servers import refuses_connections, serve_app

# Private services only: CI runs it in its distributed pass (tests/passes.py), to balance the two.
pytestmark = [pytest.mark.timeout(180), pytest.mark.one_pass("distributed")]

SERVERS = ["daphne", "uvicorn"]


@pytest.fixture
def node_on(services):
    """``node_on(server, **env)``: a node of that server on the private services."""
    started: list[faults.Node] = []

    def start(server: str, **env: str) -> faults.Node:
        node = faults.Node(dict(services["env"], **env), extra_args=("--server", server))
        node.start()
        started.append(node)
        return node

    yield start
    for node in started:
        node.kill()


@pytest.mark.parametrize("server", SERVERS)
def test_calls_in_flight_finish_during_the_drain(server, tokens, node_on):
    """SIGTERM with a 3 s call in flight: the node stops accepting connections at once, the
    call is answered normally (the drain is longer than the call), then the node exits."""
    node = node_on(server)
    slow = ScriptedAgent("slow", delay=3)
    with serve_app(slow, lifespan="off") as agent:
        agent_id = register(node.url, tokens["admin"], agent.url)
        result: dict = {}

        def call() -> None:
            with httpx.Client(timeout=60) as client:
                result["response"] = client.post(
                    f"{node.url}/a2a/{agent_id}", json=_send("drain-1"),
                    headers={"Authorization": f"Bearer {tokens['caller']}"})

        thread = threading.Thread(target=call)
        thread.start()
        _wait(lambda: slow.ids == ["drain-1"], 30, "the call to reach the agent")
        node.signal(faults.signal.SIGTERM)
        _wait(lambda: refuses_connections(node.port), 5, "the node to stop accepting connections")
        thread.join(timeout=30)
        response = result["response"]
        assert response.status_code == 200, response.text
        assert response.json() == {"jsonrpc": "2.0", "id": "drain-1", "result": {"ok": True}}
        assert response.headers["x-a2a-executed"] == "true"
        node.proc.wait(timeout=40)
    assert slow.ids == ["drain-1"]
    assert "Exception in ASGI application" not in node.log()


@pytest.mark.parametrize("server", SERVERS)
def test_a_call_outliving_the_drain_is_answered_node_stopping(server, tokens, node_on):
    """A sync call and a stream still running when a 1 s drain ends: the sync call gets a
    JSON-RPC ``node_stopping`` error (executed true), the stream a terminal ``event: error``
    of that kind after the events relayed so far -- no 500, no cut connection -- and the node
    exits promptly."""
    node = node_on(server, A2A_SHUTDOWN_DRAIN_SECONDS="1")
    slow = ScriptedAgent("slow", delay=60)
    with serve_app(slow, lifespan="off") as slow_server, \
            EchoAgent(steps=600, step_delay=0.1) as echo:
        slow_id = register(node.url, tokens["admin"], slow_server.url)
        echo_id = register(node.url, tokens["admin"], echo.url)
        caller = httpx.Client(base_url=node.url, timeout=90,
                              headers={"Authorization": f"Bearer {tokens['caller']}"})
        results: dict = {}
        threads = start_sync_and_stream(caller, slow_id, echo_id, results)
        _wait(lambda: (slow.ids == ["sync-1"] and "stream-1" in rpc_ids_received(echo))
              or results, 30, "both calls to reach their agents")
        assert not results, results  # neither call may end before the stop
        time.sleep(0.5)  # a few stream events relayed
        stopped = time.monotonic()
        node.signal(faults.signal.SIGTERM)
        for thread in threads:
            thread.join(timeout=30)
        assert not any(t.is_alive() for t in threads), "a call outlived the drain"
        assert time.monotonic() - stopped < 15

        _, response = results["sync"]
        assert response.status_code == 200, response.text
        error = response.json()["error"]
        assert error["code"] == -32064, error
        assert error["data"]["kind"] == "node_stopping"
        assert error["data"]["executed"] is True and error["data"]["retryable"] is True
        assert response.headers["x-a2a-executed"] == "true"

        _, events = results["stream"]
        assert len(events) >= 2 and "result" in events[0], events
        assert events[-1]["error"]["data"]["kind"] == "node_stopping", events[-1]
        caller.close()
        node.proc.wait(timeout=30)
    assert "Exception in ASGI application" not in node.log()


@pytest.mark.parametrize("server", SERVERS)
def test_idle_connections_do_not_hold_the_stop(server, tokens, node_on):
    """Kept-alive idle connections are closed when the drain begins: with nothing in flight
    the node exits at once, not after the drain (25 s by default)."""
    node = node_on(server)
    with EchoAgent() as echo:
        agent_id = register(node.url, tokens["admin"], echo.url)
        clients = [httpx.Client(timeout=30) for _ in range(3)]
        for index, client in enumerate(clients):
            response = client.post(f"{node.url}/a2a/{agent_id}", json=_send(f"idle-{index}"),
                                   headers={"Authorization": f"Bearer {tokens['caller']}"})
            assert response.status_code == 200 and "result" in response.json()
        stopped = time.monotonic()
        node.signal(faults.signal.SIGTERM)
        node.proc.wait(timeout=30)
        assert time.monotonic() - stopped < 10
        for client in clients:
            client.close()
