"""Push relay fixtures: the gateway fixtures (SDK agents registered on the live platform,
callers), a caller's webhook server for the module, and settings that keep retries short."""

from __future__ import annotations

import pytest

from tests import a2a_agents
from tests.gateway.conftest import (  # noqa: F401
    caller,
    make_caller,
    other_caller,
    register_agent,
)
from tests.push.webhooks import Webhook

echo_agent_factory = a2a_agents.echo_agent_factory


@pytest.fixture(scope="module")
def webhook():
    hook = Webhook().start()
    yield hook
    hook.stop()


@pytest.fixture(autouse=True)
def push_settings(settings):
    """Relay on, delivered in the node's threads, short backoffs and deadlines."""
    settings.A2A_PUSH_RELAY = True
    settings.A2A_PUSH_DELIVERY = "inprocess"
    settings.A2A_PUSH_SWEEP_SECONDS = 0.05
    settings.A2A_PUSH_BACKOFF_SECONDS = 0.05
    settings.A2A_PUSH_BACKOFF_MAX_SECONDS = 0.2
    settings.A2A_PUSH_TIMEOUT_SECONDS = 1.0
    settings.A2A_PUSH_MAX_ATTEMPTS = 4
    return settings
