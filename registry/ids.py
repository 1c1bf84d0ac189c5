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


# --- tenants (docs/tenants.md) ------------------------------------------------------------

#: The tenant every agent, client and record belongs to unless given another: today's flat
#: namespace. Its agents keep their bare ids everywhere (``/a2a/{agent_id}``, routing keys).
DEFAULT_TENANT = "default"
TENANT_RE = re.compile(r"^[a-z0-9][a-z0-9-]{1,39}\Z")
TENANT_RULE = (
    "2 to 40 characters of lowercase letters, digits and hyphens, starting with a letter or digit"
)
#: Between a tenant and an agent id in a qualified agent id (``acme.echo``): neither an agent
#: id nor a tenant slug may contain it, so a qualified id never equals a bare one.
TENANT_SEPARATOR = "."
#: A routing key: a default-tenant agent's bare id, or ``{tenant}.{agent_id}``.
AGENT_KEY_RE = re.compile(r"^(?:[a-z0-9][a-z0-9-]{1,39}\.)?[a-z0-9][a-z0-9-]{1,62}\Z")


def tenant_error(tenant: object) -> str | None:
    """Why ``tenant`` is not an acceptable tenant slug, or None when it is."""
    if not isinstance(tenant, str) or not TENANT_RE.match(tenant):
        shown = tenant[:80] if isinstance(tenant, str) else tenant
        return f"invalid tenant {shown!r}: {TENANT_RULE}"
    return None


def agent_name_error(name: object) -> str | None:
    """:func:`agent_id_error` for an id a caller names: a bare id, or a qualified one
    (``{tenant}.{agent_id}``: another tenant's agent)."""
    if isinstance(name, str) and TENANT_SEPARATOR in name and not is_reserved_channel(name):
        tenant, _, agent_id = name.partition(TENANT_SEPARATOR)
        return tenant_error(tenant) or agent_id_error(agent_id)
    return agent_id_error(name)


def agent_key(tenant: str, agent_id: str) -> str:
    """The agent's routing key, unique across tenants: the bare id in the default tenant (so
    everything keyed by agent id before tenants existed keeps its key), else
    ``{tenant}.{agent_id}``. Routing tables, channel names, Redis keys, statistics and registry
    events are keyed by it."""
    if not tenant or tenant == DEFAULT_TENANT:
        return agent_id
    return f"{tenant}{TENANT_SEPARATOR}{agent_id}"


def split_agent_key(key: str) -> tuple[str, str]:
    """``(tenant, agent_id)`` of a routing key (a bare id: the default tenant)."""
    tenant, sep, agent_id = key.partition(TENANT_SEPARATOR)
    if not sep:
        return DEFAULT_TENANT, key
    return tenant, agent_id


def is_valid_agent_key(key: object) -> bool:
    return isinstance(key, str) and AGENT_KEY_RE.match(key) is not None


#: The gateway path of a non-default tenant's agent: ``/a2a/t/{tenant}/{agent_id}/...``
#: (docs/adr/0012-tenant-addressing.md). ``t`` can never be an agent id (at least 2
#: characters), so the form cannot shadow an agent of the default tenant.
TENANT_PATH_MARK = "t"


def gateway_path(key: str) -> str:
    """The gateway base path of the agent a routing key names, with its trailing slash:
    ``/a2a/{agent_id}/`` in the default tenant, ``/a2a/t/{tenant}/{agent_id}/`` in another."""
    tenant, agent_id = split_agent_key(key)
    if tenant == DEFAULT_TENANT:
        return f"/a2a/{agent_id}/"
    return f"/a2a/{TENANT_PATH_MARK}/{tenant}/{agent_id}/"


def key_of_gateway_path(path: str) -> str:
    """The routing key of a gateway base path or URL path (``/a2a/echo/``,
    ``/a2a/t/acme/echo/``): the inverse of :func:`gateway_path`."""
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 4 and parts[-4] == "a2a" and parts[-3] == TENANT_PATH_MARK:
        return agent_key(parts[-2], parts[-1])
    return parts[-1] if parts else ""
