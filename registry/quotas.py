"""Quotas on registry writes (both API surfaces go through registry.services): per client
(``A2A_MAX_AGENTS_PER_CLIENT``) and per tenant (``Tenant.max_agents``,
``Tenant.max_card_bytes``, ``Tenant.max_registrations_per_minute``; docs/tenants.md), and the
count of every tenant quota's refusals, the gateway's included (:func:`count_refused`)."""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from typing import NamedTuple

from django.conf import settings

from registry import quota_windows
from registry.models import Agent, Tenant
from registry.permissions import Actor, PermissionDenied


class TenantLimits(NamedTuple):
    """A tenant's quotas (None: no limit)."""

    max_agents: int | None = None
    max_card_bytes: int | None = None
    max_registrations_per_minute: int | None = None
    max_calls_per_second: int | None = None
    max_concurrent_streams: int | None = None


NO_LIMITS = TenantLimits()
LIMIT_FIELDS = TenantLimits._fields


class QuotaRateExceeded(PermissionDenied):
    """A tenant's rate quota refused a request: 429 with ``Retry-After`` (``retry_after``
    whole seconds) and this message on every surface. A refusal of the actor (what catches
    ``PermissionDenied``, as the admin's forms do, shows its message); the API handlers
    answer it before ``PermissionDenied``."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = max(1, math.ceil(retry_after))


_refused: Counter[tuple[str, str]] = Counter()
_refused_lock = threading.Lock()


def count_refused(tenant: str, quota: str) -> None:
    """One request refused by ``tenant``'s ``quota`` (a field name), in this process (the
    metric ``kubemq_a2a_tenant_quota_refused_total`` and the console read it)."""
    with _refused_lock:
        _refused[(tenant, quota)] += 1


def refused_counts() -> dict[tuple[str, str], int]:
    """``(tenant, quota) -> refusals`` in this process since it started."""
    with _refused_lock:
        return dict(_refused)


def check_agent_quota(actor: Actor) -> None:
    """Refuse a *new* agent when ``actor`` already owns ``A2A_MAX_AGENTS_PER_CLIENT`` of them.

    Admin clients (and the platform's own jobs, e.g. discovery) are exempt; anonymous callers
    share one quota over the unowned agents they registered. Expired agents still count until
    they are purged: they occupy the registry just the same.
    """
    room = agent_quota_room(actor)
    if room is not None and room <= 0:
        raise _quota_reached()


def take_agent_quota(actor: Actor, rooms: dict) -> None:
    """:func:`check_agent_quota` for one of several new agents written together: ``rooms``
    (one dict per batch) keeps each client's room, so the batch's earlier agents count."""
    key = actor.api_client_pk
    if key not in rooms:
        rooms[key] = agent_quota_room(actor)
    room = rooms[key]
    if room is None:
        return
    if room <= 0:
        raise _quota_reached()
    rooms[key] = room - 1


def agent_quota_room(actor: Actor) -> int | None:
    """How many more agents ``actor`` may own (None: no limit)."""
    limit = settings.A2A_MAX_AGENTS_PER_CLIENT
    if not limit or actor.is_admin:
        return None
    if actor.api_client_pk is not None:
        owned = Agent.objects.filter(owner_id=actor.api_client_pk)
    else:
        owned = Agent.objects.filter(
            owner__isnull=True, source__in=(Agent.Source.API, Agent.Source.KUBEMQ)
        )
    return limit - owned.count()


def _quota_reached() -> PermissionDenied:
    limit = settings.A2A_MAX_AGENTS_PER_CLIENT
    return PermissionDenied(
        f"agent quota reached: this client may own at most {limit} agents "
        "(A2A_MAX_AGENTS_PER_CLIENT); deregister some first"
    )


#: How long a node believes a tenant's quotas (``Tenant.max_agents``, ``max_card_bytes``): a
#: change in the admin applies within this time, and registrations read no quota row.
TENANT_LIMITS_SECONDS = 10.0
_MAX_REMEMBERED = 10_000
_limits: dict[str, tuple[float, TenantLimits]] = {}


def forget_tenant_limits() -> None:
    """Read every tenant's quotas again at its next registration."""
    _limits.clear()


def _tenant_limits(tenants: set[str]) -> dict[str, TenantLimits]:
    """``tenant -> its quotas``, from memory when read within :data:`TENANT_LIMITS_SECONDS`
    (one query for the others)."""
    now = time.monotonic()
    missing = [t for t in tenants if _limits.get(t, (0.0,))[0] <= now]
    if missing:
        if len(_limits) + len(missing) > _MAX_REMEMBERED:
            _limits.clear()
        found = tenant_limits(slugs=missing)
        for tenant in missing:
            _limits[tenant] = (now + TENANT_LIMITS_SECONDS, found.get(tenant, NO_LIMITS))
    return {t: _limits[t][1] for t in tenants}


def tenant_limits(*, slugs: list[str] | None = None) -> dict[str, TenantLimits]:
    """The quotas of the tenants ``slugs`` (None: of every tenant with one), read now (one
    query; the gateway's background refresh reads them this way)."""
    rows = Tenant.objects.all() if slugs is not None else Tenant.objects.exclude(
        max_agents=None, max_card_bytes=None, max_registrations_per_minute=None,
        max_calls_per_second=None, max_concurrent_streams=None)
    if slugs is not None:
        rows = rows.filter(slug__in=slugs)
    return {row[0]: TenantLimits(*row[1:]) for row in rows.values_list("slug", *LIMIT_FIELDS)}


def tenants_limited(tenants: set[str]) -> set[str]:
    """The tenants among ``tenants`` with an agent or card quota of their own: their
    registrations are checked one by one (:func:`check_tenant_quotas`)."""
    return {t for t, limits in _tenant_limits(tenants).items()
            if limits.max_agents is not None or limits.max_card_bytes is not None}


def check_registration_rate(tenant: str) -> None:
    """Count one registration (new or again) of ``tenant`` against its
    ``max_registrations_per_minute`` (:mod:`registry.quota_windows`, cluster-wide in
    distributed mode); over it, :class:`QuotaRateExceeded`."""
    limit = _tenant_limits({tenant})[tenant].max_registrations_per_minute
    if limit is None:
        return
    wait = quota_windows.take_registration(tenant, limit)
    if wait is None:
        return
    count_refused(tenant, "max_registrations_per_minute")
    window = quota_windows.window_seconds()
    span = "minute" if window == 60 else f"{window:g} seconds"
    raise QuotaRateExceeded(
        f"tenant quota reached: tenant {tenant} may register at most {limit} times per {span} "
        "(max_registrations_per_minute); retry later", wait)


def check_tenant_quotas(tenant: str, *, card_bytes: int, new_agent: bool) -> None:
    """Refuse a card larger than the tenant's ``max_card_bytes``, and a *new* agent when the
    tenant has ``max_agents`` already (expired ones count until purged), naming the quota."""
    max_agents, max_card_bytes = _tenant_limits({tenant})[tenant][:2]
    if max_card_bytes is not None and card_bytes > max_card_bytes:
        count_refused(tenant, "max_card_bytes")
        raise PermissionDenied(
            f"tenant quota: tenant {tenant} registers cards of at most {max_card_bytes} bytes "
            f"(max_card_bytes); this card has {card_bytes}")
    if new_agent and max_agents is not None:
        # The tenant's row locked for the registration's transaction: concurrent new agents of
        # a limited tenant are counted one after the other, so the limit holds exactly.
        list(Tenant.objects.select_for_update().filter(slug=tenant).values_list("slug"))
        if Agent.objects.filter(tenant_id=tenant).count() < max_agents:
            return
        count_refused(tenant, "max_agents")
        raise PermissionDenied(
            f"tenant quota reached: tenant {tenant} may have at most {max_agents} agents "
            "(max_agents); deregister some first")
