"""Without ``REDIS_URL`` the tests that need Redis get a private redis-server of this run:
the machine's Redis (its database 15, say) is never written to nor flushed by the suite."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis


def test_without_redis_url_the_suite_runs_its_own_redis(redis_url):
    if os.environ.get("REDIS_URL"):
        pytest.skip("REDIS_URL is set: the run chose its Redis database")
    assert urlsplit(redis_url).port != 6379
    server_pid = redis.Redis.from_url(redis_url).info("server")["process_id"]
    status = Path(f"/proc/{server_pid}/status").read_text()
    parent = int(next(line.split()[1] for line in status.splitlines()
                      if line.startswith("PPid:")))
    assert parent == os.getpid()  # started by this test process, stopped with its session
