"""Database outages answered fast, as JSON 503s with ``Retry-After``, and recovered from alone.

Without this, a request that needs an unreachable PostgreSQL waits out the connection pool's
timeout in the one thread that runs Django's sync views, the requests queued behind it each wait
again, and the failure surfaces as Django's HTML 500 page. Here:

* :func:`is_database_outage` recognises the driver's and Django's connection errors (refused,
  broken, pool timeout).
* :class:`DatabaseOutageMiddleware` (outermost) answers ``503 {"error": ..., "retry_after": N}``
  for a view that hit one, and *trips* :data:`breaker`. While the breaker is open, requests that
  need the database are answered 503 at once, before they queue for the sync thread; a probe
  (``SELECT 1`` on a thread of its own, every :attr:`DatabaseBreaker.PROBE_SECONDS`) closes it
  as soon as the database answers again, so the node recovers by itself within about a second.
* DRF's exception handlers (``registry.api.exceptions``) and ``handler500`` use
  :func:`unavailable_response` / :func:`is_database_outage`, and the lean heartbeat path checks
  :data:`breaker` too: every API gives the same answer.

SQLite errors ("database is locked") get the 503 answer but never trip the breaker: there is no
server to wait for.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.conf import settings
from django.db import InterfaceError, OperationalError, close_old_connections, connection
from django.http import JsonResponse

from core import threads

logger = logging.getLogger(__name__)

RETRY_AFTER_SECONDS = 2
MESSAGE = "database unavailable: retry shortly"

try:  # psycopg is there in distributed mode; its pool's timeout is an OperationalError too
    import psycopg

    _ERRORS: tuple[type[BaseException], ...] = (
        OperationalError,
        InterfaceError,
        psycopg.OperationalError,
        psycopg.InterfaceError,
    )
except ImportError:  # pragma: no cover - embedded installs without psycopg
    _ERRORS = (OperationalError, InterfaceError)

#: Paths that never need the database: answered even while it is down.
_EXEMPT_PREFIXES = ("/healthz", "/readyz", "/api/schema", "/api/docs", "/.well-known/")


class DatabaseUnavailable(OperationalError):
    """Raised without asking the database while :data:`breaker` is open."""


def is_database_outage(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or what caused it) says the database cannot be reached."""
    seen = 0
    while exc is not None and seen < 5:
        if isinstance(exc, _ERRORS):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def _probe() -> None:
    close_old_connections()
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    finally:
        connection.close()


class DatabaseBreaker:
    """Open while the database is known to be unreachable; a background probe closes it."""

    #: How often the probe asks the database while the breaker is open.
    PROBE_SECONDS = 0.25

    def __init__(self) -> None:
        self.opened_at: float | None = None
        self.reason = ""
        self._lock = threading.Lock()
        self._probe_task: asyncio.Task[None] | None = None

    @property
    def is_open(self) -> bool:
        return self.opened_at is not None

    def trip(self, exc: BaseException | None = None) -> None:
        """Record an outage (called from any thread)."""
        if connection.vendor == "sqlite":
            return
        with self._lock:
            if self.opened_at is None:
                self.opened_at = time.monotonic()
                logger.warning("database unreachable, answering 503 until it is back: %s", exc)
            self.reason = f"{type(exc).__name__}: {exc}"[:300] if exc is not None else ""

    def close(self) -> None:
        with self._lock:
            if self.opened_at is not None:
                logger.warning(
                    "database reachable again after %.1fs", time.monotonic() - self.opened_at
                )
            self.opened_at = None
            self.reason = ""

    def ensure_probe(self) -> None:
        """Start the probe on the running loop unless one runs (call from async code)."""
        task = self._probe_task
        if task is None or task.done():
            self._probe_task = asyncio.get_running_loop().create_task(
                self._probe_loop(), name="database-probe"
            )

    async def _probe_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while self.is_open:
            try:
                await asyncio.wait_for(
                    loop.run_in_executor(threads.pool("a2a-dbprobe", 1), _probe),
                    timeout=settings.A2A_DB_CONNECT_TIMEOUT_SECONDS + 1,
                )
            except Exception as exc:  # still down: the next probe follows shortly
                self.reason = f"{type(exc).__name__}: {exc}"[:300]
                await asyncio.sleep(self.PROBE_SECONDS)
            else:
                self.close()


breaker = DatabaseBreaker()


def payload() -> dict[str, Any]:
    return {"error": MESSAGE, "retry_after": RETRY_AFTER_SECONDS}


def json_response() -> JsonResponse:
    """The 503 every Django surface answers during an outage."""
    response = JsonResponse(payload(), status=503)
    response["Retry-After"] = str(RETRY_AFTER_SECONDS)
    return response


def unavailable_response(exc: BaseException) -> Any:
    """For DRF exception handlers: trip the breaker and answer a DRF 503 Response."""
    from rest_framework.response import Response

    breaker.trip(exc)
    return Response(payload(), status=503, headers={"Retry-After": str(RETRY_AFTER_SECONDS)})


def _exempt(path: str) -> bool:
    return path.startswith(_EXEMPT_PREFIXES) or path.startswith("/" + settings.STATIC_URL)


class DatabaseOutageMiddleware:
    """Outermost middleware: fast 503s while the breaker is open; 503 for views that hit an
    outage (and the breaker trips)."""

    async_capable = True
    sync_capable = False

    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    async def __call__(self, request: Any) -> Any:
        if breaker.is_open and not _exempt(request.path):
            breaker.ensure_probe()
            return json_response()
        response = await self.get_response(request)
        if breaker.is_open:
            breaker.ensure_probe()
        return response

    def process_view(
        self, request: Any, view_func: Any, view_args: Any, view_kwargs: Any
    ) -> JsonResponse | None:
        # Requests that queued for Django's sync thread while the breaker tripped: answer them
        # now instead of letting each wait out the pool timeout again.
        if breaker.is_open and not _exempt(request.path):
            return json_response()
        return None

    def process_exception(self, request: Any, exception: BaseException) -> JsonResponse | None:
        if is_database_outage(exception):
            breaker.trip(exception)
            return json_response()
        return None
