"""Distributed mode: two real nodes (this process and ``manage.py serve`` in a subprocess)
each count the calls that entered them and flush their own rows; the admin sums them."""

from __future__ import annotations

import httpx
import pytest
from django.db.models import Sum

from console.models import AgentMinute
from console.selectors import agent_stats, dashboard
from gateway import recorder, runtime
from registry import services
from registry.permissions import SYSTEM
from tests.conftest import make_client
from tests.console.test_stats_and_audit import _minutes_ago, db, wait_for
from tests.gateway import test_proxy as proxy
from tests.gateway.test_cluster import node_b  # noqa: F401  (fixture)
from tests.gateway.test_proxy import rpc
from tests.gateway.test_streaming import wait_until

agent = proxy.agent

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def fast_flush_everywhere(settings, monkeypatch):
    settings.A2A_STATS_FLUSH_SECONDS = 0.2
    monkeypatch.setenv("A2A_STATS_FLUSH_SECONDS", "0.2")  # node B's environment
    recorder.reset()
    yield
    recorder.reset()


def test_each_node_flushes_its_own_rows_and_the_admin_sums_them(
        fast_flush_everywhere, live_server_url, node_b, agent):  # noqa: F811
    node_a = runtime.current_node()
    _, token = make_client(["call"], name="cluster-stats-caller")
    auth = {"Authorization": f"Bearer {token}"}
    services.agent_register(actor=SYSTEM, agent_id="shared", url=agent.url,
                            card={"name": "shared", "url": agent.url})
    wait_until(lambda: node_a.table.get("shared") is not None, timeout=3)

    def routed_on_b() -> bool:
        r = httpx.post(f"{node_b.url}/a2a/shared", headers=auth, json=rpc(rpc_id="probe"))
        return r.status_code == 200 and "result" in r.json()

    wait_until(routed_on_b, timeout=5)  # one call through B (counted below)
    for i in range(2):
        r = httpx.post(f"{live_server_url}/a2a/shared", headers=auth, json=rpc(rpc_id=i))
        assert "result" in r.json()
    for i in range(3):
        r = httpx.post(f"{node_b.url}/a2a/shared", headers=auth, json=rpc(rpc_id=f"b{i}"))
        assert "result" in r.json()

    def per_node() -> dict[str, int]:
        return dict(AgentMinute.objects.filter(agent_id="shared").values_list("node_id")
                    .annotate(n=Sum("requests")).values_list("node_id", "n"))

    assert wait_for(lambda: per_node().get(node_b.node_id, 0) >= 4
                    and per_node().get(_node_a_id(), 0) == 2)
    counts = db(per_node)
    b_calls = counts[node_b.node_id]
    assert counts[_node_a_id()] == 2 and b_calls >= 4  # 3 + the probe(s) that succeeded
    assert db(lambda: agent_stats(agent_id="shared", since=_minutes_ago(10)).requests) == \
        2 + b_calls
    assert db(lambda: dashboard()["series"].total_requests) == 2 + b_calls


def _node_a_id() -> str:
    from core import lifecycle as node_config

    return node_config.node_id()
