"""A registry change made by another process reaches a running node's routing table through
the registry event, in both modes: ``manage.py discover --once`` (its own process) admits an
agent, and a call through the node succeeds at once, with the node's safety-net resync set to
an hour so that only the event can have carried the change.

Embedded mode has no broker: a process without a node hands its events to the nodes serving
the same data directory over their Unix datagram sockets (``gateway.local_events``).
Distributed mode announces them on Redis (``gateway.replicator.announce_without_node``).
"""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
import pytest
from django.conf import settings

from tests.a2a_agents import running_echo_agent
from tests.gateway.test_backpressure import running_node
from tests.servers import ROOT

pytestmark = pytest.mark.django_db(transaction=True)


def _call(node, agent_id: str, text: str) -> httpx.Response:
    return httpx.post(
        f"{node.url}/a2a/{agent_id}", timeout=10,
        headers={"Authorization": f"Bearer {node.token}"},
        json={"jsonrpc": "2.0", "id": 1, "method": "message/send",
              "params": {"message": {"role": "user", "messageId": "m1",
                                     "parts": [{"kind": "text", "text": text}]}}},
    )


def _answered(node, agent_id: str, text: str, *, within: float) -> dict:
    """Poll the call until the agent answers it (bounded); the last answer otherwise."""
    deadline = time.monotonic() + within
    while True:
        body = _call(node, agent_id, text).json()
        if "result" in body or time.monotonic() > deadline:
            return body
        time.sleep(0.05)


@pytest.mark.parametrize("mode", ["embedded", "distributed"])
def test_an_agent_discover_admits_is_routable_at_once(mode, tmp_path):
    if mode == "distributed" and settings.EMBEDDED:
        pytest.skip("distributed mode needs REDIS_URL and DATABASE_URL")
    if mode == "embedded" and not settings.EMBEDDED:
        pytest.skip("the embedded pass covers embedded mode")
    config = tmp_path / "discovery.yaml"
    with running_echo_agent(card_shape="0.3") as agent, \
            running_node("uvicorn", distributed=mode == "distributed",
                         A2A_ROUTING_RESYNC_SECONDS="3600", LOG_LEVEL="INFO") as node:
        before = _call(node, "cross-echo", "before").json()
        assert before["error"]["data"]["kind"] == "agent_not_found"
        config.write_text(
            "allowlist:\n  - {host: 127.0.0.1, allow_http: true}\n"
            f"static:\n  - local_name: cross_echo\n    url: {agent.url}\n"
            "    description: Echoes what it is sent.\n"
        )
        result = subprocess.run(
            [sys.executable, "manage.py", "discover", "--once"], cwd=ROOT, timeout=120,
            env={**node.env, "DISCOVERY_CONFIG": str(config)}, capture_output=True, text=True,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        # The command's process embedded the new agent's search document before it exited
        # (on PostgreSQL an embedding thread does it after the write; exiting under it once
        # aborted the process).
        code = ("from ard.models import AgentDoc; print(AgentDoc.objects.filter("
                "agent_id='cross-echo').exclude(embedding_model='').count())")
        embedded = subprocess.run(
            [sys.executable, "manage.py", "shell", "-c", code], cwd=ROOT, timeout=120,
            env=node.env, capture_output=True, text=True,
        )
        assert embedded.stdout.split()[-1:] == ["1"], embedded.stdout + embedded.stderr
        # The resync runs once an hour: only the registry event can make this call succeed.
        body = _answered(node, "cross-echo", "after", within=15)
        assert "result" in body, body
        assert "echo: after" in str(body["result"]), body
        # A deregistration in yet another process (the registry service, called from a shell)
        # reaches the node the same way.
        code = ("from registry import services; from registry.permissions import SYSTEM; "
                "services.agent_deregister(actor=SYSTEM, agent_id='cross-echo')")
        result = subprocess.run(
            [sys.executable, "manage.py", "shell", "-c", code], cwd=ROOT, timeout=120,
            env=node.env, capture_output=True, text=True,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        deadline = time.monotonic() + 15
        while "result" in (body := _call(node, "cross-echo", "gone").json()) \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        assert body["error"]["data"]["kind"] == "agent_not_found", body
