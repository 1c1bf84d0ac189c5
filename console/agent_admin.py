"""The agents in the Django admin: the agent list and page, their card history.

Every write goes through :mod:`registry.services` (or ``console.services``, which composes
them) with the staff user as the actor, so the admin publishes the same registry events and
audit records as the APIs. The changelist selects what it shows in a fixed number of queries,
whatever the row count: the agent list's traffic columns are subqueries over the console's
per-minute statistics.

The agent page adds: health badge, traffic over the statistics window with a chart, the
gateway URL with curl and a2a-sdk snippets, card history with a diff between two versions,
and actions (refresh the card now, send a test message, extend the TTL, deregister).
"Add agent" is "Register by URL": the card is fetched and validated exactly as the API does.
The registry's other models in the admin: ``console.client_admin`` (API clients) and
``console.node_admin`` (nodes).
"""

from __future__ import annotations

import difflib
from datetime import timedelta
from typing import Any

import orjson
from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin.views.main import ORDER_VAR, ChangeList
from django.db.models import (
    Case,
    CharField,
    F,
    IntegerField,
    OuterRef,
    Subquery,
    Sum,
    Value,
    When,
)
from django.db.models.functions import Concat
from django.http import HttpRequest, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import mark_safe

from console import services as console_services
from console.charts import bar_chart
from console.models import AgentMinute
from console.selectors import EXPIRING_SECONDS, RECENT_WINDOW_MINUTES, agent_stats
from console.templatetags.console import ago_html
from console.tenancy import AgentKeyColumn, TenantScopedAdmin, admin_tenant, console_actor, scope
from registry import events, selectors, services
from registry.ids import (
    DEFAULT_TENANT,
    TENANT_SEPARATOR,
    agent_key,
    gateway_path,
    split_agent_key,
)
from registry.models import Agent, CardVersion, Node
from registry.permissions import Actor, PermissionDenied

#: The agent list's traffic columns cover this many minutes.
LIST_WINDOW_MINUTES = RECENT_WINDOW_MINUTES


def _actor(request: HttpRequest) -> Actor:
    return console_actor(request)


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
            _card_html(version.card_raw),
        )


class AgentChangeForm(forms.ModelForm):
    """Only the lease and the concurrency cap are edited here; the card comes from the agent."""

    ttl_seconds = forms.IntegerField(min_value=1, max_value=settings.A2A_MAX_TTL_SECONDS)
    max_concurrency = forms.IntegerField(min_value=1, max_value=100_000)

    class Meta:
        model = Agent
        fields = ("ttl_seconds", "max_concurrency", "public", "push_relay")


class RegisterByUrlForm(forms.Form):
    """Register an agent from its URL: the card is fetched from its well-known path."""

    agent_id = forms.CharField(
        max_length=63, help_text="Lowercase letters, digits and hyphens (2 to 63).")
    url = forms.CharField(
        max_length=2048, label="URL",
        help_text="The agent's A2A endpoint; its card is read at /.well-known/agent-card.json.")
    ttl_seconds = forms.IntegerField(
        required=False, min_value=1, max_value=settings.A2A_MAX_TTL_SECONDS, label="TTL seconds",
        help_text=f"Empty: {settings.A2A_DEFAULT_TTL_SECONDS}.")
    max_concurrency = forms.IntegerField(
        required=False, min_value=1, max_value=100_000,
        help_text=f"Empty: {settings.A2A_AGENT_MAX_CONCURRENCY}.")


class TestMessageForm(forms.Form):
    text = forms.CharField(max_length=4000, initial="ping from the admin console",
                           widget=forms.TextInput(attrs={"size": 60}))


def health(agent: Agent, *, unreachable: bool = False, now=None) -> tuple[str, str]:
    """The agent's health badge: (css class, label)."""
    now = now or timezone.now()
    if agent.status != Agent.Status.ACTIVE or agent.expires_at <= now:
        return "expired", "expired"
    if unreachable:
        return "unreachable", "unreachable"
    if agent.expires_at <= now + timedelta(seconds=EXPIRING_SECONDS):
        return "expiring", "expiring"
    return "active", "active"


def gateway_base(request: HttpRequest) -> str:
    return settings.A2A_PUBLIC_BASE_URL or request.build_absolute_uri("/").rstrip("/")


