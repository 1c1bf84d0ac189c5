import pytest

from registry import signatures

# Discovery's fixtures (card server, clock, cache, config file) for the discovery tests here.
from tests.discovery.conftest import (  # noqa: F401
    _fresh_trees,
    cache,
    card_server,
    clock,
    configure,
)


@pytest.fixture(autouse=True)
def _fresh_keys():
    """Each test starts with no cached keys or verdicts (settings differ per test)."""
    signatures.reset()
    yield
    signatures.reset()
