"""Fixtures of the fault matrix: private PostgreSQL/Redis, nodes, agents (tests/faults.py).

Setting up a private service that fails skips the test on a developer machine and FAILS it in
CI (``CI=true``), like the shared ``redis_url`` / ``postgres_url`` fixtures.
"""

from __future__ import annotations

import os

import httpx
import pytest

from tests import faults, passes
from tests.a2a_agents import EchoAgent
from tests.gateway.conftest import make_caller, register_agent  # noqa: F401 - shared fixtures


def _setup_failed(exc: Exception):
    message = f"fault fixture could not start a private service: {exc}"
    if faults.IN_CI:
        pytest.fail(message + " (CI=true: this must work)")
    pytest.skip(message)


@pytest.fixture(scope="module")
def services(request):
    """A private, migrated PostgreSQL and a private Redis for this module's tests."""
    marker = request.node.get_closest_marker("one_pass")
    wanted = marker.args[0] if marker is not None else "embedded"
    if not passes.runs_here(wanted):
        # Independent of the pass's own services: CI runs these once (tests/passes.py).
        pytest.skip(f"private-service fault tests run in CI's {wanted} pass")
    try:
        cm = faults.private_services()
        handles = cm.__enter__()
    except (faults.FaultSetupError, OSError) as exc:
        _setup_failed(exc)
    try:
        yield handles
    finally:
        cm.__exit__(None, None, None)


@pytest.fixture
def pg(services) -> faults.PrivatePostgres:
    """The private PostgreSQL, running again after the test whatever the test did to it."""
    yield services["pg"]
    if not services["pg"].alive():
        services["pg"].start()
    services["pg"].resume()


@pytest.fixture
def tokens(services) -> dict[str, str]:
    return faults.create_clients(
        services["env"], {"admin": ["admin"], "caller": ["call"], "late": ["call"]}
    )


@pytest.fixture
def start_node(services):
    """Start nodes on the private services: ``start_node(**env_overrides)``."""
    started: list[faults.Node] = []

    def start(**extra: str) -> faults.Node:
        node = faults.Node(dict(services["env"], **extra))
        try:
            node.start()
        except faults.FaultSetupError as exc:
            node.kill()
            _setup_failed(exc)
        started.append(node)
        return node

    yield start
    for node in started:
        node.terminate(timeout=5)


@pytest.fixture
def agent():
    with EchoAgent() as running:
        yield running


def register(node_url: str, admin_token: str, agent_url: str, **extra) -> str:
    agent_id = extra.pop("agent_id", None) or f"rel-{os.urandom(3).hex()}"
    response = httpx.post(
        f"{node_url}/api/v1/agents",
        timeout=10,
        headers={"Authorization": f"Bearer {admin_token}"},
        json={
            "agent_id": agent_id,
            "url": agent_url,
            "card": {"name": "Fault agent", "url": agent_url},
            **extra,
        },
    )
    assert response.status_code == 201, response.text
    return agent_id


def rpc_ids_received(agent: EchoAgent) -> list:
    import json

    ids = []
    for request in agent.requests:
        if request.http_method == "POST" and request.body:
            try:
                ids.append(json.loads(request.body).get("id"))
            except ValueError:
                pass
    return ids
