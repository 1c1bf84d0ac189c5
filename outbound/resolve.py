"""The connect-time address check: resolve the agent's name, refuse unsafe addresses, connect
to a checked address (TLS SNI and Host stay the name).

Every outbound client goes through here on each NEW connection (never per request on a pooled
one): the hand-written hot-path client calls :func:`resolve` itself; aiohttp sessions get
:func:`checked_connector`; httpx clients get a checked httpcore network backend
(:class:`CheckedBackend`, :class:`CheckedAsyncBackend`). A name with ANY refused address is
refused as a whole: a name that resolves to an agent and to the metadata address is an attack.

With ``A2A_OUTBOUND_PROXY`` set, the library clients resolve and check the proxy's address;
the target's name is resolved by the proxy, whose egress rules then apply.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable
from typing import Any

import httpcore

from outbound.addresses import METADATA_HOSTS, refusal, refusal_of
from outbound.errors import ConnectFailed, UnsafeAddress

Address = tuple[int, str]  # (family, IP as text)


def _literal(host: str) -> Address | None:
    try:
        addr = ipaddress.ip_address(host.strip("[]").split("%", 1)[0])
    except ValueError:
        return None
    reason = refusal(addr)
    if reason:
        raise UnsafeAddress(f"{host}: {reason}")
    return (socket.AF_INET6 if addr.version == 6 else socket.AF_INET, host.strip("[]"))


def _checked(host: str, infos: Iterable[Any]) -> list[Address]:
    found: list[Address] = []
    for family, _type, _proto, _canon, sockaddr in infos:
        ip = sockaddr[0]
        reason = refusal_of(ip)
        if reason:
            raise UnsafeAddress(f"{host} resolves to a refused address {ip}: {reason}")
        if (family, ip) not in found:
            found.append((family, ip))
    if not found:
        raise ConnectFailed(f"{host} resolves to no address")
    return found


def _by_name(host: str) -> None:
    if host.lower().rstrip(".") in METADATA_HOSTS:
        raise UnsafeAddress(f"{host}: cloud metadata hosts are refused")


async def resolve(host: str, port: int) -> list[Address]:
    """The checked addresses of ``host`` (in resolver order); raises :class:`UnsafeAddress`
    or :class:`ConnectFailed` (the name does not resolve)."""
    literal = _literal(host)
    if literal is not None:
        return [literal]
    _by_name(host)
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise ConnectFailed(f"cannot resolve {host}: {exc}") from None
    return _checked(host, infos)


def resolve_sync(host: str, port: int) -> list[Address]:
    """:func:`resolve` for synchronous clients."""
    literal = _literal(host)
    if literal is not None:
        return [literal]
    _by_name(host)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise ConnectFailed(f"cannot resolve {host}: {exc}") from None
    return _checked(host, infos)


# --- aiohttp ---------------------------------------------------------------------------------

_connector_class: list[type] = []


def checked_connector(**options: Any) -> Any:
    """An aiohttp ``TCPConnector`` that checks every address it is about to connect to.

    The check sits on the connector's host resolution, which runs for each new connection and
    (unlike a custom resolver) also for IP literals, which aiohttp never hands to a resolver.
    A refusal is raised as :class:`UnsafeAddress`, not an OSError, so aiohttp passes it
    through unchanged. DNS caching is off: a re-pointed name is seen at the next connection.
    """
    if not _connector_class:
        import aiohttp

        class CheckedConnector(aiohttp.TCPConnector):
            async def _resolve_host(self, host: str, port: int, traces: Any = None) -> Any:
                _by_name(host)
                results = await super()._resolve_host(host, port, traces)
                for result in results:
                    reason = refusal_of(result["host"])
                    if reason:
                        raise UnsafeAddress(
                            f"{host} resolves to a refused address {result['host']}: {reason}"
                        )
                return results

        _connector_class.append(CheckedConnector)
    return _connector_class[0](use_dns_cache=False, **options)


# --- httpx (httpcore network backends) ------------------------------------------------------


class CheckedBackend(httpcore.NetworkBackend):
    """httpcore's sync backend, connecting only to checked addresses of the name."""

    def __init__(self, inner: httpcore.NetworkBackend) -> None:
        self._inner = inner

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        try:
            addresses = resolve_sync(host, port)
        except ConnectFailed as exc:
            raise httpcore.ConnectError(str(exc)) from exc
        error: Exception | None = None
        for _family, ip in addresses:
            try:
                return self._inner.connect_tcp(ip, port, timeout, local_address, socket_options)
            except httpcore.ConnectError as exc:
                error = exc
        raise error  # type: ignore[misc]  # addresses are never empty: error is set

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        return self._inner.connect_unix_socket(path, timeout, socket_options)

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


class CheckedAsyncBackend(httpcore.AsyncNetworkBackend):
    """httpcore's async backend, connecting only to checked addresses of the name."""

    def __init__(self, inner: httpcore.AsyncNetworkBackend) -> None:
        self._inner = inner

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        try:
            addresses = await resolve(host, port)
        except ConnectFailed as exc:
            raise httpcore.ConnectError(str(exc)) from exc
        error: Exception | None = None
        for _family, ip in addresses:
            try:
                return await self._inner.connect_tcp(
                    ip, port, timeout, local_address, socket_options
                )
            except httpcore.ConnectError as exc:
                error = exc
        raise error  # type: ignore[misc]  # addresses are never empty: error is set

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.AsyncNetworkStream:
        return await self._inner.connect_unix_socket(path, timeout, socket_options)

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)
