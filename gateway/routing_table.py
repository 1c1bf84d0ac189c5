"""The node's in-memory routing table: agent id -> route (endpoint, owning node, cap, owner).

Loaded at node start from ``registry.selectors.agent_routes``, kept current by registry events
(this process's and, in distributed mode, other nodes' via the discovery group) and re-synced
from the database periodically as a safety net. The hot path only reads a dict.
"""

from __future__ import annotations

import time

from gateway.conf import NodeSettings
from registry.events import AgentEvent, AgentRoute

#: How many recently expired agent ids the table remembers (to say "expired", not "not found").
MAX_EXPIRED_REMEMBERED = 10_000


class RoutingTable:
    def __init__(self, settings: NodeSettings) -> None:
        self.settings = settings
        self._routes: dict[str, AgentRoute] = {}
        self._expired: dict[str, float] = {}  # agent id -> when it expired (insertion order)
        # Agents an event touched since the last resync began: the resync's (older) database
        # read must not undo them.
        self._touched: set[str] = set()

    def __len__(self) -> int:
        return len(self._routes)

    def __contains__(self, agent_id: str) -> bool:
        return agent_id in self._routes

    def routes(self) -> list[AgentRoute]:
        return list(self._routes.values())

    def get(self, agent_id: str) -> AgentRoute | None:
        """The route of a routable agent, or None (unknown, deregistered or expired).

        Heartbeats renew leases without a broadcast, so a route's ``expires_at`` may lag the
        database by up to one resync; an agent counts as expired here only once it is past its
        lease by more than that lag (the expiry job's event usually removes it sooner).
        """
        route = self._routes.get(agent_id)
        if route is None:
            return None
        if route.expires_at + self._grace() < time.time():
            return None
        return route

    def apply(self, event: AgentEvent) -> AgentRoute | None:
        """Apply a registry event; returns the agent's previous route."""
        self._touched.add(event.agent_id)
        previous = self._routes.get(event.agent_id)
        if event.kind in ("registered", "updated") and event.route is not None:
            self._routes[event.agent_id] = event.route
        elif event.kind in ("deregistered", "expired"):
            self._routes.pop(event.agent_id, None)
        self._expired.pop(event.agent_id, None)
        if event.kind == "expired":
            # An agent of a dead node expires before its lease ends: then "now".
            when = min(previous.expires_at, time.time()) if previous else time.time()
            if len(self._expired) >= MAX_EXPIRED_REMEMBERED:
                del self._expired[next(iter(self._expired))]
            self._expired[event.agent_id] = when
        return previous

    def expired_at(self, agent_id: str) -> float | None:
        """When a recently expired agent's lease ended (epoch seconds), else None."""
        when = self._expired.get(agent_id)
        if when is None:
            route = self._routes.get(agent_id)
            if route is not None and route.expires_at + self._grace() < time.time():
                when = route.expires_at
        return when

    def begin_resync(self) -> None:
        self._touched = set()

    def finish_resync(self, routes: list[AgentRoute]) -> None:
        """Replace the table with a database read begun at :meth:`begin_resync`, keeping what
        events changed meanwhile."""
        fresh = {route.agent_id: route for route in routes}
        for agent_id in self._touched:
            fresh.pop(agent_id, None)
            if agent_id in self._routes:
                fresh[agent_id] = self._routes[agent_id]
        self._routes = fresh
        self._touched = set()

    def _grace(self) -> float:
        settings = self.settings
        return settings.A2A_ROUTING_RESYNC_SECONDS + settings.A2A_EXPIRY_INTERVAL_SECONDS
