"""Discovery in the Django admin: sources, allowlist, tag vocabulary and needs, the card cache
(with "refresh now"), endpoint health, snapshots (agents, digest, pinned sessions, diff between
two), alerts (acknowledge), the last cycles and "run discovery now".

Rows the loop makes (cache entries, health, snapshots, alerts, cycles) offer no "Add"; a
snapshot a session pins cannot be deleted. Changelists select or annotate what they show:
query counts stay flat as rows grow."""

from __future__ import annotations

from urllib.parse import urlencode

from django.contrib import admin, messages
from django.db.models import Count
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join

from discovery import loop
from discovery.models import (
    Alert,
    AllowedHost,
    CapabilityTag,
    CardCacheEntry,
    ConfiguredAgent,
    CycleRun,
    DiscoveryPolicy,
    EndpointHealth,
    Need,
    SessionPin,
    Snapshot,
    SourceFeed,
)
from registry.ids import DEFAULT_TENANT


class SystemRowsAdmin(admin.ModelAdmin):
    """Rows the discovery loop makes: nothing to add by hand."""

    def has_add_permission(self, request) -> bool:
        return False


@admin.register(AllowedHost)
class AllowedHostAdmin(admin.ModelAdmin):
    list_display = ["host", "allow_http", "origin"]
    list_filter = ["allow_http", "origin"]
    search_fields = ["host"]


@admin.register(ConfiguredAgent)
class ConfiguredAgentAdmin(admin.ModelAdmin):
    list_display = ["local_name", "kind", "url", "critical", "enabled", "origin"]
    list_filter = ["kind", "critical", "enabled", "origin"]
    search_fields = ["local_name", "url", "description"]


@admin.register(SourceFeed)
class SourceFeedAdmin(admin.ModelAdmin):
    list_display = ["__str__", "kind", "url", "namespace", "label_selector", "enabled", "origin"]
    list_filter = ["kind", "enabled", "origin"]


class NeedInline(admin.StackedInline):
    model = Need
    extra = 0
    exclude = ["text"]  # a tag's need; needs given as text are added on their own page


@admin.register(CapabilityTag)
class CapabilityTagAdmin(admin.ModelAdmin):
    list_display = ["name", "meaning", "origin"]
    search_fields = ["name", "meaning"]
    inlines = [NeedInline]


@admin.register(Need)
class NeedAdmin(admin.ModelAdmin):
    list_display = ["tag", "text", "input_modes", "output_modes", "description", "enabled",
                    "origin"]
    list_select_related = ["tag"]
    list_filter = ["enabled", "origin"]
    search_fields = ["tag__name", "text", "description"]
    autocomplete_fields = ["tag"]
    fieldsets = [
        (None, {"fields": ["tag", "text"],
                "description": "A tag from the vocabulary (matched exactly against the skills' "
                               "tags), or what is needed in words (matched by meaning, as ARD "
                               "search ranks agents: DISCOVERY_NEED_TEXT_MIN_SCORE)."}),
        (None, {"fields": ["input_modes", "output_modes", "description", "require_signed",
                           "enabled", "origin"]}),
    ]


@admin.register(DiscoveryPolicy)
class DiscoveryPolicyAdmin(admin.ModelAdmin):
    list_display = ["__str__", "max_agents", "degrade_after", "recover_after"]

    def has_add_permission(self, request) -> bool:
        return not DiscoveryPolicy.objects.exists()


@admin.register(CardCacheEntry)
class CardCacheEntryAdmin(SystemRowsAdmin):
    list_display = ["card_url", "short_sha", "etag", "expires_at", "fetched_at", "changed_at",
                    "failures", "last_status", "last_error"]
    list_filter = ["last_status"]
    search_fields = ["card_url", "sha256", "etag"]
    readonly_fields = [f.name for f in CardCacheEntry._meta.fields if f.name != "id"]
    exclude = ["raw"]
    actions = ["refresh_now"]

    def get_queryset(self, request):
        return super().get_queryset(request).defer("raw", "card")

    @admin.display(description="sha256")
    def short_sha(self, obj: CardCacheEntry) -> str:
        return obj.sha256[:12]

    @admin.action(description="Refresh now (conditional GET, single-flight)")
    def refresh_now(self, request, queryset) -> None:
        from discovery.tasks import card_refresh_task

        ids = list(queryset.values_list("pk", flat=True))
        for pk in ids:
            card_refresh_task.delay_on_commit(pk)
        self.message_user(request, f"refresh queued for {len(ids)} card(s)", messages.SUCCESS)


