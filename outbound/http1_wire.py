"""The wire side of the hot-path HTTP/1.1 client (:mod:`outbound.http1`): the parsed agent URL
(:class:`Target`), one keep-alive connection on an asyncio protocol with the httptools parser
(:class:`Connection`) and the response it is reading (:class:`Response`: status and headers at
once, the body as it arrives, flow control for streams).

The bounds on what an agent sends are enforced here, each counted once per header or once per
received segment, never per request (``A2A_OUTBOUND_MAX_HEADER_BYTES``,
``A2A_OUTBOUND_MAX_HEADERS``; a smuggled second response, 101 Switching Protocols and
Transfer-Encodings other than ``chunked`` close the connection): see :mod:`outbound.http1`.
"""

from __future__ import annotations

import asyncio
import collections
import socket
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import httptools

from outbound.errors import OutboundError, ProtocolError

if TYPE_CHECKING:
    from outbound.http1 import Client



#: Unread response bytes above which reading from the agent pauses (streams, slow callers):
#: a streamed body waits here at most this plus one socket read (256 KiB), beside the relay's
#: own bounded buffer (``A2A_SSE_BUFFER_BYTES``), so it is kept small (aiohttp's reader pauses
#: at 128 KiB).
HIGH_WATER_BYTES = 64 * 1024


class Target:
    """A parsed agent URL: where to connect and what to put on the request line."""

    __slots__ = ("key", "host", "port", "tls", "request_head", "_path", "_tail", "_query",
                 "_heads")

    def __init__(self, endpoint: str) -> None:
        parts = urlsplit(endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise OutboundError(f"unsupported agent URL {endpoint[:200]!r}", sent=False)
        self.tls = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.tls else 80)
        self.key = (self.host, self.port, self.tls)
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        default_port = self.port == (443 if self.tls else 80)
        host_header = self.host if ":" not in self.host else f"[{self.host}]"
        if not default_port:
            host_header += f":{self.port}"
        self._path = (parts.path or "/").rstrip("/")
        self._query = parts.query
        self._tail = f" HTTP/1.1\r\nHost: {host_header}\r\n".encode("latin-1")
        self.request_head = f"POST {path}".encode("latin-1") + self._tail
        #: Request heads of a method and suffix, built once (an HTTP+JSON route's calls
        #: repeat theirs): at most :data:`_HEADS_KEPT`, forgotten all at once when full (the
        #: routes called most come back first; a task id's head seldom does).
        self._heads: dict[tuple[str, str], bytes] = {}

    def head(self, method: str, suffix: str = "") -> bytes:
        """The request line and Host header for ``method``; ``suffix`` (a path starting with
        ``/``, and its query) goes after the URL's path (an HTTP+JSON route under the agent's
        interface URL), replacing the URL's own query."""
        if not suffix and method == "POST":
            return self.request_head
        head = self._heads.get((method, suffix))
        if head is not None:
            return head
        if not suffix:
            path = (self._path or "/") + (f"?{self._query}" if self._query else "")
        else:
            path = self._path + suffix
        head = f"{method} {path}".encode("latin-1") + self._tail
        if len(self._heads) >= _HEADS_KEPT:
            self._heads.clear()
        self._heads[(method, suffix)] = head
        return head


#: Request heads kept per agent URL (:meth:`Target.head`): a few routes per agent, whatever
#: the number of agents (:func:`target` keeps up to 100,000 URLs).
_HEADS_KEPT = 8


_targets: dict[str, Target] = {}


def target(endpoint: str) -> Target:
    """The parsed agent URL, cached (parsing costs more than the lookup)."""
    value = _targets.get(endpoint)
    if value is None:
        value = Target(endpoint)
        if len(_targets) < 100_000:
            _targets[endpoint] = value
    return value


