"""The two HTTP servers a node runs under, with the same connection and body limits.

Both uvicorn (httptools) and Daphne (Twisted) are configured here by ``manage.py serve``:

- **Body caps before reading**: a request announcing a ``Content-Length`` above its route's cap
  (``A2A_MAX_REQUEST_BYTES`` under ``/a2a/``, ``A2A_MAX_API_BODY_BYTES`` elsewhere) is answered
  413 as soon as its headers are in, without waiting for a byte of the body; a chunked body is
  cut at the cap. Under uvicorn the gateway and :mod:`node.edge` enforce this (uvicorn hands
  the body over as it arrives, with backpressure); Daphne's Twisted channel would spool the
  whole body to disk before the application runs, so its request class enforces it instead.
- **Header timeout** (``A2A_HTTP_HEADER_TIMEOUT_SECONDS``): a connection that has not sent a
  complete request head this long after connecting, or after starting its next request, is
  answered 408 and closed, however slowly it drips bytes (idle timers reset on every byte).
- **Keep-alive timeout** (``A2A_HTTP_KEEPALIVE_SECONDS``): an idle connection between requests
  is closed after this long, and so is one whose request body stops arriving for this long.
- **Connection limit** (``A2A_HTTP_MAX_CONNECTIONS``): connections beyond it are answered 503
  and closed at once.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import time
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING

import orjson
from django.conf import settings

if TYPE_CHECKING:
    from twisted.internet.task import LoopingCall

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerLimits:
    header_timeout: float
    keepalive: float
    max_connections: int
    a2a_body_bytes: int
    api_body_bytes: int

    @classmethod
    def from_settings(cls) -> ServerLimits:
        return cls(
            header_timeout=settings.A2A_HTTP_HEADER_TIMEOUT_SECONDS,
            keepalive=settings.A2A_HTTP_KEEPALIVE_SECONDS,
            max_connections=settings.A2A_HTTP_MAX_CONNECTIONS,
            a2a_body_bytes=settings.A2A_MAX_REQUEST_BYTES,
            api_body_bytes=settings.DATA_UPLOAD_MAX_MEMORY_SIZE,
        )

    def body_cap(self, path: bytes | str) -> int:
        prefix = b"/a2a/" if isinstance(path, bytes) else "/a2a/"
        return self.a2a_body_bytes if path.startswith(prefix) else self.api_body_bytes  # type: ignore[arg-type]  # prefix has path's type




class PortInUse(Exception):
    """The port is taken by another process."""


def bind_socket(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` before anything says "serving", not listening yet.

    Binding here (not inside the server) turns a busy port into one clear error at once, and
    hands both servers the same socket. It listens only once the node has started (uvicorn
    after its lifespan startup, Daphne after :func:`core.lifecycle.start`): until then a
    connection is refused at once -- a restarting node is never a port that accepts and then
    answers nothing for the seconds its startup takes, so a client or load balancer goes to
    another node instead of waiting.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise PortInUse(f"port {port} is in use on {host}") from None
        raise
    sock.set_inheritable(True)
    return sock


#: The listen backlog of both servers (uvicorn's default).
BACKLOG = 2048


def _raw_response(status: int, reason: str, body: bytes, *, a2a: bool) -> bytes:
    headers = [
        f"HTTP/1.1 {status} {reason}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        "Connection: close",
    ]
    if a2a:
        headers.append("X-A2A-Executed: false")
    return ("\r\n".join(headers) + "\r\n\r\n").encode() + body


def too_large_response(path: bytes, cap: int) -> bytes:
    """The 413 answer for an over-cap body, in the route's error shape."""
    detail = f"request body larger than {cap} bytes"
    if path.startswith(b"/a2a/"):
        from gateway import errors

        body = errors.error_body(errors.REQUEST_TOO_LARGE, agent_id=None, detail=detail)
        return _raw_response(413, "Content Too Large", body, a2a=True)
    body = orjson.dumps({"error": f"request body too large: the limit is {cap} bytes"})
    return _raw_response(413, "Content Too Large", body, a2a=False)


