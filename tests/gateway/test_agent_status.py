"""An agent answering an HTTP status outside 100-599 (e.g. 999): uvicorn has no status line for
it (its reply would be empty) and Daphne would relay it, so the gateway answers one documented
error instead, ``bad_agent_status`` (executed true), on both servers and with both outbound
clients. The agent is a raw loopback socket server: no ASGI server writes such a status.

The outbound client reads the agent's status line and the server writes the gateway's answer;
nothing passes between the two but the gateway's decision, so each server runs with one client
and each client with one server (two nodes, not four)."""

from __future__ import annotations

import socket
import socketserver
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import orjson
import pytest

from tests.gateway import test_proxy as proxy
from tests.gateway.test_backpressure import register_on, running_node
from tests.gateway.test_proxy import rpc

# fixtures of test_proxy: a caller token, and the local fast path / broker path switch
path_mode, token = proxy.path_mode, proxy.token

pytestmark = pytest.mark.one_pass("embedded")

#: (server, outbound client): every server and every client once.
PAIRS = [("daphne", "own"), ("uvicorn", "aiohttp")]


class _OddStatus(socketserver.BaseRequestHandler):
    """Reads one request (head and Content-Length body), answers the server's ``status``."""

    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.settimeout(10)
        data = b""
        while b"\r\n\r\n" not in data:
            piece = sock.recv(65536)
            if not piece:
                return
            data += piece
        head, _, body = data.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        while len(body) < length:
            piece = sock.recv(65536)
            if not piece:
                return
            body += piece
        self.server.calls += 1  # type: ignore[attr-defined]
        status, content_type = self.server.answer  # type: ignore[attr-defined]
        payload = b'{"jsonrpc":"2.0","id":1,"result":"odd"}'
        if content_type == b"text/event-stream":
            payload = b"data: " + payload + b"\n\n"
        sock.sendall(
            b"HTTP/1.1 %d Odd\r\nContent-Type: %s\r\nContent-Length: %d\r\n"
            b"Connection: close\r\n\r\n" % (status, content_type, len(payload)) + payload
        )


@contextmanager
def odd_agent(status: int, content_type: bytes) -> Iterator[socketserver.ThreadingTCPServer]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _OddStatus)
    server.daemon_threads = True
    server.answer = (status, content_type)  # type: ignore[attr-defined]
    server.calls = 0  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(("server", "client"), PAIRS)
def test_status_outside_100_to_599_is_a_gateway_error(server, client):
    cases = [(999, b"application/json", "message/send"), (600, b"application/json", "tasks/get"),
             (999, b"text/event-stream", "message/stream")]
    with running_node(server, A2A_OUTBOUND_CLIENT=client) as node:
        auth = {"Authorization": f"Bearer {node.token}"}
        for number, (status, content_type, method) in enumerate(cases):
            with odd_agent(status, content_type) as agent:
                agent_id = f"odd-{number}"
                url = f"http://127.0.0.1:{agent.server_address[1]}/rpc"
                register_on(node, agent_id, url)
                r = httpx.post(f"{node.url}/a2a/{agent_id}", json=rpc(method, rpc_id=7),
                               headers=auth, timeout=20)
                assert agent.calls == 1
            assert r.status_code == 200, (status, method, r.status_code, r.text)
            assert r.headers["x-a2a-executed"] == "true"
            assert r.headers["x-a2a-agent-status"] == str(status)
            answer = orjson.loads(r.content)
            assert answer["id"] == 7
            assert answer["error"]["code"] == -32065
            assert answer["error"]["message"] == f"bad agent status: HTTP {status}"
            assert answer["error"]["data"] == {"executed": True, "retryable": False,
                                               "kind": "bad_agent_status",
                                               "agent_id": agent_id}


def test_kubemq_profile_code():
    with running_node("uvicorn", A2A_ERROR_PROFILE="kubemq") as node, \
            odd_agent(999, b"application/json") as agent:
        register_on(node, "odd", f"http://127.0.0.1:{agent.server_address[1]}/rpc")
        r = httpx.post(f"{node.url}/a2a/odd", json=rpc(rpc_id=3),
                       headers={"Authorization": f"Bearer {node.token}"}, timeout=20)
        assert r.status_code == 200 and r.headers["x-a2a-executed"] == "true"
        error = orjson.loads(r.content)["error"]
        assert error["code"] == -32603 and error["data"]["kind"] == "bad_agent_status"


@pytest.mark.usefixtures("outbound_client")
def test_both_paths(live_server_url, token, path_mode):
    """Over the local fast path and through the Channels layer: the same error reaches the
    caller (the subscriber decides it; the envelope carries it)."""
    with odd_agent(999, b"text/event-stream") as agent:
        agent_id = proxy.new_id("odd")
        proxy.register(agent_id, f"http://127.0.0.1:{agent.server_address[1]}/rpc")
        r = httpx.post(f"{live_server_url}/a2a/{agent_id}", json=rpc("message/stream", rpc_id=5),
                       headers={"Authorization": f"Bearer {token}"}, timeout=20)
    assert r.status_code == 200 and r.headers["x-a2a-executed"] == "true"
    assert r.headers["x-a2a-agent-status"] == "999"
    error = orjson.loads(r.content)["error"]
    assert error["data"]["kind"] == "bad_agent_status" and error["data"]["executed"] is True
