"""The agent page's copy-ready snippets work as pasted: the curl line and the a2a-sdk script,
run as a user would (a shell, a Python process) against the real gateway and a real agent."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from console.agent_admin import snippets
from tests.conftest import IN_CI

pytestmark = pytest.mark.django_db(transaction=True)


def test_curl_and_sdk_snippets_reach_the_agent(live_server_url, echo_agent, register_agent,
                                               caller, tmp_path):
    agent = register_agent(echo_agent)
    code = snippets(f"{live_server_url}/a2a/{agent.agent_id}/")
    env = {**os.environ, "TOKEN": caller.token}
    if shutil.which("curl") is None:
        if IN_CI:
            pytest.fail("curl is not installed")
        pytest.skip("curl is not installed")
    done = subprocess.run(["bash", "-c", code["curl"]], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert '"echo: hi"' in done.stdout or "echo: hi" in done.stdout, done.stdout

    script = tmp_path / "call_agent.py"
    script.write_text(code["sdk"])
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "echo: hi" in done.stdout, done.stdout[-3000:]
