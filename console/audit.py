"""The registry audit log: who registered, changed or deregistered an agent, who created,
rotated or revoked a token.

Registry services announce each change through ``registry.events.audit`` (after commit). In a
serving node the record joins the flusher's next batch; in a process without one (a Celery
worker, a management command) it is written at once.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from registry.events import AuditRecord

logger = logging.getLogger(__name__)

#: Records waiting for the flusher (bounded: at most ``MAX_PENDING``; beyond, written at once).
pending: list[AuditRecord] = []
MAX_PENDING = 10_000
buffered = False  # set by the flusher while it runs in this process


def _row(record: AuditRecord):
    from console.models import RegistryChange

    return RegistryChange(
        at=datetime.fromtimestamp(record.at, UTC),
        action=record.action,
        actor=record.actor,
        tenant=record.tenant,
        agent_id=record.agent_id,
        client_id=record.client_id,
        details=record.details,
    )


def write(records: list[AuditRecord]) -> None:
    from django.db import connection

    from console.models import RegistryChange
    from registry.rows import insert_rows

    if not records:
        return
    rows = [_row(r) for r in records]
    if connection.vendor == "postgresql" and len(rows) > 1:
        insert_rows(RegistryChange, rows)  # bulk_create's statement, bound cheaply (its doc)
    else:
        RegistryChange.objects.bulk_create(rows)


def on_registry_audit(record: AuditRecord) -> None:
    """The registry's audit hook: buffer for the flusher, or write now."""
    if buffered and len(pending) < MAX_PENDING:
        pending.append(record)
        return
    try:
        write([record])
    except Exception:  # an audit failure must not break the change it records
        logger.exception("could not write the registry audit record %s", record.action)


def take() -> list[AuditRecord]:
    """Everything pending, for the flusher's batch."""
    batch = pending[:]
    del pending[: len(batch)]
    return batch
