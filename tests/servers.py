"""Real servers on loopback for tests: uvicorn serving any ASGI app in a background thread."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ThreadedUvicorn:
    """An ASGI app served by a real uvicorn on 127.0.0.1 in a thread of the test process."""

    def __init__(self, app, *, port: int | None = None, lifespan: str = "on",
                 ssl_certfile: str | None = None, ssl_keyfile: str | None = None) -> None:
        self.port = port or free_port()
        self.scheme = "https" if ssl_certfile else "http"
        self.config = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, lifespan=lifespan, log_level="warning",
            loop="asyncio", timeout_graceful_shutdown=2,
            ssl_certfile=ssl_certfile, ssl_keyfile=ssl_keyfile,
        )
        self.server = uvicorn.Server(self.config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def start(self) -> ThreadedUvicorn:
        self.thread.start()
        deadline = time.monotonic() + 15
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"uvicorn on port {self.port} did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@contextmanager
def serve_app(app, **kwargs) -> Iterator[ThreadedUvicorn]:
    server = ThreadedUvicorn(app, **kwargs).start()
    try:
        yield server
    finally:
        server.stop()


def wait_until_serving(process, url: str, *, timeout: float, what: str) -> None:
    """Wait for a ``manage.py serve`` subprocess to answer ``/healthz``; fail the test with its
    output if it exits or does not answer within ``timeout`` seconds."""
    import httpx
    import pytest

    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            output = process.stdout.read().decode(errors="replace") if process.stdout else ""
            pytest.fail(f"{what} did not start:\n{output}")
        time.sleep(0.1)
