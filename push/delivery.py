"""Delivering a relayed config's pushes to the caller's webhook: at least once, in order.

One config's pushes form a queue ordered by their sequence (a config is for one task). Only
its head -- the lowest sequence neither delivered nor dead -- is ever tried, and only by the
worker that claimed it (``claimed_until``: a conditional update, so two workers never have one
push in flight; a worker that dies mid-attempt loses its claim when it lapses, and the push is
tried again: at least once). A later push waits for the earlier ones.

An attempt is one POST under the outbound policy (the connect-time address checks agent URLs
get, TLS, no redirects, no proxy variables) bounded whole by ``A2A_PUSH_TIMEOUT_SECONDS`` (a
webhook that never answers, or answers a byte at a time, is cut there) and reading at most
``A2A_PUSH_MAX_RESPONSE_BYTES`` of the answer. A 2xx delivers; anything else fails the attempt:
retried after an exponential backoff with jitter (``A2A_PUSH_BACKOFF_SECONDS`` doubled per
attempt, at most ``A2A_PUSH_BACKOFF_MAX_SECONDS``, times a random 0.5-1.0), until
``A2A_PUSH_MAX_ATTEMPTS``, then dead (dead-lettered; the queue goes on).

Headers of a delivery: ``Content-Type: application/json``, the caller's own
``X-A2A-Notification-Token`` and ``Authorization`` (from its config's ``authentication``),
``Idempotency-Key`` (the same on every attempt of one push), ``X-A2A-Task-Id``,
``X-A2A-Push-Sequence`` and the platform's ``X-A2A-Push-Signature`` (:mod:`push.signing`).
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import httpx
from django.conf import settings
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from outbound.clients import httpx_async_client
from outbound.errors import OutboundError, describe
from push import metrics, signing
from push.models import PushDelivery, RelayedConfig

#: The states a push still waits in.
OPEN = (PushDelivery.State.PENDING, PushDelivery.State.FAILED)
#: Pushes one run delivers at most before it hands over (a run is re-enqueued when it stops).
RUN_BUDGET = 50
#: Configs one sweep enqueues at most.
SWEEP_LIMIT = 500
#: Delivered pushes one purge deletes at most.
PURGE_LIMIT = 1000
PURGE_EVERY_SECONDS = 60.0


@dataclass(frozen=True)
class Outcome:
    ok: bool
    status: int | None
    error: str


def authorization(authentication: Any) -> str | None:
    """The ``Authorization`` value of a config's ``authentication``: A2A 1.0 ``{scheme,
    credentials}``, A2A 0.3 ``{schemes: [...], credentials}``; None without credentials."""
    if not isinstance(authentication, dict):
        return None
    credentials = authentication.get("credentials")
    scheme = authentication.get("scheme")
    if not scheme:
        schemes = authentication.get("schemes")
        scheme = schemes[0] if isinstance(schemes, list) and schemes else None
    if not isinstance(credentials, str) or not credentials or not isinstance(scheme, str):
        return None
    return f"{scheme} {credentials}"


def headers_of(config: RelayedConfig, push: PushDelivery, body: bytes) -> dict[str, str]:
    headers = {
        "Content-Type": "application/json",
        "Idempotency-Key": push.idempotency_key,
        "X-A2A-Task-Id": push.task_id,
        "X-A2A-Push-Sequence": str(push.sequence),
        signing.HEADER: signing.sign(
            body=body, task_id=push.task_id, config_id=config.config_id or config.pk,
            relay_id=config.pk, sequence=push.sequence,
            idempotency_key=push.idempotency_key),
    }
    if config.token:
        headers["X-A2A-Notification-Token"] = config.token
    auth = authorization(config.authentication)
    if auth:
        headers["Authorization"] = auth
    return headers


async def _post(url: str, body: bytes, headers: dict[str, str]) -> Outcome:
    total = settings.A2A_PUSH_TIMEOUT_SECONDS
    cap = settings.A2A_PUSH_MAX_RESPONSE_BYTES
    client = httpx_async_client(timeout=httpx.Timeout(total), limits=httpx.Limits(
        max_connections=1, max_keepalive_connections=0), transport="httpx")
    try:
        async with asyncio.timeout(total):
            async with client.stream("POST", url, content=body, headers=headers) as response:
                read = 0
                async for chunk in response.aiter_raw():
                    read += len(chunk)
                    if read >= cap:
                        break  # the answer is not needed beyond its status
            if 200 <= response.status_code < 300:
                return Outcome(True, response.status_code, "")
            return Outcome(False, response.status_code, f"HTTP {response.status_code}")
    except TimeoutError:
        return Outcome(False, None, f"no answer within {total:g}s")
    except (httpx.HTTPError, httpx.InvalidURL, OutboundError, OSError) as exc:
        return Outcome(False, None, describe(exc)[:500] or type(exc).__name__)
    finally:
        await client.aclose()


def attempt(config: RelayedConfig, push: PushDelivery) -> Outcome:
    """One delivery attempt (blocking: runs its own event loop)."""
    body = bytes(push.body)
    return asyncio.run(_post(config.url, body, headers_of(config, push, body)))


def backoff(attempts: int) -> float:
    """Seconds before the attempt after the ``attempts``-th failed: exponential, jittered."""
    base: float = settings.A2A_PUSH_BACKOFF_SECONDS
    most: float = settings.A2A_PUSH_BACKOFF_MAX_SECONDS
    ceiling = min(most, base * 2.0 ** min(attempts - 1, 30))
    return ceiling * random.uniform(0.5, 1.0)


def _claim(push: PushDelivery) -> bool:
    """Claim ``push`` as read: still open, due, unclaimed (or its claim lapsed) and tried no
    more times than when it was read -- another deliverer that tried it since (and set its
    backoff) makes this claim fail, so a stale read never retries it early or miscounts."""
    now = timezone.now()
    lease = now + timedelta(seconds=settings.A2A_PUSH_TIMEOUT_SECONDS
                                    + settings.A2A_PUSH_CLAIM_MARGIN_SECONDS)
    return PushDelivery.objects.filter(
        pk=push.pk, state__in=OPEN, attempts=push.attempts, next_attempt_at__lte=now).filter(
        Q(claimed_until__isnull=True) | Q(claimed_until__lt=now)).update(
        claimed_until=lease) == 1


def _record(push: PushDelivery, outcome: Outcome) -> float | None:
    """Write an attempt's outcome; the seconds until the push is due again (None: done)."""
    now = timezone.now()
    attempts = push.attempts + 1
    fields: dict[str, Any] = {"attempts": attempts, "claimed_until": None,
                              "last_status": outcome.status, "last_error": outcome.error}
    wait: float | None = None
    if outcome.ok:
        fields.update(state=PushDelivery.State.DELIVERED, finished_at=now,
                      latency_ms=(now - push.created_at).total_seconds() * 1000)
    elif attempts >= settings.A2A_PUSH_MAX_ATTEMPTS:
        fields.update(state=PushDelivery.State.DEAD, finished_at=now)
    else:
        wait = backoff(attempts)
        fields.update(state=PushDelivery.State.FAILED,
                      next_attempt_at=now + timedelta(seconds=wait))
    PushDelivery.objects.filter(pk=push.pk).update(**fields)
    metrics.count("delivered" if outcome.ok else "retried" if wait is not None else "dead")
    return wait


