"""Gateway test fixtures: real a2a-sdk echo agents, registered on the live platform."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import httpx
import pytest

from tests import a2a_agents, passes
from tests.a2a_agents import EchoAgent
from tests.conftest import make_client

# SDK echo agents on free loopback ports (see tests/a2a_agents.py).
echo_agent_factory = a2a_agents.echo_agent_factory
echo_agent = a2a_agents.echo_agent


@dataclass
class GatewayAgent:
    """An SDK agent registered on the live platform, and where to reach it through the gateway."""

    agent: EchoAgent
    agent_id: str
    gateway_base: str  # http://127.0.0.1:PORT/a2a/{agent_id}/ -- what a user hands the SDK
    registration: dict


@dataclass
class Caller:
    """An API client with the ``call`` scope, as the gateway's callers are."""

    client_id: str
    token: str

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


@pytest.fixture(params=["local", "broker"])
def gateway_path(request, settings) -> str:
    """Run a test over the gateway's local fast path and over the Channels layer (envelopes,
    ``a2a_hdr_*`` tags): the contract says both behave identically."""
    settings.A2A_LOCAL_FAST_PATH = request.param == "local"
    return request.param


@pytest.fixture(params=passes.outbound_clients())
def outbound_client(request, settings) -> str:
    """Run a test with the gateway's own HTTP/1.1 client and with the aiohttp one
    (``A2A_OUTBOUND_CLIENT``): a defect of the hand-written client shows as a difference."""
    settings.A2A_OUTBOUND_CLIENT = request.param
    return request.param


@pytest.fixture
def register_agent(live_server_url, api: httpx.Client) -> Callable[..., GatewayAgent]:
    """Register an :class:`EchoAgent` through ``POST /api/v1/agents`` (admin token), with its
    URL and the card it serves; answers where the gateway exposes it."""

    def register(agent: EchoAgent, agent_id: str | None = None, *,
                 with_card: bool = True, **extra) -> GatewayAgent:
        agent_id = agent_id or f"echo-{os.urandom(3).hex()}"
        payload = {"agent_id": agent_id, "url": agent.url, **extra}
        if with_card:
            payload["card"] = agent.card_document
        response = api.post("/api/v1/agents", json=payload)
        assert response.status_code == 201, response.text
        return GatewayAgent(agent=agent, agent_id=agent_id,
                            gateway_base=f"{live_server_url}/a2a/{agent_id}/",
                            registration=response.json())

    return register


@pytest.fixture
def make_caller(live_server_url) -> Callable[..., Caller]:
    """Create callers: ``make_caller()`` may call any agent; ``make_caller(agents=[...])``."""

    def create(agents: list[str] | None = None, scopes: list[str] | None = None) -> Caller:
        client, token = make_client(scopes or ["call"], agents)
        return Caller(client_id=client.client_id, token=token)

    return create


@pytest.fixture
def caller(make_caller) -> Caller:
    return make_caller()


@pytest.fixture
def other_caller(make_caller) -> Caller:
    return make_caller()
