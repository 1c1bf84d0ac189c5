"""A short soak in CI's distributed pass: ``bench/soak.py`` for a minute of open-loop mixed
traffic (send, stream, heartbeats, registration churn) against two nodes on PostgreSQL and
Redis, with real a2a-sdk agents, restarting each node in turn (SIGTERM) during the run. Asserts
the targets that do not depend on the machine's speed: errors <= 0.1 % (``--check``), every
node restarted, and 0 failed calls during the restarts (the handover); p50/p99 are printed,
not asserted.
Its result JSON goes to ``test-artifacts/``, never the committed ``bench/results/``. The rate is
modest so a shared CI machine never turns this into a timing test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.faults import ROOT

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(420)]


def test_short_soak_with_rolling_restarts(postgres_url, redis_url):
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
            "10",
            "--nodes",
            "2",
            "--rolling-restart",
            "20",
            "--rate",
            "20",
            "--agents",
            "2",
            "--check",
            "--results",  # never into the committed bench/results/
            str(ROOT / "test-artifacts"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    print(result.stdout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "total:" in result.stdout
    path = next(line.split(":", 1)[1].strip() for line in result.stdout.splitlines()
                if line.startswith("results:"))
    summary = json.loads(Path(path).read_text())
    assert summary["nodes"] == 2 and summary["node_restarts"] >= 2, summary
    assert summary["failed_during_restarts"] == 0, summary["error_samples"]
