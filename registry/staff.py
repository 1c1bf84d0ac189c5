"""Which tenant a staff user of the Django admin administers (docs/tenants.md, "Admins per
tenant"): the tenant named by its ``tenant:<slug>`` group. A superuser, and a staff user in no
such group, administers the platform (every tenant); a staff user in the groups of several
tenants is refused (no actor), not guessed."""

from __future__ import annotations

from typing import Any

from registry.permissions import SCOPE_ADMIN, Actor

#: A group named ``tenant:<slug>`` makes its staff members admins of tenant ``<slug>``.
TENANT_GROUP_PREFIX = "tenant:"

_CACHE_ATTR = "_a2a_staff_tenants"


class AmbiguousTenant(Exception):
    """A staff user in the groups of several tenants."""


def tenant_group_name(slug: str) -> str:
    return f"{TENANT_GROUP_PREFIX}{slug}"


def staff_tenants(user: Any) -> tuple[str, ...]:
    """The tenants of a user by its groups (one query, remembered on the user object, which
    lives as long as its request); empty for a superuser."""
    cached = getattr(user, _CACHE_ATTR, None)
    if cached is not None:
        return cached
    tenants: tuple[str, ...] = ()
    if user.is_authenticated and not user.is_superuser:
        names = user.groups.filter(name__startswith=TENANT_GROUP_PREFIX).values_list(
            "name", flat=True)
        tenants = tuple(sorted(n[len(TENANT_GROUP_PREFIX):] for n in names))
    setattr(user, _CACHE_ATTR, tenants)
    return tenants


def staff_tenant(user: Any) -> str | None:
    """The one tenant the user administers, or None for a platform admin. Raises
    :class:`AmbiguousTenant` for a user in several tenants' groups."""
    tenants = staff_tenants(user)
    if len(tenants) > 1:
        raise AmbiguousTenant(
            f"staff user {user.get_username()!r} is in the groups of several tenants "
            f"({', '.join(tenants)}): a tenant admin belongs to one tenant")
    return tenants[0] if tenants else None


def user_actor(user: Any) -> Actor | None:
    """The registry actor of a staff user: admin of its tenant, a platform admin (superuser
    or no tenant group), or None (not staff, or in several tenants' groups)."""
    if user is None or not getattr(user, "is_authenticated", False) or not user.is_staff:
        return None
    try:
        tenant = staff_tenant(user)
    except AmbiguousTenant:
        return None
    name = f"staff:{user.get_username()}"
    if tenant is None:
        return Actor(client_id=name, scopes=frozenset({SCOPE_ADMIN}))
    return Actor(client_id=name, scopes=frozenset({SCOPE_ADMIN}), tenant=tenant)
