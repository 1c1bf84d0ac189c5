"""Who delivers: Celery workers (``A2A_PUSH_DELIVERY=celery``, distributed mode's default) or
the serving node's own threads (``inprocess``, embedded mode's default: no worker needed).

:func:`enqueue` runs when a push is committed. Celery: the config's ``deliver_task`` is sent
to the workers; a run whose head must wait re-sends itself with that countdown, and beat's (or
the nodes', ``A2A_NODE_PERIODIC_TASKS``) ``push-sweep`` re-sends whatever is due (a lost
message, a worker that died mid-attempt). In-process: the config is handed to the
``a2a-push-delivery`` pool (``A2A_PUSH_DELIVERY_THREADS`` threads; a config queued once at a
time, at most :data:`MAX_QUEUED` configs waiting), and the node's sweeper, started with it,
hands over what is due every ``A2A_PUSH_SWEEP_SECONDS`` (retries after their backoff).
"""

from __future__ import annotations

import asyncio
import logging
import threading

from django.conf import settings
from django.db import connections

from core import threads
from push import delivery, signing

logger = logging.getLogger(__name__)

POOL = "a2a-push-delivery"
#: Configs waiting for an in-process delivery thread at most (the sweeper catches up beyond).
MAX_QUEUED = 10_000

_queued: set[str] = set()
_queued_lock = threading.Lock()
_sweeper: asyncio.Task[None] | None = None


def inprocess() -> bool:
    return bool(settings.A2A_PUSH_DELIVERY == "inprocess")


def enqueue(relay_id: str) -> None:
    """Have the pushes of ``relay_id`` delivered (after the commit that stored one)."""
    if not inprocess():
        from push.tasks import deliver_task

        deliver_task.delay(relay_id)
        return
    with _queued_lock:
        if relay_id in _queued or len(_queued) >= MAX_QUEUED:
            return
        _queued.add(relay_id)
    threads.pool(POOL, settings.A2A_PUSH_DELIVERY_THREADS).submit(_run, relay_id)


def _run(relay_id: str) -> None:
    with _queued_lock:
        _queued.discard(relay_id)
    try:
        wait = delivery.deliver(relay_id)
        if wait == 0.0:
            enqueue(relay_id)  # its budget spent: after the other configs waiting
    except Exception:
        logger.exception("push delivery of config %s failed", relay_id)
    finally:
        connections.close_all()  # this thread's; the pool's threads live long


def sweep_inprocess() -> None:
    try:
        for relay_id in delivery.due_configs():
            enqueue(relay_id)
        delivery.purge()
    finally:
        connections.close_all()


async def _sweep_loop() -> None:
    failing = 0
    while True:
        await asyncio.sleep(settings.A2A_PUSH_SWEEP_SECONDS)
        if not inprocess():
            continue
        try:
            await asyncio.get_running_loop().run_in_executor(
                threads.pool("a2a-push-sweep", 1), sweep_inprocess)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a database outage: the next sweep tries again
            if not failing:  # logged once per run of failures
                logger.warning("push sweep failed: %s: %s (logged once until it works again)",
                               type(exc).__name__, exc)
            failing += 1
        else:
            if failing:
                logger.warning("push sweep works again (%d failed sweeps)", failing)
                failing = 0


async def start() -> None:
    """The node's start: the signing keys read (a key file that cannot sign stops the node
    here, naming it) and the in-process sweeper started."""
    global _sweeper
    signing.keys()
    if _sweeper is None or _sweeper.done():
        _sweeper = asyncio.get_running_loop().create_task(_sweep_loop(), name="push-sweeper")


async def stop() -> None:
    global _sweeper
    if _sweeper is not None:
        _sweeper.cancel()
        _sweeper = None
    with _queued_lock:
        _queued.clear()
