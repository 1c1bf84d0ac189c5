"""The node's edge contract, one suite for both servers.

A node serves under Daphne (the default) or uvicorn (``manage.py serve --server``). Each
is a thin adapter over one contract: ``node/servers.py`` (both servers' connection handling
and Daphne's request class), ``node/edge.py`` (the body cap before Django reads a body) and
``gateway/admission.py`` (authentication before a gateway call's body is read). The contract
is checked here against real ``manage.py serve`` processes on loopback, each point under both
servers:

1. **Header deadline** (``A2A_HTTP_HEADER_TIMEOUT_SECONDS``): a connection that has not sent a
   complete request head in time is answered 408 or closed, however slowly it drips bytes;
   an idle kept-alive connection is closed after ``A2A_HTTP_KEEPALIVE_SECONDS``, and so is a
   request whose announced body never comes.
2. **Body caps before the app** (``A2A_MAX_REQUEST_BYTES`` under /a2a/,
   ``A2A_MAX_API_BODY_BYTES`` elsewhere): an announced body above the cap is answered 413
   before a byte of it is sent; a chunked body is cut at the cap without growing the server.
3. **Connection limits** (``A2A_HTTP_MAX_CONNECTIONS``): a connection beyond the limit is
   answered 503 at once; a busy port fails the start without claiming to serve.
4. **Authentication before the body**: an unauthenticated upload (announced or chunked, no
   token or an unknown one) is answered 401 with ``Connection: close`` and no
   ``100 Continue``, before its body is read; an authenticated one is read and routed.
5. **Drain on SIGTERM** (``A2A_SHUTDOWN_DRAIN_SECONDS``): the node stops accepting connections
   and closes its idle ones at once, answers the request in flight, runs its shutdown and
   exits cleanly. What the drain does to calls on a cluster (calls outliving it answered
   ``node_stopping``, streams included) is checked by the fault matrix,
   ``tests/reliability/test_drain.py``.
"""

from __future__ import annotations

import asyncio
import json
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.servers import ROOT, free_port, read_body, refuses_connections, serve_app
from tests.servers import fresh_env as _env
from tests.servers import run_manage as _manage
from tests.servers import wait_for_ok as _wait_for

# What this checks does not depend on the pass's database or channel layer.
pytestmark = pytest.mark.one_pass("embedded")

SERVERS = ["daphne", "uvicorn"]
CAP = 1024 * 1024  # A2A_MAX_REQUEST_BYTES in these nodes
API_CAP = 64 * 1024  # A2A_MAX_API_BODY_BYTES


class Node:
    def __init__(self, proc: subprocess.Popen, port: int) -> None:
        self.proc = proc
        self.port = port
        self.url = f"http://127.0.0.1:{port}"

    def connect(self, timeout: float = 5) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=timeout)
        sock.settimeout(timeout)
        return sock

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS")


@pytest.fixture(scope="module")
def migrated_dir(tmp_path_factory) -> Path:
    data_dir = tmp_path_factory.mktemp("edge")
    _manage(_env(data_dir), "migrate", "--no-input")
    return data_dir


@pytest.fixture(scope="module")
def token(migrated_dir) -> str:
    """An API client's token (admin and call) in the nodes' database."""
    return (
        _manage(_env(migrated_dir), "create_client", f"edge-{time.time_ns()}",
                "--scopes", "admin,call")
        .stdout.strip()
        .splitlines()[-1]
    )


def _start(data_dir: Path, server: str, **extra: str) -> Node:
    env = _env(
        data_dir,
        **{
            "A2A_MAX_REQUEST_BYTES": str(CAP),
            "A2A_MAX_API_BODY_BYTES": str(API_CAP),
            "A2A_HTTP_HEADER_TIMEOUT_SECONDS": "1",
            "A2A_HTTP_KEEPALIVE_SECONDS": "1",
            "LOG_LEVEL": "INFO",
            **extra,
        },
    )
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "serve", "--port", str(port), "--server", server],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    node = Node(proc, port)
    _wait_for(node.url + "/healthz", proc)
    return node


def _stop(node: Node) -> str:
    node.proc.send_signal(signal.SIGTERM)
    try:
        out, _ = node.proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        node.proc.kill()
        out, _ = node.proc.communicate()
    return out


@pytest.fixture(scope="module", params=SERVERS)
def node(request, migrated_dir):
    started = _start(migrated_dir, request.param)
    started.server = request.param
    yield started
    _stop(started)


def _head(path: str, *lines: str) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n" + "".join(f"{x}\r\n" for x in lines) + "\r\n"
    ).encode()


