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
from tests import passes
from tests.servers import serve_app

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def pytest_collection_modifyitems(config, items) -> None:
    """Tests marked ``one_pass`` skip in the other CI pass (tests/passes.py), before any fixture
    of theirs starts."""
    for item in items:
        marker = item.get_closest_marker("one_pass")
        if marker is not None and not passes.runs_here(marker.args[0]):
            item.add_marker(pytest.mark.skip(
                reason=f"independent of the pass's services: CI runs it in its {marker.args[0]} "
                       "pass"))


def _flush_by_delete() -> None:
    """Empty PostgreSQL's tables after a transactional test with ``DELETE`` instead of Django's
    ``TRUNCATE``: the same empty tables, at a fraction of the cost. TRUNCATE gives each of the
    40 tables a new file, which PostgreSQL syncs at commit: 0.7-0.9 s per flush on this project's
    2-core machine kind, against 0.01-0.05 s for DELETEs of the few rows a test leaves (measured
    together on the same migrated database, 5 rounds each), and the distributed pass flushes
    after several hundred tests. Django creates every foreign key ``DEFERRABLE INITIALLY
    DEFERRED``, so the DELETEs run in any order inside the flush's transaction. A flush that
    must reset sequences or cascade keeps Django's own statements."""
    from django.db.backends.postgresql.operations import DatabaseOperations

    truncate = DatabaseOperations.sql_flush

    def sql_flush(self, style, tables, *, reset_sequences=False, allow_cascade=False):
        if reset_sequences or allow_cascade or not tables:
            return truncate(self, style, tables, reset_sequences=reset_sequences,
                            allow_cascade=allow_cascade)
        return ["SET CONSTRAINTS ALL DEFERRED"] + [
            f"DELETE FROM {self.quote_name(table)}" for table in tables]

    DatabaseOperations.sql_flush = sql_flush


_flush_by_delete()


#: Rows a migrated database has that no test changes: the content types and permissions.
KEPT_BY_FLUSH = frozenset({"django_content_type", "auth_permission"})


def _flush_keeps_what_migrations_made() -> None:
    """A transactional test's flush empties every table; two kinds of rows the migrations made
    are kept as a migrated database has them, on both databases.

    - The default tenant's row: in a real database the migration that made it is the only
      writer of it and it never goes (docs/tenants.md). Every flush puts it back in the same
      transaction (foreign keys are deferred there).
    - The content types and permissions (:data:`KEPT_BY_FLUSH`): Django's flush empties them
      and makes them again (its post_migrate signal: 0.06 s of CPU per flush, measured with
      cProfile over 20 live-server tests, on several hundred tests per CI pass, which share
      two cores). Their rows are not flushed, so the signal has nothing to do and is not sent.
    """
    from django.core.management.commands import flush as flush_command
    from django.db.backends.postgresql.operations import DatabaseOperations as Postgres
    from django.db.backends.sqlite3.base import DatabaseOperations as SQLite

    for ops, insert in (
        (Postgres, "INSERT INTO registry_tenant (slug, name, created_at) VALUES "
                   "('default', 'Default tenant', now()) ON CONFLICT DO NOTHING"),
        (SQLite, "INSERT OR IGNORE INTO registry_tenant (slug, name, created_at) VALUES "
                 "('default', 'Default tenant', CURRENT_TIMESTAMP)"),
    ):
        flush = ops.sql_flush

        def sql_flush(self, style, tables, *, reset_sequences=False, allow_cascade=False,
                      _flush=flush, _insert=insert):
            statements = _flush(self, style, [t for t in tables if t not in KEPT_BY_FLUSH],
                                reset_sequences=reset_sequences, allow_cascade=allow_cascade)
            return [*statements, _insert] if "registry_tenant" in tables else statements

        ops.sql_flush = sql_flush
    flush_command.emit_post_migrate_signal = lambda *args, **kwargs: None


_flush_keeps_what_migrations_made()


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


def _private_redis():
    """A redis-server of this test run's own on a free loopback port (three tries: a free port
    can be taken before the server binds it); the answering server must be this child."""
    import redis

    from tests.faults import FaultSetupError, PrivateRedis

    for _ in range(3):
        server = PrivateRedis()
        try:
            server.start()
            info = redis.Redis.from_url(server.url(), socket_timeout=5).info("server")
            if server.alive() and info.get("process_id") == server.pid:
                return server
        except (FaultSetupError, redis.RedisError):
            pass
        server.cleanup()
    raise FaultSetupError("could not start a private redis-server")


@pytest.fixture(scope="session")
def redis_url():
    """A Redis for tests. ``REDIS_URL`` when set: the run's own choice (CI's distributed pass
    gives each pass a database of its own), written to and flushed by the tests. Unset: a
    private ``redis-server`` started for this run on a free port and stopped after it, so the
    suite never writes to, nor flushes, a database of the machine's Redis that it did not
    create. Without ``redis-server`` installed the tests that need Redis skip (fail in CI)."""
    configured = os.environ.get("REDIS_URL")
    if configured:
        yield _require(configured, 6379, "Redis")
        return
    import shutil

    from tests.faults import FaultSetupError

    try:
        if shutil.which("redis-server") is None:
            raise FaultSetupError("redis-server is not installed")
        server = _private_redis()
    except FaultSetupError as exc:
        message = (f"{exc}: tests that need Redis start a private redis-server when REDIS_URL "
                   "is unset (or set REDIS_URL to a Redis database the tests may write to and "
                   "flush)")
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    try:
        yield server.url()
    finally:
        server.cleanup()


@pytest.fixture(scope="session")
def postgres_url() -> str:
    url = os.environ.get("DATABASE_URL") or "postgresql://postgres@127.0.0.1:5432/postgres"
    return _require(url, 5432, "PostgreSQL")


@pytest.fixture
def live_server_url(transactional_db) -> str:
    """The whole platform (config.asgi.application, lifespan on) served by a real uvicorn."""
    from ard import indexer
    from config.asgi import application

    with serve_app(application) as server:
        yield server.url
    # The node's search-index writer thread writes what it still holds before the test's
    # database is flushed: a document written later would land in the next test's database.
    indexer.settle_deferred()


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
