"""The management UI: agents, their card history, API clients and nodes in the Django admin.

Every write goes through :mod:`registry.services` with the staff user as the actor, so the admin
publishes the same registry events as the APIs (routing tables and subscribers follow it).
Changelists select what they show in a fixed number of queries, whatever the row count.
"""

from __future__ import annotations

from typing import Any

import orjson
from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.db.models import Count, IntegerField, OuterRef, Subquery
from django.db.models.functions import Coalesce
from django.http import HttpRequest
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.text import slugify
from rest_framework_api_key.models import APIKey

from registry import services
from registry.ids import agent_id_error
from registry.models import Agent, ApiClient, CardVersion, Node
from registry.permissions import ALL_SCOPES, Actor, PermissionDenied, staff_actor

# The platform's tokens are ApiClient rows; the library's own APIKey model is unused, and
# listing it next to "API clients" would only mislead an operator.
if admin.site.is_registered(APIKey):
    admin.site.unregister(APIKey)


def _actor(request: HttpRequest) -> Actor:
    return staff_actor(request.user.get_username())


def _pretty_json(raw: str | None, fallback: Any = None) -> str:
    """Indented JSON of the card as registered (key order kept), else of ``fallback``."""
    try:
        value = orjson.loads(raw) if raw else fallback
    except orjson.JSONDecodeError:
        return raw or ""
    return orjson.dumps(value, option=orjson.OPT_INDENT_2).decode()


def _card_html(raw: str | None, fallback: Any = None):
    return format_html('<pre class="a2a-card">{}</pre>', _pretty_json(raw, fallback))


# --- agents ------------------------------------------------------------------------------------


class CardVersionInline(admin.TabularInline):
    """Every distinct card the agent has published, newest first. Read-only."""

    model = CardVersion
    extra = 0
    can_delete = False
    show_change_link = False
    fields = (
        "created_at", "short_sha256", "endpoint", "skills", "signature_status", "card_pretty"
    )
    readonly_fields = fields
    ordering = ("-created_at", "-id")
    verbose_name = "card version"
    verbose_name_plural = "card history"

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    @admin.display(description="sha256")
    def short_sha256(self, version: CardVersion) -> str:
        return version.sha256[:12]

    @admin.display(description="skills")
    def skills(self, version: CardVersion) -> str:
        return ", ".join(version.skill_ids or []) or "—"

    @admin.display(description="card")
    def card_pretty(self, version: CardVersion):
        return format_html(
            "<details><summary>show</summary>{}</details>",
            _card_html(version.card_raw, version.card),
        )


class AgentChangeForm(forms.ModelForm):
    """Only the lease and the concurrency cap are edited here; the card comes from the agent."""

    ttl_seconds = forms.IntegerField(min_value=1, max_value=settings.A2A_MAX_TTL_SECONDS)
    max_concurrency = forms.IntegerField(min_value=1, max_value=100_000)

    class Meta:
        model = Agent
        fields = ("ttl_seconds", "max_concurrency")


@admin.register(Agent)
class AgentAdmin(admin.ModelAdmin):
    form = AgentChangeForm
    list_display = (
        "agent_id", "name", "status_display", "node_id", "last_seen", "expires_at",
        "skill_tags", "max_concurrency", "owner_display", "source",
    )
    list_select_related = ("owner",)
    list_filter = ("status", "source", "node_id")
    search_fields = ("agent_id", "name", "description", "tags_index")
    ordering = ("agent_id",)
    list_per_page = 100
    actions = ("extend_ttl", "deregister")
    inlines = (CardVersionInline,)
    readonly_fields = (
        "agent_id", "name", "description", "url", "status_display", "source", "owner_display",
        "node_id", "registered_at", "last_seen", "expires_at", "skill_tags", "card_shape",
        "card_sha256", "raw_card_link", "card_pretty",
    )
    fieldsets = (
        (None, {"fields": ("agent_id", "name", "description", "url", "source", "owner_display")}),
        ("Lease", {"fields": (
            "status_display", "ttl_seconds", "max_concurrency", "node_id", "registered_at",
            "last_seen", "expires_at",
        )}),
        ("Card", {"fields": (
            "skill_tags", "card_shape", "card_sha256", "raw_card_link", "card_pretty",
        )}),
    )

    def has_add_permission(self, request) -> bool:
        return False  # agents register themselves (REST API, KubeMQ API, discovery)

    def get_actions(self, request):
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)  # deletes bypass services; "deregister" does not
        return actions

    # -- columns --

    @admin.display(description="status", ordering="status")
    def status_display(self, agent: Agent) -> str:
        if agent.status == Agent.Status.ACTIVE and not agent.is_routable:
            return "expired (lease lapsed)"
        return agent.status

    @admin.display(description="skill tags")
    def skill_tags(self, agent: Agent) -> str:
        return ", ".join(agent.tags) or "—"

    @admin.display(description="owner", ordering="owner__client_id")
    def owner_display(self, agent: Agent) -> str:
        return agent.owner.client_id if agent.owner_id and agent.owner else "—"

    @admin.display(description="card (as registered)")
    def card_pretty(self, agent: Agent):
        return _card_html(agent.card_raw, agent.card)

    @admin.display(description="raw card")
    def raw_card_link(self, agent: Agent):
        url = reverse("agent-card", kwargs={"agent_id": agent.agent_id})
        return format_html('<a href="{}">{}</a>', url, url)

    # -- writes, all through services --

    def save_model(self, request, obj: Agent, form, change: bool) -> None:
        changed = {name: form.cleaned_data[name] for name in form.changed_data}
        if not changed:
            return
        try:
            updated = services.agent_update(actor=_actor(request), agent_id=obj.agent_id, **changed)
        except (services.RegistryError, PermissionDenied) as exc:
            self.message_user(request, f"{obj.agent_id}: {exc}", messages.ERROR)
            return
        obj.expires_at, obj.last_seen = updated.expires_at, updated.last_seen

    def delete_model(self, request, obj: Agent) -> None:
        try:
            services.agent_deregister(actor=_actor(request), agent_id=obj.agent_id)
        except services.AgentNotFound:
            pass  # already gone: the outcome the user asked for

    def delete_queryset(self, request, queryset) -> None:
        self._deregister_ids(request, list(queryset.values_list("agent_id", flat=True)))

    def _deregister_ids(self, request, agent_ids: list[str]) -> int:
        actor = _actor(request)
        done = 0
        for agent_id in agent_ids:
            try:
                services.agent_deregister(actor=actor, agent_id=agent_id)
            except services.AgentNotFound:
                continue
            done += 1
        return done

    @admin.action(description="Deregister selected agents", permissions=["delete"])
    def deregister(self, request, queryset) -> None:
        done = self._deregister_ids(request, list(queryset.values_list("agent_id", flat=True)))
        self.message_user(request, f"Deregistered {done} agent(s).", messages.SUCCESS)

    @admin.action(
        description="Extend TTL of selected agents (renew the lease by their own TTL)",
        permissions=["change"],
    )
    def extend_ttl(self, request, queryset) -> None:
        count = services.agents_extend_ttl(
            agent_ids=list(queryset.values_list("agent_id", flat=True))
        )
        self.message_user(request, f"Extended the lease of {count} agent(s).", messages.SUCCESS)