def deliver(relay_id: str, *, budget: int = RUN_BUDGET) -> float | None:
    """Deliver the due pushes of one config, in order, until its queue is empty (None), its
    head is not due (the seconds until it is), another worker holds its head (None) or
    ``budget`` pushes were tried (0.0: run again)."""
    for _ in range(budget):
        head = PushDelivery.objects.filter(config_id=relay_id, state__in=OPEN).order_by(
            "sequence").select_related("config").first()
        if head is None:
            return None
        due_in = (head.next_attempt_at - timezone.now()).total_seconds()
        if due_in > 0:
            return due_in
        if not _claim(head):
            return None
        wait = _record(head, attempt(head.config, head))
        if wait is not None:
            return wait
    return 0.0


def due_configs(limit: int = SWEEP_LIMIT) -> list[str]:
    """Configs with a push due now and not held by a worker."""
    now = timezone.now()
    rows = PushDelivery.objects.filter(state__in=OPEN, next_attempt_at__lte=now).filter(
        Q(claimed_until__isnull=True) | Q(claimed_until__lt=now)).order_by(
        "config_id").values_list("config_id", flat=True).distinct()[:limit]
    return list(rows)


_last_purge = 0.0


def purge() -> int:
    """Delete delivered pushes older than ``A2A_PUSH_RETENTION_SECONDS``, then the configs
    done with (:func:`purge_configs`): bounded batches, at most once every
    :data:`PURGE_EVERY_SECONDS` per process (the sweeps run far more often). The rows deleted."""
    global _last_purge
    now = time.monotonic()
    if now - _last_purge < PURGE_EVERY_SECONDS:
        return 0
    _last_purge = now
    before = timezone.now() - timedelta(seconds=settings.A2A_PUSH_RETENTION_SECONDS)
    ids = list(PushDelivery.objects.filter(
        state=PushDelivery.State.DELIVERED, finished_at__lt=before).values_list(
        "pk", flat=True)[:PURGE_LIMIT])
    deleted = PushDelivery.objects.filter(pk__in=ids).delete()[0] if ids else 0
    return deleted + purge_configs()


def purge_configs() -> int:
    """Delete (a bounded batch of) the relayed configs holding no push pending, retrying or
    dead whose task a push showed done more than ``A2A_PUSH_RETENTION_SECONDS`` ago, or that
    got no push for ``A2A_PUSH_CONFIG_RETENTION_SECONDS`` (counted from their creation when
    they never got one); their delivered pushes go with them. The configs deleted."""
    now = timezone.now()
    done_before = now - timedelta(seconds=settings.A2A_PUSH_RETENTION_SECONDS)
    idle_before = now - timedelta(seconds=settings.A2A_PUSH_CONFIG_RETENTION_SECONDS)
    held = PushDelivery.objects.filter(config_id=OuterRef("pk")).exclude(
        state=PushDelivery.State.DELIVERED)
    gone = (Q(task_done_at__lt=done_before) | Q(last_push_at__lt=idle_before)
            | Q(last_push_at__isnull=True, created_at__lt=idle_before)) & ~Exists(held)
    ids = list(RelayedConfig.objects.filter(gone).values_list("pk", flat=True)[:PURGE_LIMIT])
    if not ids:
        return 0
    # Checked again as they are deleted: a push taken meanwhile keeps its config.
    return RelayedConfig.objects.filter(gone, pk__in=ids).delete()[1].get(
        RelayedConfig._meta.label, 0)
