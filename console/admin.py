"""The audit logs in the admin (read-only), and django-celery-beat hidden in embedded mode
(nothing reads its schedule there: the in-process runner uses CELERY_BEAT_SCHEDULE)."""

from __future__ import annotations

from django.conf import settings
from django.contrib import admin

from console.models import CallRecord, RegistryChange


class ReadOnlyAdmin(admin.ModelAdmin):
    """Rows the system writes: no add, no edit, no delete (retention purges them)."""

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(CallRecord)
class CallRecordAdmin(ReadOnlyAdmin):
    list_display = (
        "at",
        "caller",
        "agent_id",
        "method",
        "outcome",
        "executed",
        "http_status",
        "latency_ms_display",
        "request_bytes",
        "response_bytes",
        "node_id",
    )
    list_filter = ("outcome", "executed", "at", "agent_id", "caller")
    search_fields = ("agent_id", "caller", "method")
    date_hierarchy = "at"
    list_per_page = 100
    show_full_result_count = False

    @admin.display(description="latency", ordering="latency_ms")
    def latency_ms_display(self, row: CallRecord) -> str:
        return f"{row.latency_ms:.1f} ms"


@admin.register(RegistryChange)
class RegistryChangeAdmin(ReadOnlyAdmin):
    list_display = ("at", "action", "actor", "agent_id", "client_id", "details")
    list_filter = ("action", "at", "actor")
    search_fields = ("agent_id", "client_id", "actor")
    date_hierarchy = "at"
    list_per_page = 100
    show_full_result_count = False


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
