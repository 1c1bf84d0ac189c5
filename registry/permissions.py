"""Who may do what: the authenticated caller (an :class:`Actor`) and scope checks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from django.conf import settings

from registry.ids import DEFAULT_TENANT, TENANT_SEPARATOR, agent_key, split_agent_key

SCOPE_REGISTER = "register"
SCOPE_CALL = "call"
SCOPE_ADMIN = "admin"
ALL_SCOPES = (SCOPE_REGISTER, SCOPE_CALL, SCOPE_ADMIN)
ANONYMOUS_ID = "anonymous"


class PermissionDenied(Exception):
    """The actor is authenticated but may not do this."""


PUBLIC = "public"
SHARED = "shared"


class Reachable(Protocol):
    """What says which tenants may reach an agent (a routing table's ``AgentRoute``)."""

    @property
    def tenant(self) -> str: ...

    @property
    def visibility(self) -> str: ...

    @property
    def shared_with(self) -> tuple[str, ...]: ...


@dataclass(frozen=True)
class Actor:
    """An authenticated caller: an API client, a staff user, a system job or anonymous."""

    client_id: str
    scopes: frozenset[str]
    allowed_agents: frozenset[str] = frozenset()  # empty: any agent
    api_client_pk: str | None = None
    is_anonymous: bool = False
    #: A caller authenticated by a trusted JWT issuer (registry.identity), not an API key.
    external: bool = False
    #: The caller's tenant (docs/tenants.md): its API client's, or the one a JWT's tenant
    #: claim names. It sees, calls and manages its tenant's agents and the ones published to it.
    tenant: str = DEFAULT_TENANT
    #: ``allowed_agents`` as routing keys (an entry without a tenant is one of its own tenant's).
    allowed_keys: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "allowed_keys", frozenset(
            name if TENANT_SEPARATOR in name else agent_key(self.tenant, name)
            for name in self.allowed_agents))

    @property
    def is_authenticated(self) -> bool:  # DRF reads this on request.user
        return True

    @property
    def is_admin(self) -> bool:
        return SCOPE_ADMIN in self.scopes

    @property
    def is_platform_admin(self) -> bool:
        """An admin of the default tenant: admin of every tenant (docs/tenants.md). An admin
        of another tenant is admin of its own tenant only."""
        return SCOPE_ADMIN in self.scopes and self.tenant == DEFAULT_TENANT

    def has_scope(self, scope: str) -> bool:
        return self.is_admin or scope in self.scopes

    def may_touch(self, key: str) -> bool:
        """Whether the agent (its routing key) is within this actor's allowed list."""
        return self.is_admin or not self.allowed_agents or key in self.allowed_keys

    def locate(self, name: str) -> tuple[str, str]:
        """``(tenant, agent_id)`` of an agent named by a caller: a bare id is one of its own
        tenant's, a qualified id (``{tenant}.{agent_id}``) names its tenant."""
        if TENANT_SEPARATOR in name:
            return split_agent_key(name)
        return self.tenant, name

    def in_tenant(self, tenant: str) -> bool:
        """Whether this actor may manage what belongs to ``tenant``: its own tenant's, or any
        tenant's for a platform admin."""
        return tenant == self.tenant or self.is_platform_admin

    def reaches(self, route: Reachable) -> bool:
        """Whether the agent is in this actor's reach: its tenant's, published to every tenant
        or shared with this actor's (a platform admin reaches every agent)."""
        tenant = route.tenant
        if tenant == self.tenant:
            return True
        visibility = route.visibility
        return (visibility == PUBLIC or self.is_platform_admin
                or (visibility == SHARED and self.tenant in route.shared_with))

    def allows_call(self, key: str) -> bool:
        """The scopes and the allowed list of :meth:`may_call`, without the tenant reach."""
        scopes = self.scopes
        return SCOPE_ADMIN in scopes or (SCOPE_CALL in scopes and (
            not self.allowed_agents or key in self.allowed_keys))

    def may_call(self, key: str, route: Reachable | None = None) -> bool:
        """``has_scope(SCOPE_CALL) and may_touch(key)`` and the agent within reach (``route``;
        without one, only its own tenant's agents), inlined: the gateway asks it on every
        call."""
        scopes = self.scopes
        if SCOPE_ADMIN not in scopes and (
                SCOPE_CALL not in scopes
                or (self.allowed_agents and key not in self.allowed_keys)):
            return False
        if route is not None:
            return route.tenant == self.tenant or self.reaches(route)
        return split_agent_key(key)[0] == self.tenant or self.is_platform_admin


SYSTEM = Actor(client_id="system", scopes=frozenset({SCOPE_ADMIN}))


def anonymous_actor() -> Actor | None:
    """The anonymous actor when anonymous access is on, else None."""
    if not settings.A2A_ALLOW_ANONYMOUS:
        return None
    return Actor(
        client_id=ANONYMOUS_ID, scopes=frozenset({SCOPE_REGISTER, SCOPE_CALL}), is_anonymous=True
    )


def staff_actor(username: str) -> Actor:
    """A staff user of the admin: a platform admin (default tenant)."""
    return Actor(client_id=f"staff:{username}", scopes=frozenset({SCOPE_ADMIN}))