async def unauthenticated_response(path: bytes, authorization: str | None) -> bytes | None:
    """The gateway's 401 for a caller that does not authenticate, or None if it does."""
    from gateway import errors, runtime
    from gateway.admission import unauthenticated
    from registry.token_cache import shared_token_cache

    # The running node's token cache (the process's one cache unless the node was given its
    # own), the same the gateway's handler authenticates with.
    node = runtime.current_node()
    tokens = node.tokens if node is not None else shared_token_cache()
    detail = await unauthenticated(tokens, authorization)
    if detail is None:
        return None
    agent_id = path[5:].split(b"/", 1)[0].decode("latin-1")
    body = errors.error_body(errors.UNAUTHENTICATED, agent_id=agent_id, detail=detail)
    response = _raw_response(401, "Unauthorized", body, a2a=True)
    return response.replace(b"\r\n\r\n", b'\r\nWWW-Authenticate: Bearer realm="a2a"\r\n\r\n', 1)


TIMEOUT_RESPONSE = _raw_response(
    408, "Request Timeout", b'{"error": "request headers not received in time"}', a2a=False
)
BUSY_RESPONSE = _raw_response(
    503, "Service Unavailable", b'{"error": "too many connections"}', a2a=False
)


# --- uvicorn -----------------------------------------------------------------------------------


