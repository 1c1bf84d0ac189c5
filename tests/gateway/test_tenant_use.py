"""The tenants' gateway use seen cluster-wide (gateway.tenant_quotas, docs/tenants.md
"Seeing them"): each node's report to Redis is summed for the console, a node's report leaves
with it, and a Redis that does not answer costs the page a bounded wait, then shows this node's
own counts, marked as such."""

from __future__ import annotations

import socket
import time
import uuid

import pytest

from gateway import tenant_quotas
from gateway.tenant_quotas import TenantQuotas, UseBoard
from registry.quotas import TenantLimits


def _limits(calls: int | None = None, streams: int | None = None) -> TenantLimits:
    return TenantLimits(max_agents=None, max_card_bytes=None, max_registrations_per_minute=None,
                        max_calls_per_second=calls, max_concurrent_streams=streams)


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _node(clock: _Clock, calls: int, streams: int) -> TenantQuotas:
    """A node's counts: ``calls`` to acme's agents in one second, ``streams`` open now."""
    quotas = TenantQuotas(clock=clock)
    quotas.update({"acme": _limits(calls=100, streams=10)}, nodes=2)
    for _ in range(calls):
        assert quotas.refuse_call("acme") is None
    for _ in range(streams):
        assert not isinstance(quotas.open_stream("acme"), str)
    quotas.open_stream("beta")  # another tenant's: not acme's figures
    return quotas


def test_the_nodes_reports_add_up_and_leave_with_their_node(redis_url):
    clock = _Clock()
    one, two = _node(clock, calls=3, streams=2), _node(clock, calls=5, streams=1)
    clock.now += 1  # the second counted is the last full one
    board = UseBoard(redis_url, f"test-{uuid.uuid4().hex[:8]}")
    try:
        board.client.sadd(board.known, "n1", "n2", "n3")  # n3: known, never reported
        board.publish("n1", one.report(), ttl_seconds=30)
        board.publish("n2", two.report(), ttl_seconds=0.3)
        use = board.read("acme")
        assert (use.calls_per_second, use.streams, use.nodes, use.cluster) == (8.0, 3, 2, True)
        beta = board.read("beta")
        assert (beta.calls_per_second, beta.streams) == (0.0, 2)
        assert board.read("gamma").streams == 0

        time.sleep(0.5)  # n2 stopped reporting: its report expired with it
        use = board.read("acme")
        assert (use.calls_per_second, use.streams, use.nodes) == (3.0, 2, 1)
        board.publish("n1", {}, ttl_seconds=30)  # a report replaces the last one whole
        assert board.read("acme").streams == 0
        board.publish("n1", one.report(), ttl_seconds=30)
        board.withdraw("n1")  # a node stopping
        assert board.read("acme").nodes == 0
    finally:
        for key in board.client.scan_iter(f"{board.prefix}*"):
            board.client.delete(key)
        board.client.delete(board.known)
        board.client.close()


def test_refusals_are_summed_by_quota(redis_url):
    clock = _Clock()
    quotas = TenantQuotas(clock=clock)
    tenant = f"t{uuid.uuid4().hex[:8]}"  # refusals are counted per process: a tenant of its own
    quotas.update({tenant: _limits(calls=1, streams=1)}, nodes=1)
    assert quotas.refuse_call(tenant) is None
    assert quotas.refuse_call(tenant) is not None
    assert not isinstance(quotas.open_stream(tenant), str)
    assert isinstance(quotas.open_stream(tenant), str)
    board = UseBoard(redis_url, f"test-{uuid.uuid4().hex[:8]}")
    try:
        board.client.sadd(board.known, "n1", "n2")
        board.publish("n1", quotas.report(), ttl_seconds=30)
        board.publish("n2", quotas.report(), ttl_seconds=30)  # as if a second node refused too
        assert board.read(tenant).refused == {"max_calls_per_second": 2,
                                              "max_concurrent_streams": 2}
    finally:
        for key in board.client.scan_iter(f"{board.prefix}*"):
            board.client.delete(key)
        board.client.delete(board.known)
        board.client.close()


@pytest.fixture
def silent_redis(settings):
    """``REDIS_URL`` names a server that accepts connections and never answers."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    settings.REDIS_URL = f"redis://127.0.0.1:{silent.getsockname()[1]}/0"
    yield
    tenant_quotas._boards.pop(settings.REDIS_URL, None)
    silent.close()


def test_a_silent_redis_costs_a_bounded_wait_then_shows_this_nodes_counts(silent_redis):
    quotas = _node(_Clock(), calls=0, streams=2)
    started = time.monotonic()
    use = tenant_quotas.cluster_use(quotas, "acme")
    assert time.monotonic() - started < 2 * tenant_quotas.REDIS_WAIT_SECONDS + 0.5
    assert (use.streams, use.nodes, use.cluster) == (2, 1, False)
