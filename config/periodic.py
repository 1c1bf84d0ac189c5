"""Embedded mode's stand-in for Celery beat: runs the beat schedule's tasks in-process.

The same task functions and intervals as ``CELERY_BEAT_SCHEDULE`` (which beat uses in
distributed mode); each run happens in a worker thread so the event loop never blocks, and one
entry never overlaps itself.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

from channels.db import database_sync_to_async
from django.conf import settings

logger = logging.getLogger(__name__)


def _interval_seconds(schedule) -> float:
    if isinstance(schedule, timedelta):
        return schedule.total_seconds()
    if isinstance(schedule, (int, float)):
        return float(schedule)
    run_every = getattr(schedule, "run_every", None)
    if isinstance(run_every, timedelta):
        return run_every.total_seconds()
    raise ValueError(f"unsupported schedule {schedule!r} for the embedded runner")


def _run_task(task_name: str) -> None:
    from config.celery import app

    app.tasks[task_name].apply(throw=True)


async def _loop(name: str, task_name: str, interval: float) -> None:
    while True:
        try:
            await database_sync_to_async(_run_task, thread_sensitive=False)(task_name)
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("periodic task %s (%s) failed", name, task_name)
        await asyncio.sleep(interval)


def start_periodic_tasks() -> list[asyncio.Task]:
    """Start one asyncio task per beat entry on the running loop; cancel them to stop."""
    from config.celery import app

    app.loader.import_default_modules()
    tasks = []
    for name, entry in settings.CELERY_BEAT_SCHEDULE.items():
        interval = _interval_seconds(entry["schedule"])
        tasks.append(asyncio.get_running_loop().create_task(
            _loop(name, entry["task"], interval), name=f"periodic:{name}"
        ))
        logger.info("embedded scheduler: %s every %.1fs", entry["task"], interval)
    return tasks
