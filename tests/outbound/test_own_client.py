"""The gateway's hand-written HTTP/1.1 client (outbound.http1) against raw-socket agents.

Each agent here is a bare TCP server scripting every byte (tests/outbound/rawagent.py), so the
tests reach the corners a well-behaved server never shows: keep-alive reuse and expiry, an
agent closing an idle connection, flow control towards a slow reader, a timeout mid-body,
chunked and close-delimited bodies, oversize bodies, header bounds, trailers, transfer
codings, 101, bytes after a complete response, and what each failure says about ``executed``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import time

import pytest

from outbound import http1 as hot
from outbound import policy as outbound_policy
from outbound.errors import ConnectFailed, OutboundError, ProtocolError, UnsafeAddress, classify
from tests.outbound.rawagent import RawAgent, response

BODY = b'{"jsonrpc":"2.0","id":1,"method":"message/send","params":{}}'
HEADERS = {"content-type": "application/json"}
OK = b'{"jsonrpc":"2.0","id":1,"result":{}}'

pytestmark = pytest.mark.timeout(60)


def make_client(**changes) -> hot.Client:
    return hot.Client(dataclasses.replace(outbound_policy.current(), **changes))


async def call(
    client: hot.Client, url: str, *, timeout: float | None = 5.0, cap: int = 1 << 20
) -> tuple[int, dict[bytes, bytes], bytes | None]:
    r = await client.post(url, BODY, HEADERS, timeout)
    try:
        return r.status, dict(r.headers), await r.read(cap)
    finally:
        hot.finish(r)


def serve_forever(answer: bytes):
    """A keep-alive agent: every request on a connection gets ``answer``."""

    def script(conn: socket.socket, agent: RawAgent) -> None:
        while agent.take_request(conn):
            conn.sendall(answer)

    return script


# --- keep-alive -------------------------------------------------------------------------------


async def test_keep_alive_reuses_one_connection_and_expires_idle_ones():
    with RawAgent(serve_forever(response(OK))) as agent:
        client = make_client()
        for _ in range(3):
            assert await call(client, agent.url) == (
                200,
                {b"content-type": b"application/json", b"content-length": b"36"},
                OK,
            )
        assert agent.connections == 1 and len(agent.requests) == 3

        short = make_client(keepalive_seconds=0.2)
        await call(short, agent.url)
        await asyncio.sleep(0.35)  # past the keep-alive expiry: not reused
        await call(short, agent.url)
        assert agent.connections == 3
        await client.close()
        await short.close()


async def test_agent_closing_an_idle_connection_is_not_reused():
    def script(conn: socket.socket, agent: RawAgent) -> None:
        agent.take_request(conn)
        conn.sendall(response(OK))  # keep-alive by the headers, then closed while idle

    with RawAgent(script) as agent:
        client = make_client()
        await call(client, agent.url)
        await asyncio.sleep(0.2)
        status, _, body = await call(client, agent.url)
        assert (status, body) == (200, OK)
        assert agent.connections == 2
        await client.close()


async def test_ipv6_loopback_agent():
    with RawAgent(serve_forever(response(OK)), family=socket.AF_INET6) as agent:
        client = make_client()
        assert (await call(client, agent.url))[2] == OK
        assert agent.requests[0].split(b"\r\n")[1] == f"Host: [::1]:{agent.port}".encode()
        await client.close()


# --- bodies -----------------------------------------------------------------------------------


async def test_chunked_close_delimited_and_empty_bodies():
    answers = {
        "chunked": (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"5\r\nhello\r\n1\r\n \r\n5\r\nworld\r\n0\r\n\r\n",
            b"hello world",
        ),
        "close": (b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end", b"until the end"),
        "empty": (b"HTTP/1.1 204 No Content\r\n\r\n", b""),
    }
    for name, (raw, expected) in answers.items():

        def script(conn, agent, raw=raw, name=name):
            while agent.take_request(conn):
                conn.sendall(raw)
                if name == "close":
                    return

        with RawAgent(script) as agent:
            client = make_client()
            for _ in range(2):
                assert (await call(client, agent.url))[2] == expected, name
            # a close-delimited body ends the connection; the others are reused
            assert agent.connections == (2 if name == "close" else 1), name
            await client.close()


async def test_oversize_bodies_are_refused_and_the_connection_dropped():
    big = b"x" * (2 << 20)
    for raw in (
        response(big),
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"".join(b"100000\r\n" + b"x" * 0x100000 + b"\r\n" for _ in range(3))
        + b"0\r\n\r\n",
    ):
        with RawAgent(serve_forever(raw)) as agent:
            client = make_client()
            assert (await call(client, agent.url, cap=1 << 20))[2] is None
            assert not client.idle.get(("127.0.0.1", agent.port, False))
            await client.close()


async def test_flow_control_pauses_a_fast_agent_for_a_slow_reader():
    total = 48 << 20
    piece = b"y" * 65536

    def script(conn: socket.socket, agent: RawAgent) -> None:
        agent.take_request(conn)
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Content-Length: " + str(total).encode() + b"\r\n\r\n"
        )
        while agent.sent < total:
            conn.sendall(piece)
            agent.sent += len(piece)

    with RawAgent(script) as agent:
        client = make_client()
        r = await client.post(agent.url, BODY, HEADERS, None)
        received = len(await r.read_chunk())
        await asyncio.sleep(1.0)  # the caller reads nothing for a while
        held = agent.sent
        # paused at the high-water mark: only socket buffers fill, never the whole stream
        assert held < total // 2, held
        while piece_ := await r.read_chunk():
            received += len(piece_)
        assert received == total
        hot.finish(r)
        await client.close()


# --- executed: what each failure says ------------------------------------------------------


async def test_refused_connection_is_not_executed():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()  # nothing listens there
    client = make_client()
    with pytest.raises(ConnectFailed) as info:
        await call(client, f"http://127.0.0.1:{port}/")
    assert classify(info.value) == ("unreachable", False, str(info.value)[:300])


async def test_timeout_after_delivery_is_executed():
    def script(conn: socket.socket, agent: RawAgent) -> None:
        agent.take_request(conn)
        time.sleep(2)  # read the request, then hang past the caller's timeout

    with RawAgent(script) as agent:
        client = make_client()
        with pytest.raises(TimeoutError) as info:
            await call(client, agent.url, timeout=0.5)
        assert agent.requests  # it was delivered
        assert classify(info.value).kind == "timeout" and classify(info.value).executed
        await client.close()


async def test_timeout_mid_body_is_executed_and_drops_the_connection():
    def script(conn: socket.socket, agent: RawAgent) -> None:
        agent.take_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\nonly a part")
        time.sleep(2)

    with RawAgent(script) as agent:
        client = make_client()
        with pytest.raises(TimeoutError) as info:
            await call(client, agent.url, timeout=0.5)
        assert classify(info.value).executed
        assert not client.idle.get(("127.0.0.1", agent.port, False))
        await client.close()


async def test_connection_cut_mid_response_is_executed():
    def script(conn: socket.socket, agent: RawAgent) -> None:
        agent.take_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\ncut here")

    with RawAgent(script) as agent:
        client = make_client()
        with pytest.raises(OutboundError) as info:
            await call(client, agent.url)
        failure = classify(info.value)
        assert failure.kind == "unreachable" and failure.executed is True
        await client.close()


# --- header bounds ----------------------------------------------------------------------------


async def test_header_count_cap():
    many = b"".join(b"X-H%d: v\r\n" % i for i in range(150))
    fine = b"".join(b"X-H%d: v\r\n" % i for i in range(90))
    with RawAgent(serve_forever(response(OK, extra=fine))) as agent:
        client = make_client(max_headers=100)
        assert (await call(client, agent.url))[2] == OK
        await client.close()
    with RawAgent(serve_forever(response(OK, extra=many))) as agent:
        client = make_client(max_headers=100)
        with pytest.raises(ProtocolError, match="more than 100 headers") as info:
            await call(client, agent.url)
        assert classify(info.value).executed is True
        await client.close()


@pytest.mark.parametrize("shape", ["one huge header", "endless header", "endless 1xx"])
async def test_header_bytes_cap_bounds_what_is_read(shape):
    def script(conn: socket.socket, agent: RawAgent) -> None:
        agent.take_request(conn)
        if shape == "one huge header":
            conn.sendall(b"HTTP/1.1 200 OK\r\nX-Big: ")
            line = b"a" * 65536
        elif shape == "endless header":
            conn.sendall(b"HTTP/1.1 200 OK\r\nX-Endless: ")
            line = b"b" * 4096
        else:
            line = b"HTTP/1.1 100 Continue\r\nX-A: b\r\n\r\n"
        while agent.sent < (64 << 20):  # 64 MiB at most: more than socket buffers hold
            conn.sendall(line)
            agent.sent += len(line)

    with RawAgent(script) as agent:
        client = make_client(max_header_bytes=65536)
        started = time.monotonic()
        with pytest.raises(ProtocolError, match="bytes of headers|more than 100 headers"):
            await call(client, agent.url, timeout=20)
        assert time.monotonic() - started < 10
        # the connection was closed on the agent (its next send failed)
        assert await asyncio.to_thread(agent.closed_by_peer.wait, 5)
        assert agent.sent < (64 << 20)
        await client.close()


# --- protocol corners -------------------------------------------------------------------------


async def test_trailers_are_dropped():
    raw = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Checksum\r\n\r\n"
        b"2\r\n{}\r\n0\r\nX-Checksum: abc\r\nSet-Cookie: t=1\r\n\r\n"
    )
    with RawAgent(serve_forever(raw)) as agent:
        client = make_client()
        status, headers, body = await call(client, agent.url)
        assert (status, body) == (200, b"{}")
        assert b"x-checksum" not in headers and b"set-cookie" not in headers
        await call(client, agent.url)  # and the connection stays usable
        assert agent.connections == 1
        await client.close()


async def test_transfer_codings_other_than_chunked_are_refused():
    raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n2\r\n\x1f\x8b\r\n0\r\n\r\n"
    with RawAgent(serve_forever(raw)) as agent:
        client = make_client()
        with pytest.raises(ProtocolError, match="Transfer-Encoding"):
            await call(client, agent.url)
        await client.close()


async def test_101_switching_protocols_is_a_clean_error(caplog):
    def script(conn: socket.socket, agent: RawAgent) -> None:
        agent.take_request(conn)
        conn.sendall(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\n\r\n\x81\x05hello"
        )
        time.sleep(1)

    with RawAgent(script) as agent:
        client = make_client()
        with pytest.raises(ProtocolError, match="101") as info:
            await call(client, agent.url)
        assert classify(info.value).executed is True
        await client.close()
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]


@pytest.mark.parametrize(
    "extra",
    [
        b"SMUGGLED",
        b'HTTP/1.1 500 Oops\r\nContent-Length: 7\r\nX-Evil: 1\r\n\r\n{"b":2}',
    ],
)
async def test_bytes_after_a_complete_response_never_reach_a_caller(extra):
    def script(conn: socket.socket, agent: RawAgent) -> None:
        first = True
        while agent.take_request(conn):
            conn.sendall(response(OK) + (extra if first else b""))
            first = False

    with RawAgent(script) as agent:
        client = make_client()
        status, headers, body = await call(client, agent.url)
        assert (status, body) == (200, OK) and b"x-evil" not in headers
        await asyncio.sleep(0.1)
        # the poisoned connection was closed, never pooled: the next call is clean
        status, headers, body = await call(client, agent.url)
        assert (status, body) == (200, OK) and b"x-evil" not in headers
        assert agent.connections == 2
        await client.close()


# --- connect-time address check --------------------------------------------------------------


async def test_dns_rebinding_is_refused_at_connect_time(fake_dns):
    def script(conn: socket.socket, agent: RawAgent) -> None:
        agent.take_request(conn)
        conn.sendall(response(OK, extra=b"Connection: close\r\n"))

    with RawAgent(script) as agent:
        fake_dns["agent.rebind.test"] = "127.0.0.1"
        url = f"http://agent.rebind.test:{agent.port}/rpc"
        client = make_client()
        assert (await call(client, url))[2] == OK
        assert (
            agent.requests[0].split(b"\r\n")[1] == f"Host: agent.rebind.test:{agent.port}".encode()
        )
        fake_dns["agent.rebind.test"] = "169.254.169.254"  # the name now points at metadata
        with pytest.raises(UnsafeAddress, match="refused address 169.254.169.254") as info:
            await call(client, url)
        assert classify(info.value).executed is False
        assert len(agent.requests) == 1
        await client.close()


@pytest.mark.parametrize(
    "host",
    [
        "[2002:a9fe:a9fe::1]",
        "[::ffff:169.254.169.254]",
        "[64:ff9b::a9fe:a9fe]",
        "169.254.169.254",
        "[fe80::1]",
        "metadata.google.internal",
        "2852039166",
    ],
)
async def test_unsafe_literal_addresses_are_refused_before_connecting(host):
    client = make_client(connect_timeout=2)
    with pytest.raises(UnsafeAddress):
        await call(client, f"http://{host}:80/")


def test_request_heads_per_method_and_suffix():
    """The request line and Host of each method and suffix, the same when built again (kept
    per agent URL, a bounded few) as the first time."""
    from outbound.http1_wire import Target

    where = Target("http://agent.example:8080/rest/?q=1")
    host = b" HTTP/1.1\r\nHost: agent.example:8080\r\n"
    assert where.head("POST") == b"POST /rest/?q=1" + host
    assert where.head("GET") == b"GET /rest?q=1" + host
    for _ in range(3):  # built, kept, then past the bound forgotten and built again
        for n in range(20):
            assert where.head("GET", f"/tasks/t{n}?a=b") \
                == f"GET /rest/tasks/t{n}?a=b".encode() + host
            assert where.head("POST", "/message:send") == b"POST /rest/message:send" + host
    assert where.head("DELETE", "/tasks/t/pushNotificationConfigs/c") \
        == b"DELETE /rest/tasks/t/pushNotificationConfigs/c" + host
    assert where.head("GET") == b"GET /rest?q=1" + host
