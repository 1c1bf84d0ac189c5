"""The checks of an agent's registration fields (:mod:`registry.services.agents`): each
raises :class:`~registry.services.errors.InvalidInput` naming the field, before any write."""

from __future__ import annotations

from typing import Any

from django.conf import settings

from registry.ids import tenant_error
from registry.models import Agent, Tenant
from registry.services.errors import InvalidInput

#: Tenants one agent may be shared with by name, at most.
MAX_SHARED_WITH = 100


def _check_ttl(ttl_seconds: Any) -> int:
    if ttl_seconds is None:
        return settings.A2A_DEFAULT_TTL_SECONDS
    if isinstance(ttl_seconds, bool) or not isinstance(ttl_seconds, int):
        raise InvalidInput("ttl_seconds must be an integer")
    if not 1 <= ttl_seconds <= settings.A2A_MAX_TTL_SECONDS:
        raise InvalidInput(f"ttl_seconds must be between 1 and {settings.A2A_MAX_TTL_SECONDS}")
    return ttl_seconds


def _check_concurrency(value: Any) -> int:
    if value is None:
        return settings.A2A_AGENT_MAX_CONCURRENCY
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 100_000:
        raise InvalidInput("max_concurrency must be an integer between 1 and 100000")
    return value


def _check_passthrough(value: Any) -> bool:
    if not isinstance(value, bool):
        raise InvalidInput("credential_passthrough must be true or false")
    return value


#: ``push_relay`` not given (None is a value: the node's default).
UNSET: Any = object()


def _check_push_relay(value: Any) -> bool | None:
    if value is not None and not isinstance(value, bool):
        raise InvalidInput("push_relay must be true, false or null")
    return value  # checked: a bool or None


def _check_visibility(visibility: Any, shared_with: Any) -> tuple[str | None, list[str] | None]:
    """``visibility`` (private, public, shared) and ``shared_with`` (tenant slugs, at most
    ``MAX_SHARED_WITH``) checked; whether the tenants exist is checked when written."""
    if visibility is not None and visibility not in Agent.Visibility.values:
        raise InvalidInput("visibility must be one of: " + ", ".join(Agent.Visibility.values))
    if shared_with is None:
        return visibility, None
    if not isinstance(shared_with, list) or len(shared_with) > MAX_SHARED_WITH:
        raise InvalidInput(f"shared_with must be a list of at most {MAX_SHARED_WITH} tenants")
    for slug in shared_with:
        error = tenant_error(slug)
        if error:
            raise InvalidInput(f"shared_with: {error}")
    return visibility, sorted(set(shared_with))


def _set_shared(agent: Agent, shared_with: list[str] | None) -> None:
    """Write the tenants ``agent`` is shared with (None: unchanged); unknown ones refused."""
    if shared_with is None:
        return
    known = set(Tenant.objects.filter(slug__in=shared_with).values_list("slug", flat=True))
    unknown = [slug for slug in shared_with if slug not in known]
    if unknown:
        raise InvalidInput(f"shared_with: unknown tenant {unknown[0]!r}")
    agent.shared_with.set(Tenant.objects.filter(slug__in=shared_with))