def uvicorn_protocol(limits: ServerLimits):
    """uvicorn's httptools protocol with a header deadline, a body idle timeout and a connection
    limit."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    sweeping: set = set()  # the loop whose sweeper runs (one per server process)
    tick = max(0.05, min(1.0, limits.header_timeout / 2, limits.keepalive / 2))

    async def sweep(connections: set) -> None:
        """Enforce the header deadline, the body idle timeout (uvicorn has no timer there;
        Twisted's idle timer does the same under Daphne) and the keep-alive timeout in one pass
        per tick over the open connections: no timer or extra callback per request on the hot
        path (uvicorn's own keep-alive timer was one call_later and one cancel per response). A
        deadline fires within one tick (at most a second) of its time."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(tick)
            now = loop.time()
            for protocol in list(connections):
                transport = protocol.transport
                if transport is None or transport.is_closing():
                    continue
                cycle = protocol.cycle
                if protocol.idle_since is not None:
                    # Between requests on a kept-alive connection.
                    if now - protocol.idle_since > limits.keepalive:
                        protocol.idle_since = None
                        transport.close()
                    continue
                if protocol.head_since is not None and cycle is protocol.head_cycle:
                    # A request head started (or the connection opened) and is not complete.
                    if now - protocol.head_since > limits.header_timeout:
                        protocol.head_since = None
                        transport.write(TIMEOUT_RESPONSE)
                        transport.close()
                    continue
                if cycle is not None and cycle.more_body and not cycle.response_complete:
                    if protocol.body_moved or protocol.body_cycle is not cycle:
                        protocol.body_moved = False
                        protocol.body_cycle = cycle
                        protocol.body_since = now
                    elif now - protocol.body_since > limits.keepalive:
                        transport.close()

    class LimitedHttpToolsProtocol(HttpToolsProtocol):
        # The head being read: since when, and the cycle current when it started (uvicorn makes
        # a new cycle once the head is complete). The body being read: bytes since last tick.
        # Idle between requests: since when (None while a request is read or answered).
        idle_since: float | None = None
        head_since: float | None = None
        head_cycle = None
        body_moved = False
        body_cycle = None
        body_since = 0.0

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            if len(self.connections) > limits.max_connections:
                transport.write(BUSY_RESPONSE)
                transport.close()
                return
            if self.loop not in sweeping:
                sweeping.add(self.loop)
                self.loop.create_task(sweep(self.connections))
            self.head_since = self.loop.time()  # the first head is due from the connect
            # Everything uvicorn writes goes through the one-write-per-response transport.
            self.transport = _CoalescingTransport(transport, _held_heads(self.loop))  # type: ignore[assignment]  # duck-typed wrapper

        def on_message_begin(self) -> None:
            # The first bytes of a next request on a kept-alive connection start its deadline.
            self.idle_since = None
            if self.cycle is not None:
                self.head_since = self.loop.time()
                self.head_cycle = self.cycle
            super().on_message_begin()

        def on_body(self, body: bytes) -> None:
            self.body_moved = True
            super().on_body(body)

        def on_response_complete(self) -> None:
            # uvicorn's (0.54), with the keep-alive timer replaced by the sweep's idle check.
            self.server_state.total_requests += 1
            if self.transport.is_closing():
                return
            self._unset_keepalive_if_required()
            self.flow.resume_reading()
            if self.pipeline:
                cycle, app = self.pipeline.pop()
                self._start_asgi_task(cycle, app)
            else:
                self.idle_since = self.loop.time()

    return LimitedHttpToolsProtocol


class _CoalescingTransport:
    """A connection's transport that sends a response's head and its first body bytes in one
    write (one system call, one loopback segment) where uvicorn writes them separately.

    uvicorn writes the status line and headers at ``http.response.start`` and the body at
    ``http.response.body``; applications send both back to back. The head is held until the
    next write, or until the end of the current event-loop iteration at the latest (a body that
    comes later, e.g. a stream's first event after a wait, never delays the head longer).
    """

    __slots__ = ("_transport", "_heads", "_held")

    def __init__(self, transport, heads: _HeldHeads) -> None:
        self._transport = transport
        self._heads = heads
        self._held: bytes | None = None

    def write(self, data: bytes) -> None:
        held = self._held
        if held is not None:
            self._held = None
            if len(data) < 16384:
                self._transport.write(held + data)
            else:  # no copy of a large body
                self._transport.writelines((held, data))
        elif data[:9] == b"HTTP/1.1 " and data[9:10] != b"1":  # a final response's head
            self._held = data
            self._heads.hold(self)
        else:
            self._transport.write(data)

    def flush(self) -> None:
        held = self._held
        if held is not None:
            self._held = None
            if not self._transport.is_closing():
                self._transport.write(held)

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str):
        return getattr(self._transport, name)


class _HeldHeads:
    """The connections of one event loop holding a head: flushed together by one callback at
    the end of the loop's iteration, not one callback per response (most are empty by then:
    the body came right after the head)."""

    __slots__ = ("_loop", "_transports", "_scheduled")

    def __init__(self, loop) -> None:
        self._loop = loop
        self._transports: list[_CoalescingTransport] = []
        self._scheduled = False

    def hold(self, transport: _CoalescingTransport) -> None:
        self._transports.append(transport)
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self.flush)

    def flush(self) -> None:
        self._scheduled = False
        transports, self._transports = self._transports, []
        for transport in transports:
            try:
                transport.flush()
            except Exception:  # one broken connection must not hold the others' heads
                logger.exception("could not write a response head")


_heads_of_loops: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _held_heads(loop) -> _HeldHeads:
    """The loop's :class:`_HeldHeads` (one per server loop; tests run several)."""
    heads = _heads_of_loops.get(loop)
    if heads is None:
        heads = _heads_of_loops[loop] = _HeldHeads(loop)
    return heads


# --- Daphne (Twisted) --------------------------------------------------------------------------


