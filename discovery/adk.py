"""Adapter from a discovery tree to google-adk ``RemoteA2aAgent`` objects (optional extra).

google-adk (2.x, pinned in requirements/extras.txt) speaks the a2a-sdk 1.x types. It is large and
optional: it is imported only when :func:`build_remote_agents` runs.
Each remote agent gets the reviewed local name and description and the cached, gateway-rewritten
card, so constructing it makes no network call (the seed's "build-time fetch" failure mode).
"""

from __future__ import annotations

import copy
from typing import Any

from discovery.tree_factory import AgentTree


class AdkNotInstalled(RuntimeError):
    pass


def agent_card(card: dict[str, Any]) -> Any:
    """The a2a-sdk 1.x ``AgentCard`` (protobuf) that google-adk 2.x takes, from a cached card.

    a2a-sdk's own card parser: it reads both card generations, mapping an A2A 0.3 card's
    ``url``/``preferredTransport``/``additionalInterfaces`` onto ``supportedInterfaces``
    (the gateway URLs, already rewritten). It edits its argument, so it gets a deep copy.
    """
    from a2a.client.card_resolver import parse_agent_card

    return parse_agent_card(copy.deepcopy(card))


def build_remote_agents(tree: AgentTree) -> list[Any]:
    """One ``RemoteA2aAgent`` per agent of ``tree``; raises :class:`AdkNotInstalled`."""
    try:
        from google.adk.agents.remote_a2a_agent import RemoteA2aAgent
    except ImportError as exc:
        raise AdkNotInstalled("google-adk is not installed (pip install google-adk)") from exc
    return [
        RemoteA2aAgent(
            name=spec.local_name, description=spec.description,
            agent_card=agent_card(spec.card),
        )
        for spec in tree.agents
    ]
