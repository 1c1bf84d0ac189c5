import pytest

from registry import signatures


@pytest.fixture(autouse=True)
def _fresh_keys():
    """Each test starts with no cached keys or verdicts (settings differ per test)."""
    signatures.reset()
    yield
    signatures.reset()
