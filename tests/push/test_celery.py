"""Celery delivery (distributed mode's default): a real ``celery worker`` process, on the pass's
PostgreSQL database and Redis broker, delivers the pushes the node stored -- in order, retried
after a webhook's refusals -- while the node's own threads deliver nothing; the worker's
delivery counters show on the node's ``/metrics`` (through the cluster's Redis hash)."""

from __future__ import annotations

import os
import tempfile
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest
from django.db import connection

from push.models import PushDelivery
from tests import faults
from tests.push.test_relay import PUSHES, send_task
from tests.push.webhooks import db, verified_claims, wait_for

COUNTERS = ("delivered", "retried", "dead")


def push_counters(base: str) -> dict[str, float]:
    """The node's push delivery counters, from its ``/metrics``."""
    text = httpx.get(f"{base}/metrics", timeout=10).text
    found = {}
    for line in text.splitlines():
        for name in COUNTERS:
            if line.startswith(f"kubemq_a2a_push_{name}_total "):
                found[name] = float(line.split()[1])
    return found

pytestmark = [pytest.mark.one_pass("distributed"), pytest.mark.timeout(120)]


class Worker(faults._Process):
    def __init__(self, env: dict) -> None:
        self.env = env
        self.log_path = tempfile.mkstemp(prefix="a2a-push-worker-", suffix=".log")[1]

    def start(self) -> Worker:
        with open(self.log_path, "wb") as log:
            self._spawn([faults.PYTHON, "-m", "celery", "-A", "config", "worker",
                         "--pool=solo", "--without-heartbeat", "--without-gossip",
                         "--without-mingle", "-l", "warning"],
                        env=self.env, stdout=log, stderr=log)
        return self

    def log(self) -> str:
        with open(self.log_path, errors="replace") as log:
            return log.read()[-4000:]


@pytest.fixture
def worker(settings, live_server_url):
    if settings.EMBEDDED:
        pytest.skip("Celery delivery shares the pass's PostgreSQL and Redis: the distributed "
                    "pass runs it")
    parts = urlsplit(os.environ["DATABASE_URL"])
    test_db = urlunsplit(parts._replace(path=f"/{connection.settings_dict['NAME']}"))
    env = faults.platform_env(
        database_url=test_db, redis_url=os.environ["REDIS_URL"],
        SECRET_KEY=settings.SECRET_KEY, A2A_PUSH_DELIVERY="celery",
        A2A_PUSH_BACKOFF_SECONDS="0.05", A2A_PUSH_BACKOFF_MAX_SECONDS="0.2",
        A2A_PUSH_TIMEOUT_SECONDS="2", A2A_PUSH_MAX_ATTEMPTS="6")
    process = Worker(env).start()
    yield process
    process.terminate()


async def test_a_celery_worker_delivers_in_order_after_refusals(
        worker, echo_agent_factory, register_agent, caller, webhook, live_server_url, settings):
    settings.A2A_PUSH_DELIVERY = "celery"
    before = push_counters(live_server_url)
    assert set(before) == set(COUNTERS), before  # read from the cluster's Redis
    agent = echo_agent_factory(card_shape="1.0", push=True, steps=2, step_delay=0.05)
    target = register_agent(agent)
    name = f"celery-{os.urandom(3).hex()}"
    webhook.fail_first(name, 2)
    await send_task(target, caller, "task celery", webhook.url(name), "t")
    try:
        got = wait_for(lambda: len(webhook.delivered(name)) >= PUSHES
                       and webhook.delivered(name), timeout=60, what="the worker's deliveries")
    except AssertionError:
        raise AssertionError(f"worker log:\n{worker.log()}") from None
    claims = [verified_claims(live_server_url, r) for r in got]
    assert [c["seq"] for c in claims] == list(range(1, PUSHES + 1))
    first = await db(lambda: PushDelivery.objects.get(agent_id=target.agent_id, sequence=1))
    assert (first.state, first.attempts) == ("delivered", 3)
    # The worker's counters, on the node's /metrics (the node delivered nothing itself).
    wanted = {"delivered": before["delivered"] + PUSHES, "retried": before["retried"] + 2,
              "dead": before["dead"]}
    after = wait_for(lambda: (c := push_counters(live_server_url)) == wanted and c,
                     timeout=10, what=f"the worker's counters {wanted} on /metrics")
    assert after == wanted
