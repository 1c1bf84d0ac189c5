"""The gRPC listener's front: an HTTP/2 frame guard between the callers and grpcio.

grpcio's core leaves two HTTP/2 floods unbounded whatever the server's options (measured with
grpcio 1.76.0, the pinned version, and later ones; docs/adr/0017-grpc-frame-guard.md):

- a CONTINUATION flood: a header block that never ends, each frame full of new fields, kept
  in memory at random (up to about 250 MiB per 700 MiB sent);
- a PING flood from a peer that never reads: each PING's acknowledgement queued (a few MiB of
  PINGs grew a node by up to about 1 GiB).

The guard listens on the node's gRPC address and relays each connection, bytes unchanged, to
grpcio listening on a loopback port of its own. It reads only the 9-byte headers of the frames
the caller sends, and closes the connection (both sides, at once) when

- a header block (HEADERS, then CONTINUATIONs until END_HEADERS) passes
  :data:`MAX_HEADER_BLOCK_BYTES` -- four times the listener's metadata limit: a block that size
  carries more metadata than the limit whatever its encoding (HPACK counts each field as its
  name, value and 32 bytes, and never encodes it in more), so grpcio would refuse its call
  anyway;
- the caller sends PINGs faster than :data:`PING_BURST` at once and :data:`PINGS_PER_SECOND`
  after (well above what gRPC's keepalive and bandwidth probes send).

And it ties the two directions together: while the caller does not read what grpcio sends it
(the relay's buffer to the caller above its high-water mark), the guard reads neither the caller
nor grpcio, so neither side's buffers grow on its behalf; while grpcio does not read, the caller
is not read either. Every buffer is the transports' own, bounded by their write limits. At
most ``A2A_HTTP_MAX_CONNECTIONS`` callers' connections are open at once (the HTTP listener's
limit, counted apart); one beyond it is closed at once.

grpcio sees each call from the guard's loopback address; :func:`caller_address` gives the
caller's own (rate limits by address and the audit name callers by it).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

logger = logging.getLogger(__name__)

#: The HTTP/2 client connection preface, relayed as is before the first frame.
PREFACE_BYTES = 24
#: A header block's bytes past which the connection is closed (4 x the metadata limit).
MAX_HEADER_BLOCK_BYTES = 64 * 1024
#: PINGs (not acknowledgements) a caller may send at once, then per second.
PING_BURST = 1000
PINGS_PER_SECOND = 1000.0
#: The relay's write buffer to either side above which the other side is no longer read.
WRITE_HIGH_WATER = 256 * 1024

_HEADERS, _PING, _CONTINUATION = 0x1, 0x6, 0x9
_END_HEADERS, _ACK = 0x4, 0x1

#: The guard's loopback port of each relayed connection -> its relay (the caller's address).
_relays_by_port: dict[int, _Relay] = {}


def caller_address(host: str, port: int) -> tuple[str, int]:
    """The caller behind grpcio's peer ``host:port`` (the guard's end of a relayed
    connection); ``(host, port)`` itself when it is not one."""
    relay = _relays_by_port.get(port) if host == "127.0.0.1" else None
    return relay.caller_address if relay is not None else (host, port)


class FrameScanner:
    """Reads the frame headers of the bytes a caller sends; :meth:`feed` says whether they may
    go on (False: a flood; :attr:`reason` names it)."""

    __slots__ = ("_skip", "_partial", "_block", "_tokens", "_refilled", "reason")

    def __init__(self) -> None:
        self._skip = PREFACE_BYTES  # bytes to pass before the next frame header
        self._partial = b""  # a frame header split across reads
        self._block = -1  # bytes of the header block in progress; -1: none
        self._tokens = float(PING_BURST)
        self._refilled = time.monotonic()
        self.reason = ""

    def feed(self, data: bytes) -> bool:
        i, n = 0, len(data)
        while i < n:
            if self._skip:
                taken = min(self._skip, n - i)
                self._skip -= taken
                i += taken
                continue
            if self._partial or n - i < 9:
                need = 9 - len(self._partial)
                self._partial += data[i:i + need]
                i += need
                if len(self._partial) < 9:
                    return True
                header, self._partial = self._partial, b""
            else:
                header = data[i:i + 9]
                i += 9
            length = int.from_bytes(header[:3], "big")
            if not self._frame(length, header[3], header[4]):
                return False
            self._skip = length
        return True

    def _frame(self, length: int, kind: int, flags: int) -> bool:
        if kind == _HEADERS:
            self._block = -1 if flags & _END_HEADERS else length
        elif kind == _CONTINUATION and self._block >= 0:
            self._block += length
            if flags & _END_HEADERS:
                self._block = -1
        elif kind == _PING and not flags & _ACK:
            now = time.monotonic()
            self._tokens = min(float(PING_BURST),
                               self._tokens + (now - self._refilled) * PINGS_PER_SECOND)
            self._refilled = now
            if self._tokens < 1.0:
                self.reason = "PING flood"
                return False
            self._tokens -= 1.0
        if self._block > MAX_HEADER_BLOCK_BYTES:
            self.reason = f"header block above {MAX_HEADER_BLOCK_BYTES} bytes"
            return False
        return True


class _Relay:
    """One caller's connection and its connection to grpcio."""

    def __init__(self, guard: FrameGuard) -> None:
        self.guard = guard
        self.scanner = FrameScanner()
        self.caller: asyncio.Transport | None = None
        self.grpcio: asyncio.Transport | None = None
        self.caller_address: tuple[str, int] = ("-", 0)
        self.local_port = 0
        self.caller_backed_up = False  # our writes to the caller wait
        self.grpcio_backed_up = False  # our writes to grpcio wait
        # What the caller sent before grpcio's side was connected: reading is paused until
        # then, but a read the loop made before the pause took effect is still delivered
        # (seen under uvicorn's loop).
        self.early = bytearray()
        self.early_eof = False

    def caller_made(self, transport: asyncio.Transport) -> None:
        if len(self.guard.relays) >= self.guard.max_connections:
            transport.close()  # over the node's connection limit
            return
        self.caller = transport
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        transport.pause_reading()  # until grpcio's side is connected
        peer = transport.get_extra_info("peername") or ("-", 0)
        self.caller_address = (str(peer[0]), int(peer[1]))
        self.guard.relays.add(self)
        task = asyncio.get_running_loop().create_task(self._connect())
        self.guard.tasks.add(task)
        task.add_done_callback(self.guard.tasks.discard)

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            transport, _ = await loop.create_connection(
                lambda: _GrpcioSide(self), "127.0.0.1", self.guard.upstream_port)
        except OSError as exc:
            logger.warning("gRPC frame guard: grpcio's listener refused a connection: %s", exc)
            self.close()
            return
        if self.caller is None or self.caller.is_closing():
            transport.abort()
            return
        self.grpcio = transport
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        self.local_port = transport.get_extra_info("sockname")[1]
        _relays_by_port[self.local_port] = self
        if self.early:
            transport.write(bytes(self.early))
            self.early.clear()
        if self.early_eof:
            self.caller_eof()
        self._flow()

    def from_caller(self, data: bytes) -> None:
        if not self.scanner.feed(data):
            logger.warning("gRPC frame guard: %s from %s:%d: connection closed",
                           self.scanner.reason, *self.caller_address)
            self.close()
            return
        if self.grpcio is not None:
            self.grpcio.write(data)
        elif len(self.early) + len(data) <= WRITE_HIGH_WATER:
            self.early += data
        else:
            self.close()

    def from_grpcio(self, data: bytes) -> None:
        if self.caller is not None:
            self.caller.write(data)

    def _flow(self) -> None:
        """Read the caller only while both writes flow; read grpcio only while the caller
        reads what it is sent."""
        for transport, paused in ((self.caller, self.caller_backed_up or self.grpcio_backed_up
                                   or self.grpcio is None),
                                  (self.grpcio, self.caller_backed_up)):
            if transport is None or transport.is_closing():
                continue
            if paused and transport.is_reading():
                transport.pause_reading()
            elif not paused and not transport.is_reading():
                transport.resume_reading()

    def backed_up(self, side: str, waiting: bool) -> None:
        if side == "caller":
            self.caller_backed_up = waiting
        else:
            self.grpcio_backed_up = waiting
        self._flow()

    def caller_eof(self) -> None:
        if self.grpcio is None:
            self.early_eof = True
        elif self.grpcio.can_write_eof():
            self.grpcio.write_eof()

    def close(self, *, abort: bool = True) -> None:
        for transport in (self.caller, self.grpcio):
            if transport is not None and not transport.is_closing():
                transport.abort() if abort else transport.close()

    def lost(self) -> None:
        self.close(abort=False)  # what one side sent the other still gets
        if _relays_by_port.get(self.local_port) is self:
            del _relays_by_port[self.local_port]
        self.guard.relays.discard(self)


