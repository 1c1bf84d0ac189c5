"""Small helpers for tests that call services directly."""

import time

from registry.models import ApiClient
from registry.permissions import Actor


def actor_of(client: ApiClient) -> Actor:
    return Actor(
        client_id=client.client_id, scopes=frozenset(client.scopes),
        allowed_agents=frozenset(client.allowed_agents), api_client_pk=client.pk,
    )


def eventually(check, seconds: float = 5.0) -> bool:
    """Whether ``check()`` came true within ``seconds`` (polled every 20 ms)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return False
