"""The tree factory: builds, once per digest, the set of remote agents a session's tree holds.

Everything comes from the snapshot and the card bytes it retained: reviewed local names and
descriptions, and the cached card with every endpoint URL rewritten to the gateway
(``<base>/a2a/{agent_id}/``; ``<base>/a2a/t/{tenant}/{agent_id}/`` for a snapshot of another
tenant than the default), so a tree calls through the gateway's auth, limits and metrics
and building it makes no network call. :mod:`discovery.adk` turns a tree into google-adk
``RemoteA2aAgent`` objects when that package is installed.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from discovery.models import CardBlob, Snapshot
from registry.bindings import rewrite_card_endpoints
from registry.ids import DEFAULT_TENANT, agent_key, gateway_path


@dataclass(frozen=True)
class RemoteAgentSpec:
    local_name: str
    description: str
    agent_id: str
    gateway_url: str
    card: dict[str, Any]


@dataclass(frozen=True)
class AgentTree:
    digest: str
    version: int
    agents: tuple[RemoteAgentSpec, ...]


_trees: dict[tuple[str, str, str], AgentTree] = {}  # (digest, tenant, base URL) -> tree
_lock = threading.Lock()
stats = {"builds": 0}


def public_base_url(request: Any = None) -> str:
    """``settings.A2A_PUBLIC_BASE_URL``, else the request's scheme and host."""
    if settings.A2A_PUBLIC_BASE_URL:
        return settings.A2A_PUBLIC_BASE_URL.rstrip("/")
    if request is not None:
        return request.build_absolute_uri("/").rstrip("/")
    return ""


def gateway_url(base_url: str, agent_id: str, tenant: str = DEFAULT_TENANT) -> str:
    return f"{base_url.rstrip('/')}{gateway_path(agent_key(tenant, agent_id))}"


def _build(snapshot: Snapshot, base_url: str) -> AgentTree:
    shas = [a["card_sha256"] for a in snapshot.agents]
    cards = dict(CardBlob.objects.filter(sha256__in=shas).values_list("sha256", "card"))
    agents = []
    for row in snapshot.agents:
        url = gateway_url(base_url, row["agent_id"], str(snapshot.tenant_id))
        card = cards.get(row["card_sha256"]) or {}
        agents.append(RemoteAgentSpec(
            local_name=row["local_name"], description=row["description"],
            agent_id=row["agent_id"], gateway_url=url,
            card=rewrite_card_endpoints(card, url),
        ))
    stats["builds"] += 1
    return AgentTree(digest=snapshot.digest, version=snapshot.version, agents=tuple(agents))


def tree_for(snapshot: Snapshot, *, base_url: str) -> AgentTree:
    """The tree of ``snapshot`` (built on first use per digest and base URL, then cached)."""
    key = (snapshot.digest, str(snapshot.tenant_id), base_url)
    tree = _trees.get(key)
    if tree is None:
        with _lock:
            tree = _trees.get(key)
            if tree is None:
                tree = _trees[key] = _build(snapshot, base_url)
    return tree


def forget(digests: Iterable[str]) -> None:
    """Drop cached trees of evicted snapshots."""
    gone = set(digests)
    with _lock:
        for key in [k for k in _trees if k[0] in gone]:
            del _trees[key]


def cached_digests() -> set[str]:
    return {k[0] for k in _trees}
