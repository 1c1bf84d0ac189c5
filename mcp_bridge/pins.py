"""Tool sets pinned to a discovery snapshot, for stateless MCP clients.

A client that wants its tool set to stay stable names a discovery session or snapshot in the
URL it is configured with: ``/mcp?session=<session_id>`` (the session is pinned to the current
snapshot on its first use, exactly as ``POST /api/v1/sessions`` pins it, and keeps that
snapshot until it ends or idles out; a new session sees the newest snapshot) or
``/mcp?snapshot=<digest>`` (a retained snapshot). Its tools are then the snapshot's agents (with
the snapshot's reviewed descriptions) that are routable and that the caller may call; other
agents are unknown tools for it. Sessions and snapshots are the caller's tenant's
(docs/tenants.md): another tenant's are answered as ones that do not exist.

Snapshots are immutable, so their agent lists are kept in memory by snapshot id (at most
:data:`MAX_SNAPSHOTS`); which snapshot a session is pinned to is read from the database at most
every :data:`SESSION_TTL_SECONDS` per session (each read restarts the session's idle clock).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from urllib.parse import parse_qsl

from channels.db import database_sync_to_async
from django.db import DatabaseError

from core import outage
from discovery.models import Snapshot
from discovery.sessions import SessionError, session_pin
from discovery.snapshots import snapshot_get
from registry.ids import agent_key

MAX_SNAPSHOTS = 64
MAX_SESSIONS = 10_000
SESSION_TTL_SECONDS = 10.0


class PinError(Exception):
    """The pin named in the URL cannot be used; the message says why."""


@dataclass(frozen=True)
class Pinned:
    """A pinned tool set: the snapshot's agents and their reviewed descriptions."""

    digest: str
    version: int
    descriptions: dict[str, str]  # routing key -> reviewed description ("" when none)


_snapshots: dict[int, Pinned] = {}
_digests: dict[tuple[str, str], Pinned] = {}  # (tenant, digest) -> a snapshot pinned by digest
_sessions: dict[tuple[str, str], tuple[int, float]] = {}  # (tenant, session id) -> (snapshot
# id, read at)


def _pinned(snapshot: Snapshot) -> Pinned:
    pinned = _snapshots.get(snapshot.pk)
    if pinned is None:
        if len(_snapshots) >= MAX_SNAPSHOTS:
            _snapshots.clear()
        pinned = _snapshots[snapshot.pk] = Pinned(
            digest=snapshot.digest, version=snapshot.version,
            descriptions={agent_key(str(snapshot.tenant_id), row["agent_id"]):
                          str(row.get("description") or "")
                          for row in snapshot.agents
                          if isinstance(row, dict) and row.get("agent_id")})
    return pinned


def requested(query_string: bytes) -> tuple[str, str] | None:
    """``("session", id)`` or ``("snapshot", digest)`` from a ``/mcp`` query string."""
    for key, value in parse_qsl(query_string.decode("latin-1")):
        if key in ("session", "snapshot"):
            return key, value
    return None


@database_sync_to_async
def _resolve(kind: str, value: str, client_id: str, tenant: str) -> Pinned:
    try:
        if kind == "snapshot":
            snapshot = snapshot_get(digest=value, tenant=tenant)
            if snapshot is None:
                raise PinError(f"snapshot not found: {value} (evicted, or never published)")
            if len(_digests) >= MAX_SNAPSHOTS:
                _digests.clear()
            pinned = _digests[tenant, value] = _pinned(snapshot)
            return pinned
        pin, _ = session_pin(session_id=value, client_id=client_id, tenant=tenant)
    except SessionError as exc:
        raise PinError(str(exc)) from exc
    except DatabaseError as exc:
        if outage.is_database_outage(exc):
            outage.breaker.trip(exc)
        raise PinError("the registry database cannot be read now: retry shortly") from exc
    if len(_sessions) >= MAX_SESSIONS:
        _sessions.clear()
    _sessions[tenant, value] = (pin.snapshot_id, time.monotonic())
    return _pinned(pin.snapshot)


async def pinned(query_string: bytes, client_id: str, tenant: str) -> Pinned | None:
    """The tool set the URL pins (a session or snapshot of ``tenant``, the caller's), or None
    (no pin: every callable agent). Raises :class:`PinError`."""
    wanted = requested(query_string)
    if wanted is None:
        return None
    kind, value = wanted
    if kind == "snapshot" and (tenant, value) in _digests:
        return _digests[tenant, value]
    if kind == "session":
        cached = _sessions.get((tenant, value))
        # While the database is known to be down, the pin last read stands.
        if cached is not None and (time.monotonic() - cached[1] < SESSION_TTL_SECONDS
                                   or outage.breaker.is_open):
            hit = _snapshots.get(cached[0])
            if hit is not None:
                return hit
    if outage.breaker.is_open:
        raise PinError("the registry database cannot be read now: retry shortly")
    return await _resolve(kind, value, client_id, tenant)
