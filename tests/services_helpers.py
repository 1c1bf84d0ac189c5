"""Small helpers for tests that call services directly."""

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connection, transaction
from django.db.models import F

from registry.models import Agent, ApiClient
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


@contextmanager
def holding(take) -> Iterator:
    """Run ``take()`` in a transaction of another thread and hold what it locked until the
    block ends or the ``release()`` it yields is called."""
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        with transaction.atomic():
            take()
            locked.set()
            release.wait(30)
        connection.close()

    holder = threading.Thread(target=hold)
    holder.start()
    assert locked.wait(10)

    def done() -> None:
        release.set()
        holder.join()

    try:
        yield done
    finally:
        done()


def holding_row(agent_id: str):
    """Hold ``agent_id``'s row (PostgreSQL: its lock; SQLite: the write lock) from another
    thread (:func:`holding`): a node's batch writing that row waits meanwhile."""
    return holding(lambda: Agent.objects.filter(agent_id=agent_id).update(
        ttl_seconds=F("ttl_seconds")))
