"""The audit logs in the admin (read-only), and django-celery-beat hidden in embedded mode
(nothing reads its schedule there: the in-process runner uses CELERY_BEAT_SCHEDULE)."""

from __future__ import annotations

from django.conf import settings
from django.contrib import admin
from django.utils import timezone
from django.utils.html import format_html

from console.models import CallRecord, RegistryChange
from console.site import ReadOnlyAdmin


class TextFilter(admin.SimpleListFilter):
    """A filter typed as text (exact match), for columns with too many values to list."""

    template = "console/text_filter.html"
    field = ""

    def lookups(self, request, model_admin):
        return ()

    def has_output(self) -> bool:
        return True

    def queryset(self, request, queryset):
        value = (self.value() or "").strip()
        return queryset.filter(**{self.field: value}) if value else queryset

    def choices(self, changelist):
        # The other active filters, kept as hidden inputs when this one is submitted.
        params = changelist.get_filters_params()
        params.pop(self.parameter_name, None)
        yield {"value": self.value() or "", "params": params}


class AgentFilter(TextFilter):
    title, parameter_name, field = "agent id", "agent_id", "agent_id"


class CallerFilter(TextFilter):
    title, parameter_name, field = "caller", "caller", "caller"


def short_time(at):
    """Month, day and time to the second (the full date-time in its title): the stock
    "Dec. 2, 2026, 5:17 p.m." takes a column's width and hides the second."""
    at = timezone.localtime(at)
    return format_html('<span title="{}">{}</span>', at.isoformat(),
                       at.strftime("%m-%d %H:%M:%S"))


@admin.register(CallRecord)
class CallRecordAdmin(ReadOnlyAdmin):
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
class RegistryChangeAdmin(ReadOnlyAdmin):
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


# The registry's models in the console: agents (and their card versions), clients, nodes.
from console import agent_admin, client_admin, node_admin  # noqa: E402, F401
