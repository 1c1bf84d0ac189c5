"""Discovery's rows per tenant in the console (docs/tenants.md, "Admins per tenant"): a tenant
admin sees and edits its tenant's configured agents, source feeds and needs, sees its tenant's
snapshots and session pins (and may end a session), and sees and acknowledges its tenant's
alerts; the tenant field is set to its tenant and read-only to it. A platform admin sees every
tenant's (a tenant column and filter) and chooses the tenant of a new row (default:
``default``). The rest of discovery (allowlist, tag vocabulary, policy, card cache, endpoint
health, cycles) and the platform's alerts (those with no tenant: the shared card cache's) are
the platform's (console.tenancy.PLATFORM_MODELS).

The discovery app's own admin classes (discovery.admin) are registered again here with the
tenant scope mixed in: discovery sits below the console and does not know its tenancy."""

from __future__ import annotations

from django.contrib import admin

from console.tenancy import TenantScopedAdmin, admin_tenant
from discovery import admin as discovery_admin
from discovery.models import Alert, ConfiguredAgent, Need, SessionPin, Snapshot, SourceFeed
from registry.ids import DEFAULT_TENANT
from registry.models import Tenant


class TenantColumnAdmin(TenantScopedAdmin):
    """A tenant's discovery rows: platform admins' lists show and filter every row's tenant."""

    def get_list_display(self, request):
        shown = tuple(super().get_list_display(request))  # type: ignore[misc]
        return shown if admin_tenant(request) is not None else (*shown, "tenant_slug")

    @admin.display(description="tenant", ordering="tenant")
    def tenant_slug(self, obj) -> str:
        return obj.tenant_id  # the slug is the key: no query per row

    def get_list_filter(self, request):
        filters = tuple(super().get_list_filter(request))
        return filters if admin_tenant(request) is not None else (*filters, "tenant")


class TenantDiscoveryAdmin(TenantColumnAdmin):
    """A discovery row of one tenant that admins write. For a tenant admin the tenant field is
    shown disabled (set to its tenant, so the form's unique checks include it) rather than
    read-only."""

    def get_readonly_fields(self, request, obj=None):
        fields = tuple(super().get_readonly_fields(request, obj))
        return tuple(f for f in fields if f != "tenant")

    def get_form(self, request, obj=None, change=False, **kwargs):
        form = super().get_form(request, obj, change=change, **kwargs)
        tenant = admin_tenant(request)
        field = form.base_fields.get("tenant")
        if tenant is not None and field is not None:
            field.disabled = True
            field.queryset = Tenant.objects.filter(slug=tenant)
            field.initial = tenant
        elif field is not None:  # a platform admin's choice; left out: the default tenant
            field.required = False
            chosen = field.clean
            # The default tenant when left out, so the unique checks still include a tenant.
            field.clean = lambda value: chosen(value) or Tenant.objects.get(
                slug=DEFAULT_TENANT)
        return form

    def get_changeform_initial_data(self, request):
        initial = super().get_changeform_initial_data(request)  # type: ignore[misc]
        tenant = admin_tenant(request)
        if tenant is not None:
            initial["tenant"] = tenant
        return initial

    def save_model(self, request, obj, form, change) -> None:
        obj.tenant_id = admin_tenant(request) or obj.tenant_id or DEFAULT_TENANT
        super().save_model(request, obj, form, change)  # type: ignore[misc]


def _reregister(model, base) -> None:
    admin.site.unregister(model)
    scoped = type(base.__name__, (TenantDiscoveryAdmin, base), {"__module__": __name__})
    admin.site.register(model, scoped)


class NeedAdmin(TenantDiscoveryAdmin, discovery_admin.NeedAdmin):
    def get_fieldsets(self, request, obj=None):
        first, *rest = super().get_fieldsets(request, obj)
        name, options = first
        return [(name, {**options, "fields": ["tenant", *options["fields"]]}), *rest]

    def get_autocomplete_fields(self, request):
        # The tag vocabulary's pages are the platform's: a tenant admin picks from a list.
        return () if admin_tenant(request) is not None else super().get_autocomplete_fields(
            request)


class SnapshotAdmin(TenantDiscoveryAdmin, discovery_admin.SnapshotAdmin):
    def diff_tenant(self, request) -> str:
        return admin_tenant(request) or super().diff_tenant(request)


class SessionPinAdmin(TenantColumnAdmin, discovery_admin.SessionPinAdmin):
    """A tenant admin sees its sessions and may end one (delete); it does not repin one by
    hand (the snapshot's raw id would reach any tenant's snapshot)."""

    def get_readonly_fields(self, request, obj=None):
        fields = (*super().get_readonly_fields(request, obj), "tenant")  # its snapshot's
        if admin_tenant(request) is None:
            return tuple(dict.fromkeys(fields))
        return tuple(dict.fromkeys(
            (*fields, "session_id", "snapshot", "client_id", "created_at", "last_seen_at")))


class AlertAdmin(TenantColumnAdmin, discovery_admin.AlertAdmin):
    """A tenant admin sees and acknowledges its tenant's alerts; the platform's (no tenant:
    the shared card cache's) are platform admins' only, as the scope's filter leaves them
    out."""

    def get_readonly_fields(self, request, obj=None):
        fields = tuple(super().get_readonly_fields(request, obj))
        return fields if "tenant" in fields else (*fields, "tenant")

    @admin.display(description="tenant", ordering="tenant")
    def tenant_slug(self, obj) -> str:
        return obj.tenant_id or "(platform)"


_reregister(ConfiguredAgent, discovery_admin.ConfiguredAgentAdmin)
_reregister(SourceFeed, discovery_admin.SourceFeedAdmin)
admin.site.unregister(Need)
admin.site.register(Need, NeedAdmin)
admin.site.unregister(Snapshot)
admin.site.register(Snapshot, SnapshotAdmin)
admin.site.unregister(SessionPin)
admin.site.register(SessionPin, SessionPinAdmin)
admin.site.unregister(Alert)
admin.site.register(Alert, AlertAdmin)
