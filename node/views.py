"""Process health (/healthz), readiness (/readyz: each dependency, short timeouts) and the JSON
answers Django would otherwise give as HTML pages: ``handler400`` (a Host not in
``ALLOWED_HOSTS``, another suspicious request), ``handler403``, ``handler404``, ``handler500``,
and 405 on the plain views (:func:`methods`, which take no CSRF token: they change nothing).

Every one is the API's error shape, ``{"error": "<message>"}``."""

from __future__ import annotations

import asyncio
import sys
from concurrent.futures import ThreadPoolExecutor
from functools import wraps

from channels.layers import get_channel_layer
from django.conf import settings
from django.core.exceptions import DisallowedHost
from django.db import close_old_connections, connection
from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt

from core import outage, threads

#: /readyz answers within about this long whatever its dependencies do.
CHECK_TIMEOUT_SECONDS = 1.5
# Database checks get a thread of their own: a hung check never holds up the default pool
# (where heartbeats and the node's jobs run) nor a second /readyz.
def _db_checks() -> ThreadPoolExecutor:
    return threads.pool("a2a-readyz", 1)


def methods(*allowed: str):
    """Wrap a view (or a view callable) so any other method answers a JSON 405 with ``Allow``;
    the wrapped view takes no CSRF token (it changes nothing). ``GET`` allows ``HEAD`` too."""
    allowed_set = set(allowed) | ({"HEAD"} if "GET" in allowed else set())

    def decorate(view):
        def refuse(request):
            response = JsonResponse(
                {"error": f"method {request.method} not allowed: use "
                          f"{' or '.join(sorted(allowed_set))}"}, status=405)
            response["Allow"] = ", ".join(sorted(allowed_set))
            return response

        if asyncio.iscoroutinefunction(view):
            @wraps(view)
            async def checked(request, *args, **kwargs):
                if request.method not in allowed_set:
                    return refuse(request)
                return await view(request, *args, **kwargs)
        else:
            @wraps(view)
            def checked(request, *args, **kwargs):
                if request.method not in allowed_set:
                    return refuse(request)
                return view(request, *args, **kwargs)
        return csrf_exempt(checked)

    return decorate


@methods("GET")
async def healthz(request):
    return JsonResponse({"status": "ok"})


def _db_check() -> None:
    close_old_connections()
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    finally:
        connection.close()


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return f"unreachable: no answer within {CHECK_TIMEOUT_SECONDS}s"
    return f"unreachable: {type(exc).__name__}: {exc}"[:300]


async def _database() -> str:
    try:
        await asyncio.wait_for(
            asyncio.get_running_loop().run_in_executor(_db_checks(), _db_check),
            timeout=CHECK_TIMEOUT_SECONDS,
        )
    except Exception as exc:  # any driver error or the timeout means not ready
        outage.breaker.trip(exc)
        outage.breaker.ensure_probe()
        return _describe(exc)
    return "ok"


async def _broker() -> str:
    layer = get_channel_layer()
    try:
        await asyncio.wait_for(
            layer.send("_AGENTS_.readyz", {"type": "readyz"}), timeout=CHECK_TIMEOUT_SECONDS
        )
    except Exception as exc:  # connection refused, timeout, layer misconfigured
        return _describe(exc)
    return "ok"


@methods("GET")
async def readyz(request):
    """``{"status": "ok"|"unavailable", "checks": {"database": ..., "broker": ...}}``: 200 when
    every dependency answers, else 503 naming the one that is down (checks run concurrently)."""
    database, broker = await asyncio.gather(_database(), _broker())
    checks = {"database": database, "broker": broker}
    ready = database == "ok" and broker == "ok"
    response = JsonResponse(
        {
            "status": "ok" if ready else "unavailable",
            "checks": checks,
            "mode": "embedded" if settings.EMBEDDED else "distributed",
        },
        status=200 if ready else 503,
    )
    if not ready:
        response["Retry-After"] = str(outage.RETRY_AFTER_SECONDS)
    return response


def server_error(request):
    """``handler500``: a database outage anywhere in the stack answers the outage 503; anything
    else a JSON 500 without details (the traceback goes to the log, never to the client)."""
    exc = sys.exc_info()[1]
    if outage.is_database_outage(exc):
        outage.breaker.trip(exc)
        return outage.json_response()
    return JsonResponse({"error": "internal server error"}, status=500)


def not_found(request, exception=None):
    """``handler404``: JSON like every other answer of the API (never Django's HTML page)."""
    return JsonResponse({"error": "not found"}, status=404)


def bad_request(request, exception=None):
    """``handler400``: a Host this node does not answer to (``DisallowedHost``) says which
    setting lists the accepted ones; any other suspicious request a plain JSON 400."""
    if isinstance(exception, DisallowedHost):
        host = request.META.get("HTTP_HOST", "")[:200]
        return JsonResponse(
            {"error": f"host {host!r} is not one this node answers to: call it by a host name "
                      f"listed in its ALLOWED_HOSTS setting, or add {host!r} to ALLOWED_HOSTS"},
            status=400)
    return JsonResponse({"error": "bad request"}, status=400)


def permission_denied(request, exception=None):
    """``handler403``: JSON, never Django's HTML page."""
    return JsonResponse({"error": "forbidden"}, status=403)
