"""The push relay's bounds that no peer shows: the backoff's range, the per-agent rate table's
size, the retention of delivered pushes (dead ones are kept) and of configs, and the wait of a
scrape on a Redis that does not answer."""

from __future__ import annotations

import socket
import time
from datetime import timedelta

import httpx
import pytest
from django.utils import timezone

from push import delivery, ingress, metrics
from push.models import PushDelivery, RelayedConfig


def test_the_backoff_doubles_with_jitter_up_to_its_ceiling(settings):
    settings.A2A_PUSH_BACKOFF_SECONDS = 1.0
    settings.A2A_PUSH_BACKOFF_MAX_SECONDS = 10.0
    for attempts, (low, high) in {1: (0.5, 1.0), 2: (1.0, 2.0), 3: (2.0, 4.0),
                                  4: (4.0, 8.0), 5: (5.0, 10.0), 60: (5.0, 10.0)}.items():
        waits = [delivery.backoff(attempts) for _ in range(200)]
        assert all(low <= w <= high for w in waits), attempts
        assert max(waits) - min(waits) > (high - low) / 4  # jittered, not one value


def test_the_rate_table_keeps_a_bounded_number_of_agents(monkeypatch):
    monkeypatch.setattr(ingress, "RATE_AGENTS", 3)
    rates = ingress.AgentRates()
    for n in range(10):
        assert rates.take(f"agent-{n}", 1.0, 1) == 0.0
    assert len(rates._buckets) == 3
    assert rates.take("agent-9", 1.0, 1) > 0  # a recent agent's bucket is kept: empty
    assert rates.take("agent-0", 1.0, 1) == 0.0  # an evicted one starts full again


@pytest.mark.django_db
def test_delivered_pushes_past_the_retention_are_purged_and_dead_ones_kept(settings,
                                                                           monkeypatch):
    settings.A2A_PUSH_RETENTION_SECONDS = 60
    monkeypatch.setattr(delivery, "_last_purge", 0.0)
    config = RelayedConfig.objects.create(id="a" * 32, agent_id="a", client_id="c",
                                          url="http://127.0.0.1:9/", secret_sha256="0" * 64)
    old = timezone.now() - timedelta(seconds=120)
    for sequence, state, finished in [(1, "delivered", old), (2, "dead", old),
                                      (3, "delivered", timezone.now()), (4, "pending", None)]:
        PushDelivery.objects.create(config=config, agent_id="a", task_id="t", sequence=sequence,
                                    body=b"{}", state=state, finished_at=finished,
                                    idempotency_key=f"k{sequence}")
    assert delivery.purge() == 1
    assert sorted(PushDelivery.objects.values_list("sequence", flat=True)) == [2, 3, 4]
    assert delivery.purge() == 0  # not again within the minute


@pytest.mark.django_db
def test_one_push_is_claimed_by_one_deliverer_and_a_stale_read_cannot_claim_it(settings):
    """Two deliverers read the same head: one claims it (the other cannot while it is held);
    once the first recorded a failed attempt, the other's stale copy cannot claim it either
    (no early retry, no miscounted attempt)."""
    settings.A2A_PUSH_BACKOFF_SECONDS = 0.001
    config = RelayedConfig.objects.create(id="b" * 32, agent_id="a", client_id="c",
                                          url="http://127.0.0.1:9/", secret_sha256="0" * 64)
    PushDelivery.objects.create(config=config, agent_id="a", task_id="t", sequence=1,
                                body=b"{}", idempotency_key="k1")
    first, second = (PushDelivery.objects.get(sequence=1) for _ in range(2))
    assert delivery._claim(first) is True
    assert delivery._claim(second) is False  # held
    delivery._record(first, delivery.Outcome(False, 503, "HTTP 503"))
    assert delivery._claim(second) is False  # tried since it was read
    fresh = PushDelivery.objects.get(sequence=1)
    assert (fresh.attempts, fresh.state, fresh.claimed_until) == (1, "failed", None)


