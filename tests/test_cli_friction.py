"""Friction a user meets on a fresh clone, each fixed and checked against the real commands or a
running node: configuration errors at startup, a missing database, discover's help and a
broken config file, a JSON body without Content-Type, and calling an expired agent."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
import pytest

from registry import services
from registry.permissions import SYSTEM
from tests.conftest import make_client
from tests.registry.cards import card_03
from tests.servers import ROOT, free_port
from tests.servers import fresh_env as _env
from tests.servers import run_manage as _manage

# What this checks does not depend on the pass's database or channel layer.
pytestmark = pytest.mark.one_pass("embedded")


def _python(env: dict[str, str], code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )


SHOW = (
    "import django, os; os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'config.settings');"
    "django.setup(); from django.conf import settings as s;"
    "print(s.ALLOWED_HOSTS, s.A2A_METRICS_REQUIRE_TOKEN)"
)


def test_allowed_hosts_defaults_and_the_startup_error(tmp_path):
    embedded = _python(_env(tmp_path), SHOW)
    assert embedded.returncode == 0, embedded.stderr
    # Embedded: loopback only (scripts/run.sh serves 127.0.0.1), metrics open.
    assert "'127.0.0.1'" in embedded.stdout and "'*'" not in embedded.stdout
    assert embedded.stdout.strip().endswith("False")
    distributed = _env(tmp_path, REDIS_URL="redis://127.0.0.1:1/0", SECRET_KEY="x")
    result = _manage(distributed, "check", check=False)
    assert result.returncode != 0
    assert "ALLOWED_HOSTS must be set in distributed mode" in result.stderr.strip().splitlines()[-1]
    configured = _python({**distributed, "ALLOWED_HOSTS": "registry.example.com"}, SHOW)
    assert configured.returncode == 0, configured.stderr
    assert configured.stdout.strip() == "['registry.example.com'] True"
    # DEBUG would accept any Host and show tracebacks: refused in distributed mode, kept for
    # development in embedded mode.
    debug = _manage({**distributed, "ALLOWED_HOSTS": "a.example", "DEBUG": "true"}, "check",
                    check=False)
    assert debug.returncode != 0
    assert debug.stderr.strip().splitlines()[-1].startswith(
        "configuration error: DEBUG=true is refused in distributed mode"), debug.stderr
    assert "Traceback" not in debug.stderr
    embedded_debug = _python({**_env(tmp_path), "DEBUG": "true"}, SHOW)
    assert embedded_debug.stdout.startswith("['*']"), embedded_debug.stderr


def _refused(env: dict[str, str]) -> str:
    """``manage.py check`` under ``env`` must refuse to start with one plain line: returned."""
    result = _manage(env, "check", check=False)
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("configuration error: "), result.stderr
    return last


def test_commands_start_without_the_serving_only_libraries(tmp_path):
    """A command that does not serve (``check``, ``migrate``, ``discover``, a Celery worker)
    sets Django up without the MCP SDK: importing it costs about a second of CPU on every
    command, and only a serving node's ASGI application needs it."""
    code = ("import django, os, sys; os.environ.setdefault('DJANGO_SETTINGS_MODULE', "
            "'config.settings'); django.setup(); "
            "print(sorted(m for m in ('mcp', 'mcp_bridge.server') if m in sys.modules))")
    result = _python(_env(tmp_path), code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]", result.stdout


def test_settings_that_contradict_each_other_refuse_to_start_naming_the_fix(tmp_path, postgres_url):
    env = _env(tmp_path)
    assert "did you mean A2A_SSE_BUFFER_BYTES?" in _refused({**env, "A2A_SSE_BUFER_BYTES": "1"})
    assert "did you mean DISCOVERY_CONFIG?" in _refused({**env, "DISCOVERY_CONFG": "x.json"})
    assert "ARD_NO_SUCH_THING" in _refused({**env, "ARD_NO_SUCH_THING": "1"})
    last = _refused({**env, "A2A_NODE_LIVENESS_TTL_SECONDS": "1",
                     "A2A_NODE_LIVENESS_REFRESH_SECONDS": "1"})
    assert "A2A_NODE_LIVENESS_TTL_SECONDS (1) must be above" in last
    last = _refused({**env, "A2A_DEFAULT_TIMEOUT_SECONDS": "7200"})
    assert "A2A_DEFAULT_TIMEOUT_SECONDS (7200) is above A2A_MAX_TIMEOUT_SECONDS (3600)" in last
    assert "A2A_DEFAULT_TTL_SECONDS (100) is above A2A_MAX_TTL_SECONDS (50)" in _refused(
        {**env, "A2A_DEFAULT_TTL_SECONDS": "100", "A2A_MAX_TTL_SECONDS": "50"})
    # PostgreSQL without Redis is a mode of its own, chosen by name, never by accident.
    on_postgres = {**env, "DATABASE_URL": postgres_url, "SECRET_KEY": "x"}
    assert "set A2A_SINGLE_NODE=true" in _refused(on_postgres)
    single = _manage({**on_postgres, "A2A_SINGLE_NODE": "true"}, "check", check=False)
    assert single.returncode == 0, single.stderr
    assert "contradict" in _refused({**env, "A2A_SINGLE_NODE": "true",
                                     "REDIS_URL": "redis://127.0.0.1:1/0", "SECRET_KEY": "x",
                                     "ALLOWED_HOSTS": "a.example"})
    # Every name the node reads is a known one: a clean environment starts.
    assert _manage(env, "check", check=False).returncode == 0


