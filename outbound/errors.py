"""Transport errors of every outbound client, and their one mapping to the gateway's kinds.

ARCHITECTURE's "Executed" contract: ``executed`` is false only when the agent certainly never
received the request (refused connection, DNS failure, TLS handshake failure, an address
refused by the SSRF rules, a connect timeout); once any request byte was written it is true,
whatever happened next. Every client of this package raises :class:`OutboundError` carrying
``sent`` (were request bytes written?) and ``kind``; :func:`classify` turns any exception an
outbound call can raise (ours, asyncio's, aiohttp's, httpx's) into a :class:`Failure`.
Unknown exceptions count as sent: ``executed: false`` is a promise, so doubt says true.
"""

from __future__ import annotations

from typing import NamedTuple

#: The gateway's error kinds this layer produces (the values of ``gateway.errors``).
UNREACHABLE = "unreachable"
TIMEOUT = "timeout"


class OutboundError(Exception):
    """The agent could not be reached, or broke the connection or the protocol.

    ``sent``: whether any request byte was written to the agent (decides ``executed``).
    ``kind``: the gateway error kind it maps to.
    """

    def __init__(self, message: str, *, sent: bool = True, kind: str = UNREACHABLE) -> None:
        super().__init__(message)
        self.sent = sent
        self.kind = kind


class ConnectFailed(OutboundError):
    """No connection was made (refused, DNS, TLS handshake, connect timeout): nothing sent."""

    def __init__(self, message: str) -> None:
        super().__init__(message, sent=False)


class UnsafeAddress(ConnectFailed):
    """The agent's name resolved to an address the SSRF rules refuse (checked at connect)."""


class ProtocolError(OutboundError):
    """The agent's answer broke HTTP or a bound (header caps, 101, bytes after the response)."""


class Failure(NamedTuple):
    kind: str
    executed: bool
    detail: str


def describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text[:300]


def classify(exc: BaseException) -> Failure:
    """The gateway error kind, ``executed`` and a short detail for a failed outbound call."""
    if isinstance(exc, OutboundError):
        return Failure(exc.kind, exc.sent, describe(exc))
    if isinstance(exc, TimeoutError):
        return Failure(TIMEOUT, True, "")
    name = type(exc).__module__.split(".", 1)[0]
    if name == "aiohttp":
        import aiohttp

        if isinstance(
            exc,
            aiohttp.ClientConnectorError | aiohttp.ConnectionTimeoutError | aiohttp.InvalidURL,
        ):
            return Failure(UNREACHABLE, False, describe(exc))
        if isinstance(exc, aiohttp.ServerTimeoutError):
            return Failure(TIMEOUT, True, "")
    elif name in ("httpx", "httpcore"):
        import httpx

        if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
            return Failure(UNREACHABLE, False, describe(exc))
        if isinstance(exc, httpx.TimeoutException):
            return Failure(TIMEOUT, True, "")
    return Failure(UNREACHABLE, True, describe(exc))


#: What a failed exchange with an agent raises besides TimeoutError (the gateway catches these).
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (OutboundError, OSError)