def daphne_factory_class(limits: ServerLimits):
    """Daphne's HTTP factory with body caps, a header deadline, keep-alive and a connection
    limit. ``daphne.server.Server.run`` builds its factory from the module attribute this
    replaces (see :func:`run_daphne`)."""
    from daphne.http_protocol import HTTPFactory, WebRequest
    from twisted.web import http

    from gateway.admission import AUTH_FIRST_ABOVE_BYTES

    class LimitedWebRequest(WebRequest):
        _refused = False
        _processing = False
        _auth_pending = False
        _expect_continue = False

        def gotLength(self, length) -> None:  # noqa: N802 (Twisted's name)
            channel = self.channel
            channel.edge_head_complete()
            # Twisted would parse the Content-Type of every POST with the email package (a
            # class built per call) for form arguments; Daphne and the applications never read
            # request.args.
            self._parsePOSTFormSubmission = False
            path = self._edge_path = channel._path or b"/"
            self._edge_version = channel._version
            self._cap = limits.body_cap(path)
            self._size = 0
            if length is not None and length > self._cap:
                self._refuse(too_large_response(path, self._cap))
                return
            super().gotLength(length)
            if (
                (length is None or length > AUTH_FIRST_ABOVE_BYTES)
                and channel._command == b"POST"
                and path.startswith(b"/a2a/")
            ):
                self._authenticate_first()

        def _authenticate_first(self) -> None:
            """Stop reading until the caller is authenticated: an unknown caller gets 401
            without its body being read (what the gateway does itself under uvicorn)."""
            self._auth_pending = True
            self._expect_continue = bool(self.requestHeaders.getRawHeaders(b"expect"))
            self.requestHeaders.removeHeader(b"expect")  # no 100-continue before the answer
            self.channel._networkProducer.pauseProducing()
            authorization = self.requestHeaders.getRawHeaders(b"authorization", [None])[0]
            asyncio.ensure_future(self._authenticated(authorization))

        async def _authenticated(self, authorization: bytes | None) -> None:
            try:
                refusal = await unauthenticated_response(
                    self._edge_path, authorization.decode("latin-1") if authorization else None
                )
            except Exception:  # e.g. the database is down: let the gateway answer it
                logger.exception("authenticating before the body failed")
                refusal = None
            self._auth_pending = False
            if self._refused or self._processing or getattr(self, "_disconnected", False):
                return  # the whole body had arrived: the gateway answers it itself
            if refusal is not None:
                self._refuse(refusal)
                return
            if self._expect_continue and self._edge_version == b"HTTP/1.1":
                self.channel.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            self.channel._networkProducer.resumeProducing()

        def handleContentChunk(self, data: bytes) -> None:  # noqa: N802
            if self._refused:
                return
            self._size += len(data)
            if self._size > self._cap:
                self._refuse(too_large_response(self._edge_path, self._cap))
                return
            super().handleContentChunk(data)

        def _refuse(self, response: bytes) -> None:
            # Answer now and read nothing more: no 100-continue, no body, no application.
            self._refused = True
            self.requestHeaders.removeHeader(b"expect")
            self.content = _Discard()
            transport = self.channel.transport
            transport.write(response)
            transport.loseConnection()

        def process(self):
            if self._refused:
                return None
            self._processing = True
            return super().process()

    class LimitedChannel(http.HTTPChannel):
        # The header deadline: since when a request head is being read (None: not reading
        # one); edge_awaiting: between requests, the next head not started yet. The factory's
        # sweeper enforces it once per tick: no timer and no per-line callback per request.
        edge_head_since: float | None = None
        edge_awaiting = False
        _edge_host = None

        def connectionMade(self) -> None:  # noqa: N802
            super().connectionMade()
            self.edge_head_since = time.monotonic()  # the first head is due from the connect
            self.factory.edge_channels.add(self)

        def edge_head_complete(self) -> None:
            self.edge_head_since = None
            self.edge_awaiting = False

        def requestDone(self, request) -> None:  # noqa: N802
            self.edge_awaiting = True
            super().requestDone(request)

        def getHost(self):  # noqa: N802
            # Twisted asks the socket (getsockname) for every request; it never changes.
            host = self._edge_host
            if host is None:
                host = self._edge_host = super().getHost()
            return host

        def checkPersistence(self, request, version) -> bool:  # noqa: N802
            # A draining node answers the request in progress and then closes the connection.
            return not self.factory.edge_draining and super().checkPersistence(request, version)

        def edge_sweep(self, now: float) -> None:
            if self._handlingRequest or self.transport is None:
                return
            since = self.edge_head_since
            if since is None:
                # The first bytes of a next request on a kept-alive connection start its
                # deadline (seen by the sweeper: within one tick).
                if self.edge_awaiting and (self._receivedHeaderSize or self._buffer):
                    self.edge_awaiting = False
                    self.edge_head_since = now
                return
            if now - since > limits.header_timeout:
                self.edge_head_since = None
                self.transport.write(TIMEOUT_RESPONSE)  # type: ignore[call-arg, misc]  # zope interface
                self.transport.loseConnection()  # type: ignore[misc]  # zope interface

        def connectionLost(self, reason) -> None:  # type: ignore[override]  # noqa: N802  # Twisted always passes reason
            self.edge_head_since = None
            self.factory.edge_channels.discard(self)
            self.factory.edge_connections -= 1
            super().connectionLost(reason)

    class LimitedFactory(HTTPFactory):
        def __init__(self, server) -> None:
            super().__init__(server)
            # Twisted's idle timer: armed while reading a request and between requests, paused
            # while the application answers (so long streams are not cut).
            self.timeOut = limits.keepalive
            self.edge_connections = 0
            self.edge_channels: set = set()
            self.edge_draining = False
            self._edge_sweeper: LoopingCall | None = None

        def edge_drain(self) -> None:
            """The node is stopping: close the idle connections; the busy ones close once
            their request is answered (checkPersistence)."""
            self.edge_draining = True
            for channel in list(self.edge_channels):
                if channel.transport is None:
                    continue
                if channel._handlingRequest or channel.requests:
                    channel.persistent = False
                else:
                    channel.transport.loseConnection()

        def startFactory(self) -> None:  # noqa: N802
            super().startFactory()
            if self._edge_sweeper is None:
                from twisted.internet import task

                self._edge_sweeper = task.LoopingCall(self._edge_sweep)
                self._edge_sweeper.start(
                    max(0.05, min(1.0, limits.header_timeout / 2)), now=False)

        def stopFactory(self) -> None:  # noqa: N802
            if self._edge_sweeper is not None and self._edge_sweeper.running:
                self._edge_sweeper.stop()
            self._edge_sweeper = None
            super().stopFactory()

        def _edge_sweep(self) -> None:
            now = time.monotonic()
            for channel in list(self.edge_channels):
                try:
                    channel.edge_sweep(now)
                except Exception:  # one broken connection must not stop the sweeper
                    logger.exception("header deadline sweep failed")

        def protocol(self):
            return http._GenericHTTPChannelProtocol(LimitedChannel())

        def buildProtocol(self, addr):  # noqa: N802
            if self.edge_connections >= limits.max_connections:
                return _Refuser()
            protocol = super().buildProtocol(addr)
            protocol.requestFactory = LimitedWebRequest
            self.edge_connections += 1
            return protocol

    return LimitedFactory


class _Discard:
    """A request content sink that keeps nothing (a refused request's body)."""

    def write(self, data: bytes) -> None:
        return None

    def seek(self, *args) -> int:
        return 0

    def read(self, *args) -> bytes:
        return b""

    def close(self) -> None:
        return None


def _refuser_class():
    from twisted.internet.protocol import Protocol

    class Refuser(Protocol):
        def connectionMade(self) -> None:  # noqa: N802
            self.transport.write(BUSY_RESPONSE)  # type: ignore[union-attr, call-arg, misc]  # zope; connected
            self.transport.loseConnection()  # type: ignore[union-attr, misc]  # zope; connected

    return Refuser


def _Refuser():  # noqa: N802
    return _refuser_class()()
