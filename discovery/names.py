"""Local names: the identifiers agents carry in trees and snapshots (never ``card.name``).

A local name is a Python/ADK identifier of 2 to 63 characters; the agent id the registry and the
gateway use is derived from it (lowercase, ``_`` → ``-``: ``billing_agent`` → ``billing-agent``).
"""

from __future__ import annotations

import re

from registry.ids import agent_id_error

LOCAL_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{1,62}\Z")


def local_name_error(name: object) -> str | None:
    """Why ``name`` cannot be a local name, or None."""
    if not isinstance(name, str) or not LOCAL_NAME_RE.match(name):
        return (
            f"invalid local name {str(name)[:80]!r}: 2 to 63 letters, digits and underscores, "
            "not starting with a digit"
        )
    if agent_id_error(agent_id_for(name)):
        return f"local name {name!r} does not give a valid agent id ({agent_id_for(name)!r})"
    return None


def agent_id_for(local_name: str) -> str:
    """The registry agent id of a local name: lowercase, ``_`` → ``-``."""
    return local_name.lower().replace("_", "-")


def derive_local_name(text: str) -> str:
    """A valid local name made from a source record (service name, agent id)."""
    name = re.sub(r"[^A-Za-z0-9_]+", "_", text).strip("_").lower()
    name = re.sub(r"_+", "_", name)
    if not name or name[0].isdigit():
        name = f"agent_{name}".rstrip("_")
    if len(name) < 2:
        name = f"{name}_agent"
    return name[:63].rstrip("_")
