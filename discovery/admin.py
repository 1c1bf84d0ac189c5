"""Discovery in the Django admin: sources, allowlist, tag vocabulary and needs, the card cache
(with "refresh now"), endpoint health, snapshots (agents, digest, pinned sessions), alerts.
Changelists select or annotate what they show: query counts stay flat as rows grow."""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import Count
from django.utils.html import format_html, format_html_join

from discovery.models import (
    Alert,
    AllowedHost,
    CapabilityTag,
    CardCacheEntry,
    ConfiguredAgent,
    DiscoveryPolicy,
    EndpointHealth,
    Need,
    SessionPin,
    Snapshot,
    SourceFeed,
)


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


@admin.register(CapabilityTag)
class CapabilityTagAdmin(admin.ModelAdmin):
    list_display = ["name", "meaning", "origin"]
    search_fields = ["name", "meaning"]
    inlines = [NeedInline]


@admin.register(Need)
class NeedAdmin(admin.ModelAdmin):
    list_display = ["tag", "input_modes", "output_modes", "description", "enabled", "origin"]
    list_select_related = ["tag"]
    list_filter = ["enabled", "origin"]
    autocomplete_fields = ["tag"]


@admin.register(DiscoveryPolicy)
class DiscoveryPolicyAdmin(admin.ModelAdmin):
    list_display = ["__str__", "max_agents", "degrade_after", "recover_after"]

    def has_add_permission(self, request) -> bool:
        return not DiscoveryPolicy.objects.exists()


@admin.register(CardCacheEntry)
class CardCacheEntryAdmin(admin.ModelAdmin):
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
class EndpointHealthAdmin(admin.ModelAdmin):
    list_display = ["card_url", "state", "failure_streak", "success_streak", "changed_at"]
    list_filter = ["state"]
    search_fields = ["card_url"]


class SessionPinInline(admin.TabularInline):
    model = SessionPin
    extra = 0
    fields = ["session_id", "client_id", "created_at", "last_seen_at"]
    readonly_fields = fields
    can_delete = False
    show_change_link = True


@admin.register(Snapshot)
class SnapshotAdmin(admin.ModelAdmin):
    list_display = ["version", "digest", "agent_count", "pinned_sessions", "created_at"]
    readonly_fields = ["version", "digest", "created_at", "agent_count", "agent_table"]
    exclude = ["agents"]
    search_fields = ["digest"]
    inlines = [SessionPinInline]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(pin_count=Count("pins"))

    @admin.display(description="pinned sessions", ordering="pin_count")
    def pinned_sessions(self, obj: Snapshot) -> int:
        return obj.pin_count

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
class SessionPinAdmin(admin.ModelAdmin):
    list_display = ["session_id", "snapshot", "client_id", "created_at", "last_seen_at"]
    list_select_related = ["snapshot"]
    search_fields = ["session_id", "client_id"]
    raw_id_fields = ["snapshot"]


@admin.register(Alert)
class AlertAdmin(admin.ModelAdmin):
    list_display = ["created_at", "kind", "subject", "message", "acknowledged"]
    list_filter = ["kind", "acknowledged"]
    search_fields = ["subject", "message"]
    readonly_fields = ["kind", "subject", "message", "details", "fingerprint", "created_at"]
    actions = ["acknowledge"]

    @admin.action(description="Acknowledge")
    def acknowledge(self, request, queryset) -> None:
        queryset.update(acknowledged=True)
