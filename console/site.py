"""The admin site with the operator dashboard as its index page."""

from __future__ import annotations

from functools import wraps

from django.conf import settings
from django.contrib import admin
from django.http import Http404
from django.template.response import TemplateResponse

from console.tenancy import admin_tenant, is_platform_only
from registry.staff import AmbiguousTenant, staff_tenant


class ConsoleAdminSite(admin.AdminSite):
    site_header = "A2A registry console"
    site_title = "A2A registry console"
    index_title = "Dashboard"
    index_template = "console/dashboard.html"
    # The stock navigation column takes 280 px from every list and page; the breadcrumbs and
    # the dashboard's app list lead everywhere it does, and the tables get the width.
    enable_nav_sidebar = False

    def has_permission(self, request) -> bool:
        """Active staff, and not in the groups of several tenants (registry.staff)."""
        if not super().has_permission(request):
            return False
        try:
            staff_tenant(request.user)
        except AmbiguousTenant:
            return False
        return True

    def admin_view(self, view, cacheable=False):
        """A model admin's page of a platform-only model (console.tenancy) is a 404 for a
        tenant admin, as if the model were not in the admin."""
        inner = super().admin_view(view, cacheable)
        owner = getattr(view, "__self__", None)
        model = getattr(owner, "model", None)
        if model is None or not is_platform_only(model):
            return inner

        @wraps(inner)
        def platform_only(request, *args, **kwargs):
            if request.user.is_active and request.user.is_staff and self.has_permission(
                    request) and admin_tenant(request) is not None:
                raise Http404("no such page")
            return inner(request, *args, **kwargs)

        return platform_only

    def _build_app_dict(self, request, label=None):
        app_dict = super()._build_app_dict(request, label)
        if admin_tenant(request) is None:
            return app_dict
        for app in app_dict.values():
            app["models"] = [m for m in app["models"] if not is_platform_only(m["model"])]
        return {key: app for key, app in app_dict.items() if app["models"]}

    def index(self, request, extra_context=None) -> TemplateResponse:
        from console.charts import bar_chart
        from console.selectors import dashboard
        from gateway import recorder

        data = dashboard(tenant=admin_tenant(request))
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
