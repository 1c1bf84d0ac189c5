"""Push notifications in the console: every push the gateway took from an agent (its state,
attempts, last error, latency, agent, caller, task) and the relayed configs. Read-only, but for
two actions on deliveries:

- **Retry** (``failed`` or ``dead`` pushes): back to ``pending``, due now, a fresh series of
  ``A2A_PUSH_MAX_ATTEMPTS`` attempts; its config's delivery is started once committed (the
  sweep would find it anyway). A retried push is its config's head again if it is the lowest
  open sequence, so the pushes after it that are still open wait for it, as before.
- **Discard** (any push not delivered): the row is **deleted** (the model has no discarded
  state; an admin log entry records who discarded which push). Its idempotency key is never
  delivered; the config's queue goes on with the next push.

Both skip a push a deliverer holds at that moment (its claim not lapsed): an attempt is in
flight. The relayed configs show who set them, for which agent and task, and the webhook
without its query string; never the caller's token, its ``authentication`` or the agent's
secret. The changelists select their rows in a fixed number of queries (the config joined,
the push's body not read).
"""

from __future__ import annotations

from functools import partial
from urllib.parse import urlsplit, urlunsplit

from django.contrib import admin, messages
from django.db import transaction
from django.db.models import Q, QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.html import format_html

from console.filters import TextFilter, short_time
from console.site import ReadOnlyAdmin
from console.tenancy import TenantScopedAdmin
from push import worker
from push.models import PushDelivery, RelayedConfig

#: The states an operator may send back to the queue.
RETRYABLE = (PushDelivery.State.FAILED, PushDelivery.State.DEAD)
#: The body shown on a push's page at most (characters).
BODY_SHOWN = 4000


class PushAgentFilter(TextFilter):
    title, parameter_name, field = "agent id", "agent_id", "agent_id"


class PushCallerFilter(TextFilter):
    title, parameter_name, field = "caller (API client)", "caller", "config__client_id"


class ConfigCallerFilter(TextFilter):
    title, parameter_name, field = "caller (API client)", "caller", "client_id"


