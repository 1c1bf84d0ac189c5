"""The node's background job that moves the recorder's counts and audit rows to the database.

Every ``A2A_STATS_FLUSH_SECONDS`` it takes what accumulated (on the event loop, a few dict
operations), then writes it from a worker thread in a handful of bulk statements: agent-minute
rows are upserted with this node's absolute values, call and registry audit rows inserted,
API clients' last use upserted. Once a minute it purges rows past their retention. A failed
write keeps the counts (they are rewritten next time) and drops the audit rows (counted).
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime, timedelta

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import close_old_connections

from console import audit
from gateway import recorder
from gateway.recorder import (
    C_BYTES_IN,
    C_BYTES_OUT,
    C_DIRTY,
    C_ERR_AGENT,
    C_ERR_EXEC,
    C_ERR_NOEXEC,
    C_HIST,
    C_LAST_AT,
    C_LAST_OUTCOME,
    C_LATENCY,
    C_REQUESTS,
    C_STREAMS,
)

logger = logging.getLogger(__name__)

PURGE_EVERY_SECONDS = 60.0
_task: asyncio.Task | None = None
_last_purge = 0.0


def _ts(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


def _sample_streams(minute: int) -> None:
    """Record the SSE streams open now as the minute's high-water mark."""
    from gateway import runtime

    node = runtime.current_node()
    if node is None:
        return
    for agent_id, subscriber in list(node.manager.subscribers.items()):
        active = subscriber.sse_active
        if not active:
            continue
        key = (agent_id, minute)
        cells = recorder.stats.get(key)
        if cells is None:
            if len(recorder.stats) >= recorder.MAX_KEYS:
                continue
            cells = recorder.stats[key] = recorder.new_cells()
        if active > cells[C_STREAMS]:
            cells[C_STREAMS] = active
            cells[C_DIRTY] = 1


def _node_id() -> str:
    """The id this node's rows are written under: the running gateway node's, else the
    process's (``core.lifecycle.node_id``: ``NODE_ID``, or what ``serve`` derived from its port)."""
    from core import lifecycle as node_config
    from gateway import runtime

    node = runtime.current_node()
    return node.settings.NODE_ID if node is not None else node_config.node_id()


def take_batch() -> dict:
    """What to write now. Runs on the event loop: plain dict work, no await, no I/O."""
    minute = int(time.time()) // 60
    try:
        _sample_streams(minute)
    except Exception:  # the gateway may be stopping
        logger.debug("stream sampling failed", exc_info=True)
    rows = []
    for key, cells in list(recorder.stats.items()):
        if cells[C_DIRTY]:
            cells[C_DIRTY] = 0
            rows.append((key, list(cells)))
        elif key[1] < minute - 1:
            # Over and written: nothing will change this minute any more.
            del recorder.stats[key]
    clients = dict(recorder.clients)
    recorder.clients.clear()
    calls = recorder.audit[:]
    del recorder.audit[: len(calls)]
    refused = list(recorder.refused.items())
    recorder.refused.clear()
    for (caller, agent_id, outcome), (at, method, status, count) in refused:
        calls.append((at, caller, agent_id, method, outcome, False, status, 0.0, 0, 0, count))
    return {"rows": rows, "clients": clients, "calls": calls, "changes": audit.take()}


def _call_row(call: tuple, node_id: str):
    from console.models import CallRecord
    from registry.ids import split_agent_key

    at, caller, agent_id, method, outcome, executed, status, seconds, req, resp, *count = call
    return CallRecord(
        at=_ts(at),
        caller=caller,
        tenant=split_agent_key(agent_id)[0][:40],
        agent_id=agent_id,
        method=method[:100],
        outcome=outcome,
        executed=executed,
        http_status=status,
        latency_ms=seconds * 1000.0,
        request_bytes=req,
        response_bytes=resp,
        node_id=node_id,
        count=count[0] if count else 1,
    )


