"""Who may do what: the authenticated caller (an :class:`Actor`) and scope checks."""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings

SCOPE_REGISTER = "register"
SCOPE_CALL = "call"
SCOPE_ADMIN = "admin"
ALL_SCOPES = (SCOPE_REGISTER, SCOPE_CALL, SCOPE_ADMIN)
ANONYMOUS_ID = "anonymous"


class PermissionDenied(Exception):
    """The actor is authenticated but may not do this."""


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
    #: The tenant a JWT's tenant claim names (recorded; tenants are not enforced yet).
    tenant: str = ""

    @property
    def is_authenticated(self) -> bool:  # DRF reads this on request.user
        return True

    @property
    def is_admin(self) -> bool:
        return SCOPE_ADMIN in self.scopes

    def has_scope(self, scope: str) -> bool:
        return self.is_admin or scope in self.scopes

    def may_touch(self, agent_id: str) -> bool:
        """Whether the agent id is within this actor's allowed list."""
        return self.is_admin or not self.allowed_agents or agent_id in self.allowed_agents

    def may_call(self, agent_id: str) -> bool:
        """``has_scope(SCOPE_CALL) and may_touch(agent_id)``, inlined: the gateway asks it on
        every call."""
        scopes = self.scopes
        if SCOPE_ADMIN in scopes:
            return True
        return SCOPE_CALL in scopes and (not self.allowed_agents
                                         or agent_id in self.allowed_agents)


SYSTEM = Actor(client_id="system", scopes=frozenset({SCOPE_ADMIN}))


def anonymous_actor() -> Actor | None:
    """The anonymous actor when anonymous access is on, else None."""
    if not settings.A2A_ALLOW_ANONYMOUS:
        return None
    return Actor(
        client_id=ANONYMOUS_ID, scopes=frozenset({SCOPE_REGISTER, SCOPE_CALL}), is_anonymous=True
    )


def staff_actor(username: str) -> Actor:
    return Actor(client_id=f"staff:{username}", scopes=frozenset({SCOPE_ADMIN}))
