"""The cluster a process belongs to: the registry database it serves.

Redis keys shared by a cluster's nodes and workers are named ``a2a:node:<cluster>:...``
(liveness, gRPC slots, push delivery counters): nodes sharing a Redis but not a database are
separate clusters. Scripts those nodes run on Redis start with :data:`REDIS_NOW_MS`, so the
time they count by is Redis's own and no two nodes' clocks are compared.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping


def cluster_of(database: Mapping[str, object]) -> str:
    """A short name for the registry database a node serves (Django's database settings)."""
    where = "|".join(str(database.get(k) or "") for k in ("ENGINE", "HOST", "PORT", "NAME"))
    return hashlib.sha1(where.encode()).hexdigest()[:12]


#: A Lua prelude for scripts run on a cluster's Redis: ``now``, Redis's clock in milliseconds
#: (``TIME`` is non-deterministic, so the script's effects are replicated, not the script).
REDIS_NOW_MS = """
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""
