"""Agent ids and reserved channel names (the KubeMQ A2A rules)."""

from __future__ import annotations

import re

RESERVED_PREFIX = "_AGENTS_."
AGENT_ID_RE = re.compile(r"^[a-z0-9][a-z0-9-]{1,62}\Z")
AGENT_ID_RULE = (
    "2 to 63 characters of lowercase letters, digits and hyphens, starting with a letter or digit"
)


def is_reserved_channel(name: str) -> bool:
    """True when a name supplied from outside claims the platform's internal prefix."""
    return isinstance(name, str) and name.startswith(RESERVED_PREFIX)


def agent_id_error(agent_id: object) -> str | None:
    """Why ``agent_id`` is not acceptable, or None when it is."""
    if not isinstance(agent_id, str):
        return "agent_id must be a string"
    if is_reserved_channel(agent_id):
        return f"agent_id must not start with the reserved prefix {RESERVED_PREFIX}"
    if not AGENT_ID_RE.match(agent_id):
        return f"invalid agent_id {agent_id[:80]!r}: {AGENT_ID_RULE}"
    return None


def is_valid_agent_id(agent_id: object) -> bool:
    return agent_id_error(agent_id) is None


def agent_channel(agent_id: str) -> str:
    """The internal Channels name of an agent's virtual subscriber."""
    return f"{RESERVED_PREFIX}{agent_id}"


DISCOVERY_GROUP = f"{RESERVED_PREFIX}discovery"
