"""Process health (/healthz) and readiness (/readyz: database and broker reachable)."""

from __future__ import annotations

import asyncio

from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.db import connection
from django.http import JsonResponse


async def healthz(request):
    return JsonResponse({"status": "ok"})


def _db_ok() -> str | None:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return None
    except Exception as exc:  # any driver error means not ready
        return f"{type(exc).__name__}: {exc}"[:300]
    finally:
        connection.close()


async def _broker_ok() -> str | None:
    layer = get_channel_layer()
    try:
        await asyncio.wait_for(layer.send("_AGENTS_.readyz", {"type": "readyz"}), timeout=2)
        return None
    except Exception as exc:  # connection refused, timeout, layer misconfigured
        return f"{type(exc).__name__}: {exc}"[:300]


async def readyz(request):
    db_error = await sync_to_async(_db_ok, thread_sensitive=False)()
    broker_error = await _broker_ok()
    checks = {"database": db_error or "ok", "broker": broker_error or "ok"}
    ready = not db_error and not broker_error
    return JsonResponse({"status": "ok" if ready else "unavailable", "checks": checks},
                        status=200 if ready else 503)
