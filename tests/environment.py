"""Test-process configuration, set through the same environment variables as production
(loaded with ``-p tests.environment`` before Django reads its settings; see pyproject.toml).

The settings module never asks whether it runs under pytest: what a test process needs is
said here, explicitly.
"""

from __future__ import annotations

import os
import socket

# Test servers listen on random ports: without a node id of its own, two test runs sharing
# one Redis would both claim (and subscribe for) every agent of the default node id.
os.environ.setdefault("NODE_ID", f"{socket.gethostname()}:test{os.getpid()}")
# Test processes start and stop many nodes: never freeze their objects out of the GC.
os.environ.setdefault("A2A_GC_FREEZE", "false")
# Distributed mode requires ALLOWED_HOSTS: the test servers' loopback names and Django's test
# client ("testserver"), the names embedded mode answers to by default.
os.environ.setdefault("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1],testserver")
# Distributed runs need a SECRET_KEY; CI passes one, a developer's run gets this.
os.environ.setdefault("SECRET_KEY", "test-only-not-secret")
