"""The gateway against raw-socket agents, end to end, with both outbound clients.

A running node (the whole platform under uvicorn) calls agents that misbehave at the byte
level; the caller must get a clean JSON-RPC transport error whose ``executed`` follows
ARCHITECTURE's contract, the node must stay bounded in memory, and nothing an agent sends after
its response may reach a caller. Each test runs with the own client and the aiohttp one.
"""

from __future__ import annotations

import socket
import time

import httpx
import orjson
import pytest

from tests.conftest import make_client
from tests.gateway.test_proxy import register, rpc
from tests.outbound.rawagent import RawAgent, response
from tests.servers import free_port

pytestmark = [pytest.mark.usefixtures("outbound_client"), pytest.mark.timeout(120)]

OK = b'{"jsonrpc":"2.0","id":1,"result":{"ok":true}}'


@pytest.fixture
def gw(live_server_url):
    token = make_client(["call"])[1]
    with httpx.Client(
        base_url=live_server_url, timeout=60, headers={"Authorization": f"Bearer {token}"}
    ) as client:
        yield client


def _rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def _error(r: httpx.Response) -> dict:
    body = r.json()
    assert "result" not in body, body
    return body["error"]


# --- executed ---------------------------------------------------------------------------------


def test_refused_connection_is_not_executed(gw):
    register("refused-agent", f"http://127.0.0.1:{free_port()}/")
    r = gw.post("/a2a/refused-agent", json=rpc(rpc_id="r"))
    assert r.headers["x-a2a-executed"] == "false"
    error = _error(r)
    assert error["data"]["kind"] == "unreachable" and error["data"]["executed"] is False


def test_timeout_after_delivery_is_executed(gw):
    def script(conn: socket.socket, agent: RawAgent) -> None:
        agent.take_request(conn)
        time.sleep(4)  # read the request, then hang past the call's timeout

    with RawAgent(script) as agent:
        register("hanging-agent", agent.url)
        request = rpc(rpc_id="h")
        request["params"]["configuration"] = {"timeout": 1}
        r = gw.post("/a2a/hanging-agent", json=request)
        assert agent.requests
        assert r.headers["x-a2a-executed"] == "true"
        error = _error(r)
        assert error["data"]["kind"] == "timeout" and error["data"]["executed"] is True
        assert error["code"] == -32053


def test_connection_cut_mid_response_is_executed(gw):
    def script(conn: socket.socket, agent: RawAgent) -> None:
        agent.take_request(conn)
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b'Content-Length: 500\r\n\r\n{"jsonrpc":'
        )

    with RawAgent(script) as agent:
        register("cut-agent", agent.url)
        r = gw.post("/a2a/cut-agent", json=rpc(rpc_id="c"))
        assert r.headers["x-a2a-executed"] == "true"
        error = _error(r)
        assert error["data"]["kind"] == "unreachable" and error["data"]["executed"] is True
        assert r.json()["id"] == "c"


# --- header bounds, watched on the node's RSS -------------------------------------------------


@pytest.mark.parametrize("shape", ["endless headers", "100k headers", "one 8 MiB header"])
def test_header_floods_are_bounded(gw, shape):
    """An agent flooding headers: the call fails fast and cleanly (executed: the request was
    delivered), the connection is closed on the agent, and the node's memory stays flat."""

    def script(conn: socket.socket, agent: RawAgent) -> None:
        agent.take_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n")
        if shape == "one 8 MiB header":
            conn.sendall(b"X-Huge: ")
            pieces = [b"h" * 65536] * 128
        elif shape == "100k headers":
            pieces = [
                b"".join(b"X-N%d: v\r\n" % (i * 1000 + j) for j in range(1000)) for i in range(100)
            ]
        else:
            pieces = iter(lambda: b"X-E: " + b"e" * 1000 + b"\r\n", None)
        for piece in pieces:
            conn.sendall(piece)
            agent.sent += len(piece)
            if agent.sent > (256 << 20):
                return
        # All written (the kernel's buffers can hold 1 MiB): wait for the node's close.
        agent.wait_closed(conn, 15)

    with RawAgent(script) as agent:
        register("flood-agent", agent.url)
        gw.post("/a2a/flood-agent", json=rpc())  # warm up: the node's buffers and pools
        before = _rss_bytes()
        started = time.monotonic()
        r = gw.post("/a2a/flood-agent", json=rpc(rpc_id="f"))
        elapsed = time.monotonic() - started
        growth = _rss_bytes() - before
        assert r.status_code == 200 and r.headers["x-a2a-executed"] == "true"
        error = _error(r)
        assert error["data"]["kind"] == "unreachable", error
        assert any(word in error["message"].lower() for word in ("header", "bytes"))
        assert elapsed < 20  # failed at the bound, not at the call's 300 s timeout
        assert agent.closed_by_peer.wait(10)  # the node closed the connection
        assert growth < (64 << 20), growth


# --- a response is final when complete --------------------------------------------------------


@pytest.mark.parametrize(
    "extra",
    [
        b"SMUGGLED",
        b'HTTP/1.1 500 Oops\r\nContent-Length: 7\r\nX-Evil: 1\r\n\r\n{"b":2}',
    ],
)
def test_bytes_after_a_response_never_reach_a_caller(gw, extra, outbound_client):
    if outbound_client == "aiohttp" and extra == b"SMUGGLED":
        # aiohttp 3.14 pools the poisoned connection: the next call on it fails (`unreachable`)
        # - the defect, in the library. The own client closes it.
        pytest.xfail("aiohttp reuses a connection with bytes left after a response")

    def script(conn: socket.socket, agent: RawAgent) -> None:
        first = True
        while agent.take_request(conn):
            conn.sendall(response(OK) + (extra if first else b""))
            first = False

    with RawAgent(script) as agent:
        register("smuggler", agent.url)
        for _ in range(3):
            r = gw.post("/a2a/smuggler", json=rpc())
            assert r.status_code == 200 and r.content == OK
            assert "x-evil" not in r.headers
            time.sleep(0.05)


