"""The gateway's one call into the console: :func:`record`, at the end of every request.

It only updates plain dicts and lists in memory (the gateway runs on one event loop per
process: no locks, no await, no database). :mod:`console.flusher` moves what accumulated to the
database every ``A2A_STATS_FLUSH_SECONDS``. Memory is bounded: at most ``MAX_KEYS`` pending
agent-minutes and ``A2A_AUDIT_MAX_PENDING`` audit rows; what does not fit is counted as dropped.

Kept per agent and minute (cells of a list, see the ``C_*`` indexes): requests, errors after
and before the agent received the request, request and response bytes, latency sum, then the
latency histogram (:mod:`console.histogram`).
"""

from __future__ import annotations

import time
from typing import Any

from console.histogram import BUCKETS, bucket_of

C_REQUESTS, C_ERR_EXEC, C_ERR_NOEXEC, C_BYTES_IN, C_BYTES_OUT, C_LATENCY, C_STREAMS = range(7)
C_HIST = 7
MAX_KEYS = 100_000

#: Outcomes that are not errors (the caller got the agent's 2xx/3xx answer, or left).
OK_OUTCOMES = frozenset({"ok", "client_disconnect"})

# Configured from settings by :func:`configure` (the flusher calls it when the node starts).
enabled = True
audit_mode = "errors"  # off | errors | all
audit_cap = 10_000

stats: dict[tuple[str, int], list] = {}  # (agent_id, minute) -> cells
dirty: set[tuple[str, int]] = set()
last_call: dict[str, tuple[float, str]] = {}  # agent_id -> (time, outcome) since last flush
clients: dict[str, float] = {}  # caller client id -> last call time, since last flush
audit: list[tuple] = []
dropped = {"audit": 0, "stats": 0}


def configure(*, stats_on: bool, audit: str, cap: int) -> None:
    global enabled, audit_mode, audit_cap
    enabled, audit_mode, audit_cap = stats_on, audit, cap


def reset() -> None:
    """Forget everything pending (tests; a fresh node)."""
    stats.clear()
    dirty.clear()
    last_call.clear()
    clients.clear()
    audit.clear()
    dropped["audit"] = dropped["stats"] = 0


def record(
    agent_id: str, caller: str, method: str, exchange: Any, request_bytes: int, seconds: float
) -> None:
    """Count one finished gateway request (``exchange``: the handler's Exchange)."""
    mode = audit_mode
    if not enabled and mode == "off":
        return
    now = time.time()
    outcome = exchange.outcome
    ok = outcome in OK_OUTCOMES
    executed = exchange.started
    if enabled:
        key = (agent_id, int(now // 60))
        cells = stats.get(key)
        if cells is None and len(stats) < MAX_KEYS:
            cells = stats[key] = [0, 0, 0, 0, 0, 0.0, 0] + [0] * BUCKETS
        if cells is not None:
            cells[C_REQUESTS] += 1
            if not ok:
                cells[C_ERR_EXEC if executed else C_ERR_NOEXEC] += 1
            cells[C_BYTES_IN] += request_bytes
            cells[C_BYTES_OUT] += exchange.nbytes
            cells[C_LATENCY] += seconds
            cells[C_HIST + bucket_of(seconds)] += 1
            dirty.add(key)
            last_call[agent_id] = (now, outcome)
            clients[caller] = now
        else:
            dropped["stats"] += 1
    if mode == "all" or (mode == "errors" and not ok):
        if len(audit) < audit_cap:
            audit.append(
                (
                    now,
                    caller,
                    agent_id,
                    method,
                    outcome,
                    executed,
                    exchange.status,
                    seconds,
                    request_bytes,
                    exchange.nbytes,
                )
            )
        else:
            dropped["audit"] += 1
