"""The one pooled outbound HTTP client of the proxy hot path, behind this module.

How it was chosen, by measurement (wrk -t1 pinned to core 1, servers on core 0, 1 KiB
message/send, CPU per request read from /proc, interleaved rounds on this 2-core machine):

- httpx: out of the hot path (PERFORMANCE.md: its pool is 10x slower than aiohttp at c=64;
  httpx over the aiohttp transport still 2.7x slower). It stays the project's HTTP API
  everywhere else (card fetching, discovery, tests).
- aiohttp behind this module (first version): the gateway reached ~0.8x the reference
  raw-ASGI + aiohttp proxy at c=64 (240-275 vs 185-200 us CPU per request). A py-spy profile
  put ~28 % of the gateway's CPU inside aiohttp's client machinery (request, payload and
  multidict objects, timer contexts, a writer task per request), more than all of the
  gateway's own work (validation, auth, routing, envelope, metrics).
- this module (current): the virtual subscriber needs far less than a general client - POST
  bytes, relay bytes - so it is a small HTTP/1.1 client on asyncio protocols with the httptools
  parser (the one uvicorn uses). Same rig: 73-82 us CPU per request, ~1.7x the aiohttp proxy's
  req/s at c=64, p50 at c=1 ~300 us against its ~400 us; 256 KiB bodies at parity (the
  gateway's one JSON parse of the body is the difference). bench/proxy_bench.py measures it.

What it does: keep-alive pools per origin, one write per request, Content-Length, chunked and
close-delimited bodies, interim 1xx responses skipped, flow control for streams, TLS through
``ssl``. It never adds headers of its own (no User-Agent, Accept or Accept-Encoding), never
follows redirects, keeps no cookies and never decompresses: bodies are relayed byte for byte.

One client per event loop (a process normally has one; tests run several servers, each on its
own loop), closed on node shutdown. Idle keep-alive connections expire after
:data:`KEEPALIVE_SECONDS`, just under the common 5 s idle timeout of agent servers (uvicorn,
Node), so a pooled connection is not reused as the agent closes it. A POST is never retried.
"""

from __future__ import annotations

import asyncio
import collections
import socket
import ssl
import time
import weakref
from urllib.parse import urlsplit

import httptools

KEEPALIVE_SECONDS = 4.0
CONNECT_TIMEOUT_SECONDS = 10.0
MAX_IDLE_PER_ORIGIN = 256
#: Unread response bytes above which reading from the agent pauses (streams, slow callers).
HIGH_WATER_BYTES = 1 << 20


class OutboundError(Exception):
    """The agent could not be reached, or broke the connection or the protocol."""


#: What a failed exchange with an agent raises (besides TimeoutError).
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (OutboundError, OSError)


