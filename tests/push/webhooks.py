"""A caller's webhook for push tests: a real aiohttp server on loopback in a thread of its own,
whose every path answers as the test scripted it, and two hostile ones on raw sockets: one that
reads the request and never answers, one that answers a byte at a time."""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
from dataclasses import dataclass, field

import httpx
import jwt
from aiohttp import web

from tests.servers import free_port


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float = field(default_factory=time.monotonic)


class Webhook:
    """``url(name)``: a webhook path. ``fail_first(name, n)``: its first ``n`` requests answer
    503; ``always_fail(name)``: every one does. ``hang_url`` never answers; ``drip_url`` answers
    one byte every ``DRIP_SECONDS``."""

    DRIP_SECONDS = 0.2

    def __init__(self) -> None:
        self.port = free_port()
        self.hang_port = free_port()
        self.drip_port = free_port()
        self.received: list[Received] = []
        self.failures: dict[str, int] = {}
        self.hung: list[float] = []  # when each hanging request arrived
        self.dripped: list[float] = []
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/hook/{name}"

    @property
    def hang_url(self) -> str:
        return f"http://127.0.0.1:{self.hang_port}/hang"

    @property
    def drip_url(self) -> str:
        return f"http://127.0.0.1:{self.drip_port}/drip"

    def fail_first(self, name: str, count: int) -> None:
        self.failures[f"/hook/{name}"] = count

    def always_fail(self, name: str) -> None:
        self.failures[f"/hook/{name}"] = 10**9

    def delivered(self, name: str) -> list[Received]:
        """The requests to ``name`` answered 2xx, in arrival order."""
        return [r for r in self.received if r.path == f"/hook/{name}"
                and r.headers.get("x-test-answer") == "200"]

    async def _hook(self, request: web.Request) -> web.Response:
        body = await request.read()
        headers = {k.lower(): v for k, v in request.headers.items()}
        left = self.failures.get(request.path, 0)
        status = 200
        if left > 0:
            self.failures[request.path] = left - 1
            status = 503
        headers["x-test-answer"] = str(status)
        self.received.append(Received(request.path, headers, body))
        return web.json_response({"ok": status == 200}, status=status)

    async def _hang(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.hung.append(time.monotonic())
        try:
            await reader.read(65536)
            await asyncio.sleep(60)  # far past any attempt's deadline
        finally:
            writer.close()

    async def _drip(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.dripped.append(time.monotonic())
        try:
            await reader.read(65536)
            for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"x" * 100000:
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(self.DRIP_SECONDS)
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def serve() -> None:
            app = web.Application()
            app.router.add_post("/hook/{name}", self._hook)
            self._runner = web.AppRunner(app)
            await self._runner.setup()
            await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
            self._raw = [await asyncio.start_server(self._hang, "127.0.0.1", self.hang_port),
                         await asyncio.start_server(self._drip, "127.0.0.1", self.drip_port)]

        self._loop.run_until_complete(serve())
        self._started.set()
        self._loop.run_forever()

    def start(self) -> Webhook:
        self._thread.start()
        assert self._started.wait(10), "the webhook server did not start"
        return self

    def stop(self) -> None:
        async def close() -> None:
            for server in self._raw:
                server.close()
            await self._runner.cleanup()
            others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in others:
                task.cancel()
            await asyncio.gather(*others, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def verified_claims(node_url: str, received: Received) -> dict:
    """The platform's signature on ``received``, verified with the JWKS the node serves
    (fetched as a receiver would), and its body hash checked; the claims."""
    token = received.headers["x-a2a-push-signature"]
    keys = jwt.PyJWKSet.from_dict(httpx.get(f"{node_url}/.well-known/jwks.json").json())
    kid = jwt.get_unverified_header(token)["kid"]
    [key] = [k for k in keys.keys if k.key_id == kid]
    claims = jwt.decode(token, key, algorithms=["EdDSA", "ES256"], issuer="a2a-gateway")
    assert claims["body_sha256"] == hashlib.sha256(received.body).hexdigest()
    return claims


def wait_for(condition, timeout: float = 15.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def wait_in_thread(condition, timeout: float = 15.0, what: str = "condition"):
    """:func:`wait_for` of a condition that reads the database, in a thread of its own (an
    async test may not query on its loop), its connection given back at the end."""
    from django.db import connections

    try:
        return wait_for(condition, timeout, what)
    finally:
        connections.close_all()


def _closing(read):
    from django.db import connections

    try:
        return read()
    finally:
        connections.close_all()


async def db(read):
    """``read()`` (database reads) in a thread of its own, for an async test, its connection
    given back at the end: a connection left open would keep the test database from being
    dropped."""
    import asyncio

    return await asyncio.to_thread(_closing, read)
