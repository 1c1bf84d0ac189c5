"""The registry's one explicit event hook.

Services publish an :class:`AgentEvent` after their transaction commits; the gateway (routing
tables, subscriber manager, cluster replication) and discovery subscribe with :func:`subscribe`.
No Django signals: a reader finds every producer and consumer by searching for this module.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Literal

from django.db import transaction

logger = logging.getLogger(__name__)

EventKind = Literal["registered", "updated", "deregistered", "expired"]


@dataclass(frozen=True)
class AgentRoute:
    """What a node needs in memory to route calls to an agent (no database on the hot path)."""

    agent_id: str
    endpoint: str
    node_id: str
    max_concurrency: int
    expires_at: float  # POSIX seconds
    owner_client_id: str | None
    card_sha256: str
    credential_passthrough: bool = False  # the caller's Authorization goes to the agent

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class AgentEvent:
    kind: EventKind
    agent_id: str
    route: AgentRoute | None = None  # set for registered/updated

    def as_dict(self) -> dict:
        return {
            "kind": self.kind,
            "agent_id": self.agent_id,
            "route": self.route.as_dict() if self.route else None,
        }

    @classmethod
    def from_dict(cls, data: dict) -> AgentEvent:
        route = data.get("route")
        return cls(
            kind=data["kind"], agent_id=data["agent_id"],
            route=AgentRoute(**route) if route else None,
        )


Subscriber = Callable[[AgentEvent], None]
_subscribers: list[Subscriber] = []


def subscribe(fn: Subscriber) -> Callable[[], None]:
    """Call ``fn`` for every registry event in this process; returns an unsubscribe function."""
    _subscribers.append(fn)

    def unsubscribe() -> None:
        if fn in _subscribers:
            _subscribers.remove(fn)

    return unsubscribe


def dispatch(event: AgentEvent) -> None:
    """Deliver ``event`` to this process's subscribers now. A failing subscriber is logged."""
    for fn in list(_subscribers):
        try:
            fn(event)
        except Exception:  # a subscriber's bug must not break a registration
            logger.exception("registry event subscriber %r failed on %s", fn, event.kind)


def publish(event: AgentEvent) -> None:
    """Deliver ``event`` once the current transaction commits (at once outside one)."""
    transaction.on_commit(lambda: dispatch(event))
