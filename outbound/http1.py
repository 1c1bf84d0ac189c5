"""The one pooled outbound HTTP client of the proxy hot path, behind this module.

How it was chosen, by measurement (wrk -t1 pinned to core 1, servers on core 0, 1 KiB
message/send, CPU per request read from /proc, interleaved rounds on this 2-core machine):

- httpx: out of the hot path (docs/adr/0002: its pool is 10x slower than aiohttp at c=64;
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

Built on the shared outbound layer (package ``outbound``): TLS context, connect timeout, pool
and header bounds come from its policy; every NEW connection resolves the agent's name,
checks each address against the SSRF rules (``outbound.resolve``) and connects to a checked
address with SNI and Host the name; errors say whether the request was sent
(``outbound.errors``). Bounds on what an agent sends, each counted once per header or once per
received segment, never per request:

- before the body (interim 1xx responses included) and after its last chunk (trailers): at
  most ``A2A_OUTBOUND_MAX_HEADER_BYTES`` bytes without body progress and
  ``A2A_OUTBOUND_MAX_HEADERS`` header lines; beyond, the exchange fails and the connection
  closes (endless or huge headers cannot grow the node);
- a response is final when complete: any byte after it (a smuggled second response) closes the
  connection; it never reaches the caller and the connection never returns to the pool;
- 101 Switching Protocols and any Transfer-Encoding other than ``chunked`` (``gzip, chunked``
  would relay compressed bytes without a Content-Encoding) fail the exchange cleanly;
- chunked trailers are dropped, never relayed as headers.

``A2A_OUTBOUND_CLIENT=aiohttp`` swaps in a client with the same interface over aiohttp
(``outbound.aiohttp_client``): the gateway's proxy tests run against both, so a defect of this
one shows as a difference.

This module holds the pools and the per-loop client; the wire side (the parsed agent URL, one
connection's protocol and parser, the response being read) is :mod:`outbound.http1_wire`.
"""

from __future__ import annotations

import asyncio
import time
import weakref

from outbound import policy as outbound_policy
from outbound.errors import CONNECTION_ERRORS, ConnectFailed, OutboundError
from outbound.http1_wire import Connection, Response, Target, target
from outbound.policy import KEEPALIVE_SECONDS, Policy  # noqa: F401  (re-exported)
from outbound.resolve import resolve

__all__ = ["CONNECTION_ERRORS", "OutboundError", "Response", "client", "close_client", "finish"]

#: Methods whose empty request body is sent without a Content-Length header.
_NO_BODY_METHODS = frozenset({"GET", "DELETE", "HEAD", "OPTIONS"})


