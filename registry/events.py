"""The registry's one explicit event hook.

Services publish an :class:`AgentEvent` after their transaction commits; the gateway (routing
tables, subscriber manager, cluster replication) and discovery subscribe with :func:`subscribe`.
No Django signals: a reader finds every producer and consumer by searching for this module.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from django.db import transaction

from registry.ids import DEFAULT_TENANT

logger = logging.getLogger(__name__)

EventKind = Literal["registered", "updated", "deregistered", "expired"]


@dataclass(frozen=True, slots=True)  # slots: a node holds one per agent (no __dict__ each)
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
    http_json_endpoint: str = ""  # the agent's HTTP+JSON interface ("": it offers none)
    # docs/tenants.md: ``agent_id`` is the routing key (``tenant.agent_id`` outside the
    # default tenant); which other tenants' callers may reach it.
    tenant: str = DEFAULT_TENANT
    visibility: str = "private"  # private, public or shared (with ``shared_with``)
    shared_with: tuple[str, ...] = ()
    push_relay: bool | None = None  # callers' webhooks relayed (None: A2A_PUSH_RELAY)

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class AgentEvent:
    kind: EventKind
    agent_id: str
    route: AgentRoute | None = None  # set for registered/updated
    # The row as this process just committed it (registrations): in-process subscribers may
    # use it instead of reading it back. Never sent to other nodes (not in as_dict()).
    agent: Any = field(default=None, compare=False, repr=False)

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
            route=_route(route) if route else None,
        )


Subscriber = Callable[[AgentEvent], None]
_subscribers: list[Subscriber] = []
# A subscriber's handler of several events at once (registrations written together).
_many: dict[Subscriber, Callable[[list[AgentEvent]], None]] = {}


def subscribe(fn: Subscriber, *, many: Callable[[list[AgentEvent]], None] | None = None
              ) -> Callable[[], None]:
    """Call ``fn`` for every registry event in this process; returns an unsubscribe function.
    ``many``: called instead with the events :func:`publish_many` delivers together, when the
    subscriber does their work cheaper at once (the search index: one multi-row write)."""
    _subscribers.append(fn)
    if many is not None:
        _many[fn] = many

    def unsubscribe() -> None:
        if fn in _subscribers:
            _subscribers.remove(fn)
        _many.pop(fn, None)

    return unsubscribe


def dispatch(event: AgentEvent) -> None:
    """Deliver ``event`` to this process's subscribers now. A failing subscriber is logged."""
    for fn in list(_subscribers):
        _deliver(fn, event)


def _deliver(fn: Subscriber, event: AgentEvent) -> None:
    try:
        fn(event)
    except Exception:  # a subscriber's bug must not break a registration
        logger.exception("registry event subscriber %r failed on %s", fn, event.kind)


def publish(event: AgentEvent) -> None:
    """Deliver ``event`` once the current transaction commits (at once outside one)."""
    transaction.on_commit(lambda: dispatch(event))


def dispatch_many(events: list[AgentEvent]) -> None:
    """Deliver ``events`` in order: to a subscriber with a ``many`` handler all at once, to
    the others one by one. A failing subscriber is logged."""
    for fn in list(_subscribers):
        many = _many.get(fn)
        if many is None:
            for event in events:
                _deliver(fn, event)
            continue
        try:
            many(events)
        except Exception:
            logger.exception("registry event subscriber %r failed on %d events", many,
                             len(events))


def publish_many(events: list[AgentEvent]) -> None:
    """:func:`publish` for events of one transaction that subscribers may take together."""
    if events:
        transaction.on_commit(lambda: dispatch_many(events))


# --- the audit hook: who changed what in the registry (the console keeps the log) ------------


@dataclass(frozen=True)
class AuditRecord:
    """A registry change and its actor: ``agent.registered``, ``agent.card_changed``,
    ``agent.updated``, ``agent.deregistered``, ``client.created``, ``client.rotated``,
    ``client.revoked``. ``agent_id`` is the agent's routing key (``registry.ids.agent_key``);
    ``tenant`` the tenant the change happened in."""

    action: str
    actor: str
    agent_id: str = ""
    tenant: str = DEFAULT_TENANT
    client_id: str = ""
    details: dict = field(default_factory=dict)
    at: float = field(default_factory=time.time)


_audit_subscribers: list[Callable[[AuditRecord], None]] = []


def subscribe_audit(fn: Callable[[AuditRecord], None]) -> None:
    """Call ``fn`` with every audit record of this process (once per function)."""
    if fn not in _audit_subscribers:
        _audit_subscribers.append(fn)


def audit(record: AuditRecord) -> None:
    """Hand ``record`` to the audit subscribers once the current transaction commits."""
    if not _audit_subscribers:
        return

    def deliver() -> None:
        for fn in list(_audit_subscribers):
            try:
                fn(record)
            except Exception:
                logger.exception("registry audit subscriber %r failed", fn)

    transaction.on_commit(deliver)


def _route(data: dict) -> AgentRoute:
    """An :class:`AgentRoute` from its :meth:`AgentRoute.as_dict` (JSON gives lists)."""
    shared = data.get("shared_with")
    if shared is not None and not isinstance(shared, tuple):
        data = {**data, "shared_with": tuple(shared)}
    return AgentRoute(**data)
