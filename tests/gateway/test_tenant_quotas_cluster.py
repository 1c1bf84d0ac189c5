"""A tenant's quotas across two nodes (docs/tenants.md "Quotas"): registrations per minute are
counted once for the cluster (Redis), calls per second and concurrent streams are shared, each
node admitting its part of the limit (the limit divided by the live nodes).

Node A is the live server in this process, node B a ``manage.py serve`` process sharing its
PostgreSQL and Redis (the ``node_b`` fixture of test_cluster). Distributed mode only."""

from __future__ import annotations

import re
import time

import httpx
import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from gateway import runtime
from registry import quotas, services
from registry.models import Tenant
from tests.gateway.test_cluster import node_b  # noqa: F401 (a fixture)
from tests.gateway.test_streaming import wait_until
from tests.gateway.test_tenant_quotas import _assert_429, _auth, _refresh, _rpc, _until_refused

WINDOW = 30.0


@pytest.fixture(autouse=True)
def _quota_settings(settings):
    """Node A's registration window is node B's (the Redis counts are per window)."""
    settings.A2A_TENANT_REGISTRATION_WINDOW_SECONDS = WINDOW


@pytest.mark.parametrize("node_b", [{
    "A2A_TENANT_REGISTRATION_WINDOW_SECONDS": str(WINDOW),
    "A2A_TENANT_QUOTAS_REFRESH_SECONDS": "0.2",
}], indirect=True)
def test_a_tenants_quotas_hold_across_two_nodes(live_server_url, node_b,  # noqa: F811
                                                echo_agent_factory):
    node_a = runtime.current_node()
    a, b = live_server_url, node_b.url
    quotas.forget_tenant_limits()
    services.tenant_create(slug="acme")
    token = services.api_client_create(name="acme-rc", scopes=["register", "call"],
                                       tenant="acme")[1]
    acme = _auth(token)
    agent = echo_agent_factory(card_shape="both")
    v1 = {"agent_id": "echo", "url": agent.url, "card": agent.card_document}
    assert httpx.post(f"{a}/api/v1/agents", headers=acme, json=v1).status_code == 201
    # Both nodes see each other, and node B routes acme's agent to its owner, node A.
    wait_until(lambda: node_b.node_id in node_a.liveness.live_nodes(), timeout=10)
    wait_until(lambda: httpx.post(f"{b}/a2a/t/acme/echo", headers=acme,
                                  json=_rpc("message/send")).status_code == 200, timeout=10)

    Tenant.objects.filter(slug="acme").update(
        max_registrations_per_minute=3, max_calls_per_second=4, max_concurrent_streams=2)
    _refresh()
    assert node_a.quotas.nodes == 2
    time.sleep(2 * settings.A2A_NODE_LIVENESS_REFRESH_SECONDS)  # node B's refresh, every 0.2 s

    # Calls per second: each node admits its half of 4 (a bucket of 2, refilled at 2 a
    # second while the calls go on); one node alone would admit 4 before its first refusal.
    with httpx.Client(timeout=10) as client:
        for node in (a, b):
            started = time.monotonic()
            refused, admitted = _until_refused(lambda node=node: client.post(
                f"{node}/a2a/t/acme/echo", headers=acme, json=_rpc("message/send")))
            took = time.monotonic() - started
            assert 2 <= admitted <= 2 + 2 * took, (node, admitted, took)
            _assert_429(refused, "max_calls_per_second", 4)
    time.sleep(1.1)  # the buckets are full again

    # Concurrent streams: one of the two on each node.
    with httpx.Client(timeout=30) as holder, holder.stream(
            "POST", f"{a}/a2a/t/acme/echo", headers=acme,
            json=_rpc("message/stream", "wait for me")) as held:
        assert held.status_code == 200
        lines = held.iter_lines()  # kept open: closing it would end the stream
        next(line for line in lines if line.startswith("data:"))
        refused = httpx.post(f"{a}/a2a/t/acme/echo", headers=acme, json=_rpc("message/stream"))
        _assert_429(refused, "max_concurrent_streams", 2)
        streamed = httpx.post(f"{b}/a2a/t/acme/echo", headers=acme,
                              json=_rpc("message/stream"))
        assert streamed.status_code == 200 and "echo: hi" in streamed.text
        with holder.stream("POST", f"{b}/a2a/t/acme/echo", headers=acme,
                           json=_rpc("message/stream", "wait for me")) as held_b:
            assert held_b.status_code == 200
            lines_b = held_b.iter_lines()  # kept open, as the first one
            next(line for line in lines_b if line.startswith("data:"))
            time.sleep(1.1)  # node B's call bucket full again: the stream quota answers
            _assert_429(httpx.post(f"{b}/a2a/t/acme/echo", headers=acme,
                                   json=_rpc("message/stream")), "max_concurrent_streams", 2)
            # The console (node A's) shows the cluster's use: both nodes' open streams and
            # refusals, from node A's report and node B's (every 0.2 s).
            _refresh()
            mine = quotas.refused_counts()[("acme", "max_calls_per_second")]
            root = Client()
            root.force_login(User.objects.create_superuser("root", password="x"))

            def tenants_page() -> str:
                return root.get(reverse("admin:registry_tenant_changelist")).content.decode()

            wait_until(lambda: "open streams: 2" in tenants_page(), timeout=5)
            acme_row = next(row for row in tenants_page().split("<tr")[1:] if ">acme<" in row)
            refused = re.search(r'class="field-refusals">[^<]*calls/s: (\d+)', acme_row)
            assert refused is not None and int(refused.group(1)) > mine  # node B's counted
            assert "(this node)" not in tenants_page()

    # Registrations per minute: one count for the cluster. Two on node A and one on node B
    # (a registration again counts), then the fourth is refused on either node.
    assert httpx.post(f"{a}/api/v1/agents", headers=acme, json=v1).status_code == 200
    assert httpx.post(f"{b}/api/v1/agents", headers=acme, json=v1).status_code == 200
    assert httpx.post(f"{a}/api/v1/agents", headers=acme, json=v1).status_code == 200
    for node in (b, a):
        _assert_429(httpx.post(f"{node}/api/v1/agents", headers=acme, json=v1),
                    "max_registrations_per_minute", 3)
    quotas.forget_tenant_limits()
