"""Discovery fixtures: a counting card server, a Kubernetes API stand-in, an injectable clock
and a fresh card cache per test."""

from __future__ import annotations

import importlib
import json
import time
from types import ModuleType

import pytest

from core.locks import LocalLocks
from discovery import tree_factory
from discovery.card_cache import CardCache
from discovery.config_file import config_file_sync
from tests.conftest import IN_CI
from tests.discovery.servers import CardServer, KubeApi
from tests.servers import serve_app


def require_extra(
    module: str, install: str, *, installed_in_ci: bool = True, why_not: str = ""
) -> ModuleType:
    """Import an optional extra's module. Missing: skipped on a developer machine, a failure
    under ``CI=true`` (CI installs requirements/extras.txt, so a test never silently skips) --
    unless the extra cannot be installed next to the pinned set (``installed_in_ci=False``,
    with ``why_not`` saying so in the skip reason)."""
    try:
        return importlib.import_module(module)
    except ImportError:
        if not installed_in_ci:
            pytest.skip(f"{module} is not installable next to the pinned requirements: {why_not}")
        message = f"{module} is an optional extra: pip install -r requirements/extras.txt"
        if IN_CI:
            pytest.fail(f"{message} -- CI=true: CI installs the extras")
        pytest.skip(f"{message} (or {install})")


class FakeClock:
    """POSIX seconds that move only when told to."""

    def __init__(self, start: float | None = None) -> None:
        self.now = start if start is not None else time.time()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def card_server():
    app = CardServer()
    with serve_app(app, lifespan="off") as server:
        app.url = server.url
        yield app


@pytest.fixture
def kube_api():
    app = KubeApi()
    with serve_app(app, lifespan="off") as server:
        app.url = server.url
        yield app


@pytest.fixture
def cache(clock) -> CardCache:
    return CardCache(clock=clock, jitter=0.0, locks=LocalLocks())


@pytest.fixture(autouse=True)
def _fresh_trees(settings):
    settings.DISCOVERY_FETCH_TIMEOUT_SECONDS = 1.0
    settings.DISCOVERY_CONNECT_TIMEOUT_SECONDS = 1.0
    tree_factory.forget(tree_factory.cached_digests())
    yield
    tree_factory.forget(tree_factory.cached_digests())


@pytest.fixture
def configure(tmp_path):
    """Write a DISCOVERY_CONFIG file and sync it into the models (as the loop does)."""

    def apply(**config):
        config.setdefault("allowlist", [{"host": "127.0.0.1", "allow_http": True}])
        path = tmp_path / "discovery.json"
        path.write_text(json.dumps(config))
        return config_file_sync(path=str(path), force=True)

    return apply