class Target:
    """A parsed agent URL: where to connect and what to put on the request line."""

    __slots__ = ("key", "host", "port", "tls", "request_head")

    def __init__(self, endpoint: str) -> None:
        parts = urlsplit(endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise OutboundError(f"unsupported agent URL {endpoint[:200]!r}")
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
        self.request_head = f"POST {path} HTTP/1.1\r\nHost: {host_header}\r\n".encode("latin-1")


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

    def __init__(self, conn: _Connection) -> None:
        self._conn = conn
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.content_length: int | None = None
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._waiter: asyncio.Future | None = None
        self._complete = False
        self._error: BaseException | None = None
        self._keep_alive = False
        self._streaming = False  # read piecemeal: pause the agent when the caller lags
        self._timer: asyncio.TimerHandle | None = None
        self._eof_delimited = False
        self._headers_future: asyncio.Future = conn.loop.create_future()

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

    def _on_headers(self, status: int, headers: list, keep_alive: bool) -> None:
        self.status = status
        self.headers = headers
        self._keep_alive = keep_alive
        length = self.header(b"content-length")
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


class _Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection to an agent."""

    def __init__(self, client: Client, key: tuple) -> None:
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

    # asyncio protocol
    def connection_made(self, transport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass

    def data_received(self, data: bytes) -> None:
        if self.response is None:
            self.close()  # bytes on an idle connection: not a state worth reusing
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._broken(OutboundError(f"invalid HTTP response from the agent: {exc}"))

    def eof_received(self) -> bool | None:
        return None  # close the transport

    def connection_lost(self, exc) -> None:
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
        self._headers = []

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if status < 200:
            return  # an interim response (100 Continue, 103 Early Hints): the real one follows
        response = self.response
        if response is not None:
            response._on_headers(status, self._headers, self.parser.should_keep_alive())

    def on_body(self, body: bytes) -> None:
        if self.response is not None:
            self.response._on_body(body)

    def on_message_complete(self) -> None:
        if self.parser.get_status_code() < 200:
            return
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


class Client:
    """Keep-alive connection pools per agent origin, on one event loop."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.idle: dict[tuple, list[_Connection]] = {}
        self.closed = False

    async def post(self, endpoint: str, body: bytes, headers: dict[str, str],
                   timeout: float | None) -> Response:
        """POST ``body`` with exactly ``headers`` (plus Host and Content-Length); answers once
        the status and headers arrived. ``timeout`` bounds the whole exchange, body included
        (None: no bound; the caller enforces its own, e.g. a stream's idle timeout)."""
        where = target(endpoint)
        parts = [where.request_head]
        for name, value in headers.items():
            if "\r" in value or "\n" in value:
                continue  # never let a value split the request
            parts.append(f"{name}: {value}\r\n".encode("latin-1", "replace"))
        parts.append(b"Content-Length: %d\r\n\r\n" % len(body))
        head = b"".join(parts)
        conn = await self._acquire(where)
        response = conn.response = Response(conn)
        timer = None
        if timeout is not None:
            timer = self.loop.call_later(timeout, _expire, response)
        try:
            if len(body) < 16384:
                conn.transport.write(head + body)  # type: ignore[union-attr]
            else:  # no copy of a large body
                conn.transport.writelines((head, body))  # type: ignore[union-attr]
            await response._headers_future
        except BaseException:
            if timer is not None:
                timer.cancel()
            response.close()
            raise
        response._timer = timer
        return response

    async def _acquire(self, where: Target) -> _Connection:
        pool = self.idle.get(where.key)
        if pool:
            now = time.monotonic()
            while pool:
                conn = pool.pop()
                if not conn.closed and now - conn.idle_since < KEEPALIVE_SECONDS:
                    return conn
                conn.close()
        tls = _tls_context() if where.tls else None
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_SECONDS):
                _, conn = await self.loop.create_connection(
                    lambda: _Connection(self, where.key), where.host, where.port,
                    ssl=tls,
                    server_hostname=where.host if where.tls else None,
                )
        except TimeoutError:
            raise OutboundError(f"connect to {where.host}:{where.port} timed out") from None
        return conn  # type: ignore[return-value]

    def give_back(self, conn: _Connection) -> None:
        if self.closed:
            conn.close()
            return
        conn.idle_since = time.monotonic()
        conn.resume()
        pool = self.idle.setdefault(conn.key, [])
        if len(pool) >= MAX_IDLE_PER_ORIGIN:
            conn.close()
            return
        pool.append(conn)

    def forget(self, conn: _Connection) -> None:
        pool = self.idle.get(conn.key)
        if pool and conn in pool:
            pool.remove(conn)

    async def close(self) -> None:
        self.closed = True
        for pool in list(self.idle.values()):
            for conn in list(pool):
                conn.close()
        self.idle.clear()


_tls_contexts: dict[str | None, ssl.SSLContext] = {}


def _tls_context() -> ssl.SSLContext:
    """Certificate-verifying TLS context; ``A2A_OUTBOUND_CA_FILE`` adds a private CA bundle
    (agents behind an internal CA) to the system's trust store."""
    from django.conf import settings

    cafile = settings.A2A_OUTBOUND_CA_FILE or None
    context = _tls_contexts.get(cafile)
    if context is None:
        context = ssl.create_default_context()
        if cafile:
            context.load_verify_locations(cafile=cafile)
        _tls_contexts[cafile] = context
    return context


def _expire(response: Response) -> None:
    response._fail(TimeoutError())
    response.close()


def finish(response: Response) -> None:
    """End an exchange: cancel its timeout and release or close its connection."""
    timer = response._timer
    if timer is not None:
        response._timer = None
        timer.cancel()
    response.release()


_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Client] = (
    weakref.WeakKeyDictionary()
)


def client() -> Client:
    """The shared client of the running loop."""
    loop = asyncio.get_running_loop()
    current = _clients.get(loop)
    if current is None or current.closed:
        current = _clients[loop] = Client()
    return current


async def close_client() -> None:
    """Close the running loop's client (node shutdown)."""
    current = _clients.pop(asyncio.get_running_loop(), None)
    if current is not None:
        await current.close()