def test_metrics_are_served_without_the_delivery_counters_when_redis_is_down(
        settings, live_server_url, caplog):
    """Celery delivery reads the cluster's counters from Redis at scrape time: a Redis that
    takes the connection and never answers costs one scrape at most REDIS_WAIT_SECONDS, then
    is not asked again for a while; /metrics answers with everything else, and the failure is
    logged once."""
    settings.A2A_PUSH_DELIVERY = "celery"
    with socket.socket() as silent:  # listens, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        silent.setblocking(False)
        settings.REDIS_URL = f"redis://127.0.0.1:{silent.getsockname()[1]}/0"
        took, asked = [], []
        for _ in range(3):
            started = time.monotonic()
            response = httpx.get(f"{live_server_url}/metrics", timeout=10)
            took.append(time.monotonic() - started)
            assert response.status_code == 200
            assert "kubemq_a2a_push_received_total" in response.text
            assert "kubemq_a2a_push_delivered_total" not in response.text
            accepted = []
            while True:  # the connections this scrape opened to the silent Redis
                try:
                    accepted.append(silent.accept()[0])
                except BlockingIOError:
                    break
            asked.append(len(accepted))
            for connection in accepted:
                connection.close()
    # The first scrape waited for Redis (at least the bound, and not the client's 10 s);
    # the next two did not ask it at all.
    assert metrics.REDIS_WAIT_SECONDS <= took[0] < 5, took
    assert asked[0] >= 1 and asked[1:] == [0, 0], asked
    assert sum("push metrics: reading the delivery counters failed" in r.getMessage()
               for r in caplog.records) == 1


@pytest.mark.django_db
def test_configs_done_with_are_purged_and_those_holding_a_push_kept(settings, monkeypatch):
    settings.A2A_PUSH_RETENTION_SECONDS = 60
    settings.A2A_PUSH_CONFIG_RETENTION_SECONDS = 3600
    monkeypatch.setattr(delivery, "_last_purge", 0.0)
    now = timezone.now()
    ago = {name: now - timedelta(seconds=seconds)
           for name, seconds in {"min": 120, "hour": 7200, "recent": 10}.items()}

    def config(name: str, *, created="recent", pushed=None, done=None, states=()) -> None:
        made = RelayedConfig.objects.create(
            id=name.ljust(32, "x"), agent_id="a", client_id="c", url="http://127.0.0.1:9/",
            secret_sha256="0" * 64, created_at=ago[created],
            last_push_at=ago[pushed] if pushed else None,
            task_done_at=ago[done] if done else None)
        for sequence, state in enumerate(states, 1):
            PushDelivery.objects.create(
                config=made, agent_id="a", task_id="t", sequence=sequence, body=b"{}",
                state=state, finished_at=now, idempotency_key=f"{name}.{sequence}")

    config("done", created="hour", pushed="min", done="min", states=["delivered"])
    config("idle", created="hour", pushed="hour")
    config("neverpushed", created="hour")
    config("donerecently", pushed="recent", done="recent", states=["delivered"])
    config("running", created="hour", pushed="recent", states=["delivered"])
    config("open", created="hour", pushed="hour", done="hour", states=["delivered", "failed"])
    config("pending", created="hour", pushed="hour", states=["pending"])
    config("dead", created="hour", pushed="hour", done="hour", states=["dead"])
    assert delivery.purge() == 3  # the first's delivered push (recent) goes with it
    assert sorted(c.rstrip("x") for c in RelayedConfig.objects.values_list("pk", flat=True)) \
        == ["dead", "donerecently", "open", "pending", "running"]
    assert delivery.purge_configs() == 0


def test_a_push_showing_its_task_finished_is_told_in_both_versions():
    done = [{"task": {"id": "t", "status": {"state": "TASK_STATE_COMPLETED"}}},
            {"statusUpdate": {"taskId": "t", "status": {"state": "TASK_STATE_CANCELED"}}},
            {"kind": "task", "id": "t", "status": {"state": "failed"}},
            {"kind": "status-update", "taskId": "t", "status": {"state": "rejected"}}]
    going = [{"task": {"id": "t", "status": {"state": "TASK_STATE_WORKING"}}},
             {"artifactUpdate": {"taskId": "t"}},
             {"kind": "status-update", "taskId": "t", "status": {"state": "input-required"}},
             {"kind": "task", "id": "t", "status": "completed"}]
    assert [ingress.task_done(p) for p in done] == [True] * 4
    assert [ingress.task_done(p) for p in going] == [False] * 4
