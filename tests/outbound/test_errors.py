"""The one mapping of transport errors to the gateway's kinds and ``executed``, over the errors
the real clients raise (each provoked against loopback, not constructed by hand)."""

from __future__ import annotations

import socket

import aiohttp
import httpx
import pytest

from outbound import clients
from outbound.errors import classify
from tests.outbound.rawagent import RawAgent
from tests.servers import free_port


def _refused_url() -> str:
    return f"http://127.0.0.1:{free_port()}/"


def _cut_agent() -> RawAgent:
    def script(conn: socket.socket, agent: RawAgent) -> None:
        agent.take_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\ncut")

    return RawAgent(script)


def _httpx_error(url: str) -> BaseException:
    with clients.httpx_client(timeout=httpx.Timeout(5)) as client:
        try:
            client.get(url).read()
        except httpx.HTTPError as exc:
            return exc
    raise AssertionError("no error")


async def _aiohttp_error(url: str) -> BaseException:
    async with clients.aiohttp_session() as session:
        try:
            async with session.get(url) as response:
                await response.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            return exc
    raise AssertionError("no error")


def test_httpx_errors():
    assert classify(_httpx_error(_refused_url()))[:2] == ("unreachable", False)
    assert classify(_httpx_error("http://[::ffff:169.254.169.254]:80/"))[:2] == (
        "unreachable",
        False,
    )
    with _cut_agent() as agent:
        assert classify(_httpx_error(agent.url))[:2] == ("unreachable", True)


async def test_aiohttp_errors():
    assert classify(await _aiohttp_error(_refused_url()))[:2] == ("unreachable", False)
    with _cut_agent() as agent:
        assert classify(await _aiohttp_error(agent.url))[:2] == ("unreachable", True)


async def test_unsafe_address_through_aiohttp_is_not_sent():
    async with clients.aiohttp_session() as session:
        with pytest.raises(Exception) as info:
            await session.get("http://[2002:a9fe:a9fe::1]:80/")
    assert classify(info.value)[:2] == ("unreachable", False)
    assert "refused" in str(info.value)


def test_unknown_errors_count_as_executed():
    assert classify(RuntimeError("?")).executed is True
    assert classify(TimeoutError()) == ("timeout", True, "")
