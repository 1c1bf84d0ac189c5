"""Session pinning: a session keeps the snapshot (digest) current when it started until it ends
(DELETE) or idles out, so its history never refers to an agent that vanished. New sessions get
the current snapshot. Unpinned old snapshots are evicted.

A session belongs to its caller's tenant (docs/tenants.md): it pins that tenant's snapshots, and
its id names it within that tenant only (another tenant's session of the same id is another
session, and one of another tenant is answered as one that does not exist).
"""

from __future__ import annotations

import re
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from discovery import metrics
from discovery.models import SessionPin
from discovery.snapshots import snapshot_current, snapshots_evict
from registry.ids import DEFAULT_TENANT

SESSION_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,199}\Z")


class SessionError(Exception):
    """A session request that cannot be served; the message says why."""


class InvalidSessionId(SessionError):
    pass


class NoSnapshot(SessionError):
    pass


class SessionNotFound(SessionError):
    def __init__(self, session_id: str) -> None:
        super().__init__(f"session not found: {session_id}")
        self.session_id = session_id


def _check(session_id: object) -> str:
    if not isinstance(session_id, str) or not SESSION_ID_RE.match(session_id):
        raise InvalidSessionId(
            "session_id must be 1 to 200 letters, digits and . _ : @ -, starting with a letter "
            "or digit"
        )
    return session_id


def _pins(tenant: str):
    return SessionPin.objects.select_related("snapshot").filter(tenant_id=tenant)


def session_pin(*, session_id: str, client_id: str = "", tenant: str = DEFAULT_TENANT
                ) -> tuple[SessionPin, bool]:
    """Pin ``tenant``'s session ``session_id`` to its tenant's current snapshot; an existing
    pin is returned unchanged."""
    _check(session_id)
    existing = _pins(tenant).filter(session_id=session_id).first()
    if existing is not None:
        return _touch(existing), False
    current = snapshot_current(tenant)
    if current is None:
        raise NoSnapshot("no discovery snapshot has been published yet")
    try:
        with transaction.atomic():
            pin = SessionPin.objects.create(
                tenant_id=tenant, session_id=session_id, snapshot=current,
                client_id=client_id[:200],
            )
    except IntegrityError:  # a concurrent pin of the same id won
        return _pins(tenant).get(session_id=session_id), False
    pin.snapshot = current
    metrics.PINNED_SESSIONS.inc()
    return pin, True


def _touch(pin: SessionPin) -> SessionPin:
    now = timezone.now()
    if now - pin.last_seen_at > timedelta(seconds=1):
        SessionPin.objects.filter(pk=pin.pk).update(last_seen_at=now)
        pin.last_seen_at = now
    return pin


def session_get(*, session_id: str, tenant: str = DEFAULT_TENANT) -> SessionPin:
    """``tenant``'s session's pin (its idle clock restarts); raises :class:`SessionNotFound`."""
    _check(session_id)
    pin = _pins(tenant).filter(session_id=session_id).first()
    if pin is None:
        raise SessionNotFound(session_id)
    return _touch(pin)


def session_unpin(*, session_id: str, tenant: str = DEFAULT_TENANT) -> None:
    """End ``tenant``'s session's pin and evict snapshots nobody pins any more."""
    _check(session_id)
    deleted, _ = SessionPin.objects.filter(tenant_id=tenant, session_id=session_id).delete()
    if not deleted:
        raise SessionNotFound(session_id)
    metrics.PINNED_SESSIONS.dec()
    snapshots_evict()


def sessions_expire(*, idle_seconds: float | None = None) -> int:
    """End pins idle longer than ``DISCOVERY_SESSION_IDLE_SECONDS`` and evict their snapshots."""
    idle = settings.DISCOVERY_SESSION_IDLE_SECONDS if idle_seconds is None else idle_seconds
    cutoff = timezone.now() - timedelta(seconds=idle)
    deleted, _ = SessionPin.objects.filter(last_seen_at__lt=cutoff).delete()
    snapshots_evict()
    metrics.PINNED_SESSIONS.set(SessionPin.objects.count())
    return deleted