@admin.register(EndpointHealth)
class EndpointHealthAdmin(SystemRowsAdmin):
    list_display = ["card_url", "state", "failure_streak", "success_streak", "changed_at"]
    list_filter = ["state"]
    search_fields = ["card_url"]


class SessionPinInline(admin.TabularInline):
    model = SessionPin
    extra = 0
    fields = ["session_id", "client_id", "created_at", "last_seen_at"]
    readonly_fields = fields  # type: ignore[assignment]  # flat field names
    can_delete = False
    show_change_link = True


def snapshot_diff(old: Snapshot, new: Snapshot) -> dict[str, list]:
    """Agents added, removed and changed (card or description) from ``old`` to ``new``."""
    before = {a["local_name"]: a for a in old.agents}
    after = {a["local_name"]: a for a in new.agents}
    changed = []
    for name in sorted(before.keys() & after.keys()):
        a, b = before[name], after[name]
        what = [key for key in ("card_sha256", "description", "agent_id", "card_url")
                if a.get(key) != b.get(key)]
        if what:
            changed.append({"local_name": name, "fields": what, "old": a, "new": b})
    return {
        "added": [after[n] for n in sorted(after.keys() - before.keys())],
        "removed": [before[n] for n in sorted(before.keys() - after.keys())],
        "changed": changed,
    }


@admin.register(Snapshot)
class SnapshotAdmin(admin.ModelAdmin):
    list_display = ["version", "digest", "agent_count", "pinned_sessions", "created_at"]
    readonly_fields = ["version", "digest", "created_at", "agent_count", "delete_note",
                       "agent_table"]
    exclude = ["agents"]
    search_fields = ["digest"]
    inlines = [SessionPinInline]
    actions = ["compare"]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(pin_count=Count("pins"))

    def get_urls(self):
        return [
            path("diff/", self.admin_site.admin_view(self.diff_view),
                 name="discovery_snapshot_diff"),
            *super().get_urls(),
        ]

    def has_delete_permission(self, request, obj=None) -> bool:
        if obj is not None and obj.pins.exists():
            return False  # a pinned session still calls through it (see delete_note)
        return super().has_delete_permission(request, obj)

    def get_actions(self, request):
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)  # bulk delete would bypass the pin check
        return actions

    @admin.display(description="delete")
    def delete_note(self, obj: Snapshot) -> str:
        pins = obj.pins.count()
        if pins:
            return (f"Cannot be deleted: {pins} session(s) pin this snapshot, and their agent "
                    "trees are built from it. It is evicted by itself once no session pins it "
                    "and a newer snapshot is current; end the sessions to release it sooner.")
        return "No session pins it: it may be deleted (the loop evicts it when not current)."

    @admin.action(description="Compare the two selected snapshots")
    def compare(self, request, queryset):
        rows = sorted(queryset.values_list("version", "tenant_id"))
        if len(rows) != 2 or rows[0][1] != rows[1][1]:
            self.message_user(request, "Select exactly two snapshots of one tenant to compare.",
                              messages.WARNING)
            return None
        query = urlencode({"tenant": rows[0][1], "a": rows[0][0], "b": rows[1][0]})
        return HttpResponseRedirect(f"{reverse('admin:discovery_snapshot_diff')}?{query}")

    def diff_tenant(self, request) -> str:
        """Whose snapshots the diff page compares (versions count per tenant)."""
        return request.GET.get("tenant") or DEFAULT_TENANT

    def diff_view(self, request):
        tenant = self.diff_tenant(request)
        tenant_snapshots = Snapshot.objects.filter(tenant_id=tenant)
        versions = list(tenant_snapshots.order_by("-version").values_list("version", flat=True)[
            :200])
        try:
            a = int(request.GET.get("a") or (versions[1] if len(versions) > 1 else 0))
            b = int(request.GET.get("b") or (versions[0] if versions else 0))
        except ValueError:
            a = b = 0
        old = tenant_snapshots.filter(version=a).first()
        new = tenant_snapshots.filter(version=b).first()
        context = {
            **self.admin_site.each_context(request),
            "title": "Compare snapshots", "opts": self.model._meta, "versions": versions,
            "old": old, "new": new, "tenant": tenant,
            "diff": snapshot_diff(old, new) if old and new else None,
            "error": None if (old and new) or not versions
            else "Choose two existing snapshot versions.",
        }
        return TemplateResponse(request, "console/snapshot_diff.html", context)

    @admin.display(description="pinned sessions", ordering="pin_count")
    def pinned_sessions(self, obj: Snapshot) -> int:
        return obj.pin_count  # type: ignore[attr-defined]  # from .annotate(pin_count=...)

    @admin.display(description="agents")
    def agent_table(self, obj: Snapshot) -> str:
        rows = format_html_join(
            "", "<tr><td>{}</td><td>{}</td><td>{}</td><td><code>{}</code></td></tr>",
            ((a["local_name"], a["agent_id"], a["description"], a["card_sha256"][:12])
             for a in obj.agents),
        )
        return format_html(
            "<table><tr><th>local name</th><th>agent id</th><th>description</th>"
            "<th>card</th></tr>{}</table>", rows,
        )

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False  # immutable