def webhook_shown(url: str) -> str:
    """The webhook without its query string or fragment (which may carry a credential)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "(not a URL)"
    hidden = "?…" if parts.query or parts.fragment else ""
    netloc = parts.netloc.rsplit("@", 1)[-1]  # no user or password
    return urlunsplit(parts._replace(netloc=netloc, query="", fragment="")) + hidden


def _not_in_flight(queryset: QuerySet[PushDelivery]) -> QuerySet[PushDelivery]:
    now = timezone.now()
    return queryset.filter(Q(claimed_until__isnull=True) | Q(claimed_until__lt=now))


@admin.register(PushDelivery)
class PushDeliveryAdmin(TenantScopedAdmin, ReadOnlyAdmin):
    # Scoped by its tenant column (console.tenancy): the agent's tenant when the push came.

    class Media:
        css = {"all": ("console/console.css",)}  # list layout

    list_display = (
        "push", "state_display", "attempts", "last_error_display", "last_status",
        "latency_display", "agent_id", "caller", "task_id", "created_display",
        "next_attempt_display",
    )
    list_filter = ("state", PushAgentFilter, PushCallerFilter, "tenant")
    search_fields = ("agent_id", "task_id", "idempotency_key", "config__client_id")
    list_select_related = ("config",)
    list_per_page = 100
    show_full_result_count = False
    ordering = ("-created_at", "-pk")
    actions = ("retry", "discard")
    fields = (
        "idempotency_key", "state", "attempts", "last_status", "last_error", "latency_ms",
        "agent_id", "caller", "task_id", "sequence", "relay_id", "created_at", "next_attempt_at",
        "claimed_until", "finished_at", "body_shown",
    )
    readonly_fields = fields

    def get_queryset(self, request):
        # The body (up to A2A_PUSH_MAX_BYTES) and the config's secrets are never read for a list.
        return super().get_queryset(request).defer(
            "body", "config__url", "config__token", "config__authentication",
            "config__secret_sha256")

    @admin.display(description="push", ordering="pk")
    def push(self, row: PushDelivery) -> str:
        return row.idempotency_key

    @admin.display(description="state", ordering="state")
    def state_display(self, row: PushDelivery):
        return format_html('<span class="badge badge-push-{}">{}</span>', row.state, row.state)

    @admin.display(description="last error")
    def last_error_display(self, row: PushDelivery):
        if not row.last_error:
            return "—"
        short = row.last_error if len(row.last_error) <= 80 else row.last_error[:79] + "…"
        return format_html('<span title="{}">{}</span>', row.last_error, short)

    @admin.display(description="latency", ordering="latency_ms")
    def latency_display(self, row: PushDelivery) -> str:
        return "—" if row.latency_ms is None else f"{row.latency_ms:.0f} ms"

    @admin.display(description="caller", ordering="config__client_id")
    def caller(self, row: PushDelivery) -> str:
        return row.config.client_id

    @admin.display(description="relay id")
    def relay_id(self, row: PushDelivery) -> str:
        return row.config_id

    @admin.display(description="created", ordering="created_at")
    def created_display(self, row: PushDelivery):
        return short_time(row.created_at)

    @admin.display(description="next attempt", ordering="next_attempt_at")
    def next_attempt_display(self, row: PushDelivery):
        if row.state not in (PushDelivery.State.PENDING, PushDelivery.State.FAILED):
            return "—"
        return short_time(row.next_attempt_at)

    @admin.display(description="body")
    def body_shown(self, row: PushDelivery):
        text = bytes(row.body).decode("utf-8", errors="replace")
        more = f"\n… ({len(text) - BODY_SHOWN} more characters)" if len(text) > BODY_SHOWN else ""
        return format_html('<pre class="a2a-card">{}{}</pre>', text[:BODY_SHOWN], more)

    # --- actions ---------------------------------------------------------------------------

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("push.change_pushdelivery")

    def has_discard_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("push.delete_pushdelivery")

    @admin.action(description="Retry selected failed or dead pushes now",
                  permissions=["retry"])
    def retry(self, request: HttpRequest, queryset: QuerySet[PushDelivery]) -> None:
        selected = queryset.count()
        with transaction.atomic():
            chosen = _not_in_flight(queryset.filter(state__in=RETRYABLE))
            configs = sorted(set(chosen.values_list("config_id", flat=True)))
            done = PushDelivery.objects.filter(pk__in=list(chosen.values_list("pk", flat=True))
                                               ).update(
                state=PushDelivery.State.PENDING, attempts=0, next_attempt_at=timezone.now(),
                claimed_until=None, finished_at=None)
            for relay_id in configs:
                # robust: the sweep enqueues it if this fails (a broker down).
                transaction.on_commit(partial(worker.enqueue, relay_id), robust=True)
        skipped = selected - done
        self.message_user(
            request, f"Retrying {done} push(es) now."
            + (f" {skipped} skipped: only failed or dead pushes no deliverer holds are retried."
               if skipped else ""),
            messages.SUCCESS if done else messages.WARNING)

    @admin.action(description="Discard selected pushes not delivered (deletes them)",
                  permissions=["discard"])
    def discard(self, request: HttpRequest, queryset: QuerySet[PushDelivery]) -> None:
        selected = queryset.count()
        with transaction.atomic():
            ids = list(_not_in_flight(queryset.exclude(state=PushDelivery.State.DELIVERED))
                       .values_list("pk", flat=True))
            chosen = PushDelivery.objects.filter(pk__in=ids).defer("body")
            if ids:
                self.log_deletions(request, chosen)
                chosen.delete()
        skipped = selected - len(ids)
        self.message_user(
            request, f"Discarded {len(ids)} push(es)."
            + (f" {skipped} skipped: delivered pushes and pushes in flight are kept."
               if skipped else ""),
            messages.SUCCESS if ids else messages.WARNING)


@admin.register(RelayedConfig)
class RelayedConfigAdmin(TenantScopedAdmin, ReadOnlyAdmin):
    """The callers' configs the gateway keeps. Never shows the caller's token, its
    ``authentication`` or the agent's secret (only whether the first two are set). Scoped by
    its tenant column (console.tenancy): the agent's tenant when the config was relayed."""

    class Media:
        css = {"all": ("console/console.css",)}

    list_display = ("id", "agent_id", "client_id", "config_id", "task_id", "webhook",
                    "sequence", "created_display")
    list_filter = (PushAgentFilter, ConfigCallerFilter, "tenant")
    search_fields = ("id", "agent_id", "client_id", "task_id", "config_id")
    list_per_page = 100
    show_full_result_count = False
    ordering = ("-created_at",)
    fields = ("id", "agent_id", "client_id", "config_id", "task_id", "webhook", "has_token",
              "has_authentication", "sequence", "created_at")
    readonly_fields = fields

    def get_queryset(self, request):
        return super().get_queryset(request).defer("token", "authentication", "secret_sha256")

    @admin.display(description="webhook")
    def webhook(self, row: RelayedConfig) -> str:
        return webhook_shown(row.url)

    @admin.display(description="caller's token set", boolean=True)
    def has_token(self, row: RelayedConfig) -> bool:
        return bool(row.token)

    @admin.display(description="caller's authentication set", boolean=True)
    def has_authentication(self, row: RelayedConfig) -> bool:
        return bool(row.authentication)

    @admin.display(description="created", ordering="created_at")
    def created_display(self, row: RelayedConfig):
        return short_time(row.created_at)
