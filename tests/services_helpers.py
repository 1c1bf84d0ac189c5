"""Small helpers for tests that call services directly."""

from registry.models import ApiClient
from registry.permissions import Actor


def actor_of(client: ApiClient) -> Actor:
    return Actor(
        client_id=client.client_id, scopes=frozenset(client.scopes),
        allowed_agents=frozenset(client.allowed_agents), api_client_pk=client.pk,
    )