def snippets(gateway_url: str) -> dict[str, str]:
    """Copy-ready ways to call the agent through the gateway."""
    curl = (
        f"curl -s -X POST {gateway_url} \\\n"
        '  -H "Authorization: Bearer $TOKEN" -H "Content-Type: application/json" \\\n'
        """  -d '{"jsonrpc":"2.0","id":1,"method":"message/send","params":{"message":"""
        """{"kind":"message","role":"user","messageId":"m1","parts":[{"kind":"text","""
        """"text":"hi"}]}}}'"""
    )
    sdk = f"""import asyncio, os

import httpx
from a2a.client import ClientConfig, ClientFactory
from a2a.helpers import new_text_message
from a2a.types import Role, SendMessageRequest


async def main() -> None:
    headers = {{"Authorization": f"Bearer {{os.environ['TOKEN']}}"}}
    async with httpx.AsyncClient(headers=headers, timeout=60) as http:
        client = await ClientFactory(ClientConfig(httpx_client=http)).create_from_url(
            "{gateway_url}")
        request = SendMessageRequest(message=new_text_message("hi", role=Role.ROLE_USER))
        async for event in client.send_message(request):
            print(event)
        await client.close()

asyncio.run(main())"""
    return {"curl": curl, "sdk": sdk}


class NodeListFilter(admin.SimpleListFilter):
    """The owning node. Its choices come from the nodes table (one row per server process),
    not from a DISTINCT over every agent, which reads the whole table at 100,000 agents."""

    title = "node id"
    parameter_name = "node_id"
    max_choices = 200

    def lookups(self, request, model_admin):
        nodes = Node.objects.order_by("node_id").values_list("node_id", flat=True)
        return [(node_id, node_id) for node_id in nodes[: self.max_choices]]

    def queryset(self, request, queryset):
        value = self.value()
        return queryset if value is None else queryset.filter(node_id=value)


#: Columns the agent list never shows: not read for its rows (a card is 2 to 8 KiB).
LIST_DEFERRED = ("card", "card_raw", "description", "skills_index", "input_modes_index",
                 "output_modes_index")


class AgentChangeList(ChangeList):
    def get_queryset(self, request, exclude_parameters=None):
        return super().get_queryset(request, exclude_parameters).defer(*LIST_DEFERRED)

    def get_ordering(self, request, queryset):
        # A search lists best first (``search_rank``, annotated by the search); a column the
        # operator sorts by still wins.
        if "search_rank" in queryset.query.annotations and ORDER_VAR not in self.params:
            return ["search_rank", "-pk"]
        return super().get_ordering(request, queryset)


