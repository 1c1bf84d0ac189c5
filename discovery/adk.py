"""Adapter from a discovery tree to google-adk ``RemoteA2aAgent`` objects (optional extra).

google-adk is large and optional: it is imported only when :func:`build_remote_agents` runs.
Each remote agent gets the reviewed local name and description and the cached, gateway-rewritten
card, so constructing it makes no network call (the seed's "build-time fetch" failure mode).
"""

from __future__ import annotations

from typing import Any

from discovery.tree_factory import AgentTree


class AdkNotInstalled(RuntimeError):
    pass


def _agent_card(card: dict[str, Any]) -> Any:
    try:  # google-adk speaks the A2A 0.3 pydantic types
        from a2a.types import AgentCard

        if hasattr(AgentCard, "model_validate"):
            return AgentCard.model_validate(card)
    except ImportError:
        pass
    from a2a.compat.v0_3.types import AgentCard as AgentCard03

    return AgentCard03.model_validate(card)


def build_remote_agents(tree: AgentTree) -> list[Any]:
    """One ``RemoteA2aAgent`` per agent of ``tree``; raises :class:`AdkNotInstalled`."""
    try:
        from google.adk.agents.remote_a2a_agent import RemoteA2aAgent
    except ImportError as exc:
        raise AdkNotInstalled("google-adk is not installed (pip install google-adk)") from exc
    return [
        RemoteA2aAgent(
            name=spec.local_name, description=spec.description,
            agent_card=_agent_card(spec.card),
        )
        for spec in tree.agents
    ]
