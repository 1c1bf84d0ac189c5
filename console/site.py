"""The admin site with the operator dashboard as its index page."""

from __future__ import annotations

from django.conf import settings
from django.contrib import admin
from django.template.response import TemplateResponse


class ConsoleAdminSite(admin.AdminSite):
    site_header = "A2A registry console"
    site_title = "A2A registry console"
    index_title = "Dashboard"
    index_template = "console/dashboard.html"
    # The stock navigation column takes 280 px from every list and page; the breadcrumbs and
    # the dashboard's app list lead everywhere it does, and the tables get the width.
    enable_nav_sidebar = False

    def index(self, request, extra_context=None) -> TemplateResponse:
        from console.charts import bar_chart
        from console.selectors import dashboard
        from gateway import recorder

        data = dashboard()
        context = {
            "dash": data,
            "chart": bar_chart(data["series"], width=1200),  # scaled to the page's width
            "audit_mode": settings.A2A_AUDIT,
            "stats_on": settings.A2A_STATS,
            "dropped": dict(recorder.dropped),
            **(extra_context or {}),
        }
        return super().index(request, context)


class ReadOnlyAdmin(admin.ModelAdmin):
    """Rows the system writes (calls, registry changes, nodes): no add, no edit, no delete
    (retention purges them, or the nodes themselves)."""

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False
