"""Celery tasks of push delivery (``A2A_PUSH_DELIVERY=celery``): they take ids and are
idempotent (a push is claimed before it is tried)."""

from __future__ import annotations

from celery import shared_task
from django.conf import settings

from push import delivery


@shared_task(name="push.tasks.deliver_task", ignore_result=True)  # type: ignore[untyped-decorator]  # celery has no types
def deliver_task(relay_id: str) -> None:
    """Deliver the due pushes of one config, in order; re-sent when its head must wait."""
    wait = delivery.deliver(relay_id)
    if wait is not None:
        deliver_task.apply_async((relay_id,), countdown=wait)


@shared_task(name="push.tasks.sweep_task", ignore_result=True)  # type: ignore[untyped-decorator]  # celery has no types
def sweep_task() -> None:
    """Send a delivery task for every config with a push due (Celery delivery only: the
    in-process mode's sweeper runs on the node, push.worker); purge old delivered pushes."""
    if settings.A2A_PUSH_DELIVERY != "celery":
        return
    for relay_id in delivery.due_configs():
        deliver_task.delay(relay_id)
    delivery.purge()
