"""Nodes: their liveness beat, and which live node owns a registration."""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from core import lifecycle as node_config
from registry.models import Agent, Node


def _node_dead_after() -> timedelta:
    """A node whose last heartbeat is older than this is taken for dead."""
    return timedelta(seconds=max(60.0, 6 * settings.A2A_NODE_HEARTBEAT_SECONDS))


#: node id -> when this process last wrote its heartbeat row (``node_heartbeat``): a node known
#: live from its own recent beat needs no query to own the registrations it serves.
_own_beats: dict[str, datetime] = {}


def _owning_node(*, agent_id: str, current: Agent | None) -> str:
    """The node whose virtual subscriber will serve a new or renewed registration.

    A registration arriving at a serving node belongs to that node (KubeMQ's rule). One made
    elsewhere -- a Celery worker running discovery, a management command -- goes to a live
    node: the agent's current one if it is alive, else one picked by the agent id's hash so
    agents spread over the cluster. With no live node known, this process's id.
    """
    this_node = node_config.node_id()
    if node_config.serving():
        # Answering this request proves it alive, even before its first heartbeat row lands
        # (right after a start, the rows could name only nodes that just died).
        return this_node
    since = timezone.now() - _node_dead_after()
    beat = _own_beats.get(this_node)
    if beat is not None and beat >= since:
        return this_node  # live by its own beat (the query below would list it): no query
    live = sorted(Node.objects.filter(last_heartbeat__gte=since).values_list("node_id", flat=True))
    if not live or this_node in live:
        return this_node
    if current is not None and current.node_id in live:
        return current.node_id
    return live[int(hashlib.sha256(agent_id.encode()).hexdigest(), 16) % len(live)]


def node_heartbeat(*, node_id: str, address: str = "") -> Node:
    now = timezone.now()
    node, _ = Node.objects.update_or_create(
        node_id=node_id, defaults={"last_heartbeat": now, "address": address}
    )
    if node_id == node_config.node_id():
        _own_beats[node_id] = now
    return node


def agents_move_off_node(*, node_id: str, to_nodes: list[str]) -> list[str]:
    """Move the active agents of ``node_id`` to ``to_nodes`` (adoption of a dead node's agents,
    or a clean handover by a node stopping), spread by the agent id's hash. Returns their ids.

    One transaction, race-free: the rows are locked with the condition ``node_id = <from>`` and
    updated under that lock, so when two survivors adopt the same dead node at once the second
    finds nothing left (PostgreSQL re-checks the condition on rows the first one changed). The
    routing marker moves, so every node's incremental resync sees the change, and an
    ``updated`` event per agent goes out once the transaction commits.
    """
    targets = sorted(set(to_nodes) - {node_id})
    if not targets:
        return []
    from registry import events
    from registry.selectors import agent_route

    now = timezone.now()
    moved: list[Agent] = []
    with transaction.atomic():
        agents = list(
            Agent.objects.select_for_update()
            .filter(node_id=node_id, status=Agent.Status.ACTIVE)
            .order_by("pk")
        )
        by_target: dict[str, list[int]] = {}
        for agent in agents:
            target = targets[int(hashlib.sha256(agent.agent_id.encode()).hexdigest(), 16)
                             % len(targets)]
            by_target.setdefault(target, []).append(agent.pk)
        for target, pks in by_target.items():
            for i in range(0, len(pks), 500):
                Agent.objects.filter(pk__in=pks[i : i + 500], node_id=node_id).update(
                    node_id=target, routing_changed_at=now
                )
        pks = [agent.pk for agent in agents]
        for i in range(0, len(pks), 500):
            moved.extend(Agent.objects.filter(pk__in=pks[i : i + 500]).select_related("owner"))
        for agent in moved:
            events.publish(events.AgentEvent(kind="updated", agent_id=agent.key,
                                             route=agent_route(agent)))
    return sorted(agent.key for agent in moved)
