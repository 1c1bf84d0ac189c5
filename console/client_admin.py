"""The API clients (the platform's tokens, :class:`registry.models.ApiClient`) in the Django
admin: create one (its token shown once), edit its scopes and agents, revoke, rotate. Every
write goes through :mod:`registry.services` (or ``console.services``) with the staff user as
the actor, as the API's writes do.
"""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.db.models import Count, Max, OuterRef, Subquery
from django.http import HttpRequest
from django.utils.text import slugify
from rest_framework_api_key.models import APIKey

from console import services as console_services
from console.models import ClientUsage
from console.templatetags.console import ago_html
from console.tenancy import TenantScopedAdmin, admin_tenant, console_actor
from registry import services
from registry.ids import DEFAULT_TENANT, agent_name_error
from registry.models import ApiClient
from registry.permissions import ALL_SCOPES, Actor

# The platform's tokens are ApiClient rows; the library's own APIKey model is unused, and
# listing it next to "API clients" would only mislead an operator.
if admin.site.is_registered(APIKey):
    admin.site.unregister(APIKey)


def _actor(request: HttpRequest) -> Actor:
    return console_actor(request)


class AgentIdsField(forms.CharField):
    """Agent ids, one per line or comma-separated, as a list."""

    widget = forms.Textarea(attrs={"rows": 3, "cols": 60})

    def prepare_value(self, value):
        if isinstance(value, list):
            return "\n".join(value)
        return value

    def to_python(self, value) -> list[str]:  # type: ignore[override]  # cleans to a list
        text = super().to_python(value) or ""
        return list(dict.fromkeys(v.strip() for v in text.replace(",", "\n").splitlines()
                                  if v.strip()))

    def validate(self, value: list[str]) -> None:
        for agent_id in value:
            error = agent_name_error(agent_id)
            if error:
                raise forms.ValidationError(error)


class ApiClientForm(forms.ModelForm):
    scopes = forms.MultipleChoiceField(
        choices=[(s, s) for s in ALL_SCOPES], widget=forms.CheckboxSelectMultiple,
        help_text="register: register, heartbeat and deregister its own agents; call: call the "
                  "allowed agents; admin: everything.",
    )
    allowed_agents = AgentIdsField(
        required=False,
        help_text="Agent ids this client may call or register, one per line. Empty: any.",
    )

    class Meta:
        model = ApiClient
        fields = ("name", "client_id", "scopes", "allowed_agents", "expiry_date", "revoked")

    def clean(self):
        data = super().clean()
        assert data is not None  # ModelForm.clean returns cleaned_data
        if self.instance._state.adding and "name" in data:
            # The id the create service will use; refused here so the form can show why.
            client_id = data.get("client_id") or slugify(data["name"])[:100]
            if not client_id:
                self.add_error("name", "the name must contain letters or digits")
            elif ApiClient.objects.filter(client_id=client_id).exists():
                self.add_error(
                    "client_id" if data.get("client_id") else "name",
                    f"a client with the id {client_id!r} exists already",
                )
        return data


