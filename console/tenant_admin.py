"""Tenants in the admin (docs/tenants.md): a platform admin lists, creates and edits them and
their quotas; a tenant admin sees its own tenant's row only, read-only. Each row shows the
tenant's quotas and its current use: agents (the database), registrations in the sliding
window (the quota's own counter: Redis in distributed mode; tenants with that quota only),
calls per second and open streams, and the refusals of each quota (since each process
started, as on ``/metrics``). Calls, streams and refusals are the cluster's in distributed
mode (every node's report summed, :func:`gateway.tenant_quotas.cluster_use`; at most
``A2A_TENANT_QUOTAS_REFRESH_SECONDS`` old) and say "this node" when they are this node's
alone (embedded mode, or Redis not answering).
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import Count
from django.http import HttpRequest
from django.utils.html import format_html_join

from console.tenancy import NotFoundForTenantAdmins, admin_tenant, scope
from gateway import runtime
from gateway.tenant_quotas import cluster_use
from registry.ids import DEFAULT_TENANT
from registry.models import Tenant
from registry.quota_windows import registrations_used
from registry.quotas import LIMIT_FIELDS

_SHORT = {"max_agents": "agents", "max_card_bytes": "card bytes",
          "max_registrations_per_minute": "registrations/min",
          "max_calls_per_second": "calls/s", "max_concurrent_streams": "streams"}


def tenant_use(tenant: Tenant) -> dict[str, Any]:
    """What ``tenant`` uses now of each quota (None: not known here), its refusals by quota,
    and whether the gateway's figures are the cluster's."""
    node = runtime.current_node()
    gateway = cluster_use(getattr(node, "quotas", None), tenant.slug)
    agents = getattr(tenant, "_agent_count", None)
    return {
        "agents": tenant.agents.count() if agents is None else agents,
        "registrations": (round(registrations_used(tenant.slug), 1)
                          if tenant.max_registrations_per_minute is not None else None),
        "calls_per_second": (gateway.calls_per_second
                             if tenant.max_calls_per_second is not None else None),
        "streams": gateway.streams,
        "refused": gateway.refused,
        "cluster": gateway.cluster,
    }


@admin.register(Tenant)
class TenantAdmin(NotFoundForTenantAdmins, admin.ModelAdmin):
    """Tenants; create them here or with ``manage.py tenants create``."""

    list_display = ("slug", "name", "quotas", "use", "refusals")
    search_fields = ("slug", "name")
    fieldsets = (
        (None, {"fields": ("slug", "name", "created_at")}),
        ("Quotas (empty: no limit)", {"fields": LIMIT_FIELDS}),
        ("Use now", {"fields": ("use", "refusals")}),
    )

    def get_queryset(self, request: HttpRequest):
        queryset = super().get_queryset(request).annotate(_agent_count=Count("agents"))
        return scope(queryset, admin_tenant(request), tenant_field="slug")

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        if admin_tenant(request) is not None:  # its own tenant's quotas, read-only
            return ("slug", "name", "created_at", *LIMIT_FIELDS, "use", "refusals")
        return ("slug", "created_at", "use", "refusals") if obj is not None \
            else ("created_at", "use", "refusals")

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        tenant = admin_tenant(request)
        if tenant is not None:
            return obj is None or obj.slug == tenant
        return super().has_view_permission(request, obj)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return admin_tenant(request) is None and super().has_add_permission(request)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return admin_tenant(request) is None and super().has_change_permission(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return admin_tenant(request) is None and (obj is None or obj.slug != DEFAULT_TENANT) \
            and super().has_delete_permission(request, obj)

    @admin.display(description="quotas")
    def quotas(self, tenant: Tenant) -> str:
        set_ = [(_SHORT[f], getattr(tenant, f)) for f in LIMIT_FIELDS
                if getattr(tenant, f) is not None]
        return format_html_join(", ", "{}: {}", set_) if set_ else "none"

    @admin.display(description="use now")
    def use(self, tenant: Tenant) -> str:
        if tenant.pk is None:
            return "-"
        use = self._use(tenant)
        where = "" if use["cluster"] else " (this node)"
        rows = [("agents", use["agents"])]
        if use["registrations"] is not None:
            rows.append(("registrations in the window", use["registrations"]))
        if use["calls_per_second"] is not None:
            rows.append((f"calls/s{where}", f"{use['calls_per_second']:g}"))
        rows.append((f"open streams{where}", use["streams"]))
        return format_html_join(", ", "{}: {}", rows)

    @admin.display(description="refused")
    def refusals(self, tenant: Tenant) -> str:
        if tenant.pk is None:
            return "-"
        refused = self._use(tenant)["refused"]
        if not refused:
            return "none"
        return format_html_join(", ", "{}: {}", sorted(
            (_SHORT.get(quota, quota), count) for quota, count in refused.items()))

    def _use(self, tenant: Tenant) -> dict[str, Any]:
        """The tenant's use, read once for its row's two columns."""
        use = getattr(tenant, "_use", None)
        if use is None:
            use = tenant._use = tenant_use(tenant)  # type: ignore[attr-defined]  # the row's
        return use
