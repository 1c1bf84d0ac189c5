"""Registry writes. Views, consumers and tasks call these and stay thin.

Every public function is keyword-only and typed, raises :class:`RegistryError` subclasses with
messages fit for an API client, and publishes registry events after commit. One module per
concern -- ``agents`` (register, update, deregister), ``leases`` (heartbeats, renewals,
expiry), ``cards`` (resolving and recording a registration's card), ``clients`` (API clients),
``nodes`` (liveness, ownership), ``tenants`` -- all importable from here.
"""

from registry.services.agents import (
    Registration,
    agent_deregister,
    agent_register,
    agent_update,
    agents_register,
    register_one,
    registration,
)
from registry.services.clients import api_client_create, api_client_update
from registry.services.errors import (
    AgentNotFound,
    InvalidInput,
    RegistrationConflict,
    RegistryError,
)
from registry.services.leases import (
    HeartbeatResult,
    agent_heartbeat,
    agents_expire,
    agents_extend_ttl,
    agents_heartbeat,
    agents_renew_leases,
)
from registry.services.nodes import agents_move_off_node, node_heartbeat
from registry.services.tenants import agent_move_tenant, tenant_create

__all__ = [
    "agent_move_tenant",
    "tenant_create",
    "AgentNotFound",
    "HeartbeatResult",
    "InvalidInput",
    "RegistrationConflict",
    "Registration",
    "RegistryError",
    "agent_deregister",
    "agent_heartbeat",
    "agents_heartbeat",
    "agent_register",
    "agent_update",
    "agents_register",
    "register_one",
    "registration",
    "agents_expire",
    "agents_extend_ttl",
    "agents_renew_leases",
    "api_client_create",
    "api_client_update",
    "agents_move_off_node",
    "node_heartbeat",
]