class _CallerSide(asyncio.Protocol):
    def __init__(self, guard: FrameGuard) -> None:
        self.relay = _Relay(guard)

    def connection_made(self, transport: Any) -> None:
        self.relay.caller_made(transport)

    def data_received(self, data: bytes) -> None:
        self.relay.from_caller(data)

    def eof_received(self) -> bool:
        self.relay.caller_eof()
        return True  # grpcio may still answer

    def pause_writing(self) -> None:
        self.relay.backed_up("caller", True)

    def resume_writing(self) -> None:
        self.relay.backed_up("caller", False)

    def connection_lost(self, exc: Exception | None) -> None:
        self.relay.lost()


class _GrpcioSide(asyncio.Protocol):
    def __init__(self, relay: _Relay) -> None:
        self.relay = relay

    def data_received(self, data: bytes) -> None:
        self.relay.from_grpcio(data)

    def eof_received(self) -> bool:
        return False  # grpcio is done: the caller's side closes once it has what was sent

    def pause_writing(self) -> None:
        self.relay.backed_up("grpcio", True)

    def resume_writing(self) -> None:
        self.relay.backed_up("grpcio", False)

    def connection_lost(self, exc: Exception | None) -> None:
        self.relay.lost()


class FrameGuard:
    """The listener in front of grpcio (``upstream_port``: grpcio's loopback port); at most
    ``max_connections`` callers' connections at once, those beyond it closed at once."""

    def __init__(self, upstream_port: int, max_connections: int) -> None:
        self.upstream_port = upstream_port
        self.max_connections = max_connections
        self.relays: set[_Relay] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None

    async def listen(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (an exclusive bind); the port bound."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _CallerSide(self), host, port, reuse_port=False)
        port_bound: int = self._server.sockets[0].getsockname()[1]
        return port_bound

    def stop_accepting(self) -> None:
        if self._server is not None:
            self._server.close()

    async def close(self) -> None:
        """Stop accepting and end every relayed connection (after grpcio stopped)."""
        self.stop_accepting()
        for relay in list(self.relays):
            relay.close()
        for task in list(self.tasks):
            task.cancel()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