class Client:
    """Keep-alive connection pools per agent origin, on one event loop."""

    def __init__(self, policy: Policy | None = None) -> None:
        self.loop = asyncio.get_running_loop()
        self.policy = policy or outbound_policy.current()
        self.idle: dict[tuple[str, int, bool], list[Connection]] = {}
        self.closed = False

    async def post(self, endpoint: str, body: bytes, headers: dict[str, str],
                   timeout: float | None) -> Response:
        """POST ``body`` with exactly ``headers`` (plus Host and Content-Length); answers once
        the status and headers arrived. ``timeout`` bounds the whole exchange, body included
        (None: no bound; the caller enforces its own, e.g. a stream's idle timeout)."""
        return await self.request("POST", endpoint, body, headers, timeout)

    async def request(self, method: str, endpoint: str, body: bytes, headers: dict[str, str],
                      timeout: float | None, *, suffix: str = "") -> Response:
        """:meth:`post` with another request method (GET, DELETE: an empty body is sent
        without Content-Length, as clients send them) and ``suffix``, a path (and query) after
        the endpoint's path: the endpoint's parsed form stays cached per agent, whatever the
        suffix."""
        where = target(endpoint)
        parts = [where.head(method, suffix)]
        for name, value in headers.items():
            if "\r" in value or "\n" in value:
                continue  # never let a value split the request
            parts.append(f"{name}: {value}\r\n".encode("latin-1", "replace"))
        if body or method not in _NO_BODY_METHODS:
            parts.append(b"Content-Length: %d\r\n\r\n" % len(body))
        else:
            parts.append(b"\r\n")
        head = b"".join(parts)
        conn = await self._acquire(where)
        conn.begin()
        response = conn.response = Response(conn)
        timer = None
        if timeout is not None:
            timer = self.loop.call_later(timeout, _expire, response)
        try:
            if len(body) < 16384:
                conn.transport.write(head + body)  # type: ignore[union-attr]  # connected
            else:  # no copy of a large body
                conn.transport.writelines((head, body))  # type: ignore[union-attr]  # connected
            await response._headers_future
        except BaseException:
            if timer is not None:
                timer.cancel()
            response.close()
            raise
        response._timer = timer
        return response

    async def _acquire(self, where: Target) -> Connection:
        pool = self.idle.get(where.key)
        if pool:
            now = time.monotonic()
            while pool:
                conn = pool.pop()
                if not conn.closed and now - conn.idle_since < self.policy.keepalive_seconds:
                    return conn
                conn.close()
        policy = self.policy
        tls = policy.tls_context() if where.tls else None
        error: OSError | None = None
        try:
            async with asyncio.timeout(policy.connect_timeout):
                # Resolved and checked on every new connection (DNS rebinding), then connected
                # to a checked address; TLS verifies the name, Host carries it.
                for _family, address in await resolve(where.host, where.port):
                    try:
                        _, conn = await self.loop.create_connection(
                            lambda: Connection(self, where.key), address, where.port,
                            ssl=tls, server_hostname=where.host if where.tls else None,
                        )
                        return conn
                    except OSError as exc:
                        error = exc
        except TimeoutError:
            raise ConnectFailed(f"connect to {where.host}:{where.port} timed out") from None
        raise ConnectFailed(f"connect to {where.host}:{where.port} failed: {error}")

    def give_back(self, conn: Connection) -> None:
        if self.closed:
            conn.close()
            return
        conn.idle_since = time.monotonic()
        conn.resume()
        pool = self.idle.setdefault(conn.key, [])
        if len(pool) >= self.policy.max_idle_per_origin:
            conn.close()
            return
        pool.append(conn)

    def forget(self, conn: Connection) -> None:
        pool = self.idle.get(conn.key)
        if pool and conn in pool:
            pool.remove(conn)

    async def close(self) -> None:
        self.closed = True
        for pool in list(self.idle.values()):
            for conn in list(pool):
                conn.close()
        self.idle.clear()


def _expire(response: Response) -> None:
    response._fail(TimeoutError())
    response.close()


def finish(response: Response) -> None:
    """End an exchange: cancel its timeout and release or close its connection."""
    response.finish()


_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Client] = (
    weakref.WeakKeyDictionary()
)


def client() -> Client:
    """The shared client of the running loop (``A2A_OUTBOUND_CLIENT``: own or aiohttp)."""
    loop = asyncio.get_running_loop()
    current = _clients.get(loop)
    if current is None or current.closed:
        policy = outbound_policy.current()
        if policy.client == "aiohttp":
            from outbound.aiohttp_client import AiohttpClient

            current = AiohttpClient(policy)  # type: ignore[assignment]  # Client's interface
        else:
            current = Client(policy)
        _clients[loop] = current  # type: ignore[assignment]  # Client's interface
    return current  # type: ignore[return-value]  # Client's interface


def _drop_clients(_policy: Policy) -> None:
    """The policy changed: every loop's client closes (on its loop) and is rebuilt on demand."""
    for loop, current in list(_clients.items()):
        current.closed = True  # seen at once by subscribers holding it
        try:
            loop.call_soon_threadsafe(lambda c=current, lp=loop: lp.create_task(c.close()))  # type: ignore[misc]  # default-bound
        except RuntimeError:  # that loop is closed
            pass
        _clients.pop(loop, None)


outbound_policy.on_change(_drop_clients)


async def close_client() -> None:
    """Close the running loop's client (node shutdown)."""
    current = _clients.pop(asyncio.get_running_loop(), None)
    if current is not None:
        await current.close()
