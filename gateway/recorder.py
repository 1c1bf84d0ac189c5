"""The gateway's one call into the console: :func:`record`, at the end of every request.

It only updates plain dicts and lists in memory (the gateway runs on one event loop per
process: no locks, no await, no database). :mod:`console.flusher` moves what accumulated to the
database every ``A2A_STATS_FLUSH_SECONDS``. Memory is bounded: at most ``MAX_KEYS`` pending
agent-minutes and ``A2A_AUDIT_MAX_PENDING`` audit rows; what does not fit is counted as dropped.

Calls the gateway refuses before any agent is involved (401, 403, 429, agent_not_found) are
audited by :func:`refuse`, aggregated: one row per caller, agent and outcome with a count, and
at most ``A2A_AUDIT_MAX_REFUSED_PER_MINUTE`` such rows per node and minute (the rest are counted
as dropped). A flood of refused calls, which address-keyed rate limiting answers before any
authentication, therefore adds a bounded number of rows whatever its rate.

Kept per agent and minute (cells of a list, see the ``C_*`` indexes): requests, gateway errors
after and before the agent received the request, request and response bytes, latency sum,
agent errors (outcome ``agent_error``: the agent answered a JSON-RPC error, or an HTTP error
status; the gateway relayed it), then the latency histogram (:mod:`gateway.histogram`).
"""

from __future__ import annotations

import time
from math import ceil, log2
from typing import Any

from gateway.histogram import BASE_MS, BUCKETS

C_REQUESTS, C_ERR_EXEC, C_ERR_NOEXEC, C_BYTES_IN, C_BYTES_OUT, C_LATENCY, C_STREAMS = range(7)
C_LAST_AT, C_LAST_OUTCOME, C_DIRTY = 7, 8, 9  # last call (time, outcome); changed since flush
C_ERR_AGENT = 10
C_HIST = 11
MAX_KEYS = 100_000

#: Outcomes that are not errors (the caller got the agent's 2xx/3xx answer, or left).
OK_OUTCOMES = frozenset({"ok", "client_disconnect"})
#: The outcome of an agent's own error answer (not the gateway's: counted apart).
AGENT_ERROR = "agent_error"

# Configured from settings by :func:`configure` (the flusher calls it when the node starts).
enabled = True
audit_mode = "errors"  # off | errors | all
audit_cap = 10_000
refused_cap = 60  # refused-call rows per minute

#: A minute's cells of one agent: counts, sums and the latency histogram (new_cells' layout).
Cells = list[Any]

stats: dict[tuple[str, int], Cells] = {}  # (agent_id, minute) -> cells
current: dict[str, Cells] = {}  # agent_id -> cells of the current minute (no tuple per call)
current_minute = [0]
clients: dict[str, float] = {}  # caller client id -> last call time, since last flush
audit: list[tuple[Any, ...]] = []
#: Refused calls since the last flush: (caller, agent_id, outcome) -> [first at, method,
#: HTTP status, count]. At most ``refused_cap`` keys are created per minute.
refused: dict[tuple[str, str, str], list[Any]] = {}
refused_minute = [0, 0]  # [minute, rows created in it]
dropped = {"audit": 0, "stats": 0, "refused": 0}


def new_cells() -> Cells:
    return [0, 0, 0, 0, 0, 0.0, 0, 0.0, "", 0, 0] + [0] * BUCKETS


def configure(*, stats_on: bool, audit: str, cap: int, refused_per_minute: int = 60) -> None:
    global enabled, audit_mode, audit_cap, refused_cap
    enabled, audit_mode, audit_cap = stats_on, audit, cap
    refused_cap = refused_per_minute


def reset() -> None:
    """Forget everything pending (tests; a fresh node)."""
    stats.clear()
    current.clear()
    current_minute[0] = 0
    clients.clear()
    audit.clear()
    refused.clear()
    refused_minute[0] = refused_minute[1] = 0
    dropped["audit"] = dropped["stats"] = dropped["refused"] = 0


def refuse(agent_id: str, caller: str, method: str, outcome: str, status: int) -> None:
    """Count one call refused before reaching an agent (audited unless ``A2A_AUDIT=off``)."""
    if audit_mode == "off":
        return
    key = (caller, agent_id, outcome)
    row = refused.get(key)
    if row is not None:
        row[3] += 1
        return
    now = time.time()
    minute = int(now) // 60
    if minute != refused_minute[0]:
        refused_minute[0], refused_minute[1] = minute, 0
    if refused_minute[1] >= refused_cap or len(refused) >= refused_cap:
        dropped["refused"] += 1
        return
    refused_minute[1] += 1
    refused[key] = [now, method, status, 1]


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
        minute = int(now) // 60
        if minute != current_minute[0]:
            current_minute[0] = minute
            current.clear()
        cells = current.get(agent_id)
        if cells is None:
            key = (agent_id, minute)
            cells = stats.get(key)
            if cells is None and len(stats) < MAX_KEYS:
                cells = stats[key] = new_cells()
            if cells is not None:
                current[agent_id] = cells
        if cells is not None:
            cells[C_REQUESTS] += 1
            if not ok:
                if outcome == AGENT_ERROR:
                    cells[C_ERR_AGENT] += 1
                else:
                    cells[C_ERR_EXEC if executed else C_ERR_NOEXEC] += 1
            cells[C_BYTES_IN] += request_bytes
            cells[C_BYTES_OUT] += exchange.nbytes
            cells[C_LATENCY] += seconds
            ms = seconds * 1000.0  # gateway.histogram.bucket_of, inlined: the hot path
            if ms <= BASE_MS:
                cells[C_HIST] += 1
            else:
                index = ceil(2.0 * log2(ms / BASE_MS))
                cells[C_HIST + (index if index < BUCKETS else BUCKETS - 1)] += 1
            cells[C_LAST_AT] = now
            cells[C_LAST_OUTCOME] = outcome
            cells[C_DIRTY] = 1
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
