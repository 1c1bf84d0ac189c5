"""Fixtures of the outbound-layer tests: both gateway clients, a resolver the test controls."""

from __future__ import annotations

import socket

import pytest

from tests import passes


@pytest.fixture(params=passes.outbound_clients())
def outbound_client(request, settings) -> str:
    """The gateway's own HTTP/1.1 client and the aiohttp one (``A2A_OUTBOUND_CLIENT``)."""
    settings.A2A_OUTBOUND_CLIENT = request.param
    return request.param


@pytest.fixture
def fake_dns(monkeypatch) -> dict[str, str]:
    """Names put in the returned dict resolve to the address given there (the system resolver
    is the one part that cannot run here: no DNS server of ours is on its path). Everything
    goes through ``socket.getaddrinfo``: the asyncio loop's resolver, aiohttp's threaded
    resolver and httpcore's sync backend all call it."""
    real = socket.getaddrinfo
    table: dict[str, str] = {}

    def getaddrinfo(host, port, *args, **kwargs):
        if isinstance(host, str) and host in table:
            return real(table[host], port, *args, **kwargs)
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return table
