"""The audit logs in the admin (read-only), and django-celery-beat hidden in embedded mode
(nothing reads its schedule there: the in-process runner uses CELERY_BEAT_SCHEDULE)."""

from __future__ import annotations

from django.conf import settings
from django.contrib import admin

from console import tenant_admin  # noqa: F401  (registers the Tenants page)
from console.filters import TextFilter, short_time
from console.models import CallRecord, RegistryChange
from console.site import ReadOnlyAdmin
from console.tenancy import TenantScopedAdmin


class AgentFilter(TextFilter):
    title, parameter_name, field = "agent id", "agent_id", "agent_id"


class CallerFilter(TextFilter):
    title, parameter_name, field = "caller", "caller", "caller"


@admin.register(CallRecord)
class CallRecordAdmin(TenantScopedAdmin, ReadOnlyAdmin):
    class Media:
        css = {"all": ("console/console.css",)}  # list layout

    list_display = (
        "at_display",
        "caller",
        "agent_id",
        "method",
        "outcome",
        "count",
        "executed",
        "http_status",
        "latency_ms_display",
        "request_bytes",
        "response_bytes",
        "node_id",
    )
    list_filter = ("outcome", "executed", "at", AgentFilter, CallerFilter)
    search_fields = ("agent_id", "caller", "method")
    date_hierarchy = "at"
    list_per_page = 100
    show_full_result_count = False

    @admin.display(description="at", ordering="at")
    def at_display(self, row: CallRecord):
        return short_time(row.at)

    @admin.display(description="latency", ordering="latency_ms")
    def latency_ms_display(self, row: CallRecord) -> str:
        return f"{row.latency_ms:.1f} ms"


@admin.register(RegistryChange)
class RegistryChangeAdmin(TenantScopedAdmin, ReadOnlyAdmin):
    class Media:
        css = {"all": ("console/console.css",)}  # list layout

    list_display = ("at_display", "action", "actor", "agent_id", "client_id", "details")
    list_filter = ("action", "at", AgentFilter)
    search_fields = ("agent_id", "client_id", "actor")
    date_hierarchy = "at"
    list_per_page = 100
    show_full_result_count = False

    @admin.display(description="at", ordering="at")
    def at_display(self, row: RegistryChange):
        return short_time(row.at)


if settings.EMBEDDED:
    from django_celery_beat import models as beat

    for _model in (
        beat.PeriodicTask,
        beat.IntervalSchedule,
        beat.CrontabSchedule,
        beat.SolarSchedule,
        beat.ClockedSchedule,
    ):
        if admin.site.is_registered(_model):
            admin.site.unregister(_model)


# The registry's models in the console: agents (and their card versions), clients, nodes; the
# push deliveries and relayed configs; discovery's rows per tenant.
from console import (  # noqa: E402, F401
    agent_admin,
    client_admin,
    discovery_admin,
    node_admin,
    push_admin,
)