@admin.register(SessionPin)
class SessionPinAdmin(SystemRowsAdmin):
    list_display = ["session_id", "snapshot", "client_id", "created_at", "last_seen_at"]
    list_select_related = ["snapshot"]
    search_fields = ["session_id", "client_id"]
    raw_id_fields = ["snapshot"]


@admin.register(Alert)
class AlertAdmin(SystemRowsAdmin):
    list_display = ["created_at", "kind", "subject", "message", "acknowledged"]
    list_filter = ["kind", "acknowledged"]
    search_fields = ["subject", "message"]
    readonly_fields = ["kind", "subject", "message", "details", "fingerprint", "created_at"]
    actions = ["acknowledge"]

    @admin.action(description="Acknowledge")
    def acknowledge(self, request, queryset) -> None:
        count = queryset.filter(acknowledged=False).update(acknowledged=True)
        self.message_user(request, f"Acknowledged {count} alert(s).", messages.SUCCESS)


@admin.register(CycleRun)
class CycleRunAdmin(SystemRowsAdmin):
    """The last discovery cycles and what each did; "Run discovery now" on top."""

    class Media:
        css = {"all": ("console/console.css",)}  # list layout

    list_display = ["started_at", "health_display", "seconds_display", "fetched",
                    "not_modified", "failed", "selected", "snapshot_display", "short_digest"]
    list_filter = ["published"]
    readonly_fields = ["started_at", "health_display", "seconds", "fetched", "not_modified",
                       "failed", "selected", "snapshot_display", "digest", "summary_text"]
    exclude = ["summary", "published", "version"]  # shown together as "snapshot"
    change_list_template = "console/cyclerun_change_list.html"

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def get_urls(self):
        return [
            path("run/", self.admin_site.admin_view(self.run_view),
                 name="discovery_cyclerun_run"),
            *super().get_urls(),
        ]

    @admin.display(description="health")
    def health_display(self, obj: CycleRun):
        """What went wrong in the cycle, from its summary: the configuration file could not be
        read (the cycle ran on the rows last read from it), a source failed, cards failed to
        fetch; or it had nothing to do, or another cycle was running."""
        css, label, title = loop.cycle_health(obj)
        return format_html('<span class="badge badge-{}" title="{}">{}</span>', css, title,
                           label)

    @admin.display(description="snapshot", ordering="version")
    def snapshot_display(self, obj: CycleRun) -> str:
        """The snapshot the cycle left current: a new one published, or the current one kept
        (nothing changed: not a failure)."""
        if obj.version is None:
            return "none"
        return f"v{obj.version} " + ("published (new)" if obj.published else "kept (unchanged)")

    @admin.display(description="took", ordering="seconds")
    def seconds_display(self, obj: CycleRun) -> str:
        return f"{obj.seconds:.2f} s"

    @admin.display(description="digest")
    def short_digest(self, obj: CycleRun) -> str:
        return obj.digest[:12]

    @admin.display(description="summary")
    def summary_text(self, obj: CycleRun):
        return format_html("<pre>{}</pre>", obj.summary)

    def run_view(self, request):
        """GET: a confirmation page; POST: run one cycle now, here, and show its summary.

        Inline in both modes, so the operator sees the outcome at once; the cycle stays
        single-flight (a cycle already running elsewhere makes this one report "skipped")."""
        if request.method != "POST":
            context = {**self.admin_site.each_context(request), "title": "Run discovery now",
                       "opts": self.model._meta}
            return TemplateResponse(request, "console/cyclerun_run.html", context)
        from discovery.loop import run_cycle

        report = run_cycle()
        level = messages.SUCCESS if report.configured and not report.skipped \
            else messages.WARNING
        self.message_user(request, report.summary(), level)
        return HttpResponseRedirect(reverse("admin:discovery_cyclerun_changelist"))
