"""Shared fixtures: the platform served by a real ASGI server, API clients, real services.

Tests that need PostgreSQL or Redis use the ``postgres_url`` / ``redis_url`` fixtures: when the
service is unreachable they skip on a developer machine and *fail* in CI (``CI=true``).
"""

from __future__ import annotations

import os
import socket
from urllib.parse import urlsplit

import httpx
import pytest

from registry import events, services
from tests.servers import serve_app

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _reachable(url: str, default_port: int) -> bool:
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or default_port),
                                      timeout=1):
            return True
    except OSError:
        return False


def _require(url: str, default_port: int, what: str) -> str:
    if not _reachable(url, default_port):
        message = f"{what} is not reachable at {url}"
        if IN_CI:
            pytest.fail(f"{message} (CI=true: services this test needs must be running)")
        pytest.skip(message)
    return url


@pytest.fixture(scope="session")
def redis_url() -> str:
    """A Redis for tests: REDIS_URL when set, else the local one (db 15)."""
    return _require(os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/15", 6379, "Redis")


@pytest.fixture(scope="session")
def postgres_url() -> str:
    url = os.environ.get("DATABASE_URL") or "postgresql://postgres@127.0.0.1:5432/postgres"
    return _require(url, 5432, "PostgreSQL")


@pytest.fixture
def live_server_url(transactional_db) -> str:
    """The whole platform (config.asgi.application, lifespan on) served by a real uvicorn."""
    from config.asgi import application

    with serve_app(application) as server:
        yield server.url


def make_client(scopes: list[str], agents: list[str] | None = None, name: str | None = None):
    name = name or f"client-{os.urandom(4).hex()}"
    client, token = services.api_client_create(name=name, scopes=scopes, allowed_agents=agents)
    return client, token


@pytest.fixture
def admin_token(db) -> str:
    return make_client(["admin"], name="admin-test")[1]


@pytest.fixture
def register_token(db) -> str:
    return make_client(["register", "call"], name="registrar")[1]


@pytest.fixture
def api(live_server_url, admin_token):
    """An httpx client for the live server, authenticated as an admin client."""
    with httpx.Client(
        base_url=live_server_url, headers={"Authorization": f"Bearer {admin_token}"}, timeout=30
    ) as client:
        yield client


@pytest.fixture
def recorded_events():
    """Every registry event published while the test runs, in order."""
    seen: list[events.AgentEvent] = []
    unsubscribe = events.subscribe(seen.append)
    yield seen
    unsubscribe()


@pytest.fixture(autouse=True)
def _open_metrics(settings):
    """Tests of other features read /metrics without a token in both CI modes; the token gate
    itself (on by default in distributed mode) is tested in tests/gateway/test_exposure.py."""
    settings.A2A_METRICS_REQUIRE_TOKEN = False


@pytest.fixture(autouse=True)
def _fresh_vector_index(settings):
    """Each test starts with no ARD vector index in memory: it loads from the test's database
    on its first search (a rolled-back test's document ids may be reused by the next one).
    Documents are embedded as they are written: the embedding thread's own connection would
    not see a test's uncommitted rows (tests/ard/test_semantic.py covers the thread)."""
    from ard import vectors

    settings.ARD_EMBED_DEFERRED = False
    settings.ARD_SEMANTIC_SYNC_SECONDS = 0  # no catch-up thread (tests call sync() themselves)
    vectors.reset()
    yield
    vectors.reset()
