"""The hot-path client's interface over aiohttp (``A2A_OUTBOUND_CLIENT=aiohttp``).

A well-kept library behind the same small interface as :mod:`outbound.http1`'s own client
(``post`` / ``request`` -> a response with ``status``, ``headers``, ``content_length``,
``header()``, ``read(cap)``, ``read_chunk()``, ``finish()``), built by the shared outbound
layer (TLS, proxy, connect-time address check, header bounds). The gateway's proxy tests run
against both, so a defect of the hand-written client shows as a difference; operators can
switch to it too.
aiohttp adds no headers of its own here (no User-Agent, Accept, Accept-Encoding or
Content-Type), never follows redirects and never decompresses, like the own client.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import yarl

from outbound.clients import aiohttp_session
from outbound.errors import ConnectFailed, OutboundError, ProtocolError
from outbound.policy import Policy

_SKIP = ("User-Agent", "Accept", "Accept-Encoding", "Content-Type")

#: The most ``read_chunk`` hands over at once, about what the own client's does (its high-water
#: mark plus one socket read): aiohttp's ``readany`` joins everything its reader holds (half a
#: MiB and more for a fast stream), which then waits in the relay and the server's write buffer.
PIECE_BYTES = 256 * 1024


def _wrap(exc: BaseException) -> BaseException:
    if isinstance(exc, OutboundError | TimeoutError):
        return exc
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return ConnectFailed(f"connect timed out: {exc}")
    if isinstance(exc, aiohttp.ServerTimeoutError):
        return TimeoutError()
    if isinstance(exc, aiohttp.ClientConnectorError | aiohttp.InvalidURL):
        return ConnectFailed(str(exc) or type(exc).__name__)
    if isinstance(exc, aiohttp.ClientResponseError):
        return ProtocolError(f"invalid HTTP response from the agent: {str(exc.message)[:120]}")
    return OutboundError(str(exc) or type(exc).__name__)


class AiohttpResponse:
    """An aiohttp response; the session's total timeout bounds the body too."""

    __slots__ = ("status", "headers", "content_length", "_response", "complete")

    def __init__(self, response: Any) -> None:
        self._response = response
        self.status = response.status
        self.headers: list[tuple[bytes, bytes]] = [(k.lower(), v) for k, v in response.raw_headers]
        self.content_length = response.content_length
        self.complete = False

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None

    async def read(self, cap: int) -> bytes | None:
        chunks: list[bytes] = []
        size = 0
        try:
            piece: bytes
            async for piece in self._response.content.iter_any():
                size += len(piece)
                if size > cap:
                    self._response.close()
                    return None
                chunks.append(piece)
        except aiohttp.ClientError as exc:
            raise _wrap(exc) from exc
        self.complete = True
        return b"".join(chunks)

    async def read_chunk(self) -> bytes:
        try:
            piece: bytes = await self._response.content.read(PIECE_BYTES)
        except aiohttp.ClientError as exc:
            raise _wrap(exc) from exc
        if not piece:
            self.complete = True
        return piece

    def finish(self) -> None:
        if self.complete:
            self._response.release()
        else:
            self._response.close()


class AiohttpClient:
    """One pooled aiohttp session per event loop."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.closed = False
        self._session = aiohttp_session(skip_auto_headers=_SKIP)

    async def post(
        self, endpoint: str, body: bytes, headers: dict[str, str], timeout: float | None
    ) -> AiohttpResponse:
        return await self.request("POST", endpoint, body, headers, timeout)

    async def request(
        self, method: str, endpoint: str, body: bytes, headers: dict[str, str],
        timeout: float | None, *, suffix: str = "",
    ) -> AiohttpResponse:
        url: Any = endpoint
        if suffix:  # the caller's encoding kept as it is (yarl would normalize it)
            url = yarl.URL(endpoint.split("?", 1)[0].rstrip("/") + suffix, encoded=True)
        clean = {k: v for k, v in headers.items() if "\r" not in v and "\n" not in v}
        timeouts = aiohttp.ClientTimeout(total=timeout, connect=self.policy.connect_timeout)
        try:
            response = await self._session.request(
                method, url, data=body if body or method == "POST" else None,
                headers=clean, allow_redirects=False, timeout=timeouts,
            )
        except (aiohttp.ClientError, ValueError) as exc:
            raise _wrap(exc) from exc
        if response.status == 101:
            response.close()
            raise ProtocolError("the agent answered 101 Switching Protocols")
        coding = response.headers.get("Transfer-Encoding")
        if coding is not None and coding.strip().lower() != "chunked":
            # aiohttp would hand over e.g. gzip-coded bytes as if they were the body
            response.close()
            raise ProtocolError(f"unsupported Transfer-Encoding from the agent: {coding[:100]}")
        return AiohttpResponse(response)

    async def close(self) -> None:
        self.closed = True
        await self._session.close()