def test_missing_database_fails_fast_with_the_cause_last(tmp_path, postgres_url):
    base = postgres_url.rsplit("/", 1)[0]
    env = _env(
        tmp_path,
        DATABASE_URL=f"{base}/a2a_no_such_db_{free_port()}",
        REDIS_URL="redis://127.0.0.1:1/0",
        SECRET_KEY="x",
        ALLOWED_HOSTS="127.0.0.1",
    )
    started = time.monotonic()
    result = _manage(env, "serve", "--port", str(free_port()), check=False)
    assert result.returncode != 0
    assert time.monotonic() - started < 30
    last = result.stderr.strip().splitlines()[-1]
    assert "database not reachable" in last and "does not exist" in last, result.stderr
    assert "serving" not in result.stdout


def test_discover_help_names_the_config_variable_and_a_broken_file_fails(tmp_path):
    env = _env(tmp_path)
    _manage(env, "migrate", "--no-input")
    help_text = _manage(env, "discover", "--help").stdout
    assert "DISCOVERY_CONFIG" in help_text
    broken = tmp_path / "discovery.json"
    broken.write_text('{"static": [{"url": ')
    result = _manage(
        {**env, "DISCOVERY_CONFIG": str(broken)}, "discover", "--once", "--no-progress", check=False
    )
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert "DISCOVERY_CONFIG" in last and "not valid JSON" in last
    good = tmp_path / "ok.json"
    good.write_text('{"needs": []}')
    ok = _manage({**env, "DISCOVERY_CONFIG": str(good)}, "discover", "--once", "--no-progress")
    assert ok.returncode == 0


def test_json_registration_without_content_type_says_so(live_server_url, admin_token):
    body = b'{"agent_id": "no-ctype", "card": {"name": "x", "url": "http://127.0.0.1:9/"}}'
    r = httpx.post(
        live_server_url + "/api/v1/agents",
        content=body,
        headers={"Authorization": f"Bearer {admin_token}"},
    )
    assert r.status_code == 415
    assert "without a Content-Type" in r.json()["error"]
    assert "application/json" in r.json()["error"]


def test_calling_an_expired_agent_says_expired_not_not_found(live_server_url):
    _, token = make_client(["call"])
    services.agent_register(actor=SYSTEM, agent_id="short-lived", card=card_03(), ttl_seconds=1)
    time.sleep(1.2)
    services.agents_expire()  # the expiry job: publishes "expired" to the routing table
    rpc = {"jsonrpc": "2.0", "id": 7, "method": "message/send", "params": {}}
    headers = {"Authorization": f"Bearer {token}"}
    deadline = time.monotonic() + 5
    while True:
        error = httpx.post(live_server_url + "/a2a/short-lived", json=rpc, headers=headers).json()[
            "error"
        ]
        if "expired" in error["message"] or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert error["message"].startswith("agent expired at ")
    assert "re-register" in error["message"] and error["message"].endswith("short-lived")
    assert error["data"]["kind"] == "agent_not_found" and error["data"]["executed"] is False
    never = httpx.post(live_server_url + "/a2a/never-was", json=rpc, headers=headers).json()
    assert never["error"]["message"] == "agent not found: never-was"


def test_serving_beyond_loopback_without_allowed_hosts_warns(tmp_path):
    env = _env(tmp_path)
    _manage(env, "migrate", "--no-input")
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "serve", "--host", "0.0.0.0", "--port", str(free_port())],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stderr.readline()
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    assert line.startswith("warning: listening on 0.0.0.0") and "ALLOWED_HOSTS" in line


def test_runserver_refuses_and_points_to_serve(tmp_path):
    """Daphne's (and Django's) ``runserver`` would start a process without the node around
    Django; the command refuses, whatever its arguments, starts nothing, and names ``serve``."""
    env = _env(tmp_path)
    port = free_port()
    for args in ([], [f"127.0.0.1:{port}"], ["--noreload", str(port)]):
        result = _manage(env, "runserver", *args, check=False)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert "python manage.py serve" in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
    listed = _manage(env, "help").stdout
    assert "[daphne]" not in listed or "runserver" not in listed.split("[daphne]")[1].split("[")[0]
