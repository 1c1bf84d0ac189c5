"""A Celery beat scheduler that survives database and broker outages.

django-celery-beat's ``DatabaseScheduler`` reads its schedule from PostgreSQL at start and every
few minutes; when that read meets an outage the exception ends ``celery beat`` for good, and with
it agent expiry and discovery cluster-wide. :class:`ResilientDatabaseScheduler` keeps the last
schedule it read, logs the outage and tries again a second later; broker errors while sending a
due task are already logged and skipped by Celery. Expiry does not depend on beat alone either:
every serving node runs it under a lock (``node.periodic``).

Imported by beat only (``CELERY_BEAT_SCHEDULER``), once Django is set up.
"""

from __future__ import annotations

import logging

from django.db import DatabaseError, InterfaceError, close_old_connections
from django_celery_beat.schedulers import DatabaseScheduler
from kombu.exceptions import OperationalError as BrokerError

logger = logging.getLogger(__name__)

_OUTAGES = (DatabaseError, InterfaceError, BrokerError, ConnectionError, TimeoutError, OSError)


class ResilientDatabaseScheduler(DatabaseScheduler):
    """``DatabaseScheduler`` that waits out database and broker outages instead of dying.

    Use: ``celery -A config beat -S node.beat:ResilientDatabaseScheduler`` (the
    ``CELERY_BEAT_SCHEDULER`` default)."""

    #: Seconds between attempts while the database or the broker is unreachable.
    RETRY_SECONDS = 1.0
    _setup_done = False

    def setup_schedule(self) -> None:
        try:
            super().setup_schedule()
        except _OUTAGES as exc:
            self._outage("reading the schedule at start", exc)
        else:
            self._setup_done = True

    def tick(self, *args, **kwargs) -> float:
        try:
            if not self._setup_done:
                super().setup_schedule()
                self._setup_done = True
                logger.warning("beat: schedule read; scheduling resumes")
            return super().tick(*args, **kwargs)
        except _OUTAGES as exc:
            self._outage("ticking", exc)
            return self.RETRY_SECONDS

    def sync(self) -> None:
        try:
            super().sync()
        except _OUTAGES as exc:
            self._outage("saving run times", exc)

    def _outage(self, doing: str, exc: BaseException) -> None:
        logger.warning(
            "beat: outage while %s, retrying in %.0fs: %s: %s",
            doing,
            self.RETRY_SECONDS,
            type(exc).__name__,
            exc,
        )
        try:
            close_old_connections()
        except Exception:  # a broken connection may fail to close: it is dropped anyway
            pass
        if self._schedule is None:
            # The first read failed half-way: read it in full at the next attempt.
            self._initial_read = True
            self._heap = None
