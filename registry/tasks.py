"""Celery tasks of the registry. Each calls one service and is idempotent."""

from celery import shared_task

from registry import services


@shared_task(name="registry.tasks.agents_expire_task", ignore_result=True)
def agents_expire_task() -> dict[str, int]:
    """Mark agents past their TTL expired and purge old expired rows."""
    return services.agents_expire()
