"""The node's in-memory routing table: agent id -> route (endpoint, owning node, cap, owner).

Loaded at node start from ``registry.selectors.agent_routes``, kept current by registry events
(this process's and, in distributed mode, other nodes' via the discovery group) and re-synced
from the database as a safety net: incrementally (``registry.selectors.agent_route_changes``,
the rows changed since the last read) every ``A2A_ROUTING_RESYNC_SECONDS``, fully every
``A2A_ROUTING_FULL_RESYNC_SECONDS``. The hot path only reads a dict.

Routing needs no lease clock of its own: heartbeats renew leases without a broadcast and without
moving the routing marker, so a route's ``expires_at`` is the lease as of its last routing
change, not the current one. An agent leaves the table through its ``expired`` or
``deregistered`` event, or at the next incremental resync, which also drops active agents whose
lease lapsed before the expiry job marked them.

**Watchers** (:meth:`RoutingTable.watch`) hear which agents' routes appeared, changed or went
away, whichever way the change arrived (an event, an incremental or a full resync): the MCP
bridge's change notifications (``mcp_bridge.notify``). A full resync compares the tables only
while someone watches.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from gateway.conf import NodeSettings
from registry.events import AgentEvent, AgentRoute

logger = logging.getLogger(__name__)

#: A watcher: called on the node's loop with the ids whose route appeared, changed or went away.
Watcher = Callable[[set[str]], None]

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
        self._watchers: list[Watcher] = []

    def watch(self, watcher: Watcher) -> Callable[[], None]:
        """Call ``watcher`` with the agent ids whose route appeared, changed (routing fields,
        card, or who may reach it) or went away, after each change; returns the function that
        stops it."""
        self._watchers.append(watcher)

        def unwatch() -> None:
            if watcher in self._watchers:
                self._watchers.remove(watcher)

        return unwatch

    def _changed(self, agent_ids: set[str]) -> None:
        for watcher in list(self._watchers):
            try:
                watcher(agent_ids)
            except Exception:  # a watcher's bug must not break routing
                logger.exception("routing table watcher %r failed", watcher)

    def __len__(self) -> int:
        return len(self._routes)

    def __contains__(self, agent_id: str) -> bool:
        return agent_id in self._routes

    def routes(self) -> list[AgentRoute]:
        return list(self._routes.values())

    def get(self, agent_id: str) -> AgentRoute | None:
        """The route of a routable agent, or None (unknown, deregistered or expired)."""
        return self._routes.get(agent_id)

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
            self._remember_expired(event.agent_id, when)
        if self._watchers:
            current = self._routes.get(event.agent_id)
            if (previous is None) != (current is None) or (
                    previous is not None and current is not None
                    and not _same_routing(previous, current, reach=True)):
                self._changed({event.agent_id})
        return previous

    def _remember_expired(self, agent_id: str, when: float) -> None:
        if len(self._expired) >= MAX_EXPIRED_REMEMBERED:
            del self._expired[next(iter(self._expired))]
        self._expired[agent_id] = when

    def expired_at(self, agent_id: str) -> float | None:
        """When a recently expired agent's lease ended (epoch seconds), else None."""
        return self._expired.get(agent_id)

    def begin_resync(self) -> None:
        self._touched = set()

    def finish_resync(self, routes: Iterable[AgentRoute] | dict[str, AgentRoute]) -> None:
        """Replace the table with a database read begun at :meth:`begin_resync`, keeping what
        events changed meanwhile. ``routes`` may be the new table already (agent id -> route),
        built off the event loop; it is then used as is."""
        fresh = routes if isinstance(routes, dict) else {r.agent_id: r for r in routes}
        for agent_id in self._touched:
            fresh.pop(agent_id, None)
            if agent_id in self._routes:
                fresh[agent_id] = self._routes[agent_id]
        old, self._routes = self._routes, fresh
        self._touched = set()
        if self._watchers:
            changed = {agent_id for agent_id, route in fresh.items()
                       if (before := old.get(agent_id)) is None
                       or not _same_routing(before, route, reach=True)}
            changed.update(agent_id for agent_id in old if agent_id not in fresh)
            if changed:
                self._changed(changed)

    def finish_incremental(self, routes: Iterable[AgentRoute], gone: Iterable[str]) -> set[str]:
        """Apply an incremental database read begun at :meth:`begin_resync` (changed routes to
        add or replace, ids to remove), skipping agents events changed meanwhile. Returns the
        ids whose route changed, for the subscriber manager; the work is proportional to the
        changes, never to the table."""
        touched = self._touched
        table = self._routes
        changed: set[str] = set()
        reach: set[str] = set()  # only who may reach it changed: news to watchers only
        for route in routes:
            agent_id = route.agent_id
            if agent_id in touched:
                continue
            previous = table.get(agent_id)
            table[agent_id] = route
            if previous is None or not _same_routing(previous, route):
                changed.add(agent_id)
            elif not _same_routing(previous, route, reach=True):
                reach.add(agent_id)
        now = time.time()
        for agent_id in gone:
            if agent_id in touched:
                continue
            previous = table.pop(agent_id, None)
            if previous is not None:
                changed.add(agent_id)
                if previous.expires_at <= now:  # a lapsed lease whose event was lost
                    self._remember_expired(agent_id, previous.expires_at)
        self._touched = set()
        if (changed or reach) and self._watchers:
            self._changed(changed | reach)
        return changed


def _same_routing(a: AgentRoute, b: AgentRoute, *, reach: bool = False) -> bool:
    """Whether two routes route alike: ``expires_at`` aside (heartbeats move it, routing does
    not read it), so re-reading a row a heartbeat renewed changes no subscriber. ``reach``:
    and the same tenants may reach them (visibility, ``shared_with``: news to the watchers,
    e.g. MCP's change notifications, not to the subscribers)."""
    if reach and (a.visibility != b.visibility or a.shared_with != b.shared_with):
        return False
    return (
        a.endpoint == b.endpoint
        and a.node_id == b.node_id
        and a.max_concurrency == b.max_concurrency
        and a.owner_client_id == b.owner_client_id
        and a.card_sha256 == b.card_sha256
        and a.credential_passthrough == b.credential_passthrough
        and a.push_relay == b.push_relay
    )
