"""A Hypothesis state machine over register / heartbeat / expire / deregister / call against a
live node and a real a2a-sdk agent: after every step the registry API and the gateway agree
with a simple model of each agent (absent, active, expired)."""

from __future__ import annotations

import time
from datetime import timedelta

import httpx
import pytest
from django.utils import timezone
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from registry import services
from tests.a2a_agents import EchoAgent
from tests.conftest import make_client

AGENT_IDS = st.sampled_from(["sm-a", "sm-b", "sm-c"])
MAX_TTL = 600


def _eventually(check, timeout: float = 3.0):
    """Routing tables follow registry events asynchronously: wait a little for agreement."""
    deadline = time.monotonic() + timeout
    while True:
        outcome = check()
        if outcome is True or time.monotonic() > deadline:
            return outcome
        time.sleep(0.02)


@pytest.mark.timeout(300)
def test_registry_lifecycle_state_machine(live_server_url):
    admin = make_client(["admin"])[1]
    caller = make_client(["call"])[1]
    with (
        EchoAgent() as agent,
        httpx.Client(
            base_url=live_server_url, timeout=30, headers={"Authorization": f"Bearer {admin}"}
        ) as api,
        httpx.Client(
            base_url=live_server_url, timeout=30, headers={"Authorization": f"Bearer {caller}"}
        ) as gateway,
    ):

        class Lifecycle(RuleBasedStateMachine):
            def __init__(self) -> None:
                super().__init__()
                self.model: dict[str, str] = {}
                for agent_id in ("sm-a", "sm-b", "sm-c"):  # each run starts from nothing
                    api.delete(f"/api/v1/agents/{agent_id}")

            @rule(agent_id=AGENT_IDS, ttl=st.integers(min_value=5, max_value=MAX_TTL))
            def register(self, agent_id: str, ttl: int) -> None:
                response = api.post(
                    "/api/v1/agents",
                    json={
                        "agent_id": agent_id,
                        "url": agent.url,
                        "ttl_seconds": ttl,
                        "card": agent.card_document,
                    },
                )
                assert response.status_code == (200 if agent_id in self.model else 201), (
                    response.text
                )
                assert response.json()["status"] == "active"
                self.model[agent_id] = "active"

            @rule(agent_id=AGENT_IDS)
            def heartbeat(self, agent_id: str) -> None:
                response = api.post(f"/api/v1/agents/{agent_id}/heartbeat")
                expected = 200 if self.model.get(agent_id) == "active" else 404
                assert response.status_code == expected, response.text

            @rule()
            def expire(self) -> None:
                # Expiry as the periodic job runs it, at a time past every lease (not so far
                # that the retention purges the rows).
                services.agents_expire(now=timezone.now() + timedelta(seconds=MAX_TTL + 1))
                self.model = {k: "expired" for k in self.model}

            @rule(agent_id=AGENT_IDS)
            def deregister(self, agent_id: str) -> None:
                response = api.delete(f"/api/v1/agents/{agent_id}")
                assert response.status_code == (204 if agent_id in self.model else 404)
                self.model.pop(agent_id, None)

            @rule(agent_id=AGENT_IDS)
            def call(self, agent_id: str) -> None:
                active = self.model.get(agent_id) == "active"

                def agrees():
                    response = gateway.post(
                        f"/a2a/{agent_id}",
                        json={
                            "jsonrpc": "2.0",
                            "id": "sm",
                            "method": "message/send",
                            "params": {
                                "message": {
                                    "role": "user",
                                    "messageId": "m",
                                    "parts": [{"kind": "text", "text": "hi"}],
                                }
                            },
                        },
                    )
                    body = response.json()
                    if active:
                        return "result" in body or body
                    return (
                        body.get("error", {}).get("data", {}).get("kind") == "agent_not_found"
                        or body
                    )

                assert _eventually(agrees) is True

            @invariant()
            def registry_agrees(self) -> None:
                for agent_id in ("sm-a", "sm-b", "sm-c"):
                    response = api.get(f"/api/v1/agents/{agent_id}")
                    if agent_id in self.model:
                        assert response.status_code == 200
                        assert response.json()["status"] == self.model[agent_id]
                    else:
                        assert response.status_code == 404

        run_state_machine_as_test(
            Lifecycle,
            settings=settings(
                max_examples=12,
                stateful_step_count=12,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            ),
        )