class Response:
    """An agent's response: status and headers at once, the body as it arrives."""

    __slots__ = ("status", "headers", "content_length", "_conn", "_chunks", "_buffered",
                 "_waiter", "_complete", "_error", "_headers_future", "_keep_alive",
                 "_streaming", "_timer", "_eof_delimited")

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.content_length: int | None = None
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._waiter: asyncio.Future[None] | None = None
        self._complete = False
        self._error: BaseException | None = None
        self._keep_alive = False
        self._streaming = False  # read piecemeal: pause the agent when the caller lags
        self._timer: asyncio.TimerHandle | None = None
        self._eof_delimited = False
        self._headers_future: asyncio.Future[None] = conn.loop.create_future()

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None

    @property
    def complete(self) -> bool:
        return self._complete

    # -- reading ---------------------------------------------------------------------------

    async def read(self, cap: int) -> bytes | None:
        """The whole body; None once it passes ``cap`` bytes (the connection is dropped)."""
        while not self._complete:
            if self._error is not None:
                raise self._error
            if self._buffered > cap:
                self.close()
                return None
            await self._wait()
        if self._error is not None and not self._complete:
            raise self._error
        return self.take(cap)

    def take(self, cap: int) -> bytes | None:
        """The whole body of a :attr:`complete` response, without a coroutine (most answers
        arrive with their head); None once it passes ``cap`` bytes (the connection is
        dropped)."""
        if self._buffered > cap:
            self.close()
            return None
        chunks = self._chunks
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self._buffered = 0
        return body

    async def read_chunk(self) -> bytes:
        """The next piece of the body as it arrives; b"" at its end."""
        self._streaming = True
        while not self._chunks:
            if self._complete:
                return b""
            if self._error is not None:
                raise self._error
            await self._wait()
        piece = self._chunks.popleft() if len(self._chunks) == 1 else b"".join(self._chunks)
        self._chunks.clear()
        self._buffered = 0
        self._conn.resume()
        return piece

    async def _wait(self) -> None:
        waiter = self._waiter = self._conn.loop.create_future()
        try:
            await waiter
        finally:
            self._waiter = None

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- feeding (from the connection) ----------------------------------------------------

    def _on_headers(self, status: int, headers: list[tuple[bytes, bytes]], keep_alive: bool,
                    length: bytes | None) -> None:
        """``length``: the first Content-Length value, found while the headers were parsed."""
        self.status = status
        self.headers = headers
        self._keep_alive = keep_alive
        if length is not None:
            try:
                self.content_length = int(length)
            except ValueError:
                self.content_length = None
        elif status not in (204, 304) and b"chunked" not in (
            self.header(b"transfer-encoding") or b""
        ).lower():
            self._eof_delimited = True  # the body ends when the agent closes the connection
        if not self._headers_future.done():
            self._headers_future.set_result(None)

    def _on_body(self, data: bytes) -> None:
        self._chunks.append(data)
        self._buffered += len(data)
        if self._streaming and self._buffered > HIGH_WATER_BYTES:
            self._conn.pause()
        self._wake()

    def _on_complete(self) -> None:
        self._complete = True
        self._wake()

    def _fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
        if not self._headers_future.done():
            self._headers_future.set_exception(error)
            self._headers_future.exception()  # retrieved by whoever awaits it, or nobody
        self._wake()

    # -- ending ------------------------------------------------------------------------------

    def release(self) -> None:
        """Done with the response: a complete keep-alive exchange returns the connection to
        the pool; anything else closes it (the agent sees the caller went away)."""
        conn = self._conn
        if conn.response is not self:
            return
        conn.response = None
        if self._complete and self._keep_alive and self._error is None and not conn.closed:
            conn.client.give_back(conn)
        else:
            conn.close()

    def close(self) -> None:
        conn = self._conn
        if conn.response is self:
            conn.response = None
        conn.close()

    def finish(self) -> None:
        """End the exchange: cancel its timeout, release or close its connection."""
        timer = self._timer
        if timer is not None:
            self._timer = None
            timer.cancel()
        self.release()


class _Stop(Exception):
    """Raised inside a parser callback to stop parsing (the reason is on the connection)."""


class Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection to an agent."""

    def __init__(self, client: Client, key: tuple[str, int, bool]) -> None:
        self.client = client
        self.key = key
        self.loop = client.loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.response: Response | None = None
        self.closed = False
        self.paused = False
        self.idle_since = 0.0
        self._headers: list[tuple[bytes, bytes]] = []
        self.max_headers = client.policy.max_headers
        self.max_header_bytes = client.policy.max_header_bytes
        # Per exchange: bytes received without body progress (head, interim responses,
        # trailers), header lines seen, whether the final response is complete, why parsing
        # stopped, the Transfer-Encoding of the final response.
        self.quiet = 0
        self.header_count = 0
        self.finished = False
        self.violation: str | None = None
        self.in_body = False
        self.transfer_encoding: bytes | None = None
        self.length_header: bytes | None = None  # the first Content-Length

    def begin(self) -> None:
        """Reset the per-exchange state before a request is written."""
        self.quiet = 0
        self.header_count = 0
        self.finished = False
        self.in_body = False

    # asyncio protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a socket transport (asyncio.Transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass

    def data_received(self, data: bytes) -> None:
        if self.response is None or self.finished:
            # Bytes on an idle connection, or after a complete response (a smuggled second
            # response): never parsed into anything a caller sees; the connection closes.
            self.close()
            return
        self.quiet += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            if self.finished:  # the response stands; the extra bytes only end the connection
                self.close()
                return
            self._broken(ProtocolError(
                self.violation or f"invalid HTTP response from the agent: {exc}"))
            return
        except httptools.HttpParserUpgrade:  # 101 without headers_complete seen (defensive)
            self._broken(ProtocolError("the agent switched protocols; not an HTTP answer"))
            return
        if self.quiet > self.max_header_bytes and not self.finished:
            self._broken(ProtocolError(
                f"the agent sent more than {self.max_header_bytes} bytes of headers"))

    def eof_received(self) -> bool | None:
        return None  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        response = self.response
        if response is not None and not response.complete:
            if exc is None and response._eof_delimited and response.status:
                response._keep_alive = False
                response._on_complete()
            else:
                response._fail(OutboundError("the agent closed the connection") if exc is None
                               else OutboundError(f"connection lost: {exc}"))
        self.client.forget(self)

    # httptools callbacks
    def on_message_begin(self) -> None:
        if self.finished:
            self.violation = "bytes after a complete response"
            raise _Stop
        self._headers = []
        self.transfer_encoding = None
        self.length_header = None

    def on_header(self, name: bytes, value: bytes) -> None:
        self.header_count += 1
        if self.header_count > self.max_headers:
            self.violation = f"the agent sent more than {self.max_headers} headers"
            raise _Stop
        if self.in_body:
            return  # a chunked trailer: dropped, never relayed as a header
        name = name.lower()
        if name == b"content-length":
            if self.length_header is None:
                self.length_header = value
        elif name == b"transfer-encoding":
            self.transfer_encoding = value
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if status < 200:
            if status == 101:
                self.violation = "the agent answered 101 Switching Protocols"
                raise _Stop
            return  # an interim response (100 Continue, 103 Early Hints): the real one follows
        encoding = self.transfer_encoding
        if encoding is not None and encoding.strip().lower() != b"chunked":
            self.violation = (f"unsupported Transfer-Encoding from the agent: "
                              f"{encoding[:100].decode('latin-1')}")
            raise _Stop
        self.in_body = True
        self.quiet = 0
        response = self.response
        if response is not None:
            response._on_headers(status, self._headers, self.parser.should_keep_alive(),
                                 self.length_header)

    def on_body(self, body: bytes) -> None:
        self.quiet = 0
        if self.response is not None:
            self.response._on_body(body)

    def on_message_complete(self) -> None:
        if self.parser.get_status_code() < 200:
            return
        self.finished = True
        if self.response is not None:
            self.response._on_complete()

    # flow control and ending
    def pause(self) -> None:
        if not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.paused and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.close()
        self.client.forget(self)

    def _broken(self, error: BaseException) -> None:
        if self.response is not None:
            self.response._fail(error)
        self.close()