@admin.register(Agent)
class AgentAdmin(AgentKeyColumn, TenantScopedAdmin, admin.ModelAdmin):
    movable = True
    class Media:
        css = {"all": ("console/console.css",)}  # list layout

    form = AgentChangeForm
    change_form_template = "console/agent_change_form.html"
    # One line per column: other features add theirs here.
    list_display = (
        "agent_key",
        "name",
        "status_display",
        "seen",
        "expires",
        "requests_15m",
        "errors_15m",
        "node_id",
        "skill_tags",
        "max_concurrency",
        "origin",
    )
    list_select_related = ("owner", "tenant")
    list_filter = ("status", "source", NodeListFilter, "public")
    search_fields = ("agent_id", "name", "description", "tags_index")
    ordering = ("agent_id",)
    list_per_page = 100
    # A second COUNT over the whole table on every filtered page: "Show all" links instead.
    show_full_result_count = False
    actions = ("extend_ttl", "deregister")
    inlines = (CardVersionInline,)
    readonly_fields = (
        "agent_id", "tenant", "visibility", "name", "description", "url", "http_json_url",
        "status_display", "source", "owner_display", "node_id", "registered_at", "seen",
        "expires", "skill_tags", "card_shape", "card_sha256", "raw_card_link", "card_pretty",
    )
    fieldsets = (
        (None, {"fields": (
            "agent_id", "tenant", "visibility", "name", "description", "url", "http_json_url",
            "source", "owner_display", "public", "push_relay",
        )}),
        ("Lease", {"fields": (
            "status_display", "ttl_seconds", "max_concurrency", "node_id", "registered_at",
            "seen", "expires",
        )}),
        ("Card", {"fields": (
            "skill_tags", "card_shape", "card_sha256", "raw_card_link", "card_pretty",
        )}),
    )

    def get_changelist(self, request, **kwargs):
        return AgentChangeList

    def get_search_results(self, request, queryset, search_term):
        """The search box ranks as the registry's API does (an id first, then by words and by
        meaning, registry.selectors.agents_search), best first."""
        if not search_term.strip():
            return queryset, False
        return selectors.agents_search(queryset, search_term), False

    def get_queryset(self, request):
        since = timezone.now() - timedelta(minutes=LIST_WINDOW_MINUTES)
        window = AgentMinute.objects.filter(
            agent_id=OuterRef("_key"), minute__gte=since.replace(second=0, microsecond=0)
        ).order_by()
        per_agent = window.values("agent_id")
        # Statistics are keyed by the routing key (registry.ids.agent_key).
        key = Case(When(tenant_id=DEFAULT_TENANT, then=F("agent_id")),
                   default=Concat(F("tenant_id"), Value(TENANT_SEPARATOR), F("agent_id")),
                   output_field=CharField())
        return super().get_queryset(request).annotate(_key=key).annotate(
            _requests=Subquery(per_agent.annotate(n=Sum("requests")).values("n"),
                               output_field=IntegerField()),
            _errors=Subquery(
                per_agent.annotate(n=Sum("errors_executed") + Sum("errors_not_executed")
                                   + Sum("errors_agent"))
                .values("n"), output_field=IntegerField()),
            _agent_errors=Subquery(per_agent.annotate(n=Sum("errors_agent")).values("n"),
                                   output_field=IntegerField()),
            _last_outcome=Subquery(
                window.filter(last_call_at__isnull=False).order_by("-last_call_at")
                .values("last_outcome")[:1]),
        )

    # -- columns --

    @admin.display(description="health", ordering="status")
    def status_display(self, agent: Agent):
        css, label = health(agent, unreachable=getattr(agent, "_last_outcome", "") ==
                            "unreachable")
        titles = {
            "active": "routable: heartbeats arrive within the TTL",
            "expiring": f"the lease ends within {EXPIRING_SECONDS} s unless a heartbeat comes",
            "expired": "not routable: the lease lapsed or the agent expired",
            "unreachable": "routable, but its last call failed: the agent could not be reached",
        }
        return format_html('<span class="badge badge-{}" title="{}">{}</span>', css,
                           titles[css], label)

    @admin.display(description="last seen", ordering="last_seen")
    def seen(self, agent: Agent):
        return ago_html(agent.last_seen)

    @admin.display(description="expires", ordering="expires_at")
    def expires(self, agent: Agent):
        return ago_html(agent.expires_at)

    @admin.display(description=f"requests ({LIST_WINDOW_MINUTES} min)", ordering="_requests")
    def requests_15m(self, agent: Agent) -> int:
        return getattr(agent, "_requests", None) or 0

    @admin.display(description=f"errors ({LIST_WINDOW_MINUTES} min)", ordering="_errors")
    def errors_15m(self, agent: Agent):
        """Every failed call; the agent's own errors (a JSON-RPC error or an HTTP error status
        it answered) named apart from the gateway's."""
        errors = getattr(agent, "_errors", None) or 0
        own = getattr(agent, "_agent_errors", None) or 0
        if not own:
            return errors
        return format_html('{} <span class="agent-errors" title="the agent answered a JSON-RPC '
                           'error or an HTTP error status">({} agent)</span>', errors, own)

    @admin.display(description="skill tags")
    def skill_tags(self, agent: Agent) -> str:
        return ", ".join(agent.tags) or "—"

    @admin.display(description="owner", ordering="owner__client_id")
    def owner_display(self, agent: Agent) -> str:
        return agent.owner.client_id if agent.owner_id and agent.owner else "—"

    @admin.display(description="owner, source", ordering="owner__client_id")
    def origin(self, agent: Agent):
        """Who registered the agent and through which surface, in one column (the list must
        fit a laptop's width)."""
        return format_html('{}<br><span class="quiet">{}</span>', self.owner_display(agent),
                           agent.get_source_display())

    @admin.display(description="card (as registered)")
    def card_pretty(self, agent: Agent):
        return _card_html(agent.card_raw, agent.card)

    @admin.display(description="raw card")
    def raw_card_link(self, agent: Agent):
        url = reverse("agent-card", kwargs={"agent_id": agent.key})
        return format_html('<a href="{}">{}</a>', url, url)

    # -- pages --

    def get_urls(self):
        view = self.admin_site.admin_view
        return [
            path("id/<str:agent_id>/", view(self.by_id_view), name="registry_agent_by_id"),
            path("<path:object_id>/refresh-card/", view(self.refresh_card_view),
                 name="registry_agent_refresh_card"),
            path("<path:object_id>/extend-ttl/", view(self.extend_ttl_view),
                 name="registry_agent_extend_ttl"),
            path("<path:object_id>/test-message/", view(self.test_message_view),
                 name="registry_agent_test_message"),
            path("<path:object_id>/card-diff/", view(self.card_diff_view),
                 name="registry_agent_card_diff"),
            *super().get_urls(),
        ]

    def _agent(self, request, object_id: str) -> Agent:
        return get_object_or_404(self.get_queryset(request), pk=object_id)

    def _back(self, agent: Agent) -> HttpResponseRedirect:
        return HttpResponseRedirect(reverse("admin:registry_agent_change", args=[agent.pk]))

    def by_id_view(self, request, agent_id: str):
        tenant, bare = split_agent_key(agent_id)  # a routing key
        agent = get_object_or_404(scope(Agent.objects.all(), admin_tenant(request)),
                                  tenant_id=tenant, agent_id=bare)
        return self._back(agent)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        agent = (scope(Agent.objects.filter(pk=object_id), admin_tenant(request)).first()
                 if object_id.isdigit() else None)
        context = dict(extra_context or {})
        if agent is not None:
            hours = settings.A2A_STATS_RETENTION_HOURS
            now = timezone.now()
            recent = agent_stats(agent_id=agent.key,
                                 since=now - timedelta(minutes=LIST_WINDOW_MINUTES))
            step = 1 if hours <= 2 else (10 if hours <= 24 else 30)
            window = agent_stats(agent_id=agent.key, since=now - timedelta(hours=hours),
                                 with_series=True, step_minutes=step)
            assert window.series is not None  # asked for with_series=True
            url = f"{gateway_base(request)}{gateway_path(agent.key)}"
            context.update({
                "recent": recent, "window": window, "window_hours": hours,
                "list_window": LIST_WINDOW_MINUTES,
                "chart": bar_chart(window.series, title=f"requests per {step} min"),
                "step_minutes": step,
                "gateway_url": url, "snippets": snippets(url),
                "card_versions": list(agent.card_versions.order_by("-created_at", "-id")
                                      .values("id", "sha256", "created_at")),
            })
        return super().change_view(request, object_id, form_url, context)

    def add_view(self, request, form_url="", extra_context=None):
        """"Add agent" registers one by URL, exactly as ``POST /api/v1/agents`` would."""
        if not self.has_add_permission(request):
            return super().add_view(request, form_url, extra_context)
        form = RegisterByUrlForm(request.POST or None)
        if request.method == "POST" and form.is_valid():
            data = form.cleaned_data
            try:
                agent, created = services.agent_register(
                    actor=_actor(request), agent_id=data["agent_id"], url=data["url"],
                    ttl_seconds=data["ttl_seconds"], max_concurrency=data["max_concurrency"],
                    source=Agent.Source.ADMIN,
                )
            except services.InvalidInput as exc:
                message = str(exc)
                field = "agent_id" if "agent_id" in message else "url"
                form.add_error(field, message)
            except PermissionDenied as exc:
                form.add_error(None, str(exc))
            else:
                verb = "Registered" if created else "Re-registered"
                self.message_user(request, f"{verb} {agent.agent_id} ({agent.name}).",
                                  messages.SUCCESS)
                return self._back(agent)
        context = {
            **self.admin_site.each_context(request), "title": "Register an agent by URL",
            "opts": self.model._meta, "form": form, "add": True,
        }
        return TemplateResponse(request, "console/agent_register.html", context)

    def refresh_card_view(self, request, object_id: str):
        agent = self._agent(request, object_id)
        if request.method != "POST" or not self.has_change_permission(request, agent):
            return self._back(agent)
        try:
            agent, changed = console_services.agent_refresh_card(
                actor=_actor(request), agent_id=agent.key)
        except (services.RegistryError, PermissionDenied) as exc:
            self.message_user(request, f"Card not refreshed: {exc}", messages.ERROR)
        else:
            what = f"a new card, {agent.card_sha256[:12]}" if changed else "unchanged"
            self.message_user(request, f"Card refreshed: {what}.", messages.SUCCESS)
        return self._back(agent)

    def extend_ttl_view(self, request, object_id: str):
        agent = self._agent(request, object_id)
        if request.method == "POST" and self.has_change_permission(request, agent):
            services.agents_extend_ttl(agent_ids=[agent.key])
            _audit_extend(request, [agent.key])
            self.message_user(request, f"Extended the lease of {agent.agent_id} by its TTL "
                              f"({agent.ttl_seconds} s).", messages.SUCCESS)
        return self._back(agent)

    def test_message_view(self, request, object_id: str):
        agent = self._agent(request, object_id)
        form = TestMessageForm(request.POST or None)
        reply = None
        if request.method == "POST" and form.is_valid():
            reply = console_services.agent_test_message(
                agent_id=agent.key, text=form.cleaned_data["text"])
        context = {
            **self.admin_site.each_context(request), "title": f"Test message to {agent}",
            "opts": self.model._meta, "original": agent, "form": form, "reply": reply,
            "gateway_url": f"{gateway_base(request)}{gateway_path(agent.key)}",
        }
        return TemplateResponse(request, "console/agent_test_message.html", context)

    def card_diff_view(self, request, object_id: str):
        agent = self._agent(request, object_id)
        versions = {v.pk: v for v in agent.card_versions.all()}
        a: CardVersion | None
        b: CardVersion | None
        try:
            a, b = versions[int(request.GET["a"])], versions[int(request.GET["b"])]
        except (KeyError, ValueError):
            ordered = sorted(versions.values(), key=lambda v: (v.created_at, v.pk))
            a, b = (ordered[-2], ordered[-1]) if len(ordered) > 1 else (None, None)
        table = None
        if a is not None and b is not None:
            old = _pretty_json(a.card_raw).splitlines()
            new = _pretty_json(b.card_raw).splitlines()
            # HtmlDiff escapes the card text itself.
            table = mark_safe(difflib.HtmlDiff(wrapcolumn=80).make_table(  # noqa: S308
                old, new, fromdesc=f"{a.sha256[:12]} ({a.created_at:%Y-%m-%d %H:%M:%S})",
                todesc=f"{b.sha256[:12]} ({b.created_at:%Y-%m-%d %H:%M:%S})",
                context=True, numlines=3))
        context = {
            **self.admin_site.each_context(request), "title": f"Card changes of {agent}",
            "opts": self.model._meta, "original": agent, "table": table, "a": a, "b": b,
            "versions": sorted(versions.values(), key=lambda v: (v.created_at, v.pk),
                               reverse=True),
        }
        return TemplateResponse(request, "console/agent_card_diff.html", context)

    # -- writes, all through services --

    def save_model(self, request, obj: Agent, form, change: bool) -> None:
        changed = {name: form.cleaned_data[name] for name in form.changed_data}
        tenant = changed.pop("tenant", None)  # a superuser's move (console.tenancy)
        key = agent_key(form.initial.get("tenant", obj.tenant_id), obj.agent_id)  # as it was
        try:
            if changed:
                updated = services.agent_update(actor=_actor(request), agent_id=key, **changed)
                obj.expires_at, obj.last_seen = updated.expires_at, updated.last_seen
            if tenant is not None:
                services.agent_move_tenant(actor=_actor(request), agent_id=key, tenant=tenant.pk)
        except (services.RegistryError, PermissionDenied) as exc:
            self.message_user(request, f"{obj.agent_id}: {exc}", messages.ERROR)

    def delete_model(self, request, obj: Agent) -> None:
        try:
            services.agent_deregister(actor=_actor(request), agent_id=obj.key)
        except services.AgentNotFound:
            pass  # already gone: the outcome the user asked for

    def delete_queryset(self, request, queryset) -> None:
        self._deregister_ids(request, _keys(queryset))

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

    def get_actions(self, request):
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)  # deletes bypass services; "deregister" does not
        return actions

    @admin.action(description="Deregister selected agents", permissions=["delete"])
    def deregister(self, request, queryset) -> None:
        done = self._deregister_ids(request, _keys(queryset))
        self.message_user(request, f"Deregistered {done} agent(s).", messages.SUCCESS)

    @admin.action(
        description="Extend TTL of selected agents (renew the lease by their own TTL)",
        permissions=["change"],
    )
    def extend_ttl(self, request, queryset) -> None:
        ids = _keys(queryset)
        count = services.agents_extend_ttl(agent_ids=ids)
        _audit_extend(request, ids)
        self.message_user(request, f"Extended the lease of {count} agent(s).", messages.SUCCESS)


def _keys(queryset) -> list[str]:
    """The routing keys (registry.ids.agent_key) of the agents of ``queryset``."""
    return [agent_key(tenant, agent_id)
            for tenant, agent_id in queryset.values_list("tenant_id", "agent_id")]


def _audit_extend(request, agent_ids: list[str]) -> None:
    for agent_id in agent_ids:
        events.audit(events.AuditRecord(action="agent.lease_extended",
                                        actor=_actor(request).client_id, agent_id=agent_id))
