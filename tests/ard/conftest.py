"""ARD fixtures: agents registered through the registry's own services, so the search index is
fed by the real event hook."""

from __future__ import annotations

from typing import Any

import pytest

from registry import services
from registry.permissions import SYSTEM
from tests.ard.corpus import CARDS
from tests.discovery.conftest import FakeClock, cache, card_server, configure  # noqa: F401


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def register(django_capture_on_commit_callbacks):
    """Register an agent (events delivered as after a real commit); returns the Agent."""

    def apply(agent_id: str, card: dict[str, Any], *, public: bool = True, ttl: int = 600):
        with django_capture_on_commit_callbacks(execute=True):
            agent, _ = services.agent_register(
                actor=SYSTEM, agent_id=agent_id, card=card, ttl_seconds=ttl, public=public
            )
        return agent

    return apply


@pytest.fixture
def corpus(db, register) -> dict[str, Any]:
    """The thirty realistic agents of tests/ard/corpus.py, all public."""
    return {agent_id: register(agent_id, card) for agent_id, card in CARDS.items()}
