"""Alerts: skill list changed, endpoint changed, repeated fetch failures, name collision, cap
reached, endpoint refused, card signature not valid. Each is stored (admin list), logged,
counted in a Prometheus metric and, when ``settings.DISCOVERY_ALERT_WEBHOOK_URL`` is set,
POSTed there as JSON.

A condition that persists (a cap that keeps biting, a collision that stays) raises one alert,
not one per cycle: an alert is skipped while the latest one of its kind, subject and tenant
carries the same fingerprint.

An alert raised by a tenant's part of a cycle (its sources refused, its collisions, its cap,
its signatures) is that tenant's, for its admins to see; card changes and fetch failures of the
card cache, which every tenant shares, are the platform's (``tenant`` None).
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

import httpx
from django.conf import settings
from django.db import transaction

from discovery import http, metrics
from discovery.models import Alert

logger = logging.getLogger(__name__)


def _fingerprint(kind: str, subject: str, details: dict[str, Any]) -> str:
    body = json.dumps([kind, subject, details], sort_keys=True, default=str)
    return hashlib.sha256(body.encode()).hexdigest()


def alert_raise(
    *, kind: str, subject: str, message: str, details: dict[str, Any] | None = None,
    dedupe: bool = True, tenant: str | None = None,
) -> Alert | None:
    """Record an alert unless the same condition was the last one reported for ``subject`` in
    ``tenant`` (None: the platform's)."""
    details = details or {}
    fingerprint = _fingerprint(kind, subject, details)
    if dedupe:
        last = (
            Alert.objects.filter(kind=kind, subject=subject[:2048], tenant_id=tenant)
            .order_by("-created_at", "-id").values_list("fingerprint", flat=True).first()
        )
        if last == fingerprint:
            return None
    alert = Alert.objects.create(
        kind=kind, subject=subject[:2048], message=message, details=details,
        fingerprint=fingerprint, tenant_id=tenant,
    )
    metrics.ALERTS.labels(kind=kind).inc()
    logger.warning("discovery alert %s%s: %s", kind, f" (tenant {tenant})" if tenant else "",
                   message)
    if settings.DISCOVERY_ALERT_WEBHOOK_URL:
        payload = {
            "kind": kind, "tenant": tenant, "subject": alert.subject, "message": message,
            "details": details, "created_at": alert.created_at.isoformat(),
        }
        transaction.on_commit(lambda: _post(payload))
    return alert


def _post(payload: dict[str, Any]) -> None:
    try:
        http.sync_client().post(
            settings.DISCOVERY_ALERT_WEBHOOK_URL, json=payload, timeout=httpx.Timeout(5, connect=3)  # type: ignore[arg-type]  # posted only when set
        ).raise_for_status()
    except httpx.HTTPError as exc:
        logger.warning("discovery alert webhook failed: %s", exc)


def _skill_summary(card: dict[str, Any] | None) -> list[list[Any]]:
    skills = (card or {}).get("skills") or []
    return sorted(
        [str(s.get("id") or s.get("name") or ""), sorted(s.get("tags") or [])]
        for s in skills if isinstance(s, dict)
    )


def alerts_for_card_change(
    *, local_name: str, card_url: str, old_card: dict[str, Any] | None,
    new_card: dict[str, Any] | None,
) -> list[Alert]:
    """Alerts for a card whose bytes changed: its skill list, or its endpoint, moved."""
    from registry.cards import card_endpoint

    raised = []
    old_skills, new_skills = _skill_summary(old_card), _skill_summary(new_card)
    if old_skills != new_skills:
        alert = alert_raise(
            kind=Alert.Kind.SKILLS_CHANGED, subject=card_url,
            message=f"{local_name}: the skill list changed",
            details={"local_name": local_name, "before": old_skills, "after": new_skills},
            dedupe=False,
        )
        raised.append(alert)
    old_ep = card_endpoint(old_card or {})
    new_ep = card_endpoint(new_card or {})
    if old_ep != new_ep:
        alert = alert_raise(
            kind=Alert.Kind.ENDPOINT_CHANGED, subject=card_url,
            message=f"{local_name}: the endpoint changed from {old_ep} to {new_ep}",
            details={"local_name": local_name, "before": old_ep, "after": new_ep}, dedupe=False,
        )
        raised.append(alert)
    return [a for a in raised if a is not None]


def alert_signature(
    *, local_name: str, card_url: str, status: str, detail: str, sha256: str,
    kept_sha256: str | None, tenant: str | None = None,
) -> Alert | None:
    """A fetched card's signature is not valid (docs/signatures.md). ``kept_sha256``: the last
    valid version discovery keeps serving instead; None: the card was left out."""
    outcome = f"keeping the last valid version {kept_sha256[:12]}" if kept_sha256 else "left out"
    return alert_raise(
        kind=Alert.Kind.SIGNATURE_INVALID, subject=card_url,
        message=f"{local_name}: card signature is {status.replace('_', ' ')}"
                + (f" ({detail})" if detail else "") + f"; {outcome}",
        details={"local_name": local_name, "status": status, "card_sha256": sha256,
                 "kept_sha256": kept_sha256},
        tenant=tenant,
    )
