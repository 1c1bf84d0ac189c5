"""Fault matrix, scheduling rows: Celery beat survives PostgreSQL and Redis outages
(started while the database is down, database killed -9 under it, broker killed -9 under it),
and agent expiry does not need beat at all: serving nodes run it under a cluster-wide lock."""

from __future__ import annotations

import subprocess
import tempfile
import time

import httpx
import pytest
import redis

from tests import faults
from tests.reliability.conftest import register

pytestmark = pytest.mark.timeout(180)


def _queued(redis_url: str) -> int:
    """Task messages beat has sent (no worker consumes them here)."""
    try:
        return redis.Redis.from_url(redis_url, socket_timeout=2).llen("celery")
    except redis.RedisError:
        return -1


def _wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


# `celery beat` with django-celery-beat's forced full schedule read (every 5 minutes) compressed
# to 2 seconds, so an outage overlaps it within the test (the overlap that killed beat).
BEAT_MAIN = """
import os, sys
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
import django
django.setup()
import django_celery_beat.schedulers as schedulers
schedulers.SCHEDULE_SYNC_MAX_INTERVAL = 2
from celery.__main__ import main
sys.argv[0] = "celery"
main()
"""


class Beat(faults._Process):
    def __init__(self, env: dict, scheduler: str | None = None) -> None:
        self.env = dict(env, A2A_EXPIRY_INTERVAL_SECONDS="1", LOG_LEVEL="INFO")
        self.scheduler = scheduler
        self.log_path = tempfile.mkstemp(prefix="a2a-beat-", suffix=".log")[1]

    def start(self) -> Beat:
        args = [
            faults.PYTHON,
            "-c",
            BEAT_MAIN,
            "-A",
            "config",
            "beat",
            "-l",
            "info",
            "--max-interval",
            "1",
            "--pidfile=",
        ]
        if self.scheduler:
            args += ["-S", self.scheduler]
        log = open(self.log_path, "ab")  # noqa: SIM115 - kept open by the child
        self._spawn(args, cwd=faults.ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        return self

    def log(self) -> str:
        with open(self.log_path, errors="replace") as handle:
            return handle.read()[-3000:]


def test_beat_survives_database_and_broker_outages(services, pg):
    redis_server = services["redis"]
    url = services["redis_url"]
    pg.kill()
    beat = Beat(services["env"]).start()  # the default scheduler (settings)
    try:
        time.sleep(4)  # beat reads its schedule at start: the database is down
        assert beat.alive(), beat.log()

        pg.start()
        _wait_until(lambda: _queued(url) > 0, 20, "beat sent nothing after the database came back")

        pg.kill()  # down under a running beat, across several ticks and a schedule check
        before = _queued(url)
        time.sleep(4)
        assert beat.alive(), beat.log()
        pg.start()
        _wait_until(lambda: _queued(url) > before + 1, 20, "beat stopped after the outage")

        redis_server.kill()
        time.sleep(3)
        assert beat.alive(), beat.log()
        redis_server.start()
        _wait_until(lambda: _queued(url) > 1, 20, "beat stopped after the broker outage")
        assert beat.alive()
    finally:
        beat.terminate(timeout=5)


def test_expiry_runs_on_serving_nodes_without_beat(services, tokens, start_node, agent):
    # No beat process at all; two nodes run expiry under the cluster-wide lock.
    first = start_node(A2A_EXPIRY_INTERVAL_SECONDS="0.5")
    start_node(A2A_EXPIRY_INTERVAL_SECONDS="0.5")
    agent_id = register(first.url, tokens["admin"], agent.url, ttl_seconds=1)
    auth = {"Authorization": f"Bearer {tokens['admin']}"}

    def expired() -> bool:
        body = httpx.get(f"{first.url}/api/v1/agents/{agent_id}", headers=auth, timeout=10)
        return body.status_code == 200 and body.json()["status"] == "expired"

    _wait_until(expired, 15, "the agent did not expire without beat")