@admin.register(ApiClient)
class ApiClientAdmin(TenantScopedAdmin, admin.ModelAdmin):
    """API clients. A new client's token is shown once, in a message after saving."""

    form = ApiClientForm
    list_display = (
        "client_id", "tenant", "name", "scopes_display", "allowed_agents_display", "prefix",
        "created", "last_used", "expiry_date", "_has_expired", "revoked", "agent_count",
    )
    list_filter = ("revoked", "created", "tenant")
    search_fields = ("client_id", "name", "prefix")
    ordering = ("client_id",)
    actions = ("rotate", "revoke")

    def get_queryset(self, request):
        last_used = (ClientUsage.objects.filter(client_id=OuterRef("client_id")).order_by()
                     .values("client_id").annotate(t=Max("last_used_at")).values("t"))
        return super().get_queryset(request).annotate(
            _agent_count=Count("agents"), _last_used=Subquery(last_used))

    def get_readonly_fields(self, request, obj=None):
        # A client belongs to one tenant for its life: its tenant is chosen (by a platform
        # admin) when it is created; a tenant admin's clients are its tenant's.
        if obj is None:
            return ("prefix",) if admin_tenant(request) is None else ("prefix", "tenant")
        if obj.revoked:
            return ("client_id", "tenant", "prefix", "created", "name", "scopes",
                    "allowed_agents", "expiry_date", "revoked")
        return ("client_id", "tenant", "prefix", "created")

    def get_fields(self, request, obj=None):
        if obj is None:
            return ("name", "client_id", "tenant", "scopes", "allowed_agents", "expiry_date")
        return ("client_id", "tenant", "name", "prefix", "created", "scopes", "allowed_agents",
                "expiry_date", "revoked")

    def get_form(self, request, obj=None, change=False, **kwargs):
        form = super().get_form(request, obj, change=change, **kwargs)
        if obj is None and "tenant" in form.base_fields:  # a platform admin's choice
            form.base_fields["tenant"].required = False
            form.base_fields["tenant"].help_text = (
                f"The tenant the client belongs to for its life. Empty: {DEFAULT_TENANT}.")
        if obj is None and "client_id" in form.base_fields:
            form.base_fields["client_id"].required = False
            form.base_fields["client_id"].help_text = (
                "Identity sent to agents in the caller-id header. Empty: derived from the name."
            )
        return form

    def has_delete_permission(self, request, obj=None) -> bool:
        return False  # revoke instead: agents keep their owner and the audit trail stays

    def get_actions(self, request):
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)
        return actions

    @admin.display(description="scopes")
    def scopes_display(self, client: ApiClient) -> str:
        return ", ".join(client.scopes or [])

    @admin.display(description="allowed agents")
    def allowed_agents_display(self, client: ApiClient) -> str:
        return ", ".join(client.allowed_agents or []) or "any"

    @admin.display(description="agents", ordering="_agent_count")
    def agent_count(self, client: ApiClient) -> int:
        return client._agent_count  # type: ignore[attr-defined]  # from .annotate(_agent_count=...)

    @admin.display(description="last gateway call", ordering="_last_used")
    def last_used(self, client: ApiClient):
        return ago_html(getattr(client, "_last_used", None))

    def save_model(self, request, obj: ApiClient, form, change: bool) -> None:
        data = form.cleaned_data
        if change:
            editable = ("name", "scopes", "allowed_agents", "revoked", "expiry_date")
            changed = {name: data[name] for name in form.changed_data if name in editable}
            if changed:
                services.api_client_update(client_id=obj.client_id, actor=_actor(request),
                                           **changed)
            return
        chosen = data.get("tenant")  # a platform admin's choice (a Tenant), else empty
        tenant = admin_tenant(request) or (chosen.slug if chosen else DEFAULT_TENANT)
        created, token = services.api_client_create(
            name=data["name"], scopes=data["scopes"], allowed_agents=data["allowed_agents"],
            client_id=data.get("client_id") or None, actor=_actor(request),
            tenant=tenant,
        )
        if data.get("expiry_date"):
            created = services.api_client_update(
                client_id=created.client_id, expiry_date=data["expiry_date"]
            )
        # The admin goes on with ``obj`` (log entry, redirect): make it the saved row.
        for field in ApiClient._meta.concrete_fields:
            setattr(obj, field.attname, getattr(created, field.attname))
        obj._state.adding = False
        obj._state.db = created._state.db
        self.message_user(
            request,
            f"The token of {created.client_id} is: {token} — copy it now: it is stored hashed "
            "and will not be shown again.",
            messages.WARNING,
        )

    @admin.action(description="Revoke selected clients (cannot be undone)",
                  permissions=["change"])
    def revoke(self, request, queryset) -> None:
        ids = list(queryset.filter(revoked=False).values_list("client_id", flat=True))
        for client_id in ids:
            console_services.client_revoke(client_id=client_id, actor=_actor(request))
        self.message_user(request, f"Revoked {len(ids)} client(s).", messages.SUCCESS)

    @admin.action(description="Rotate the token of selected clients (old tokens stop working)",
                  permissions=["change"])
    def rotate(self, request, queryset) -> None:
        ids = list(queryset.filter(revoked=False).values_list("client_id", flat=True))
        for client_id in ids:
            token = console_services.client_rotate(client_id=client_id, actor=_actor(request))
            self.message_user(
                request,
                f"The new token of {client_id} is: {token} — copy it now: it is stored hashed "
                "and will not be shown again. The old token is revoked.",
                messages.WARNING,
            )
        if not ids:
            self.message_user(request, "Revoked clients cannot be rotated.", messages.ERROR)
