"""uvicorn under the node's protocol (node.servers.uvicorn_protocol) writes a response's head
and first body bytes together, and never holds a head back: a body sent later (a stream's first
event after a wait) does not delay the status line and headers."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest
import uvicorn

from node.servers import ServerLimits, uvicorn_protocol
from tests.servers import free_port

LIMITS = ServerLimits(header_timeout=10, keepalive=5, max_connections=100,
                      a2a_body_bytes=1 << 20, api_body_bytes=1 << 20)


async def app(scope, receive, send) -> None:
    if scope["type"] != "http":
        return
    if scope["path"] == "/late":
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        await asyncio.sleep(1.5)  # the first event comes later
        await send({"type": "http.response.body", "body": b"data: late\n\n",
                    "more_body": False})
        return
    body = b'{"ok": true}'
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


@pytest.fixture(scope="module")
def server():
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, lifespan="off",
                            log_level="warning", http=uvicorn_protocol(LIMITS))
    running = uvicorn.Server(config)
    thread = threading.Thread(target=running.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not running.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    yield port
    running.should_exit = True
    thread.join(timeout=10)


def _request(port: int, path: str) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    return sock


def test_head_of_a_late_body_is_not_held_back(server):
    sock = _request(server, "/late")
    try:
        sock.settimeout(1.0)  # the body comes 1.5 s after the head
        head = sock.recv(65536)
        assert head.startswith(b"HTTP/1.1 200 OK\r\n"), head
        assert b"content-type: text/event-stream" in head.lower()
        assert b"data: late" not in head
        sock.settimeout(5)
        rest = b""
        while b"data: late" not in rest:
            chunk = sock.recv(65536)
            assert chunk, "connection closed before the body"
            rest += chunk
    finally:
        sock.close()


def test_keep_alive_responses_arrive_whole_and_in_order(server):
    sock = _request(server, "/")
    try:
        for n in range(20):
            data = b""
            while not data.endswith(b'{"ok": true}'):
                chunk = sock.recv(65536)
                assert chunk, f"connection closed at response {n}"
                data += chunk
            assert data.startswith(b"HTTP/1.1 200 OK\r\n") and data.count(b"HTTP/1.1") == 1
            sock.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    finally:
        sock.close()


def test_heads_held_on_many_connections_at_once_all_go_out(server):
    # Held heads are flushed together, once per loop iteration: every connection's head goes
    # out, not only the first one's.
    socks = [_request(server, "/late") for _ in range(8)]
    try:
        for sock in socks:
            sock.settimeout(1.0)  # each body comes 1.5 s after its head
            head = sock.recv(65536)
            assert head.startswith(b"HTTP/1.1 200 OK\r\n"), head
            assert b"data: late" not in head
    finally:
        for sock in socks:
            sock.close()
