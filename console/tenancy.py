"""Admins per tenant in the console (docs/tenants.md, "Admins per tenant"): a staff user in
the group ``tenant:<slug>`` (registry.staff) sees and changes only that tenant's rows; a
platform admin (a superuser, or a staff user in no tenant group) sees every tenant's.

Rows with a ``tenant`` column (push deliveries and configs among them) are filtered by it; rows
keyed by an agent's routing key (statistics) by the key's tenant prefix. Another tenant's row is
absent from lists, and its pages answer 404 (the admin's own "does not exist" for a change
page). What only platform admins see: :data:`PLATFORM_APPS` and :data:`PLATFORM_MODELS`.
"""

from __future__ import annotations

from typing import Any, TypeVar

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models import Q, QuerySet
from django.http import Http404

from registry.ids import DEFAULT_TENANT, TENANT_SEPARATOR
from registry.permissions import Actor
from registry.staff import staff_tenant, user_actor

_QS = TypeVar("_QS", bound=QuerySet)

#: Apps whose models only platform admins see: users and groups make tenant admins;
#: celery-beat runs the platform's jobs.
PLATFORM_APPS = frozenset({"auth", "django_celery_beat"})
#: Models only platform admins see: the cluster's nodes (agent counts of every tenant) and
#: discovery's shared machinery (the allowlist, the tag vocabulary, the policy, the card cache
#: and endpoint health, cycles). A tenant's own discovery rows (configured agents, source
#: feeds, needs, snapshots, session pins, its alerts) are in console.discovery_admin; the
#: tenants' page shows a tenant admin its own tenant, read-only (console.tenant_admin).
PLATFORM_MODELS = frozenset({
    "registry.Node", "discovery.AllowedHost", "discovery.CapabilityTag",
    "discovery.DiscoveryPolicy", "discovery.CardCacheEntry", "discovery.EndpointHealth",
    "discovery.CycleRun", "discovery.CatalogListing", "discovery.CardBlob",
})


def admin_tenant(request: Any) -> str | None:
    """The tenant the request's staff user administers, or None for a platform admin. (A user
    in several tenants' groups never gets here: the site refuses it.)"""
    return staff_tenant(request.user)


def is_platform_only(model: Any) -> bool:
    meta = model._meta
    return meta.app_label in PLATFORM_APPS or meta.label in PLATFORM_MODELS


def key_q(tenant: str, field: str = "agent_id") -> Q:
    """Rows whose routing key (registry.ids.agent_key) is one of ``tenant``'s agents'."""
    if tenant == DEFAULT_TENANT:
        return ~Q(**{f"{field}__contains": TENANT_SEPARATOR})
    return Q(**{f"{field}__startswith": f"{tenant}{TENANT_SEPARATOR}"})


class NotFoundForTenantAdmins:
    """A ModelAdmin mixin: a change page of a row a tenant admin may not see (another tenant's,
    or none) is a 404, not the admin's redirect with "does not exist", so that whether another
    tenant's row exists shows nowhere."""

    def _get_obj_does_not_exist_redirect(self, request, opts, object_id):
        if admin_tenant(request) is not None:
            raise Http404("no such object")
        return super()._get_obj_does_not_exist_redirect(  # type: ignore[misc]
            request, opts, object_id)


class AgentKeyColumn:
    """The agent list's first column: the agent's routing key (its bare id in the default
    tenant, ``tenant.agent_id`` elsewhere), so two tenants' ``echo`` are told apart without a
    tenant column (the list keeps to a 1280 px screen)."""

    @admin.display(description="agent id", ordering="agent_id")
    def agent_key(self, agent: Any) -> str:
        return str(agent.key)


class TenantScopedAdmin(NotFoundForTenantAdmins):
    """A ModelAdmin mixin: rows of the tenant admin's tenant only (``tenant_field``, a tenant
    column, or ``key_field``, a routing key); the ``tenant`` field read-only for tenant admins,
    editable by platform admins where the admin lists it as editable."""

    tenant_field: str | None = "tenant"
    key_field: str | None = None

    def get_queryset(self, request):
        queryset: QuerySet = super().get_queryset(request)  # type: ignore[misc]
        return scope(queryset, admin_tenant(request), tenant_field=self.tenant_field,
                     key_field=self.key_field)

    #: Whether a superuser may move a row to another tenant (its ``tenant`` field editable).
    movable = False

    def get_readonly_fields(self, request, obj=None):
        fields = tuple(super().get_readonly_fields(request, obj))  # type: ignore[misc]
        if self.movable and obj is not None and request.user.is_superuser:
            return tuple(f for f in fields if f != "tenant")
        if admin_tenant(request) is not None and "tenant" not in fields:
            fields += ("tenant",)
        return fields

    def get_form(self, request, obj=None, change=False, **kwargs):
        form = super().get_form(request, obj, change=change, **kwargs)  # type: ignore[misc]
        field = form.base_fields.get("tenant") if self.movable and obj is not None else None
        if field is not None:  # a superuser's move; empty: stays where it is
            field.required = False
            field.help_text = "Move to another tenant (a superuser's act; empty: stays)."
        return form

    def get_list_filter(self, request):
        filters = tuple(super().get_list_filter(request))  # type: ignore[misc]
        if admin_tenant(request) is None:
            return filters
        return tuple(f for f in filters if f != "tenant")  # its choices name every tenant


def scope(queryset: _QS, tenant: str | None, *, tenant_field: str | None = "tenant",
          key_field: str | None = None) -> _QS:
    """``queryset`` limited to ``tenant``'s rows (None: unlimited)."""
    if tenant is None:
        return queryset
    if key_field is not None:
        return queryset.filter(key_q(tenant, key_field))
    assert tenant_field is not None
    return queryset.filter(**{tenant_field: tenant})


def console_actor(request: Any) -> Actor:
    """The registry actor of the console's staff user (registry.staff.user_actor); the site
    lets in only users that have one."""
    actor = user_actor(request.user)
    if actor is None:
        raise PermissionDenied("not a staff user of one tenant")
    return actor
