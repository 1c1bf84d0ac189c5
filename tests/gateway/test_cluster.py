"""Two nodes sharing Redis and PostgreSQL: the cross-node request path and replication.

Node A is the live server in this process; node B is ``manage.py serve --server uvicorn`` in a
subprocess with another ``NODE_ID``. An agent registered on one node is owned (subscribed) there
only; the other node learns the route from the ``_AGENTS_.discovery`` announcements and routes
Queries to the owner through Redis. Distributed mode only (the in-memory layer is one process).
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from urllib.parse import quote

import httpx
import pytest
from django.conf import settings
from django.db import connection

from gateway import relays, runtime
from gateway.redis_layer import RedisDirectChannelLayer
from registry import services
from registry.permissions import SYSTEM
from tests.conftest import make_client
from tests.gateway import test_proxy as proxy
from tests.gateway.test_proxy import rpc
from tests.gateway.test_streaming import read_events, wait_until
from tests.servers import start_node, wire_name

agent = proxy.agent


def _database_url() -> str:
    db = connection.settings_dict
    auth = quote(db["USER"] or "postgres")
    if db.get("PASSWORD"):
        auth += ":" + quote(db["PASSWORD"])
    return f"postgresql://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


@dataclass
class NodeB:
    node_id: str
    url: str
    process: subprocess.Popen

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


@pytest.fixture
def node_b(request, live_server_url, redis_url, postgres_url):
    """Node B, a ``manage.py serve`` process; ``indirect`` parametrization adds settings."""
    if settings.EMBEDDED or connection.vendor != "postgresql":
        pytest.skip("cross-node routing needs the distributed mode (REDIS_URL, DATABASE_URL)")
    node_id = f"node-b-{os.getpid()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env.update(NODE_ID=node_id, DATABASE_URL=_database_url(), REDIS_URL=settings.REDIS_URL,
               SECRET_KEY=settings.SECRET_KEY, LOG_LEVEL="WARNING",  # one installation: one key
               ALLOWED_HOSTS="127.0.0.1,localhost", **getattr(request, "param", {}))
    process, port = start_node(env, what="node B")
    url = f"http://127.0.0.1:{port}"
    try:
        yield NodeB(node_id, url, process)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_cross_node_routing(live_server_url, node_b, agent):
    node_b_id, node_b_url = node_b.node_id, node_b.url
    node_a = runtime.current_node()
    caller, token = make_client(["call"], name="cluster-caller")
    _, admin = make_client(["admin"], name="cluster-admin")
    auth = {"Authorization": f"Bearer {token}"}

    # Registered through node B's API: node B owns it, node A learns the route.
    r = httpx.post(f"{node_b_url}/api/v1/agents", headers={"Authorization": f"Bearer {admin}"},
                   json={"agent_id": "on-b", "url": agent.url,
                         "card": {"name": "on-b", "url": agent.url}})
    assert r.status_code == 201, r.text
    wait_until(lambda: node_a.table.get("on-b") is not None, timeout=2)
    assert node_a.table.get("on-b").node_id == node_b_id
    assert "on-b" not in node_a.manager.subscribers  # not replicated: B's alone
    import redis

    probe = redis.Redis.from_url(settings.REDIS_URL)
    # Single owner: node B's subscriber is the only listener on the agent's channel.
    assert probe.pubsub_numsub(wire_name("_AGENTS_.on-b"))[0][1] == 1

    # A request entering node A reaches the agent through node B's subscriber.
    r = httpx.post(f"{live_server_url}/a2a/on-b", headers={**auth, "X-Trace": "via-a"},
                   json=rpc(rpc_id="x1", text="hi"))
    assert r.status_code == 200 and r.json()["result"]["params"]["text"] == "hi"
    assert r.headers["x-a2a-executed"] == "true"
    arrived = agent.arrived[-1]
    assert arrived.header("x-trace") == "via-a"
    assert arrived.header("x-kubemq-caller-id") == caller.client_id

    # Streams cross nodes too, event by event; a caller leaving closes the upstream.
    with httpx.Client(timeout=10) as client:
        with client.stream("POST", f"{live_server_url}/a2a/on-b", headers=auth,
                           json=rpc("message/stream", mode="sse", events=50, delay=0.1)) as s:
            events = read_events(s, limit=3)
            assert len(events) == 3 and events[2][0] - events[0][0] > 0.15
            s.close()
    wait_until(lambda: agent.streams_open == 0, timeout=1.5)

    # Registered on node A (this process): node B routes to node A's subscriber.
    services.agent_register(actor=SYSTEM, agent_id="on-a", url=agent.url,
                            card={"name": "on-a", "url": agent.url})
    wait_until(lambda: _routed(node_b_url, "on-a", auth), timeout=3)
    r = httpx.post(f"{node_b_url}/a2a/on-a", headers=auth, json=rpc(rpc_id="x2"))
    assert r.json()["id"] == "x2" and "result" in r.json()

    # Busy and errors keep their meaning across nodes.
    r = httpx.post(f"{live_server_url}/a2a/on-b", headers=auth,
                   json=rpc(mode="status", status=503))
    assert r.json()["error"]["data"]["kind"] == "upstream_unavailable"

    # Deregistration on node A tears down node B's subscriber and both tables forget it.
    services.agent_deregister(actor=SYSTEM, agent_id="on-b")
    wait_until(lambda: node_a.table.get("on-b") is None, timeout=1)
    r = httpx.post(f"{node_b_url}/a2a/on-b", headers=auth, json=rpc())
    assert r.json()["error"]["data"]["kind"] == "agent_not_found"
    wait_until(lambda: probe.pubsub_numsub(wire_name("_AGENTS_.on-b"))[0][1] == 0, timeout=1)


@pytest.mark.parametrize("node_b", [{"A2A_FAILOVER": "expire"}], indirect=True)
def test_owner_node_gone_is_unreachable(live_server_url, node_b, agent, settings, monkeypatch):
    """KubeMQ's seed behaviour (A2A_FAILOVER=expire): a stopped node's agents stay routed to it
    until they expire; a call is `unreachable`, executed false."""
    settings.A2A_FAILOVER = "expire"
    node_b_url = node_b.url
    node_a = runtime.current_node()
    _, token = make_client(["call"], name="cluster-caller-2")
    _, admin = make_client(["admin"], name="cluster-admin-2")
    r = httpx.post(f"{node_b_url}/api/v1/agents", headers={"Authorization": f"Bearer {admin}"},
                   json={"agent_id": "orphan", "url": agent.url,
                         "card": {"name": "orphan", "url": agent.url}})
    assert r.status_code == 201
    wait_until(lambda: node_a.table.get("orphan") is not None, timeout=2)
    served = httpx.post(f"{live_server_url}/a2a/orphan", json=rpc(),
                        headers={"Authorization": f"Bearer {token}"})
    assert "result" in served.json()
    # Stop node B: its subscriber is gone, the registry still routes to it.
    node_b.stop()
    if isinstance(node_a.layer, RedisDirectChannelLayer):
        # Checked send: the direct layer's send() finds nobody listening on the agent's
        # channel and the call is answered then; the ack wait (made longer than the client's
        # patience here) is not what answers it.
        monkeypatch.setattr(relays, "ACK_TIMEOUT_SECONDS", 120.0)
    # No subscriber acknowledges the Query: `unreachable` (no live subscriber) after the ack
    # wait, not `timeout` after the request's 300 s (the client would give up after 30 s).
    r = httpx.post(f"{live_server_url}/a2a/orphan", json=rpc(rpc_id="o"), timeout=30,
                   headers={"Authorization": f"Bearer {token}"})
    assert r.json()["error"]["data"]["kind"] == "unreachable"
    assert r.json()["error"]["message"] == "agent unreachable: no live subscriber for this agent"
    assert r.json()["id"] == "o" and r.headers["x-a2a-executed"] == "false"
    assert node_a.table.get("orphan").node_id == node_b.node_id


def test_owner_node_stopped_hands_its_agents_over(live_server_url, node_b, agent):
    """A2A_FAILOVER=adopt (the default): node B stopping cleanly hands its agent to node A
    first, so calls keep succeeding without a re-registration."""
    node_a = runtime.current_node()
    _, token = make_client(["call"], name="cluster-caller-3")
    _, admin = make_client(["admin"], name="cluster-admin-3")
    r = httpx.post(f"{node_b.url}/api/v1/agents", headers={"Authorization": f"Bearer {admin}"},
                   json={"agent_id": "handed", "url": agent.url,
                         "card": {"name": "handed", "url": agent.url}})
    assert r.status_code == 201
    wait_until(lambda: node_a.table.get("handed") is not None, timeout=2)
    auth = {"Authorization": f"Bearer {token}"}
    assert "result" in httpx.post(f"{live_server_url}/a2a/handed", json=rpc(),
                                  headers=auth).json()
    node_b.stop()
    assert node_a.table.get("handed").node_id == node_a.settings.NODE_ID
    r = httpx.post(f"{live_server_url}/a2a/handed", json=rpc(rpc_id="h"), timeout=30,
                   headers=auth)
    assert "result" in r.json(), r.text


def _routed(base: str, agent_id: str, auth: dict) -> bool:
    r = httpx.post(f"{base}/a2a/{agent_id}", headers=auth, json=rpc())
    return "result" in r.json()


@pytest.mark.parametrize("own_rest", [True, False], ids=["forwarded", "translated"])
async def test_cross_node_rest_binding(live_server_url, node_b, echo_agent_factory, caller,
                                       admin_token, own_rest):
    """The HTTP+JSON binding across nodes: an agent owned by node B (registered there), called
    through node A by a REST client -- its route carries the agent's HTTP+JSON interface, node
    A sends the Query (method and path in its tags) through Redis to node B's subscriber; an
    agent without one gets the call translated to its JSON-RPC on node A, the JSON-RPC Query
    crossing to node B."""
    from a2a.helpers import get_message_text
    from a2a.types import GetTaskRequest, TaskState

    from tests.a2a_agents import sdk_client, send_and_collect

    agent = echo_agent_factory(interfaces=[("HTTP+JSON", "1.0"), ("JSONRPC", "1.0")]) \
        if own_rest else echo_agent_factory(card_shape="1.0")
    node_a = runtime.current_node()
    agent_id = "rest-on-b" if own_rest else "rest-on-b-translated"
    auth = caller.auth
    r = httpx.post(f"{node_b.url}/api/v1/agents",
                   headers={"Authorization": f"Bearer {admin_token}"},
                   json={"agent_id": agent_id, "url": agent.url, "card": agent.card_document})
    assert r.status_code == 201, r.text
    wait_until(lambda: node_a.table.get(agent_id) is not None, timeout=3)
    route = node_a.table.get(agent_id)
    assert (route.node_id, route.http_json_endpoint) == (
        node_b.node_id, agent.rest_url if own_rest else "")
    assert agent_id not in node_a.manager.subscribers

    base = f"{live_server_url}/a2a/{agent_id}/"
    async with sdk_client(base, bindings=["HTTP+JSON"], streaming=False, polling=True,
                          headers=auth) as client:
        [reply] = await send_and_collect(client, "across")
        [first] = await send_and_collect(client, "task polled")
        got = await client.get_task(GetTaskRequest(id=first.event.task.id))
    async with sdk_client(base, bindings=["HTTP+JSON"], headers=auth) as client:
        events = await send_and_collect(client, "task streamed")
    assert get_message_text(reply.event.message) == "echo: across"
    assert got.id == first.event.task.id
    assert events[-1].event.status_update.status.state == TaskState.TASK_STATE_COMPLETED
    assert len([a for a in events if a.kind == "artifact_update"]) == 4
    if own_rest:
        assert [(r.http_method, r.path) for r in agent.requests
                if r.path.startswith("/rest")] == [
            ("POST", "/rest/message:send"), ("POST", "/rest/message:send"),
            ("GET", f"/rest/tasks/{got.id}"), ("POST", "/rest/message:stream")]
    else:
        assert [r.rpc_method for r in agent.recorder.rpc()] == [
            "SendMessage", "SendMessage", "GetTask", "SendStreamingMessage"]
