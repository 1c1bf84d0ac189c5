"""Which of CI's two passes runs a test.

CI runs the suite twice at once: the embedded pass (SQLite, the in-memory channel layer) and
the distributed pass (PostgreSQL, Redis). A test whose subject does not depend on the pass's
database or channel layer -- a server's edge limits, the outbound clients' matrix, the
command-line tools, faults of private services -- checks the same thing in both, so CI runs it
in one of them: the module says which with ``pytest.mark.one_pass("embedded")`` (or
``"distributed"``), chosen to balance the two passes' wall time. A run outside CI (no
``CI=true``) runs everything wherever it is.
"""

from __future__ import annotations

import os

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
#: This process's pass: distributed when it was given a database URL (as CI's second pass is).
CURRENT = "distributed" if os.environ.get("DATABASE_URL") else "embedded"
PASSES = ("embedded", "distributed")


def runs_here(wanted: str) -> bool:
    """Whether a test CI runs in the ``wanted`` pass runs in this process."""
    if wanted not in PASSES:
        raise ValueError(f"one_pass takes one of {PASSES}, not {wanted!r}")
    return not IN_CI or wanted == CURRENT


def outbound_clients() -> list[str]:
    """The gateway's outbound clients a client-matrix test runs with: both (its own HTTP/1.1
    client and aiohttp) in the embedded pass and outside CI; the default one in CI's
    distributed pass, whose subject is the database and the broker, not the client."""
    return ["own", "aiohttp"] if runs_here("embedded") else ["own"]
