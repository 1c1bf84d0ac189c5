"""Celery tasks of discovery: take ids (or nothing), re-read state, call one service, and are
idempotent. The cycle is single-flight across workers (``loop._cycle_guard``)."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from discovery import alerts
from discovery.card_cache import default_cache
from discovery.loop import run_cycle
from discovery.models import CardCacheEntry, ConfiguredAgent
from discovery.resolver import Admission, allowlist_entries
from discovery.sessions import sessions_expire


@shared_task(name="discovery.tasks.discovery_cycle_task", ignore_result=True)
def discovery_cycle_task() -> dict[str, Any]:
    """One discovery cycle, every tenant with discovery rows (a no-op when nothing is
    configured)."""
    report = run_cycle()
    return {
        "configured": report.configured, "skipped": report.skipped,
        "fetched": report.fetched, "not_modified": report.not_modified,
        "failed": report.failed, "degraded": report.degraded,
        "published": report.published, "version": report.version,
        "tenants": [r.tenant for r in report.tenants],  # the first's figures above
    }


@shared_task(name="discovery.tasks.card_refresh_task", ignore_result=True)
def card_refresh_task(entry_id: int) -> str | None:
    """Refresh one cached card now (the admin's "refresh now"); returns the outcome."""
    entry = CardCacheEntry.objects.filter(pk=entry_id).first()
    if entry is None:
        return None
    admission = Admission(allowlist_entries())
    if not admission.admits(entry.card_url):
        return "refused"
    result = default_cache().refresh(entry.card_url, force=True, admit=admission.admits)
    if result.changed:
        base = entry.card_url.removesuffix("/.well-known/agent-card.json")
        name = ConfiguredAgent.objects.filter(url__startswith=base).values_list(
            "local_name", flat=True).first() or entry.card_url
        alerts.alerts_for_card_change(
            local_name=name, card_url=entry.card_url, old_card=result.previous.card,  # type: ignore[union-attr]  # changed: set
            new_card=result.entry.card,  # type: ignore[union-attr]  # changed: set
        )
    return str(result.outcome)


@shared_task(name="discovery.tasks.sessions_expire_task", ignore_result=True)
def sessions_expire_task() -> int:
    """End idle session pins and evict snapshots nobody pins."""
    return sessions_expire()
