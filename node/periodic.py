"""Periodic jobs run by the serving node itself: the beat schedule's tasks, in-process.

Embedded mode: every ``CELERY_BEAT_SCHEDULE`` entry (this is embedded mode's Celery beat).

Distributed mode: the entries named in ``A2A_NODE_PERIODIC_TASKS`` (agent expiry by default) run
on every serving node under a cluster-wide Redis lock taken for 90 % of the interval and never
released early, so about one node runs each per interval, whichever nodes are alive. Expiry and
node-death recovery thus need no single beat process; beat may run them as well (they are
idempotent). While Redis is unreachable a node runs them without the lock: duplicated work beats
none.

Each run happens in a worker thread so the event loop never blocks, and an entry never overlaps
itself.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

from channels.db import database_sync_to_async
from django.conf import settings

logger = logging.getLogger(__name__)

LOCK_PREFIX = "periodic:"


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
    from celery import current_app as app  # the project's app (config/celery.py), set at start

    app.tasks[task_name].apply(throw=True)


def _claim(name: str, interval: float) -> bool:
    """Whether this node runs ``name`` this interval (the cluster-wide lock is ours)."""
    from core.locks import default_locks

    try:
        # Held until it expires: one run per interval across the nodes.
        return default_locks().hold(LOCK_PREFIX + name, ttl=interval * 0.9) is not None
    except Exception as exc:  # Redis down: run anyway, the jobs are idempotent
        logger.warning("periodic %s: lock unavailable (%s), running without it", name, exc)
        return True


def _run_claimed(name: str, task_name: str, interval: float) -> None:
    if _claim(name, interval):
        _run_task(task_name)


async def _loop(name: str, task_name: str, interval: float, locked: bool) -> None:
    """Run the task every ``interval``. Failures are logged once per run of failures (an
    outage makes every run fail the same way): the first, then one line when it works again
    with how many runs failed."""
    failing_since: float | None = None
    failed_runs = 0
    loop = asyncio.get_running_loop()
    while True:
        try:
            if locked:
                await database_sync_to_async(_run_claimed, thread_sensitive=False)(
                    name, task_name, interval
                )
            else:
                await database_sync_to_async(_run_task, thread_sensitive=False)(task_name)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            failed_runs += 1
            if failing_since is None:
                failing_since = loop.time()
                logger.warning("periodic task %s (%s) failed: %s: %s (logged once until it "
                               "runs again)", name, task_name, type(exc).__name__, exc)
        else:
            if failing_since is not None:
                logger.warning("periodic task %s runs again after %.1fs (%d failed runs)",
                               name, loop.time() - failing_since, failed_runs)
                failing_since, failed_runs = None, 0
        await asyncio.sleep(interval)


def start_periodic_tasks(*, distributed: bool | None = None) -> list[asyncio.Task]:
    """Start one asyncio task per entry on the running loop; cancel them to stop.

    ``distributed`` (default: not ``settings.EMBEDDED``): only ``A2A_NODE_PERIODIC_TASKS``,
    under the cluster-wide lock."""
    from celery import current_app as app  # the project's app (config/celery.py), set at start

    if distributed is None:
        distributed = not settings.EMBEDDED
    app.loader.import_default_modules()
    wanted = set(settings.A2A_NODE_PERIODIC_TASKS) if distributed else None
    tasks = []
    for name, entry in settings.CELERY_BEAT_SCHEDULE.items():
        if wanted is not None and name not in wanted:
            continue
        interval = _interval_seconds(entry["schedule"])
        tasks.append(
            asyncio.get_running_loop().create_task(
                _loop(name, entry["task"], interval, distributed), name=f"periodic:{name}"  # type: ignore[arg-type]  # a task name
            )
        )
        logger.info(
            "node scheduler: %s every %.1fs%s",
            entry["task"],
            interval,
            " under a cluster-wide lock" if distributed else "",
        )
    return tasks