def write_batch(batch: dict, node_id: str) -> None:
    """Write one batch (sync; a worker thread)."""
    from console.models import AgentMinute, CallRecord, ClientUsage

    rows = []
    for (agent_id, minute), cells in batch["rows"]:
        last_at = cells[C_LAST_AT]
        rows.append(
            AgentMinute(
                agent_id=agent_id,
                minute=_ts(minute * 60),
                node_id=node_id,
                requests=cells[C_REQUESTS],
                errors_executed=cells[C_ERR_EXEC],
                errors_not_executed=cells[C_ERR_NOEXEC],
                errors_agent=cells[C_ERR_AGENT],
                bytes_in=cells[C_BYTES_IN],
                bytes_out=cells[C_BYTES_OUT],
                latency_sum=cells[C_LATENCY],
                streams_max=cells[C_STREAMS],
                histogram=cells[C_HIST:],
                last_call_at=_ts(last_at) if last_at else None,
                last_outcome=cells[C_LAST_OUTCOME],
            )
        )
    if rows:
        AgentMinute.objects.bulk_create(
            rows,
            update_conflicts=True,
            unique_fields=["agent_id", "minute", "node_id"],
            update_fields=[
                "requests",
                "errors_executed",
                "errors_not_executed",
                "errors_agent",
                "bytes_in",
                "bytes_out",
                "latency_sum",
                "streams_max",
                "histogram",
                "last_call_at",
                "last_outcome",
            ],
        )
    if batch["calls"]:
        CallRecord.objects.bulk_create([_call_row(call, node_id) for call in batch["calls"]])
    if batch["clients"]:
        ClientUsage.objects.bulk_create(
            [
                ClientUsage(client_id=c, node_id=node_id, last_used_at=_ts(t))
                for c, t in batch["clients"].items()
            ],
            update_conflicts=True,
            unique_fields=["client_id", "node_id"],
            update_fields=["last_used_at"],
        )
    audit.write(batch["changes"])


def purge(now: datetime | None = None) -> dict[str, int]:
    """Delete statistics and audit rows past their retention."""
    from console.models import AgentMinute, CallRecord, RegistryChange

    now = now or datetime.now(UTC)
    stats_cut = now - timedelta(hours=settings.A2A_STATS_RETENTION_HOURS)
    audit_cut = now - timedelta(hours=settings.A2A_AUDIT_RETENTION_HOURS)
    return {
        "minutes": AgentMinute.objects.filter(minute__lt=stats_cut).delete()[0],
        "calls": CallRecord.objects.filter(at__lt=audit_cut).delete()[0],
        "changes": RegistryChange.objects.filter(at__lt=audit_cut).delete()[0],
    }


def _write(batch: dict, node_id: str, do_purge: bool) -> None:
    close_old_connections()
    try:
        write_batch(batch, node_id)
        if do_purge:
            purge()
    finally:
        close_old_connections()


async def flush_once(*, do_purge: bool = False) -> None:
    """Take a batch and write it; on failure the counts are kept for the next flush."""
    batch = take_batch()
    if not any(batch[k] for k in ("rows", "calls", "clients", "changes")) and not do_purge:
        return
    try:
        await sync_to_async(_write, thread_sensitive=False)(batch, _node_id(), do_purge)
    except Exception as exc:
        logger.warning("console flush failed: %s: %s", type(exc).__name__, exc)
        for key, cells in batch["rows"]:
            live = recorder.stats.setdefault(key, cells)  # absolute values: rewritten later
            live[C_DIRTY] = 1
        recorder.dropped["audit"] += len(batch["calls"])
        recorder.dropped["changes"] = recorder.dropped.get("changes", 0) + len(batch["changes"])


async def _loop(interval: float) -> None:
    global _last_purge
    while True:
        await asyncio.sleep(interval)
        now = time.monotonic()
        do_purge = now - _last_purge >= PURGE_EVERY_SECONDS
        if do_purge:
            _last_purge = now
        try:
            await flush_once(do_purge=do_purge)
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("console flush job failed")


async def start() -> None:
    """Node startup hook: configure the recorder and start the flush job."""
    global _task
    if _task is None or _task.done():
        # A fresh node: nothing of an earlier node in this process (tests run many) may be
        # rewritten under this one's id.
        recorder.reset()
        audit.pending.clear()
    recorder.configure(
        stats_on=settings.A2A_STATS, audit=settings.A2A_AUDIT, cap=settings.A2A_AUDIT_MAX_PENDING,
        refused_per_minute=settings.A2A_AUDIT_MAX_REFUSED_PER_MINUTE,
    )
    if _task is not None and not _task.done():
        return
    audit.buffered = True
    _task = asyncio.get_running_loop().create_task(
        _loop(settings.A2A_STATS_FLUSH_SECONDS), name="console-flush"
    )


async def stop() -> None:
    """Node shutdown hook: stop the job and write what is left."""
    global _task
    task, _task = _task, None
    if task is not None:
        task.cancel()
        try:
            await task
        except (asyncio.CancelledError, Exception):
            pass
    audit.buffered = False
    try:
        await asyncio.wait_for(flush_once(), timeout=5)
    except Exception as exc:
        logger.warning("final console flush failed: %s", exc)