def test_101_switching_protocols_is_a_clean_transport_error(gw, caplog):
    def script(conn: socket.socket, agent: RawAgent) -> None:
        agent.take_request(conn)
        conn.sendall(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\n\r\n\x81\x05hello"
        )
        time.sleep(1)

    with RawAgent(script) as agent:
        register("upgrader", agent.url)
        r = gw.post("/a2a/upgrader", json=rpc(rpc_id="u"))
        assert r.status_code == 200 and r.headers["x-a2a-executed"] == "true"
        error = _error(r)
        assert error["data"]["kind"] == "unreachable" and "101" in error["message"]
    assert not [rec for rec in caplog.records if rec.levelname in ("ERROR", "CRITICAL")]


def test_chunked_trailers_are_not_relayed(gw):
    raw = (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
        b"Trailer: X-Checksum\r\n\r\n" + b"%x\r\n" % len(OK) + OK + b"\r\n"
        b"0\r\nX-Checksum: abc\r\n\r\n"
    )

    def script(conn: socket.socket, agent: RawAgent) -> None:
        while agent.take_request(conn):
            conn.sendall(raw)

    with RawAgent(script) as agent:
        register("trailing", agent.url)
        r = gw.post("/a2a/trailing", json=rpc())
        assert r.status_code == 200 and r.content == OK
        assert "x-checksum" not in r.headers


def test_gzip_transfer_coding_is_not_relayed_as_identity(gw):
    import gzip

    packed = gzip.compress(OK)
    raw = (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: gzip, chunked\r\n\r\n"
        + b"%x\r\n" % len(packed)
        + packed
        + b"\r\n0\r\n\r\n"
    )

    def script(conn: socket.socket, agent: RawAgent) -> None:
        while agent.take_request(conn):
            conn.sendall(raw)

    with RawAgent(script) as agent:
        register("gzipper", agent.url)
        r = gw.post("/a2a/gzipper", json=rpc(rpc_id="g"))
        # refused cleanly: compressed bytes never pose as the identity body
        assert "x-a2a-agent-status" not in r.headers
        error = _error(r)
        assert error["data"]["kind"] == "unreachable" and "Transfer-Encoding" in error["message"]
        assert r.headers["x-a2a-executed"] == "true"


# --- SSRF at connect time ---------------------------------------------------------------------


def test_dns_rebinding_after_registration_is_refused_at_connect(gw, fake_dns):
    def script(conn: socket.socket, agent: RawAgent) -> None:
        agent.take_request(conn)
        conn.sendall(response(OK, extra=b"Connection: close\r\n"))

    with RawAgent(script) as agent:
        fake_dns["agent.rebind.test"] = "127.0.0.1"
        register("rebinder", f"http://agent.rebind.test:{agent.port}/rpc")
        r = gw.post("/a2a/rebinder", json=rpc())
        assert r.status_code == 200 and r.content == OK
        fake_dns["agent.rebind.test"] = "169.254.169.254"  # re-pointed at the metadata address
        r = gw.post("/a2a/rebinder", json=rpc(rpc_id="s"))
        assert r.headers["x-a2a-executed"] == "false"
        error = _error(r)
        assert error["data"]["kind"] == "unreachable"
        assert "169.254.169.254" in error["message"]
        assert len(agent.requests) == 1


def test_unresolvable_name_at_registration_is_checked_when_it_resolves(gw, fake_dns):
    # accepted at registration (the agent may not be up yet) ...
    register("late-name", "http://late.rebind.test:80/rpc")
    # ... and refused when the gateway connects, once it resolves to link-local
    fake_dns["late.rebind.test"] = "169.254.10.1"
    r = gw.post("/a2a/late-name", json=rpc())
    assert r.headers["x-a2a-executed"] == "false"
    assert "link-local" in _error(r)["message"]


def test_request_bytes_reach_the_agent_unchanged(gw):
    """Both clients send exactly the caller's body and add no headers of their own."""

    def script(conn: socket.socket, agent: RawAgent) -> None:
        while agent.take_request(conn):
            conn.sendall(response(OK))

    with RawAgent(script) as agent:
        register("exact", agent.url)
        body = orjson.dumps(rpc(rpc_id="x", text="é" * 10))
        caller_headers = {
            "Content-Type": "application/json",
            "User-Agent": "caller-ua/1",
            "Accept": "application/json",
            "Accept-Encoding": "identity",
        }
        r = gw.post("/a2a/exact", content=body, headers=caller_headers)
        assert r.status_code == 200
        head, _, sent = agent.requests[-1].partition(b"\r\n\r\n")
        assert sent == body
        lines = [line.split(b":", 1) for line in head.split(b"\r\n")[1:]]
        arrived: dict[bytes, list[bytes]] = {}
        for name, value in lines:
            arrived.setdefault(name.lower(), []).append(value.strip())
        assert arrived[b"user-agent"] == [b"caller-ua/1"]
        assert arrived[b"accept"] == [b"application/json"]
        assert arrived[b"accept-encoding"] == [b"identity"]
        assert arrived[b"content-type"] == [b"application/json"]
        assert arrived[b"content-length"] == [str(len(body)).encode()]
