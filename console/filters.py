"""List filters and cell formats shared by the console's changelists."""

from __future__ import annotations

from django.contrib import admin
from django.utils import timezone
from django.utils.html import format_html


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


def short_time(at):
    """Month, day and time to the second (the full date-time in its title): the stock
    "Dec. 2, 2026, 5:17 p.m." takes a column's width and hides the second."""
    at = timezone.localtime(at)
    return format_html('<span title="{}">{}</span>', at.isoformat(),
                       at.strftime("%m-%d %H:%M:%S"))
