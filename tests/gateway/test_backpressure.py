"""Backpressure of relayed streams against running nodes.

A caller that stops reading an SSE stream must not make the node buffer the agent's stream:
at most ``A2A_SSE_BUFFER_BYTES`` wait per stream, the agent is then no longer read, and a
caller stalled past ``A2A_SSE_STALL_TIMEOUT_SECONDS`` gets a terminal ``stream_stalled`` event
(when its connection takes it) while everything is freed. Through the broker the owning node
sends at most a window ahead of what the caller read, so neither node nor Redis fill up.

The nodes are ``manage.py serve`` subprocesses (uvicorn and Daphne), so their RSS is their own;
callers are raw sockets with a tiny receive buffer that never read; the agent streams 64 KiB
events as fast as its connection takes them and counts what it sent.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import orjson
import pytest
from django.conf import settings
from django.db import connection

from registry import services
from registry.permissions import SYSTEM
from tests.conftest import make_client
from tests.gateway.test_cluster import _database_url
from tests.gateway.test_proxy import rpc
from tests.servers import (
    answer_lifespan,
    kernel_buffer_bytes,
    read_body,
    serve_agent,
    start_node,
    watch_disconnect,
)

# Every test runs with both outbound clients (tests/gateway/conftest.py).
# The caller's side of flow control is the server's: one outbound client, both servers; the
# memory a stalled stream costs depends on the client's read-ahead too: both clients there.
pytestmark = pytest.mark.one_pass("embedded")

ROOT = Path(__file__).resolve().parents[2]
EVENT_PAD = 64 * 1024
#: The agent stops a stream after this much (a run without backpressure ends, too).
AGENT_STREAM_LIMIT = 400 * 1024 * 1024
STALL_SECONDS = 3.0
#: What an agent may have written into a stream the node stopped reading: the kernel's
#: buffers on the way (tests.servers.kernel_buffer_bytes) and the node's bounded relay, with
#: room to spare -- far below AGENT_STREAM_LIMIT, which an unbounded relay reads through.
NOT_READ_ON_BYTES = kernel_buffer_bytes() + 16 * 1024 * 1024


@dataclass
class FloodAgent:
    """``message/stream`` (and the sync method ``flood/sync``: the agent's Content-Type decides
    what is relayed): 64 KiB events as fast as the connection takes them, until the caller's
    side closes; anything else: a small JSON-RPC result."""

    sent: dict[int, int] = field(default_factory=dict)
    open: int = 0
    url: str = ""

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            await answer_lifespan(receive, send)
            return
        body = await read_body(receive)
        payload = orjson.loads(body)
        if payload.get("method") not in ("message/stream", "flood/sync"):
            answer = orjson.dumps({"jsonrpc": "2.0", "id": payload.get("id"), "result": "ok"})
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-type", b"application/json")],
                }
            )
            await send({"type": "http.response.body", "body": answer})
            return
        number = len(self.sent)
        self.sent[number] = 0
        self.open += 1
        closed, watcher = watch_disconnect(receive)
        limit = AGENT_STREAM_LIMIT if payload["method"] == "message/stream" \
            else max(64 << 20, 2 * NOT_READ_ON_BYTES)
        event = (
            b"data: "
            + orjson.dumps(
                {"jsonrpc": "2.0", "id": payload.get("id"), "result": {"pad": "x" * EVENT_PAD}}
            )
            + b"\n\n"
        )
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")],
                }
            )
            while not closed.is_set() and self.sent[number] < limit:
                await send({"type": "http.response.body", "body": event, "more_body": True})
                self.sent[number] += len(event)
                await asyncio.sleep(0)  # let the disconnect watcher run
            await send({"type": "http.response.body", "body": b""})
        finally:
            watcher.cancel()
            self.open -= 1


@pytest.fixture
def flood():
    with serve_agent(FloodAgent()) as agent:
        yield agent


@dataclass
class Node:
    url: str
    port: int
    process: subprocess.Popen
    token: str  # an admin token of this node's registry
    env: dict = field(default_factory=dict)  # the node's environment (for manage.py beside it)

    def rss_mib(self) -> float:
        with open(f"/proc/{self.process.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        raise AssertionError("no VmRSS")


def _manage(args: list[str], env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


#: A migrated embedded data dir with an admin client, and its token: made once per test
#: process (``migrate`` and ``create_client`` are a Django start-up each), copied per node.
_template: tuple[tempfile.TemporaryDirectory, str] | None = None


def _embedded_data(env: dict[str, str], data_dir: str) -> str:
    """Fill ``data_dir`` with a copy of the migrated template; the admin token."""
    global _template
    if _template is None:
        template = tempfile.TemporaryDirectory(prefix="a2a-bp-template-")
        template_env = dict(env, A2A_DATA_DIR=template.name)
        _manage(["migrate", "--noinput", "-v", "0"], template_env)
        token = (
            _manage(["create_client", "bp-admin", "--scopes", "admin,call"], template_env)
            .strip()
            .splitlines()[-1]
        )
        _template = (template, token)
    template, token = _template
    shutil.copytree(template.name, data_dir, dirs_exist_ok=True)
    return token


_node_numbers = itertools.count(1)


@contextmanager
def running_node(server: str, *, distributed: bool = False, **extra: str) -> Iterator[Node]:
    """``manage.py serve --server <server>`` in a subprocess: embedded with its own data dir,
    or (``distributed``) on this test run's PostgreSQL database and Redis."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("PYTEST") and k not in ("DATABASE_URL", "REDIS_URL")
    }
    env.update(
        SECRET_KEY="backpressure-test",
        LOG_LEVEL="WARNING",
        A2A_SSE_STALL_TIMEOUT_SECONDS=str(STALL_SECONDS),
        # the test's outbound client (the ``outbound_client`` fixture sets the setting)
        A2A_OUTBOUND_CLIENT=settings.A2A_OUTBOUND_CLIENT,
    )
    env.update(extra)
    with tempfile.TemporaryDirectory() as data_dir:
        env["A2A_DATA_DIR"] = data_dir
        if distributed:
            env.update(DATABASE_URL=_database_url(), REDIS_URL=settings.REDIS_URL)
            token = make_client(["admin"])[1]
        else:
            token = _embedded_data(env, data_dir)
        process, port = start_node(env, server, node_id=extra.get("NODE_ID")
                                   or f"bp-{server}-{os.getpid()}-{next(_node_numbers)}")
        node = Node(f"http://127.0.0.1:{port}", port, process, token, env)
        try:
            yield node
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def stalled_caller(
    node: Node, agent_id: str, token: str, method: str = "message/stream"
) -> socket.socket:
    """Call ``method`` (a stream) through the node and never read (tiny receive buffer)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", node.port))
    body = orjson.dumps(rpc(method, rpc_id="stalled"))
    sock.sendall(
        f"POST /a2a/{agent_id} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    return sock


def read_to_end(sock: socket.socket, timeout: float) -> bytes:
    """Everything until the response's end: its last chunk, or the connection's end."""
    sock.settimeout(timeout)
    data = bytearray()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            piece = sock.recv(1 << 20)
        except TimeoutError:
            break
        if not piece:
            return bytes(data)
        data += piece
        if data.endswith(b"\r\n0\r\n\r\n"):
            return bytes(data)
    raise AssertionError(f"the stream did not end within {timeout} s ({len(data)} bytes read)")


def register_on(node: Node, agent_id: str, url: str) -> None:
    r = httpx.post(
        f"{node.url}/api/v1/agents",
        headers={"Authorization": f"Bearer {node.token}"},
        json={"agent_id": agent_id, "url": url, "card": {"name": agent_id, "url": url}},
    )
    assert r.status_code == 201, r.text


def hold_and_watch(node: Node, callers: list, call_unrelated, seconds: float) -> tuple[float, int]:
    """While the stalled callers hold their streams: the node's peak RSS, and how many
    unrelated calls succeeded (every one must)."""
    peak = node.rss_mib()
    ok = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        peak = max(peak, node.rss_mib())
        call_unrelated()
        ok += 1
        time.sleep(0.05)
    return peak, ok


@pytest.mark.parametrize("server", ["uvicorn", "daphne"])
def test_non_reading_callers_do_not_grow_the_node(flood, server):
    with running_node(server) as node:
        register_on(node, "flood", flood.url)
        register_on(node, "other", flood.url)
        auth = {"Authorization": f"Bearer {node.token}"}

        def unrelated() -> None:
            r = httpx.post(f"{node.url}/a2a/other", json=rpc(rpc_id="u"), headers=auth, timeout=5)
            assert r.status_code == 200 and r.json()["result"] == "ok", r.text

        for _ in range(5):  # warm up the paths before the baseline
            unrelated()
        baseline = node.rss_mib()
        callers = [stalled_caller(node, "flood", node.token) for _ in range(3)]
        try:
            peak, ok = hold_and_watch(node, callers, unrelated, STALL_SECONDS - 0.8)
            sent = sorted(flood.sent.values())
            assert len(sent) == 3 and ok > 5
            # The agent is no longer read once the buffers are full: the socket buffers and
            # the bounded relay per stream, not the stream (hundreds of MiB).
            assert max(sent) < NOT_READ_ON_BYTES, sent
            assert peak - baseline < 48, (baseline, peak)
            # Stalled past the deadline: the streams are ended and the agent released.
            deadline = time.monotonic() + STALL_SECONDS + 8
            while flood.open and time.monotonic() < deadline:
                time.sleep(0.1)
            assert flood.open == 0, "the stalled streams were not freed"
            unrelated()
        finally:
            for sock in callers:
                sock.close()


#: What one stalled stream may cost the node (RSS growth per stream, several held at once).
#: docs/streams.md ("What a slow caller costs") counts about A2A_SSE_BUFFER_BYTES (1 MiB) plus
#: at most 0.7 MiB of fixed buffers, measured 1.5-2.5 MiB; the relay once held 7.5 MiB.
STALLED_STREAM_MIB = 4.0


@pytest.mark.parametrize(("server", "client"), [("daphne", "own"), ("uvicorn", "aiohttp")])
def test_a_stalled_stream_costs_about_its_buffer(flood, server, client):
    """Ten callers stop reading at once; the node grows by about their buffers, not by what
    the outbound client, the relay and the server's write buffer could add on top. Each server
    and each outbound client is measured once: the client's read buffers and the server's write
    buffer add up, they do not depend on each other."""
    with running_node(server, A2A_SSE_STALL_TIMEOUT_SECONDS="120",
                      A2A_OUTBOUND_CLIENT=client) as node:
        register_on(node, "flood", flood.url)
        warm = stalled_caller(node, "flood", node.token)  # the stream path's first use
        time.sleep(1.5)
        warm.close()
        deadline = time.monotonic() + 10
        while flood.open and time.monotonic() < deadline:
            time.sleep(0.1)
        baseline = node.rss_mib()
        callers = [stalled_caller(node, "flood", node.token) for _ in range(10)]
        try:
            # Held until every stream stops moving (the agents are no longer read).
            peak, last, still = baseline, -1, 0
            deadline = time.monotonic() + 30
            while still < 5 and time.monotonic() < deadline:
                time.sleep(0.2)
                peak = max(peak, node.rss_mib())
                total = sum(flood.sent.values())
                still = still + 1 if total == last else 0
                last = total
            assert len(flood.sent) == 11 and flood.open == 10
            per_stream = (peak - baseline) / 10
            assert per_stream < STALLED_STREAM_MIB, (baseline, peak, per_stream)
        finally:
            for sock in callers:
                sock.close()


@pytest.mark.parametrize("server", ["uvicorn", "daphne"])
def test_sync_method_answered_with_an_event_stream_is_bounded(flood, server):
    """A non-streaming method the agent answers with an endless event stream: relayed as
    events, with the same backpressure (no stall deadline on the sync path: the memory is
    bounded while the caller holds the connection)."""
    with running_node(server) as node:
        register_on(node, "flood", flood.url)
        auth = {"Authorization": f"Bearer {node.token}"}

        def unrelated() -> None:
            r = httpx.post(f"{node.url}/a2a/flood", json=rpc(rpc_id="u"), headers=auth, timeout=5)
            assert r.status_code == 200 and r.json()["result"] == "ok", r.text

        for _ in range(5):
            unrelated()
        baseline = node.rss_mib()
        callers = [stalled_caller(node, "flood", node.token, "flood/sync") for _ in range(3)]
        try:
            peak, ok = hold_and_watch(node, callers, unrelated, 2.5)
            sent = sorted(flood.sent.values())
            assert len(sent) == 3 and ok > 5
            assert max(sent) < NOT_READ_ON_BYTES, sent
            assert peak - baseline < 48, (baseline, peak)
        finally:
            for sock in callers:
                sock.close()


@pytest.mark.parametrize("server", ["uvicorn", "daphne"])
def test_stalled_caller_gets_a_terminal_error_event(flood, server):
    """The same ending on both servers, however long after the stall the caller reads again:
    the data, then the ``stream_stalled`` event, then the chunked terminator (the node writes
    the last message into the connection's buffer without waiting for it to drain)."""
    with running_node(server) as node:
        register_on(node, "flood", flood.url)
        sock = stalled_caller(node, "flood", node.token)
        try:
            deadline = time.monotonic() + STALL_SECONDS + 20
            while (not flood.sent or flood.open) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert flood.sent and flood.open == 0, "the stalled stream was not ended"
            # The caller comes back only after the node has given up any wait for room for
            # the ending (at most min(max(stall, 1), 5) s): it must be buffered by then.
            time.sleep(min(max(STALL_SECONDS, 1.0), 5.0) + 2)
            data = read_to_end(sock, timeout=30)
        finally:
            sock.close()
        assert data.startswith(b"HTTP/1.1 200")
        tail = data[-4096:]
        assert data.endswith(b"\r\n0\r\n\r\n"), tail[-300:]
        assert b"event: error" in tail and b'"kind":"stream_stalled"' in tail, tail[-600:]
        assert b"stream stalled: the caller read nothing for" in tail


@pytest.mark.one_pass("distributed")  # the module's other tests run in the embedded pass
def test_cross_node_stalled_callers_are_bounded(
    live_server_url, redis_url, postgres_url, flood, settings
):
    """The caller enters node B; the agent is owned by this process's node (A). B's inbox
    never grows an unbounded queue, A's subscriber stops reading the agent (flow control),
    and unrelated cross-node calls keep working."""
    if settings.EMBEDDED or connection.vendor != "postgresql":
        pytest.skip("cross-node streams need the distributed mode (REDIS_URL, DATABASE_URL)")
    settings.A2A_SSE_STALL_TIMEOUT_SECONDS = STALL_SECONDS
    with running_node("uvicorn", distributed=True) as node_b:
        for agent_id in ("flood-x", "other-x"):
            services.agent_register(
                actor=SYSTEM,
                agent_id=agent_id,
                url=flood.url,
                card={"name": agent_id, "url": flood.url},
            )
        _, token = make_client(["call"])
        auth = {"Authorization": f"Bearer {token}"}

        def unrelated() -> None:
            r = httpx.post(
                f"{node_b.url}/a2a/other-x", json=rpc(rpc_id="u"), headers=auth, timeout=5
            )
            assert r.status_code == 200 and r.json().get("result") == "ok", r.text

        deadline = time.monotonic() + 10
        while True:  # node B learns the routes from the discovery group
            try:
                unrelated()
                break
            except AssertionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        for _ in range(5):
            unrelated()
        baseline = node_b.rss_mib()
        callers = [stalled_caller(node_b, "flood-x", token) for _ in range(3)]
        try:
            peak, ok = hold_and_watch(node_b, callers, unrelated, STALL_SECONDS - 0.8)
            sent = sorted(flood.sent.values())
            assert len(sent) == 3 and ok > 5
            assert max(sent) < NOT_READ_ON_BYTES, sent
            assert peak - baseline < 48, (baseline, peak)
            deadline = time.monotonic() + STALL_SECONDS + 8
            while flood.open and time.monotonic() < deadline:
                time.sleep(0.1)
            assert flood.open == 0, "the stalled streams were not freed"
            unrelated()
        finally:
            for sock in callers:
                sock.close()
