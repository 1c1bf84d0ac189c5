"""``/mcp`` driven by the MCP Inspector's CLI mode (``@modelcontextprotocol/inspector``, the
version pinned in ``tests/js/package.json``), a client of another SDK than the Python one.

The Inspector is installed by ``scripts/setup.sh dev`` into ``tests/js/node_modules``, never
by a test. Missing: these tests skip on a developer machine and fail under ``CI=true``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import IN_CI

INSPECTOR = Path(__file__).resolve().parents[1] / "js" / "node_modules" / ".bin" / "mcp-inspector"


@pytest.fixture
def inspector(tmp_path):
    """Run the Inspector's CLI against a URL; answers (exit code, stdout, stderr)."""
    if not INSPECTOR.exists() or shutil.which("node") is None:
        message = (f"the MCP Inspector is not installed at {INSPECTOR} (or node is missing): "
                   "run scripts/setup.sh dev")
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    # Its catalog, client config and any state it keeps go to the test's own directory.
    env = {**os.environ, "HOME": str(tmp_path), "MCP_CATALOG_PATH": str(tmp_path / "mcp.json"),
           "MCP_CLIENT_CONFIG_PATH": str(tmp_path / "client.json"), "NO_COLOR": "1"}

    def cli(url: str, token: str | None, *args: str) -> tuple[int, str, str]:
        headers = ["--header", f"Authorization: Bearer {token}"] if token else []
        done = subprocess.run(
            [str(INSPECTOR), "--cli", url, "--transport", "http", "--format", "json",
             "--quiet", *headers, *args],
            capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
        return done.returncode, done.stdout, done.stderr

    return cli


def test_the_inspector_lists_and_calls_the_agents(
        inspector, live_server_url, register_agent, echo_agent_factory, caller):
    agent = register_agent(echo_agent_factory(name="Echo For The Inspector"))
    url = f"{live_server_url}/mcp"

    listed = inspector(url, caller.token, "--method", "tools/list")  # the handshake era
    called = inspector(url, caller.token, "--method", "tools/call", "--tool-name",
                       agent.agent_id, "--tool-arg", "message=from the inspector")

    assert listed[0] == 0, listed
    tools = {tool["name"]: tool for tool in json.loads(listed[1])["result"]["tools"]}
    assert set(tools) == {agent.agent_id, "get_task"}
    assert tools[agent.agent_id]["title"] == "Echo For The Inspector"
    assert tools[agent.agent_id]["inputSchema"]["required"] == ["message"]
    assert called[0] == 0, called
    result = json.loads(called[1])["result"]
    assert not result["isError"] and result["content"][0]["text"] == "echo: from the inspector"
    assert result["structuredContent"]["agent_id"] == agent.agent_id


def test_the_inspector_on_the_2026_protocol_and_refused_without_a_valid_token(
        inspector, live_server_url, register_agent, echo_agent_factory, caller):
    agent = register_agent(echo_agent_factory())
    url = f"{live_server_url}/mcp"

    called = inspector(url, caller.token, "--protocol-era", "modern", "--method", "tools/call",
                       "--tool-name", agent.agent_id, "--tool-arg", "message=modern")
    refused = inspector(url, "not-a-token", "--method", "tools/list")

    assert called[0] == 0, called
    assert json.loads(called[1])["result"]["content"][0]["text"] == "echo: modern"
    # The 401's WWW-Authenticate sends the Inspector to OAuth, which it cannot run here.
    assert refused[0] != 0 and not refused[1]
    assert json.loads(refused[2])["error"]["code"] == "auth_required", refused
