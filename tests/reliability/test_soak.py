"""A short soak in CI's distributed pass: ``bench/soak.py`` for one minute of open-loop mixed
traffic (send, stream, heartbeats, registration churn) against a node on PostgreSQL and Redis,
with real a2a-sdk agents. Asserts the targets that do not depend on the machine's speed: errors
<= 0.1 % and RSS growth <= 10 % after warm-up (``--check``); p50/p99 are printed, not asserted.
Its result JSON goes to ``test-artifacts/``, never the committed ``bench/results/``. The rate is
modest so a shared CI machine never turns this into a timing test."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.faults import ROOT

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(300)]


def test_one_minute_soak(postgres_url, redis_url):
    if not (os.environ.get("DATABASE_URL") and os.environ.get("REDIS_URL")):
        pytest.skip("the soak runs in the distributed pass (DATABASE_URL, REDIS_URL)")
    env = dict(os.environ, DATABASE_URL=postgres_url, REDIS_URL=redis_url)
    result = subprocess.run(
        [
            sys.executable,
            "bench/soak.py",
            "--distributed",
            "--minutes",
            "1",
            "--interval",
            "15",
            "--rate",
            "20",
            "--agents",
            "1",
            "--check",
            "--results",  # never into the committed bench/results/
            str(ROOT / "test-artifacts"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    print(result.stdout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "total:" in result.stdout