# --- API clients ------------------------------------------------------------------------------


class AgentIdsField(forms.CharField):
    """Agent ids, one per line or comma-separated, as a list."""

    widget = forms.Textarea(attrs={"rows": 3, "cols": 60})

    def prepare_value(self, value):
        if isinstance(value, list):
            return "\n".join(value)
        return value

    def to_python(self, value) -> list[str]:
        text = super().to_python(value) or ""
        return list(dict.fromkeys(v.strip() for v in text.replace(",", "\n").splitlines()
                                  if v.strip()))

    def validate(self, value: list[str]) -> None:
        for agent_id in value:
            error = agent_id_error(agent_id)
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
class ApiClientAdmin(admin.ModelAdmin):
    """API clients. A new client's token is shown once, in a message after saving."""

    form = ApiClientForm
    list_display = (
        "client_id", "name", "scopes_display", "allowed_agents_display", "prefix", "created",
        "expiry_date", "_has_expired", "revoked", "agent_count",
    )
    list_filter = ("revoked", "created")
    search_fields = ("client_id", "name", "prefix")
    ordering = ("client_id",)
    actions = ("revoke",)

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(_agent_count=Count("agents"))

    def get_readonly_fields(self, request, obj=None):
        if obj is None:
            return ("prefix",)
        if obj.revoked:
            return ("client_id", "prefix", "created", "name", "scopes", "allowed_agents",
                    "expiry_date", "revoked")
        return ("client_id", "prefix", "created")

    def get_fields(self, request, obj=None):
        if obj is None:
            return ("name", "client_id", "scopes", "allowed_agents", "expiry_date")
        return ("client_id", "name", "prefix", "created", "scopes", "allowed_agents",
                "expiry_date", "revoked")

    def get_form(self, request, obj=None, change=False, **kwargs):
        form = super().get_form(request, obj, change=change, **kwargs)
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
        return client._agent_count

    def save_model(self, request, obj: ApiClient, form, change: bool) -> None:
        data = form.cleaned_data
        if change:
            editable = ("name", "scopes", "allowed_agents", "revoked", "expiry_date")
            changed = {name: data[name] for name in form.changed_data if name in editable}
            if changed:
                services.api_client_update(client_id=obj.client_id, **changed)
            return
        created, token = services.api_client_create(
            name=data["name"], scopes=data["scopes"], allowed_agents=data["allowed_agents"],
            client_id=data.get("client_id") or None,
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
            services.api_client_update(client_id=client_id, revoked=True)
        self.message_user(request, f"Revoked {len(ids)} client(s).", messages.SUCCESS)


# --- nodes -------------------------------------------------------------------------------------


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    """The cluster's server processes, as they report themselves. Read-only."""

    list_display = ("node_id", "address", "alive", "started_at", "last_heartbeat", "agent_count")
    search_fields = ("node_id", "address")
    ordering = ("node_id",)

    def get_queryset(self, request):
        agents = (
            Agent.objects.filter(node_id=OuterRef("node_id"))
            .order_by().values("node_id").annotate(n=Count("pk")).values("n")
        )
        return super().get_queryset(request).annotate(
            _agent_count=Coalesce(Subquery(agents, output_field=IntegerField()), 0)
        )

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    @admin.display(boolean=True, description="alive")
    def alive(self, node: Node) -> bool:
        window = 3 * settings.A2A_NODE_HEARTBEAT_SECONDS
        return (timezone.now() - node.last_heartbeat).total_seconds() <= window

    @admin.display(description="agents", ordering="_agent_count")
    def agent_count(self, node: Node) -> int:
        return node._agent_count