def _response(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def _status(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


def test_over_cap_content_length_is_refused_before_any_body_byte(node):
    for path, cap in (("/a2a/echo", CAP), ("/api/v1/agents", API_CAP)):
        sock = node.connect()
        # Only the head is sent: the answer must come without the body.
        sock.sendall(
            _head(
                path,
                "Authorization: Bearer AbCdEfGh.0123456789abcdef0123456789abcdef",
                "Content-Type: application/json",
                f"Content-Length: {cap + 1}",
            )
        )
        response = _response(sock)
        assert _status(response) == 413, response
        if path.startswith("/a2a/"):
            assert b"x-a2a-executed: false" in response.lower()
        sock.close()


def test_a_body_announced_but_never_sent_does_not_hold_the_connection(node):
    sock = node.connect(timeout=10)
    sock.sendall(_head("/a2a/echo", "Content-Type: application/json", "Content-Length: 5000"))
    # A small body is read before authentication; it never comes, and the keep-alive timeout
    # (1 s here) cuts the connection instead of holding it forever.
    response = _response(sock)
    assert response == b""
    assert sock.recv(100) == b""


@pytest.mark.parametrize("token", [None, "AbCdEfGh.0123456789abcdef0123456789abcdef"])
@pytest.mark.parametrize("framing", ["length", "chunked"])
def test_unauthenticated_upload_is_refused_before_its_body(node, token, framing):
    sock = node.connect()
    lines = ["Content-Type: application/json", "Expect: 100-continue"]
    lines.append(
        f"Content-Length: {CAP - 1}" if framing == "length" else "Transfer-Encoding: chunked"
    )
    if token:  # well-formed but unknown
        lines.append(f"Authorization: Bearer {token}")
    sock.sendall(_head("/a2a/echo", *lines))
    # Not a byte of the body sent, no 100 Continue: the answer is 401 and the connection ends.
    response = _response(sock)
    assert _status(response) == 401, response
    assert b"connection: close" in response.lower()
    assert b"x-a2a-executed: false" in response.lower()
    assert b"www-authenticate: bearer" in response.lower()
    sock.settimeout(5)
    rest = b""
    while chunk := sock.recv(65536):
        rest += chunk
    assert b"HTTP/1.1" not in rest


def test_authenticated_upload_is_read_after_authentication(node, token):
    """The caller that authenticates gets its (large) body read and routed: here to an agent
    that does not exist, so the gateway answers agent_not_found having parsed the body."""
    body = (
        b'{"jsonrpc": "2.0", "id": 9, "method": "message/send", "params": {"pad": "'
        + b"x" * 300_000
        + b'"}}'
    )
    r = httpx.post(
        node.url + "/a2a/nobody-here",
        content=body,
        timeout=10,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    assert r.status_code == 200
    assert r.json()["id"] == 9 and r.json()["error"]["data"]["kind"] == "agent_not_found"


def _chunked_upload(sock: socket.socket, total: int) -> tuple[int, bytes]:
    """Send up to ``total`` bytes chunked until the server answers or cuts; returns (sent,
    response)."""
    chunk = b"x" * 65536
    frame = b"%x\r\n" % len(chunk) + chunk + b"\r\n"
    sent = 0
    sock.settimeout(5)
    while sent < total:
        readable, _, _ = select.select([sock], [], [], 0)
        if readable:
            break
        try:
            sock.sendall(frame)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            break
        sent += len(chunk)
    try:
        return sent, _response(sock)
    except ConnectionResetError:
        return sent, b""


@pytest.mark.parametrize(
    "path", ["/a2a/echo", "/api/v1/agents", "/api/v1/agents/x/heartbeat", "/agents/heartbeat"]
)
def test_chunked_upload_is_cut_at_the_cap_without_growing_the_server(node, path):
    rss_before = node.rss_kib()
    sock = node.connect()
    sock.sendall(_head(path, "Content-Type: application/json", "Transfer-Encoding: chunked"))
    sent, response = _chunked_upload(sock, 64 * 1024 * 1024)
    # Answered (413 at the cap, or 401 before reading under uvicorn) long before 64 MiB.
    assert response, "the server never answered"
    assert _status(response) in (401, 413)
    assert sent < 16 * 1024 * 1024
    assert node.rss_kib() - rss_before < 16 * 1024
    assert httpx.get(node.url + "/healthz").status_code == 200


def test_idle_connections_are_closed(node):
    socks = [node.connect(timeout=6) for _ in range(50)]
    for sock in socks:
        # Never sent a byte: answered 408 and closed after the 1 s header timeout.
        data = _response(sock)
        assert data == b"" or _status(data) == 408
        assert sock.recv(10) == b""


def test_kept_alive_connection_is_closed_after_the_keepalive_timeout(node):
    sock = node.connect(timeout=6)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert _status(_response(sock)) == 200
    started = time.monotonic()
    while sock.recv(65536):  # the rest of the first response, then the close
        pass
    assert time.monotonic() - started < 5


def test_slowly_dripped_header_is_cut_after_the_header_timeout(node):
    sock = node.connect()
    sock.sendall(b"GET /healthz HTTP/1.1\r\n")
    cut = False
    for _ in range(40):  # 8 s of one byte every 0.2 s: each byte resets an idle timer
        try:
            sock.sendall(b"X")
        except (BrokenPipeError, ConnectionResetError):
            cut = True
            break
        readable, _, _ = select.select([sock], [], [], 0.2)
        if readable:
            data = sock.recv(1000)
            assert data == b"" or _status(data) == 408
            cut = True
            break
    assert cut, "a header dripped for 8 s was never cut"


def test_connections_beyond_the_limit_are_refused(migrated_dir):
    for server in SERVERS:
        node = _start(
            migrated_dir,
            server,
            A2A_HTTP_MAX_CONNECTIONS="10",
            A2A_HTTP_HEADER_TIMEOUT_SECONDS="30",
            A2A_HTTP_KEEPALIVE_SECONDS="30",
        )
        try:
            time.sleep(0.5)  # the readiness probe's connection has gone
            held = [node.connect() for _ in range(10)]
            extra = node.connect()
            response = _response(extra)
            assert _status(response) == 503, (server, response)
            for sock in held:
                sock.close()
            time.sleep(0.5)
            assert httpx.get(node.url + "/healthz").status_code == 200
        finally:
            _stop(node)


@pytest.mark.parametrize("server", SERVERS)
def test_busy_port_fails_at_once_without_saying_serving(migrated_dir, server):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    try:
        result = _manage(
            _env(migrated_dir), "serve", "--port", str(port), "--server", server, check=False
        )
    finally:
        taken.close()
    assert result.returncode != 0
    assert f"port {port} is in use" in result.stderr.strip().splitlines()[-1]
    assert "serving" not in result.stdout


class SlowAgent:
    """A raw ASGI agent answering every JSON-RPC request after ``delay`` seconds."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.received = threading.Event()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        body = await read_body(receive)
        self.received.set()
        await asyncio.sleep(self.delay)
        out = json.dumps({"jsonrpc": "2.0", "id": json.loads(body)["id"],
                          "result": {"ok": True}}).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": out})


@pytest.mark.parametrize("server", SERVERS)
def test_sigterm_drains_the_edge_then_runs_the_node_shutdown(migrated_dir, token, server):
    """SIGTERM with a kept-alive idle connection and a call in flight: the node refuses new
    connections and closes the idle one at once, answers the call (the drain is longer than
    it), runs its shutdown and exits cleanly."""
    node = _start(migrated_dir, server, A2A_HTTP_KEEPALIVE_SECONDS="30")
    agent = SlowAgent(delay=1.5)
    try:
        with serve_app(agent, lifespan="off") as served:
            agent_id = f"drain-{server}-{time.time_ns() % 10**6}"
            registered = httpx.post(
                node.url + "/api/v1/agents", timeout=10,
                headers={"Authorization": f"Bearer {token}"},
                json={"agent_id": agent_id, "url": served.url,
                      "card": {"name": "Slow agent", "url": served.url}},
            )
            assert registered.status_code == 201, registered.text
            idle = node.connect(timeout=10)
            idle.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert _status(_response(idle)) == 200
            result: dict = {}

            def call() -> None:
                result["response"] = httpx.post(
                    f"{node.url}/a2a/{agent_id}", timeout=30,
                    headers={"Authorization": f"Bearer {token}"},
                    json={"jsonrpc": "2.0", "id": "in-flight", "method": "message/send",
                          "params": {"message": {"kind": "message", "role": "user",
                                                 "messageId": "m1",
                                                 "parts": [{"kind": "text", "text": "hi"}]}}},
                )

            thread = threading.Thread(target=call)
            thread.start()
            assert agent.received.wait(10), "the call never reached the agent"
            stopped = time.monotonic()
            node.proc.send_signal(signal.SIGTERM)
            # The idle connection is closed at once (the rest of its response, then EOF),
            # not after its 30 s keep-alive.
            while idle.recv(65536):
                pass
            assert time.monotonic() - stopped < 5
            deadline = time.monotonic() + 5
            while not refuses_connections(node.port):
                assert time.monotonic() < deadline, "the node still accepts connections"
                time.sleep(0.1)
            thread.join(timeout=30)
            response = result["response"]
            assert response.status_code == 200, response.text
            assert response.json()["result"] == {"ok": True}, response.text
            assert response.headers["x-a2a-executed"] == "true"
            out, _ = node.proc.communicate(timeout=30)
    finally:
        if node.proc.poll() is None:
            _stop(node)
    # uvicorn re-raises the signal once it has shut down; Daphne exits normally.
    assert node.proc.returncode in (0, -signal.SIGTERM), out
    assert "node stopped:" in out, out
    assert "Exception in ASGI application" not in out, out


def test_serve_help_documents_host_port_server_and_defaults(migrated_dir):
    text = _manage(_env(migrated_dir), "serve", "--help").stdout
    text = " ".join(text.split())
    assert "--host HOST" in text and "default: 127.0.0.1" in text
    assert "--port PORT" in text and "default: 8000" in text
    assert "--server {daphne,uvicorn}" in text and "default: daphne" in text
